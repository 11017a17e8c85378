"""The gravity benchmark of issue 4, parts (a)-(d), one workload per part.

    python -m benchmarks gravity direct   [args]  # (a) GPU direct P2P pairs/s
    python -m benchmarks gravity tree-cpu [args]  # (b) CPU tree vs pytreegrav, N=1e5
    python -m benchmarks gravity tree-gpu [args]  # (c) GPU tree, N=2^23 Hernquist
    python -m benchmarks gravity treepm   [args]  # (d) TreePM, 128^3 Zel'dovich vs Ewald

The same as ``python -m benchmarks gravity-direct`` (and so on): the remaining arguments
go to that part's workload (``--help`` there). Figures: ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

PARTS = {"direct": "benchmarks.gravity.direct", "tree-cpu": "benchmarks.gravity.tree_cpu",
         "tree-gpu": "benchmarks.gravity.tree_gpu", "treepm": "benchmarks.gravity.treepm"}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in PARTS:
        sys.exit(f"usage: python -m benchmarks gravity {{{'|'.join(PARTS)}}} "
                 "[options of that part]")
    return importlib.import_module(PARTS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    main()
