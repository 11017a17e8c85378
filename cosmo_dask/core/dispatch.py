"""One kernel contract per computation: the kernel is chosen by the type of the chunk it is
given, the way dask-image chooses a backend (``dask.utils.Dispatch`` keyed on the chunk's
type). The CPU kernel (NumPy/numba) is registered eagerly for ``numpy.ndarray``; the GPU
kernel (CuPy/CUDA) is named by its module and registered the first time a CuPy chunk
arrives, so CPU-only machines never import CuPy or the GPU modules.

Each capability keeps its contracts in its own ``dispatch`` module (``gravity.dispatch``,
``density.dispatch``, ...); callers use those objects and never import a ``*_gpu`` module
or test ``xp is not np`` to pick a kernel. A kernel module imports no API module, and a
CPU kernel module never imports its GPU twin (no import cycles).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from dask.utils import Dispatch

from .errors import DeviceError

__all__ = ["KernelDispatch"]

#: every contract made, by (module that made it, name)
_CONTRACTS: dict[tuple[str, str], KernelDispatch] = {}


def _contract(home: str, name: str) -> KernelDispatch:
    """The contract ``name`` made in module ``home`` (imported when it is not yet)."""
    if (home, name) not in _CONTRACTS:
        importlib.import_module(home)
    return _CONTRACTS[(home, name)]


class KernelDispatch(Dispatch):
    """A kernel contract: one signature, a CPU and (optionally) a GPU implementation.

    Parameters
    ----------
    name : str
        The contract's name, used in error messages.
    cpu : callable
        The implementation for ``numpy.ndarray`` chunks.
    gpu : str, optional
        ``"package.module:function"``, the implementation for ``cupy.ndarray`` chunks;
        imported on the first CuPy chunk. ``None``: the contract has no GPU kernel and a
        CuPy chunk raises :class:`~cosmo_dask.core.errors.DeviceError`.
    chunk_of : callable, optional
        For a kernel whose first argument is not an array (a column tuple, a domain
        tree): a named module-level function returning the array whose type chooses the
        kernel. ``None``: the first argument is the chunk.

    Calling the object dispatches on the type of its first argument's chunk
    (``kernel(chunk, ...)``, or ``kernel(column, ...)`` with ``chunk_of``).
    """

    def __init__(self, name: str, cpu: Callable, gpu: str | None = None,
                 chunk_of: Callable[[Any], Any] | None = None):
        super().__init__(name)
        self.gpu_spec = gpu
        self.chunk_of = chunk_of
        #: the module that made the contract (its ``dispatch`` module): a contract
        #: travels to workers by name (module, contract name), not by value
        self.home = sys._getframe(1).f_globals.get("__name__", "")
        _CONTRACTS[(self.home, name)] = self
        self.register(np.ndarray, cpu)
        if gpu is not None:
            self.register_lazy("cupy", self._register_gpu)

    def _register_gpu(self) -> None:
        import cupy

        self.register(cupy.ndarray, self.gpu_implementation())

    def gpu_implementation(self) -> Callable:
        """Import and return the GPU implementation (for the contract tests)."""
        if self.gpu_spec is None:
            raise DeviceError(f"{self.__name__} has no GPU kernel")
        module, _, attr = self.gpu_spec.partition(":")
        return getattr(importlib.import_module(module), attr)

    def dispatch(self, cls: type) -> Callable:
        try:
            return super().dispatch(cls)
        except TypeError:
            kinds = "NumPy" + (" or CuPy" if self.gpu_spec is not None else "")
            raise DeviceError(
                f"{self.__name__}: no kernel for chunks of type {cls.__module__}."
                f"{cls.__qualname__}; it takes {kinds} arrays") from None

    def __call__(self, arg, *args, **kwargs):
        chunk = arg if self.chunk_of is None else self.chunk_of(arg)
        return self.dispatch(type(chunk))(arg, *args, **kwargs)

    def __dask_tokenize__(self):
        return ("KernelDispatch", self.home, self.__name__, self.gpu_spec)

    def __reduce__(self):
        return _contract, (self.home, self.__name__)

    def __repr__(self) -> str:
        return f"KernelDispatch({self.__name__!r}, gpu={self.gpu_spec!r})"
