"""Lazy public names of a subpackage (PEP 562), so that importing its light modules (the
``parameters`` modules the CLI's parser reads) loads neither numba nor the kernels."""

from __future__ import annotations

import importlib
import sys
import types

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: dict[str, str]) -> None:
    """Make ``package``'s public names (``exports``: name -> the submodule defining it)
    load on first use.

    A public name that is also a submodule's name (``halos.fof``, ``density.paint``)
    keeps naming the public object when the submodule is imported (the import system sets
    a loaded submodule as an attribute of its package), as an eager ``from .x import x``
    would.
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

    class LazyPackage(types.ModuleType):
        def __setattr__(self, name, value):
            if (name in exports and isinstance(value, types.ModuleType)
                    and value.__name__ == f"{package}.{name}"):
                return
            super().__setattr__(name, value)

    module.__getattr__ = __getattr__
    module.__dir__ = __dir__
    module.__class__ = LazyPackage
