"""The package's structure rules (issue 15, "one way to do each thing"; issue 35, "layers
in folders"), checked on the source: a capability package uses another package only
through its public names, the package imports form no cycles between capability packages
at module level, and no import points up a layer (core, units, plot, store, the
capabilities, cli)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "cosmo_dask"


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, parts


def _relative_imports(path: Path, parts: tuple[str, ...]):
    """(line, target module parts, imported names, at module level) of every
    ``from .x import y`` in ``path``."""
    tree = ast.parse(path.read_text())
    package = parts if path.name == "__init__.py" else parts[:-1]
    top_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = base + (tuple(node.module.split(".")) if node.module else ())
            yield node.lineno, target, [a.name for a in node.names], id(node) in top_level


def _subpackage(parts: tuple[str, ...]) -> str:
    """``cosmo_dask.gravity.api`` -> ``gravity``; top-level modules -> their own name."""
    return parts[1] if len(parts) > 1 else ""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_names_across_packages():
    """``from ..density.paint import _helper`` or ``from ..models._lpt import x`` in
    another package couples it to internals; such a helper becomes public (or moves to
    the shared module that owns it)."""
    found = []
    for path, parts in _modules():
        for line, target, names, _ in _relative_imports(path, parts):
            if _subpackage(target) == _subpackage(parts):
                continue
            private_module = any(_private(p) for p in target[1:])
            private_names = [n for n in names if _private(n)]
            if private_module or private_names:
                found.append(f"{path.relative_to(ROOT.parent)}:{line}: "
                             f"{'.'.join(target)} {private_names or ''}")
    assert not found, "private imports across packages:\n" + "\n".join(found)


def test_no_import_cycles_between_packages_at_module_level():
    """Module-level imports between capability packages form a DAG (imports inside
    functions, which load lazily, are not counted)."""
    edges: dict[str, set[str]] = {}
    for path, parts in _modules():
        src = _subpackage(parts)
        if len(parts) < 3:  # top-level modules (snapshot, cli, ...) are the shared base
            continue
        for _, target, _, top in _relative_imports(path, parts):
            dst = _subpackage(target)
            if top and len(target) > 2 and dst and dst != src:
                edges.setdefault(src, set()).add(dst)

    def cycle_from(node, stack, seen):
        for nxt in sorted(edges.get(node, ())):
            if nxt in stack:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in seen:
                seen.add(nxt)
                found = cycle_from(nxt, stack + [nxt], seen)
                if found:
                    return found
        return None

    for start in sorted(edges):
        cycle = cycle_from(start, [start], {start})
        assert cycle is None, f"package import cycle: {' -> '.join(cycle)}"


# --------------------------------------------------------------------------- one graph idiom
#: The one module that builds graphs by hand (issue 15: one graph idiom).
GRAPH_MODULE = "cosmo_dask/core/task_graph.py"
#: issue 15: being converted to map_blocks/blockwise or TaskGraph; empty this list as
#: they are (the test fails on an entry that has no site left).
NOT_YET_CONVERTED: set[str] = set()
_GRAPH_MODULES = ("dask.delayed", "dask.highlevelgraph", "dask._task_spec", "dask.core")
_GRAPH_NAMES = {"delayed", "highlevelgraph", "_task_spec", "core", "Delayed", "HighLevelGraph",
                "MaterializedLayer", "Task", "TaskRef"}


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def graph_sites(source: str) -> list[tuple[int, str]]:
    """(line, what) of every hand-built graph in ``source``: imports of ``dask.delayed``,
    ``dask.highlevelgraph``, ``dask._task_spec`` or ``dask.core`` (or their names),
    ``dask.delayed(...)``-style attribute use, ``HighLevelGraph``, and the arrays'
    ``to_delayed`` / ``from_delayed``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if a.name.startswith(_GRAPH_MODULES)]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.startswith(_GRAPH_MODULES) or (
                    node.module.split(".")[0] == "dask"
                    and any(a.name in _GRAPH_NAMES for a in node.names)):
                found.append((node.lineno, f"from {node.module} import "
                              + ", ".join(a.name for a in node.names)))
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if node.attr in ("to_delayed", "from_delayed") or dotted.startswith(
                    tuple(m + "." for m in _GRAPH_MODULES)) or dotted in _GRAPH_MODULES:
                found.append((node.lineno, dotted or node.attr))
        elif isinstance(node, ast.Name) and node.id == "HighLevelGraph":
            found.append((node.lineno, node.id))
    return sorted(set(found))


