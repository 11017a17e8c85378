"""benchmarks/runtime/graphs.py (``python -m benchmarks graphs``) at n_side = 64: every
graph is built (never run) and counted."""

import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    return importlib.import_module("benchmarks.runtime.graphs")


def test_bench_graphs_small(tmp_path):
    out = tmp_path / "graphs.jsonl"
    rows = _bench().main(["--n-side", "64", "--out", str(tmp_path)])
    assert [r["graph"] for r in rows] == ["fof", "tree", "treepm", "treepm-max", "pk",
                                          "pk-max", "ics1", "ics2"]
    assert [json.loads(line)["graph"] for line in out.read_text().splitlines()] == \
        [r["graph"] for r in rows]
    for row in rows:
        assert "error" not in row, row
        assert row["tasks"] > 0 and row["layers"] > 0, row
        assert row["max_task_input_bytes"] >= 0 and row["scheduler_mem_bytes"] >= 0
    by = {r["graph"]: r for r in rows}
    # the eager steps are intercepted and recorded, never run
    assert [e["call"] for e in by["fof"]["eager_computes"]] == ["persist", "compute"]
    assert by["fof"]["tasks"] > by["fof"]["tasks_domain_stage"] > 0
    assert by["tree"]["eager_computes"] and by["tree"]["eager_computes"][0]["tasks"] > 0
    assert by["ics2"]["eager_computes"] == []
