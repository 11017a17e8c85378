"""The gravity benchmark of issue 4, parts (a)-(d), one script per part.

    python benchmarks/bench_gravity.py direct   [args]  # (a) GPU direct P2P pairs/s
    python benchmarks/bench_gravity.py tree-cpu [args]  # (b) CPU tree vs pytreegrav, N=1e5
    python benchmarks/bench_gravity.py tree-gpu [args]  # (c) GPU tree, N=2^23 Hernquist
    python benchmarks/bench_gravity.py treepm   [args]  # (d) TreePM, 128^3 Zel'dovich vs Ewald

Each part prints one JSON object per measurement; the remaining arguments go
to that part's script (``--help`` there). Figures: ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

PARTS = {"direct": "bench_gravity_direct.py", "tree-cpu": "bench_gravity_tree_cpu.py",
         "tree-gpu": "bench_gravity_tree_gpu.py", "treepm": "bench_gravity_treepm.py"}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in PARTS:
        sys.exit(f"usage: bench_gravity.py {{{'|'.join(PARTS)}}} [args of that part]")
    script = Path(__file__).with_name(PARTS[sys.argv[1]])
    sys.argv = [str(script)] + sys.argv[2:]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