def test_graph_sites_are_found():
    """The checker below sees each way of writing a graph by hand, and not the idioms."""
    hand_built = ["import dask\nx = dask.delayed(f)(1)",
                  "from dask import delayed",
                  "from dask.delayed import Delayed",
                  "import dask.highlevelgraph",
                  "from dask.highlevelgraph import HighLevelGraph",
                  "from dask._task_spec import TaskRef",
                  "y = arr.to_delayed()",
                  "import dask.array as da\nz = da.from_delayed(v, (3,), float)",
                  "g = HighLevelGraph({}, {})"]
    for source in hand_built:
        assert graph_sites(source), source
    idioms = ["import dask.array as da\nx = da.map_blocks(f, a, meta=m)",
              "from dask.base import tokenize",
              "from ..task_graph import TaskGraph\nd = TaskGraph().delayed(k)",
              "import dask\ndask.compute(x)"]
    for source in idioms:
        assert not graph_sites(source), source


def test_one_graph_idiom():
    """Issue 15: chunk-wise work is map_blocks/blockwise; placed or multi-output tasks go
    through :class:`cosmo_dask.core.task_graph.TaskGraph`, the only module that touches dask's
    graph internals. No ``dask.delayed`` and no hand-written ``HighLevelGraph`` elsewhere."""
    found = []
    for path, _ in _modules():
        rel = path.relative_to(ROOT.parent).as_posix()
        if rel != GRAPH_MODULE and rel not in NOT_YET_CONVERTED:
            found += [f"{rel}:{line}: {what}" for line, what in graph_sites(path.read_text())]
    stale = sorted(rel for rel in NOT_YET_CONVERTED if not (ROOT.parent / rel).is_file()
                   or not graph_sites((ROOT.parent / rel).read_text()))
    assert not found, ("hand-built graphs outside cosmo_dask/core/task_graph.py (use map_blocks/"
                       "blockwise or TaskGraph):\n" + "\n".join(found))
    assert not stale, ("converted, so remove from NOT_YET_CONVERTED: " + ", ".join(stale))


# --------------------------------------------------------------------------- one kernel contract
def _module_imports():
    """{module: set of cosmo_dask modules it imports}, every import counted (those inside
    functions too); ``from .pkg import name`` counts the submodule ``pkg.name`` when
    there is one, else the package's ``__init__``."""
    modules = {".".join(parts): path for path, parts in _modules()}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for path, parts in _modules():
        me = ".".join(parts)
        for _, target, names, _ in _relative_imports(path, parts):
            base = ".".join(target)
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]
            for dst in subs or ([base] if base in modules else []):
                if dst != me:
                    edges[me].add(dst)
    return edges


def test_no_import_cycles_between_modules():
    """Issue 15: no import cycles at all, counting imports inside functions (a CPU kernel
    module that imports its GPU twin, which imports it back, is one). A package's
    ``__init__`` is left out as a target: it only re-exports."""
    edges = _module_imports()
    inits = {".".join(parts) for path, parts in _modules() if path.name == "__init__.py"}
    graph = {m: {d for d in ds if d not in inits} for m, ds in edges.items() if m not in inits}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_gpu_modules_are_reached_through_dispatch():
    """Issue 15: a capability chooses its kernel by the chunk's type through its
    ``dispatch`` module (:class:`cosmo_dask.core.dispatch.KernelDispatch`); only a dispatch
    module or another GPU module imports a ``*_gpu`` module."""
    found = []
    for me, targets in _module_imports().items():
        if me.endswith((".dispatch", "_gpu")):
            continue
        found += [f"{me} imports {t}" for t in sorted(targets) if t.endswith("_gpu")]
    assert not found, "GPU modules imported outside dispatch modules:\n" + "\n".join(found)


