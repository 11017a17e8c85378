"""Every code block of README.md runs as written (the two commands .ci/run runs excepted).

Python blocks run in order in one interpreter through ``python -c`` (later
blocks use names of earlier ones, as when a reader pastes them into one
interactive session; like an interactive session, and unlike a script file,
``-c`` code is not re-run by the worker processes a local cluster spawns);
bash blocks run line by line in the same directory, each line a fresh process, all
on one local cluster (``COSMO_DASK_SCHEDULER``).
The one file the README names but cannot make, a Gadget snapshot
``snap_010.hdf5``, is written here first.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.gadget import make_parts, write_gadget_file

README = Path(__file__).resolve().parents[2] / "README.md"
#: blocks that .ci/run itself runs, each in a fresh virtual environment
CI_MARKERS = ("<!-- demo-command -->", "<!-- test-command -->")

pytestmark = pytest.mark.slow


def readme_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block, without the blocks .ci/run runs."""
    lines = README.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while not lines[j].startswith("```"):
            j += 1
        previous = next((s for s in reversed(lines[:i]) if s.strip()), "")
        if previous.strip() not in CI_MARKERS:
            blocks.append((m.group(1), "\n".join(lines[i + 1:j])))
        i = j + 1
    return blocks


def test_readme_blocks_are_found():
    kinds = [lang for lang, _ in readme_blocks()]
    assert kinds.count("python") >= 4 and kinds.count("bash") >= 1
    assert all(k in ("python", "bash", "") for k in kinds)  # "" = printed output


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A directory with the README's Gadget file and `cosmo-dask` on PATH."""
    rng = np.random.default_rng(10)
    write_gadget_file(tmp_path / "snap_010.hdf5", {1: make_parts(rng, 20_000)},
                      mass_table=[0, 1.0, 0, 0, 0, 0])
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "cosmo-dask").exists():  # not pip-installed: a shim to `python -m`
        shim = tmp_path / "bin" / "cosmo-dask"
        shim.parent.mkdir()
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cosmo_dask "$@"\n')
        shim.chmod(0o755)
        bin_dir = shim.parent
    repo = str(README.parent)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p),
               MPLBACKEND="Agg")
    return tmp_path, env


def test_python_blocks_run_in_order(workdir):
    tmp, env = workdir
    script = "\n\n".join(code for lang, code in readme_blocks() if lang == "python")
    script += "\n\nprint('HALOS', halos.n_halos)\n"
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    n_halos = int(re.search(r"^HALOS (\d+)$", out.stdout, re.M).group(1))
    assert 200 <= n_halos <= 400  # the block's comment says ~400 halos
    assert (tmp / "ics.zarr" / "zarr.json").exists() and (tmp / "halos.zarr").exists()
    assert "Traceback" not in out.stderr


@pytest.mark.timeout(900)  # some twenty CLI runs, each a fresh process
def test_bash_blocks_run_line_by_line(workdir):
    """Each line in a fresh process, all on one local cluster named by
    ``COSMO_DASK_SCHEDULER`` (README, "Clusters"): a cluster per line cost its start and
    its workers' imports and kernel loads, about 5 s a line on 2 cores. A command starting
    its own cluster is tested in test_cli.py (the acceptance commands, as subprocesses)."""
    import cosmo_dask

    tmp, env = workdir
    printed = {}
    with cosmo_dask.connect(quiet=True) as cluster_client:  # what a command would start
        env = dict(env, COSMO_DASK_SCHEDULER=cluster_client.scheduler.address)
        for lang, code in readme_blocks():
            if lang != "bash":
                continue
            for line in code.splitlines():
                command = line.split(" #")[0].strip()
                if not command:
                    continue
                out = subprocess.run(["bash", "-c", command], cwd=tmp, env=env,
                                     capture_output=True, text=True, timeout=600)
                assert out.returncode == 0, (
                    f"{command}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
                assert "Traceback" not in out.stderr, command
                printed[command.split()[1]] = out.stdout
    for product in ("mf.png", "slice.png", "pse.png", "pk.png"):
        assert (tmp / product).stat().st_size > 10_000, product  # a real figure
    n_halos = int(re.search(r"^(\d+) halos", printed["halos"], re.M).group(1))
    assert 200 <= n_halos <= 400
    assert "valid" in printed["info"]
