"""The package's structure rules (issue 15, "one way to do each thing"), checked on the
source: a capability package uses another package only through its public names, and
the package imports form no cycles between capability packages at module level."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "cosmo_dask"


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
    """``from ..density.paint import _helper`` or ``from ..models._blocks import x`` in
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
