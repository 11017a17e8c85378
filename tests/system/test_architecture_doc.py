"""docs/architecture.md is the package's map: it names every module and CUDA source and
stands alone (no link or path outside the repository)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "cosmo_dask"


def _modules() -> list[str]:
    """Every module and CUDA source, as a path relative to ``cosmo_dask/``."""
    found = []
    for pattern in ("*.py", "*.cu", "*.cuh"):
        found += [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob(pattern)]
    return sorted(found)


def test_every_module_is_named():
    text = DOC.read_text()
    root_files = {"__init__.py", "__main__.py"}  # named in the "Layers" paragraph
    missing = [m for m in _modules()
               if f"`{m}`" not in text and not (m in root_files and m in text)]
    assert not missing, "docs/architecture.md does not name: " + ", ".join(missing)


def test_no_module_named_that_does_not_exist():
    """A path in the map that no longer exists (a module renamed or moved) fails."""
    text = DOC.read_text()
    named = re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.(?:py|cu|cuh))`", text)
    package_dirs = {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    stale = [n for n in named if n.split("/")[0] in package_dirs
             and not (PACKAGE / n).exists() and not (ROOT / n).exists()]
    assert not stale, "docs/architecture.md names modules that do not exist: " + ", ".join(stale)


def test_stands_alone():
    text = DOC.read_text()
    outside = re.findall(r"\.\./[\w./-]+|https?://\S+", text)
    assert not outside, f"docs/architecture.md points outside the repository: {outside}"
    assert not re.search(r"\bissues? [0-9]+", text), "cite decisions in their own words"
