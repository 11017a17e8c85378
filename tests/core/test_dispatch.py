"""cosmo_dask.core.dispatch.KernelDispatch: the kernel contract chosen by the chunk's type."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.core.dispatch import KernelDispatch
from cosmo_dask.core.errors import DeviceError
from tests.support.kernels import cpu_implementation


def _cpu_sum(chunk, scale=1.0):
    return float(np.sum(chunk)) * scale


def test_numpy_chunks_and_subclasses_reach_the_cpu_kernel():
    kernel = KernelDispatch("sum", _cpu_sum, gpu="cosmo_dask.no_such_module:sum_gpu")
    x = np.arange(5.0)
    assert kernel(x, scale=2.0) == 20.0
    assert kernel(np.ma.masked_array(x)) == 10.0  # a numpy.ndarray subclass
    assert kernel.dispatch(type(x)) is _cpu_sum is cpu_implementation(kernel)


def test_other_chunk_types_get_a_clear_error():
    with pytest.raises(DeviceError, match="sum: no kernel for chunks of type builtins.list; "
                                          "it takes NumPy arrays"):
        KernelDispatch("sum", _cpu_sum)([1.0, 2.0])
    with pytest.raises(DeviceError, match="has no GPU kernel"):
        KernelDispatch("sum", _cpu_sum).gpu_implementation()


def test_the_gpu_kernel_is_imported_only_when_asked():
    """The GPU module is named, not imported: a contract whose GPU module does not exist
    still serves NumPy chunks, and fails only when its GPU kernel is fetched."""
    kernel = KernelDispatch("sum", _cpu_sum, gpu="cosmo_dask.no_such_module:sum_gpu")
    assert kernel(np.ones(3)) == 3.0
    with pytest.raises(ModuleNotFoundError):
        kernel.gpu_implementation()


def test_contracts_travel_and_tokenize_by_name():
    """A contract in a task pickles to the same object (by module and name, not by
    value) and its dask token does not depend on which backends were registered."""
    import pickle

    from dask.base import tokenize

    from cosmo_dask.gravity import dispatch as gravity_kernels

    kernel = gravity_kernels.p2p_block
    assert pickle.loads(pickle.dumps(kernel)) is kernel
    token = tokenize(kernel)
    kernel.register(list, _cpu_sum)  # another backend registered in this process
    try:
        assert tokenize(kernel) == token
    finally:
        kernel._lookup.pop(list)


def _first_item(pair):
    return pair[0]


def test_chunk_of_names_the_array_a_kernel_dispatches_on():
    kernel = KernelDispatch("pair_sum", lambda pair, scale: _cpu_sum(pair[0], scale),
                            chunk_of=_first_item)
    assert kernel((np.ones(4), "label"), 0.5) == 2.0
    with pytest.raises(DeviceError, match="pair_sum: no kernel for chunks of type builtins.list"):
        kernel(([1.0], "label"), 1.0)
