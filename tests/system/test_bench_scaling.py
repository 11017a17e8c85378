"""``python -m benchmarks scaling`` (benchmarks/runtime/scaling.py) runs on CPU workers at
tiny sizes (issue 20, item 3): every task on 2 workers equals its 1-worker result (FOF
exactly, the others to their stated tolerances) and each line carries the timing,
efficiency and bytes moved; the rows also go to ``<out>/scaling.jsonl`` with the fields
the scaling table reads (workload, n, gpus, kind, seconds, efficiency, device, date)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_scaling_script_on_two_cpu_workers(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "scaling", "--workers", "1", "2",
         "--n-side-strong", "16", "--n-side-weak", "12", "--mesh", "32", "--n-scf", "5000",
         "--dir", str(tmp_path), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    tasks = {"fof", "treepm", "pm", "power", "scf", "pse", "pm_step", "treepm_step"}
    assert {(r["task"], r["kind"], r["workers"]) for r in rows} == (
        {(t, "strong", w) for t in tasks for w in (1, 2)}
        | {(t, "weak", w) for t in tasks - {"scf"} for w in (1, 2)})
    for r in rows:
        assert r["equal_to_1_worker"], r
        assert r["seconds"] > 0 and r["efficiency"] > 0 and r["bytes_moved"] >= 0
    # the weak rows hold about n_weak^3 particles per worker
    weak2 = next(r for r in rows if r["kind"] == "weak" and r["workers"] == 2)
    assert weak2["n_side"] == 15
    saved = [json.loads(line) for line in (tmp_path / "out" / "scaling.jsonl").open()]
    saved = [r for r in saved if "workload" in r]
    assert len(saved) == len(rows)
    for r in saved:
        assert r["workload"] == r["task"] and r["n"] == r["n_particles"] and r["gpus"] == 0
        assert r["device"] == "cpu" and r["kind"] in ("strong", "weak") and r["date"]
    step = [r for r in saved if r["workload"] == "pm_step" and r["workers"] == 2]
    assert step and all(0 < r["seconds"] < 60 for r in step)
