"""numba compile seconds of each kernel the demo runs, from a cold cache, biggest first.

The demo's stages (``cosmo_dask.demo.STAGES``, or the ones named with ``--stages``) run
in ONE fresh subprocess on dask's threaded scheduler (no cluster: the compiles happen in
the measuring process), with ``NUMBA_CACHE_DIR`` a new empty temporary directory, so
every kernel a run dispatches compiles exactly as on a first run. numba's compile events
(``numba.core.event``, kind ``"numba:compile"``, one per dispatcher and signature)
are recorded with their wall time:

* ``seconds``: inclusive, the kernel and the jitted functions it compiles on the way
  (callees compiled as their own dispatchers, not those inlined);
* ``self_seconds``: less the compiles nested inside it;
* ``cpu_seconds``, ``self_cpu_seconds``: the same in CPU seconds of the compiling
  thread (less sensitive to other load on a shared machine);
* ``top``: true when no other compile was running around it (a kernel called from
  Python, which is what a run waits for).

Prints one JSON object per (kernel, signature), biggest ``seconds`` first, then one
``summary`` object (compile seconds of the top-level kernels together, the stages'
wall time, the numba version) and appends them all to
``benchmarks/results/compile.jsonl``. ``--warm`` runs the stages a second time in a new
subprocess on the same cache and reports that run's compiles (none expected: every
kernel loads from the cache) and its cache hits.

    python benchmarks/bench_compile.py [--n-side 64] [--stages halos pse] [--warm]
        [--top 10] [--no-append]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "compile.jsonl"

_CHILD = r"""
import json, sys, time, threading
import numba
import numba.core.event as ev

records = []
lock = threading.Lock()
stack = threading.local()

class Recorder(ev.Listener):
    def on_start(self, event):
        st = getattr(stack, "s", None)
        if st is None:
            st = stack.s = []
        st.append([time.perf_counter(), 0.0, time.thread_time(), 0.0])

    def on_end(self, event):
        st = getattr(stack, "s", None)
        if not st:
            return
        t0, nested, c0, cnested = st.pop()
        dt = time.perf_counter() - t0
        dc = time.thread_time() - c0
        if st:
            st[-1][1] += dt
            st[-1][3] += dc
        data = event.data or {}
        fn = getattr(data.get("dispatcher"), "py_func", None)
        name = (f"{fn.__module__}.{fn.__qualname__}" if fn is not None
                else repr(data.get("dispatcher")))
        with lock:
            records.append({
                "kernel": name,
                "signature": "(" + ", ".join(str(a) for a in data.get("args", ())) + ")",
                "seconds": round(dt, 3),
                "self_seconds": round(dt - nested, 3),
                "cpu_seconds": round(dc, 3),
                "self_cpu_seconds": round(dc - cnested, 3),
                "top": not st,
            })

ev.register("numba:compile", Recorder())

from cosmo_dask import demo
want = set(sys.argv[2:])
stages = [s for s in demo.STAGES if not want or s.__name__.removeprefix("stage_") in want]
needed = {"halos", "density", "pse"} & {s.__name__.removeprefix("stage_") for s in stages}
if needed and "simulate" not in want:  # the analysis stages need the evolved box
    stages = [s for s in demo.STAGES if s.__name__ in ("stage_generate", "stage_simulate")
              and s not in stages] + stages
demo.STAGES[:] = stages
t0 = time.perf_counter()
demo.run_demo(n_side=int(sys.argv[1]), say=lambda s: print(s, file=sys.stderr))
wall = time.perf_counter() - t0
hits = 0
from numba.core.registry import CPUDispatcher
import gc
for obj in gc.get_objects():
    try:
        if isinstance(obj, CPUDispatcher):
            hits += sum(obj.stats.cache_hits.values())
    except Exception:
        pass
print(json.dumps({"records": records, "wall": wall, "cache_hits": hits,
                  "numba": numba.__version__}))
"""


def run_child(n_side: int, stages: list[str], cache_dir: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE.parent), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(n_side), *stages], env=env,
                         check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def report(res: dict, run: str, n_side: int, stages: list[str], top: int) -> list[dict]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    common = {"date": stamp, "commit": _commit(), "run": run, "n_side": n_side,
              "load": round(os.getloadavg()[0], 2)}
    rows = sorted(res["records"], key=lambda r: -r["seconds"])
    out = [dict(common, **r) for r in rows]
    for r in out[:top] if top else out:
        print(json.dumps(r))
    tops = [r for r in rows if r["top"]]
    summary = dict(common, summary=True, stages=stages or "all",
                   compile_seconds=round(sum(r["seconds"] for r in tops), 2),
                   compile_cpu_seconds=round(sum(r["cpu_seconds"] for r in tops), 2),
                   n_compiles=len(rows), n_top_level=len(tops),
                   stages_wall_seconds=round(res["wall"], 2), cache_hits=res["cache_hits"],
                   numba=res["numba"])
    print(json.dumps(summary))
    return [*out, summary]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-side", type=int, default=64, help="the demo's particles per side")
    ap.add_argument("--stages", nargs="*", default=[],
                    help="demo stages to run (names without 'stage_'; default all)")
    ap.add_argument("--warm", action="store_true", help="also a second run on the same cache")
    ap.add_argument("--top", type=int, default=0, help="print only the N biggest (0: all)")
    ap.add_argument("--no-append", action="store_true", help="do not append to compile.jsonl")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache:
        rows += report(run_child(args.n_side, args.stages, cache), "cold", args.n_side,
                       args.stages, args.top)
        if args.warm:
            rows += report(run_child(args.n_side, args.stages, cache), "warm", args.n_side,
                           args.stages, args.top)
    if not args.no_append:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with RESULTS.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
