"""numba kernels compile once per machine: a second process waits and loads the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parents[2]

KERNEL = """
import numba

@numba.njit(cache=True)
def twice(x):
    return 2 * x
"""

# each process: waits for the go file, compiles twice(int) (numba's compile event made
# to last 1.5 s, so that both processes are inside it together), prints cache misses
CHILD = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import numba.core.event as ev
if sys.argv[3] == "lock":
    from cosmo_dask.core import compile_cache
    compile_cache.install()

class Slow(ev.Listener):
    def on_start(self, event):
        time.sleep(1.5)
    def on_end(self, event):
        pass

ev.register("numba:compile", Slow())
import kernel
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
assert kernel.twice(21) == 42
s = kernel.twice.stats
print(json.dumps({"misses": sum(s.cache_misses.values()), "hits": sum(s.cache_hits.values())}))
"""


def _race(tmp_path, mode):
    src = tmp_path / mode
    src.mkdir()
    (src / "kernel.py").write_text(textwrap.dedent(KERNEL))
    go = tmp_path / f"go-{mode}"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / f"cache-{mode}"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(src), str(go), mode],
                              env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(0.5)
    go.touch()
    out = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return sorted((o["misses"], o["hits"]) for o in out)


def test_second_process_loads_what_the_first_compiled(tmp_path):
    # one process compiles (a miss), the other waits and loads it (a hit)
    assert _race(tmp_path, "lock") == [(0, 1), (1, 0)]


def test_without_the_lock_both_compile(tmp_path):
    # the reference: numba alone compiles the kernel in both processes
    assert _race(tmp_path, "nolock") == [(1, 0), (1, 0)]


def test_install_is_idempotent_and_keeps_uncached_kernels_working():
    import numba

    from cosmo_dask.core import compile_cache

    compile_cache.install()
    compile_cache.install()
    assert compile_cache.installed()

    @numba.njit  # no cache: compiled unlocked, as before
    def add(a, b):
        return a + b

    assert add(2, 3) == 5
