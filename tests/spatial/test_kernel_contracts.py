"""The kernel contracts of spatial (:mod:`cosmo_dask.spatial.dispatch`): Morton keys and the
octree build on each backend (NumPy arrays reach numba, CuPy arrays the GPU kernels),
through the dispatch objects, against references written here (bit interleaving in
Python, per-node float64 sums in NumPy)."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.spatial import dispatch as kernels
from tests.support.kernels import cpu_implementation

BACKENDS = [pytest.param("cpu"), pytest.param("gpu", marks=pytest.mark.gpu)]


def _xp(backend: str):
    return pytest.importorskip("cupy") if backend == "gpu" else np


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def _interleave(cells: np.ndarray) -> np.ndarray:
    """Reference Morton keys of integer cells (N, 3): bit b of x, y, z -> bits 3b+2, 3b+1, 3b."""
    out = []
    for i, j, k in cells.tolist():
        key = 0
        for b in range(21):
            key |= ((i >> b) & 1) << (3 * b + 2)
            key |= ((j >> b) & 1) << (3 * b + 1)
            key |= ((k >> b) & 1) << (3 * b)
        out.append(key)
    return np.array(out, dtype=np.uint64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_morton_keys(backend):
    """Cell centres get their interleaved cell index; periodic images share a key; the
    same checks on both backends."""
    xp = _xp(backend)
    rng = np.random.default_rng(0)
    cells = rng.integers(0, 2**21, size=(300, 3))
    lo, size = np.array([-1.0, 2.0, 0.5]), 4.0
    pos = lo + (cells + 0.5) * (size / 2**21)
    keys = kernels.morton_keys(xp.asarray(pos), lo, size)
    assert isinstance(keys, xp.ndarray) and keys.dtype == np.uint64
    np.testing.assert_array_equal(_host(keys), _interleave(cells))
    box = 10.0
    pos = rng.uniform(0, box, size=(300, 3))
    shift = rng.integers(-3, 4, size=(300, 3)) * box
    ref = _interleave(np.floor(pos / box * 2**21).astype(np.int64))
    for p in (pos, pos + shift):
        np.testing.assert_array_equal(
            _host(kernels.morton_keys(xp.asarray(p), np.zeros(3), box, box_size=box)), ref)
    with pytest.raises(ParameterError, match="root_size"):
        kernels.morton_keys(xp.asarray(pos), np.zeros(3), -1.0)
    with pytest.raises(ParameterError, match=r"shape \(N, 3\)"):
        kernels.morton_keys(xp.asarray(pos[:, :2]), np.zeros(3), box)


@pytest.mark.parametrize("backend", BACKENDS)
def test_build_octree(backend):
    """The octree of 3000 particles of a Plummer-like cloud: a permutation, keys of the
    sorted particles, children tiling their parents in Morton order, node multipoles
    against float64 sums, groups tiling the particles."""
    xp = _xp(backend)
    rng = np.random.default_rng(3)
    u = rng.uniform(0.0, 0.99, 3000)
    r = 1.0 / np.sqrt(u ** (-2.0 / 3.0) - 1.0)
    v = rng.normal(size=(3000, 3))
    pos = r[:, None] * v / np.linalg.norm(v, axis=1)[:, None]
    mass = rng.uniform(0.5, 1.5, 3000) / 3000
    tree = kernels.build_octree(xp.asarray(pos), xp.asarray(mass), max_leaf=16, max_group=40)
    assert isinstance(tree.pos, xp.ndarray)
    t = {k: _host(v) if hasattr(v, "shape") else v for k, v in vars(tree).items()}
    n = len(pos)
    order = t["order"]
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
    np.testing.assert_array_equal(t["pos"], pos[order])
    np.testing.assert_array_equal(t["pmass"], mass[order])
    cell = np.floor((pos[order] - t["root_lo"]) * (2.0**21 / t["root_size"]))
    np.testing.assert_array_equal(t["keys"], _interleave(np.clip(cell, 0, 2**21 - 1)
                                                         .astype(np.int64)))
    assert np.all(np.diff(t["keys"].astype(np.float64)) >= 0)
    scale = np.abs(pos).max()
    for nd in range(tree.n_nodes):
        f, k = t["first_child"][nd], t["n_child"][nd]
        s, c = t["start"][nd], t["count"][nd]
        if f >= 0:
            ch = np.arange(f, f + k)
            assert np.all(t["parent"][ch] == nd) and t["count"][ch].sum() == c
            assert t["start"][ch[0]] == s
            np.testing.assert_array_equal(t["start"][ch[1:]], (t["start"] + t["count"])[ch[:-1]])
        else:
            assert c <= 16 or t["level"][nd] == 21
        x, w = pos[order][s:s + c], mass[order][s:s + c]
        com = (w[:, None] * x).sum(0) / w.sum()
        d = x - com
        d2 = (d * d).sum(1)
        q = np.array([(w * (3 * d[:, a] * d[:, b] - (a == b) * d2)).sum()
                      for a, b in [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]])
        assert t["mass"][nd] == pytest.approx(w.sum(), rel=1e-12)
        np.testing.assert_allclose(t["com"][nd], com, rtol=0, atol=1e-12 * scale)
        np.testing.assert_allclose(t["quad"][nd], q, rtol=0, atol=1e-10 * w.sum() * scale**2)
        assert t["bmax"][nd] == pytest.approx(np.sqrt(d2.max()), rel=1e-10, abs=1e-12 * scale)
    g = t["groups"]
    np.testing.assert_array_equal(t["start"][g[1:]], (t["start"] + t["count"])[g[:-1]])
    assert t["start"][g[0]] == 0 and (t["start"] + t["count"])[g[-1]] == n
    assert np.all(t["count"][g] <= 40)


@pytest.mark.parametrize("name", kernels.__all__)
def test_one_signature(name):
    """The GPU kernel takes the CPU kernel's parameters, by name and in order."""
    import inspect

    contract = getattr(kernels, name)
    cpu = inspect.signature(cpu_implementation(contract)).parameters
    gpu = inspect.signature(contract.gpu_implementation()).parameters
    assert list(gpu) == list(cpu)
