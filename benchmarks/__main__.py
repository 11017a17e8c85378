"""Run one benchmark workload: ``python -m benchmarks WORKLOAD [options]``.

``python -m benchmarks --list`` lists the workloads, one line each;
``python -m benchmarks WORKLOAD --help`` shows a workload's options (the common ones:
``--device cpu|gpu``, ``--repeat``, ``--warmup``, ``--out DIR``, ``--label``).
Each measurement is a JSON line on stdout, appended to ``DIR/<workload>.jsonl``
(default ``benchmarks/results/``); a table of the rows follows on stderr.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

#: workload name -> module (grouped by capability); one ``main(argv)`` each
WORKLOADS = {
    "capabilities": "benchmarks.capabilities",
    # halos
    "halos": "benchmarks.halos.fof",
    "mbp": "benchmarks.halos.mbp",
    "fof-profile-gpu": "benchmarks.halos.fof_profile_gpu",
    "hod": "benchmarks.halos.hod",
    "merger-tree": "benchmarks.halos.merger_tree",
    "subhalos": "benchmarks.halos.subhalos",
    # gravity
    "gravity": "benchmarks.gravity.parts",
    "gravity-direct": "benchmarks.gravity.direct",
    "gravity-tree-cpu": "benchmarks.gravity.tree_cpu",
    "gravity-tree-gpu": "benchmarks.gravity.tree_gpu",
    "gravity-treepm": "benchmarks.gravity.treepm",
    "treepm-walk": "benchmarks.gravity.treepm_walk",
    "mesh-scale": "benchmarks.gravity.mesh_scale",
    "domains-profile-gpu": "benchmarks.gravity.domains_profile_gpu",
    "pm-profile-gpu": "benchmarks.gravity.pm_profile_gpu",
    # analysis
    "xi": "benchmarks.analysis.xi",
    # density
    "pse": "benchmarks.density.pse",
    "pse-phases": "benchmarks.density.pse_phases",
    "power": "benchmarks.density.power",
    "tet-deposit": "benchmarks.density.tet_deposit",
    # analysis
    "rsd": "benchmarks.analysis.rsd",
    "bispectrum": "benchmarks.analysis.bispectrum",
    # expansion
    "expansion": "benchmarks.expansion.scf",
    # simulation
    "simulation": "benchmarks.simulation.step",
    "simulation-peer": "benchmarks.simulation.peer",
    "simulation-checks": "benchmarks.simulation.checks",
    "simulation-boost": "benchmarks.simulation.boost",
    "simulation-halos": "benchmarks.simulation.halos",
    "simulation-treepm": "benchmarks.simulation.treepm",
    "simulation-domains": "benchmarks.simulation.domains",
    "lightcone": "benchmarks.simulation.lightcone",
    "ics": "benchmarks.simulation.ics",
    # io
    "io": "benchmarks.io.store",
    "pipeline": "benchmarks.io.pipeline",
    "info-phases": "benchmarks.io.info_phases",
    # runtime
    "graphs": "benchmarks.runtime.graphs",
    "graph-paths": "benchmarks.runtime.graph_paths",
    "dispatch": "benchmarks.runtime.dispatch",
    "faults": "benchmarks.runtime.faults",
    "memory-limit": "benchmarks.runtime.memory_limit",
    "worker-restart": "benchmarks.runtime.worker_restart",
    "verify": "benchmarks.runtime.verify",
    "compile": "benchmarks.runtime.compile",
    "scaling": "benchmarks.runtime.scaling",
    "task-stream": "benchmarks.runtime.task_stream",
    "one-gpu": "benchmarks.runtime.one_gpu",
}

ROOT = Path(__file__).resolve().parents[1]


def summary(name: str) -> str:
    """The first line of a workload module's docstring (read, not imported)."""
    path = ROOT.joinpath(*WORKLOADS[name].split(".")).with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def resolve(name: str) -> str:
    """The workload's registered name (``_`` and ``-`` alike, the old ``bench_`` prefix
    dropped); exits with the valid names otherwise."""
    key = name.removeprefix("bench_").removesuffix(".py").replace("_", "-")
    if key not in WORKLOADS:
        sys.exit(f"benchmarks: no workload {name!r}; valid: {', '.join(WORKLOADS)} "
                 "(python -m benchmarks --list)")
    return key


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv[0] == "--list":
        width = max(map(len, WORKLOADS))
        for name, module in WORKLOADS.items():
            group = module.split(".")[1] if module.count(".") > 1 else ""
            print(f"{name:<{width}}  {group:<10}  {summary(name)}")
        return 0
    name = resolve(argv[0])
    mod = importlib.import_module(WORKLOADS[name])
    sys.argv = [f"python -m benchmarks {name}", *argv[1:]]
    rc = mod.main(argv[1:])
    from benchmarks import common

    if common.CONFIG is not None and common.CONFIG.rows:
        print(common.table(common.CONFIG.rows), file=sys.stderr)
        if common.CONFIG.out is not None:
            print(f"appended to {common.CONFIG.out}/", file=sys.stderr)
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
