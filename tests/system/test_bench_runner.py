"""``python -m benchmarks``: the workload list, and one tiny workload end to end on the CPU
writing its JSON lines (the environment record first) to ``--out``."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_list_names_every_workload_module():
    sys.path.append(str(ROOT))
    from benchmarks.__main__ import WORKLOADS

    out = _run("--list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == list(WORKLOADS)
    assert all(len(ln.split()) > 2 for ln in lines)  # each with its one-line description
    for module in WORKLOADS.values():  # every registered module exists
        assert ROOT.joinpath(*module.split(".")).with_suffix(".py").is_file(), module
    # every workload module under benchmarks/ is registered, and every registered one but
    # the gravity dispatcher starts common's Config (helper modules start none)
    registered = {ROOT.joinpath(*m.split(".")).with_suffix(".py") for m in WORKLOADS.values()}
    for path in sorted((ROOT / "benchmarks").glob("*/*.py")) + [ROOT / "benchmarks" /
                                                               "capabilities.py"]:
        starts = re.search(r"\bstart\(\w+", path.read_text()) is not None
        assert starts == (path in registered and path.name != "parts.py"), path


def test_unknown_workload_names_the_valid_ones():
    out = _run("no-such-workload")
    assert out.returncode != 0
    assert "no workload 'no-such-workload'" in out.stderr and "capabilities" in out.stderr


def test_tiny_io_workload_writes_json_lines_with_the_common_fields(tmp_path):
    out = _run("io", "--log2n", "8", "--repeat", "1", "--label", "tiny", "--out",
               str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(ln) for ln in (tmp_path / "io.jsonl").read_text().splitlines()]
    printed = [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert rows == printed and len(rows) == 5  # 4 timings and a summary
    for row in rows:
        for key in ("bench", "device", "label", "host", "cpus", "date", "commit"):
            assert key in row, (key, row)
        assert row["bench"] == "io" and row["device"] == "cpu" and row["label"] == "tiny"
    assert {r["workload"] for r in rows[:4]} == {"write_zarr", "write_npy", "read_zarr",
                                                "read_npy"}
    assert all(r["n_particles"] == 256 for r in rows)
    assert "workload" in out.stderr  # the table


def test_one_gpu_rows_have_the_issue_format_on_the_cpu(tmp_path):
    """``one-gpu --device cpu --small``: a row ``{workload, n, device, date, kernel_s,
    end_to_end_s}`` per workload with its stage split (here SCF only, to stay cheap)."""
    out = _run("one-gpu", "--device", "cpu", "--small", "--only", "scf", "--no-p2p",
               "--repeat", "1", "--warmup", "1", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = [json.loads(ln) for ln in (tmp_path / "one_gpu.jsonl").read_text().splitlines()]
    assert row["workload"] == "scf" and row["n"] == 1024 and row["device"] == "cpu"
    assert row["kernel_s"] > 0 and row["end_to_end_s"] > 0 and row["date"]
    assert row["rounds"] == 2  # the fit's one pass, then the forces
    assert row["scheduler_s"] + row["outside_scheduler_s"] == pytest.approx(
        row["end_to_end_s"])
