"""One test on both devices: ``@pytest.mark.parametrize("device", DEVICES)`` runs it on
NumPy and on CuPy; the GPU parameter is marked ``gpu`` (selected by ``-m gpu``, skipped
without a CUDA GPU by conftest.py, and without CuPy by :func:`array_module`)."""

from __future__ import annotations

import numpy as np
import pytest

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def array_module(device: str):
    """NumPy for ``"cpu"``, CuPy for ``"gpu"`` (the test is skipped without CuPy)."""
    return np if device == "cpu" else pytest.importorskip("cupy")


def to_host(a) -> np.ndarray:
    """A NumPy array of ``a`` (a NumPy or CuPy array)."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)
