"""The notebooks in notebooks/: stored without outputs, and each runs top to bottom.

The execution tests (``slow``) run every notebook with nbclient in a fresh
kernel whose working directory is a temporary directory, within a time budget
per notebook, and fail with the failing cell's source and traceback. Notebooks
start a LocalCluster with worker processes: the kernel is shut down at the end
and every process it started must be gone (left-overs are killed and reported).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))

#: seconds per notebook, kernel start included: each runs in under a minute on 2
#: warm cores; the rest is for cold numba caches (first run after an install)
BUDGET_S = 240
#: seconds to close a Dask client left open by a failed notebook
CLEANUP_S = 60
#: seconds the kernel's child processes get to exit after the kernel has
EXIT_GRACE_S = 30

CLOSE_CLIENT = """
try:
    client.close()
except NameError:
    pass
"""


def _ids(path: Path) -> str:
    return path.stem


def test_every_notebook_is_found():
    names = {p.name for p in NOTEBOOKS}
    expected = {"01_quick_start.ipynb", "02_gadget_to_halos.ipynb",
                "03_power_and_density.ipynb", "04_gravity_and_expansions.ipynb",
                "05_clustering.ipynb", "06_structure.ipynb"}
    assert expected <= names, sorted(expected - names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_is_stored_without_outputs(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert nb.get("nbformat") == 4
    dirty = [
        i for i, cell in enumerate(nb["cells"])
        if cell["cell_type"] == "code"
        and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]
    assert not dirty, (
        f"{path.name}: code cells {dirty} carry outputs or execution counts; clear them "
        "(jupyter nbconvert --clear-output --inplace notebooks/*.ipynb)"
    )
    # every notebook has its one cluster line and closes its client
    sources = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert any("SCHEDULER = None" in s and "cosmo_dask.connect(SCHEDULER)" in s
               for s in sources), f"{path.name}: no 'SCHEDULER = None' cluster line"
    assert "client.close()" in sources[-1], f"{path.name}: the last cell must close the client"


# ----------------------------------------------------------------------------- execution
def _descendants() -> dict:
    import psutil

    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


def _plain(exc: BaseException) -> str:
    """The exception's text without the terminal colour codes of IPython tracebacks."""
    return re.sub(r"\x1b\[[0-9;]*m", "", str(exc))


def run_notebook(path: Path, workdir: Path, budget: float = BUDGET_S) -> float:
    """Execute ``path`` in a new kernel working in ``workdir``; returns the seconds taken.

    Fails the test with the first failing cell's error, when the budget runs
    out, or when processes started by the kernel outlive it.
    """
    import nbformat
    import psutil
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError
    from nbclient.util import ensure_async, run_sync

    nb = nbformat.read(path, as_version=4)
    executor = NotebookClient(nb, timeout=int(budget), kernel_name="python3",
                              resources={"metadata": {"path": str(workdir)}})
    env = {k: v for k, v in os.environ.items() if k != "COSMO_DASK_SCHEDULER"}
    before = set(_descendants())
    started: dict = {}
    failure = None
    t0 = time.monotonic()
    deadline = t0 + budget
    try:
        with executor.setup_kernel(env=env):
            try:
                for index, cell in enumerate(nb.cells):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        failure = (f"{path.name}: over its budget of {budget:g} s before "
                                   f"cell {index}")
                        break
                    executor.timeout = max(1, int(left))
                    try:
                        executor.execute_cell(cell, index)
                    except CellTimeoutError as exc:
                        failure = (f"{path.name}: cell {index} still running when the "
                                   f"budget of {budget:g} s ran out:\n{_plain(exc)}")
                        # interrupt it, so that the cleanup cell below can run
                        run_sync(ensure_async)(executor.km.interrupt_kernel())
                        break
                    except CellExecutionError as exc:
                        failure = f"{path.name}: cell {index} failed:\n{_plain(exc)}"
                        break
            finally:
                started = {pid: p for pid, p in _descendants().items() if pid not in before}
                if failure is not None:
                    # a notebook stopped early leaves its client (and local cluster) open
                    executor.timeout = CLEANUP_S
                    try:
                        executor.execute_cell(nbformat.v4.new_code_cell(CLOSE_CLIENT),
                                              len(nb.cells))
                    except Exception:  # noqa: BLE001 (the kill below is the fallback)
                        pass
        elapsed = time.monotonic() - t0
    finally:
        _, alive = psutil.wait_procs(list(started.values()), timeout=EXIT_GRACE_S)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    if alive:
        names = ", ".join(f"{p.pid}" for p in alive)
        pytest.fail(f"{path.name}: processes outlived the kernel by {EXIT_GRACE_S} s "
                    f"(killed): {names}", pytrace=False)
    return elapsed


@pytest.mark.slow
@pytest.mark.timeout(BUDGET_S + CLEANUP_S + EXIT_GRACE_S + 60)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_runs(path, tmp_path):
    elapsed = run_notebook(path, tmp_path)
    print(f"{path.name}: {elapsed:.1f} s")
