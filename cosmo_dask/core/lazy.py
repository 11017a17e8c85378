"""Lazy public names of a subpackage (PEP 562), so that importing its light modules (the
``parameters`` modules the CLI's parser reads) loads neither numba nor the kernels."""

from __future__ import annotations

import importlib
import sys

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: dict[str, str]) -> None:
    """Make ``package``'s public names (``exports``: name -> the submodule defining it)
    load on first use.

    No public name may be a submodule's name: importing the submodule would set it as the
    package's attribute in place of the public object (the modules behind ``halos.fof``,
    ``density.paint``, ``simulation.run``, ``halos.mass_function``,
    ``halos.spherical_overdensity`` and ``models.zeldovich`` are ``fof_graph``,
    ``painting``, ``runner``, ``mass_functions``, ``overdensity``, ``zeldovich_ics``).
    """
    module = sys.modules[package]

    def __getattr__(name: str):  # noqa: N807
        if name in exports:
            value = getattr(importlib.import_module(f".{exports[name]}", package), name)
            module.__dict__[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():  # noqa: N807
        return sorted(set(module.__dict__) | set(exports))

    module.__getattr__ = __getattr__
    module.__dir__ = __dir__