def test_gpu_kernels_follow_one_naming_rule():
    """A contract's GPU kernel lives in a ``*_gpu`` module of the CPU kernel's package and
    is named after the CPU kernel (less a ``_numpy``/``_cpu`` suffix) plus ``_gpu``."""
    import importlib
    import pkgutil

    import numpy as np

    import cosmo_dask
    from cosmo_dask.core.dispatch import _CONTRACTS

    for info in pkgutil.walk_packages(cosmo_dask.__path__, "cosmo_dask."):
        if info.name.endswith(".dispatch"):
            importlib.import_module(info.name)
    wrong = []
    for contract in _CONTRACTS.values():
        if contract.gpu_spec is None or not contract.home.startswith("cosmo_dask."):
            continue
        cpu = contract.dispatch(np.ndarray)
        module, _, name = contract.gpu_spec.partition(":")
        stem = cpu.__name__.removesuffix("_numpy").removesuffix("_cpu")
        if (not module.endswith("_gpu") or name != stem + "_gpu"
                or module.rpartition(".")[0] != cpu.__module__.rpartition(".")[0]):
            wrong.append(f"{contract.__name__}: {cpu.__module__}.{cpu.__name__} -> "
                         f"{contract.gpu_spec}")
    assert not wrong, "GPU kernels named outside the rule:\n" + "\n".join(wrong)


def test_test_modules_share_helpers_only_through_tests_support():
    """tests/ mirrors the package; a helper two test modules need lives in tests/support/,
    so no test module (nor conftest.py) imports another test module."""
    tests = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.ImportFrom):
                names = ["." * node.level + (node.module or "")]
            else:
                continue
            for name in names:
                parts = name.split(".")
                inside = parts[0] == "tests" or name.startswith(".")
                if (parts[0].startswith(("test_", "conftest")) or name.startswith(".")
                        or (inside and (len(parts) < 2 or parts[1] != "support"))
                        or (inside and any(p.startswith("test_") for p in parts))):
                    found.append(f"{path.relative_to(tests.parent)}:{node.lineno}: {name}")
    assert not found, "test modules import other test modules:\n" + "\n".join(found)


# --------------------------------------------------------------------------- layers
#: The layers, lowest first: a module imports only from its own layer or lower ones. The
#: package root (``cosmo_dask/__init__.py``, ``__main__.py``) sits above them all.
LAYERS = (
    ("core", ("core", "cuda")),
    ("units", ("units",)),
    ("plot", ("plot",)),
    ("store", ("store",)),
    ("capabilities", ("models", "spatial", "io", "gravity", "expansion", "density", "halos",
                      "analysis", "simulation")),
    ("cli", ("cli",)),
)
_ROOT_LAYER = len(LAYERS)


def layer_of(parts: tuple[str, ...]) -> int:
    """The layer (index into :data:`LAYERS`) of module ``parts`` (``("cosmo_dask",
    "store", "atomic")``); the package root and its ``__main__`` are above every layer."""
    if len(parts) < 2 or parts[1] == "__main__":
        return _ROOT_LAYER
    for i, (_, packages) in enumerate(LAYERS):
        if parts[1] in packages:
            return i
    raise AssertionError(f"{'.'.join(parts)}: in no layer; add its package to LAYERS")


def _imports(path: Path, parts: tuple[str, ...]):
    """(line, imported module parts) of every import of the package in ``path``, at module
    level and inside functions, relative (``from ..store import x``) or absolute
    (``import cosmo_dask.core.backend``)."""
    tree = ast.parse(path.read_text())
    package = parts if path.name == "__init__.py" else parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = base + (tuple(node.module.split(".")) if node.module else ())
            elif node.module and node.module.split(".")[0] == "cosmo_dask":
                target = tuple(node.module.split("."))
            else:
                continue
            if len(target) == 1:  # from cosmo_dask import x / from .. import x
                for a in node.names:
                    yield node.lineno, target + (a.name,)
            else:
                yield node.lineno, target
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "cosmo_dask":
                    yield node.lineno, tuple(a.name.split("."))


