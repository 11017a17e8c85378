"""Tree gravity graph on CuPy chunks: the GPU tree per domain, CuPy out."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from test_gravity_tree_graph import direct_reference, rel_err

from cosmo_dask.gravity.tree_graph import tree_accelerations
from cosmo_dask.models import plummer

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n_domains", [1, 4])
def test_gpu_chunks_against_direct(n_domains):
    cupy = pytest.importorskip("cupy")
    x = np.asarray(plummer(20000, seed=4).pos.compute(), np.float64)
    m = np.full(len(x), 1.0 / len(x))
    pos = da.from_array(cupy.asarray(x), chunks=(5000, 3), asarray=False)
    acc, pot = tree_accelerations(pos, float(m[0]), G=1.0, theta=0.5, precision="float64",
                                  n_domains=n_domains)
    with dask.config.set(scheduler="synchronous"):
        a, p = dask.compute(acc, pot)
    assert isinstance(a, cupy.ndarray) and isinstance(p, cupy.ndarray)
    idx = np.random.default_rng(1).choice(len(x), 500, replace=False)
    ref_a, ref_p = direct_reference(x, m, idx)
    err = rel_err(cupy.asnumpy(a)[idx], ref_a)
    assert np.median(err) <= 5e-4
    assert np.percentile(err, 99) <= 5e-3
    assert np.median(np.abs(cupy.asnumpy(p)[idx] / ref_p - 1)) <= 1e-4