def upward_imports(path: Path, parts: tuple[str, ...]) -> list[str]:
    """One line per import of ``path`` that points to a higher layer."""
    me = layer_of(parts)
    found = []
    for line, target in _imports(path, parts):
        if len(target) > 1 and target[1] == "__version__" or target == ("cosmo_dask",):
            there = _ROOT_LAYER
        else:
            there = layer_of(target)
        if there > me:
            name = lambda i: LAYERS[i][0] if i < _ROOT_LAYER else "package root"  # noqa: E731
            found.append(f"{'/'.join(parts)}.py:{line}: imports "
                         f"{'.'.join(target)} (layer {there}, {name(there)}) from layer "
                         f"{me} ({name(me)})")
    return found


def test_no_import_points_up_a_layer():
    """Issue 35: the layers in folders, lowest first: core (and cuda), units, plot, store,
    the capabilities, cli; no module imports from a higher layer, counting imports inside
    functions."""
    found = []
    for path, parts in _modules():
        found += upward_imports(path, parts)
    assert not found, "imports pointing up a layer:\n" + "\n".join(found)


def test_layer_rule_finds_an_upward_import(tmp_path):
    """The rule reads relative, absolute and function-level imports."""
    for source in ("from ..store.atomic import local_path",
                   "def f():\n    from ..cli import main",
                   "import cosmo_dask.halos.api",
                   "from cosmo_dask import plot"):
        path = tmp_path / "cosmo_dask" / "core" / "x.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source + "\n")
        found = upward_imports(path, ("cosmo_dask", "core", "x"))
        assert len(found) == 1 and "from layer 0 (core)" in found[0], (source, found)
    path.write_text("from .errors import ParameterError\nfrom ..cuda import module\n")
    assert upward_imports(path, ("cosmo_dask", "core", "x")) == []


#: what the package's sources may not hold: an issue number, a date, a GPU model name
#: (measurements and dated notes live in benchmarks/RESULTS.md and docs/, issue numbers
#: in the tracker)
_UNDATED = re.compile(r"[Ii]ssue #?[0-9]|\b20[0-9][0-9]-[0-9][0-9]-[0-9][0-9]\b|"
                      r"\b(H100|H200|A100)\b")


def test_package_sources_hold_no_issue_numbers_dates_or_gpu_models():
    """Docstrings and comments of cosmo_dask/ (``*.py``, ``*.cu``, ``*.cuh``) say what they
    mean in their own words: no "issue N", no dated note, no GPU model (a timing belongs
    in benchmarks/RESULTS.md)."""
    found = []
    for path in sorted(p for ext in ("*.py", "*.cu", "*.cuh") for p in ROOT.rglob(ext)):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if _UNDATED.search(line):
                found.append(f"{path.relative_to(ROOT.parent)}:{i}: {line.strip()}")
    assert not found, "issue numbers, dates or GPU models in the package:\n" + "\n".join(found)


def test_tests_mirror_the_package():
    """Every test module sits in a folder named after a package of cosmo_dask (tests/halos/,
    tests/gravity/tree/, ...) or in tests/system/ or tests/support/, none at the top."""
    tests = Path(__file__).resolve().parents[1]
    misplaced = []
    for path in sorted(tests.rglob("test_*.py")):
        folder = path.parent.relative_to(tests)
        if folder.parts[:1] in (("system",), ("support",)):
            continue
        if not folder.parts or not (ROOT / folder).is_dir():
            misplaced.append(str(path.relative_to(tests.parent)))
    assert not misplaced, "test modules outside the package's mirror: " + ", ".join(misplaced)
