"""The package's CUDA C: every kernel source in a ``.cu`` file, one loader.

Kernel sources (one per GPU module, named after it; the type and tuning variants of a
source are preprocessor defines given by its module):

* ``p2p.cu`` (:mod:`cosmo_dask.gravity.p2p_kernels_gpu`), ``pm.cu``
  (:mod:`~cosmo_dask.gravity.pm_kernels_gpu`), ``tree.cu``
  (:mod:`~cosmo_dask.gravity.tree.forces_gpu`), ``let.cu``
  (:mod:`~cosmo_dask.gravity.tree.let_gpu`);
* ``paint.cu`` (:mod:`cosmo_dask.density.paint_kernels_gpu`), ``tessellation.cu``
  (:mod:`~cosmo_dask.density.tessellation_kernels_gpu`), ``tet_volume.cu`` and
  ``tet_volume_lattice.cu`` (:mod:`~cosmo_dask.density.tet_volume_gpu`);
* ``octree.cu`` and ``octree_morton.cu`` (the device functions of the Morton-key
  elementwise kernel, :mod:`cosmo_dask.spatial.octree_gpu`);
* ``center.cu`` (:mod:`cosmo_dask.halos.center_kernels_gpu`), ``fof.cu``
  (:mod:`~cosmo_dask.halos.fof_kernels_gpu`);
* ``scf.cu`` (:mod:`cosmo_dask.expansion.scf_kernels_gpu`), ``mex.cu``
  (:mod:`~cosmo_dask.expansion.mex_kernels_gpu`);
* ``pair_count.cu`` (:mod:`cosmo_dask.analysis.pair_count_kernels_gpu`).

Shared headers (the device functions more than one source needs, each written once):

* ``periodic.cuh``: ``cd_rint`` (float/double), the minimum image of a separation
  ``cd_min_image`` / ``cd_min_image_if`` (``d - box rint(d / box)``), and the wrap of a
  coordinate into ``[0, L)`` ``cd_wrap_box`` (``x - L floor(x / L)`` when outside);
* ``softening.cuh``: ``cd_rsqrt`` (float/double) and the pair factors of the softened
  potentials, ``a = -G m K r_vec``, ``phi = -G m P``: ``cd_inv_kp`` (Plummer, and the
  Newtonian part of the spline, from ``1 / sqrt(s2)``) and ``cd_spline_kp`` (the Gadget-2
  cubic spline inside its support);
* ``tet_clip.cuh``: the clip of a tetrahedron against a cube (``Tet``, ``tet_setup``,
  ``fast_volume``, ``slow_volume``, ``clip_volume``) of the GPU tetrahedron-cube volumes
  and of the per-cell clip deposits kept for comparison in ``benchmarks/``; the including
  source typedefs ``real``;
* ``truncated.cuh``: the truncated TreePM factor ``cd_trunc_T`` (table or exact) and
  ``cd_erfc`` (:mod:`cosmo_dask.gravity.truncated`, which holds the table);
* ``truncated_fit.cuh``: ``cd_trunc_fit`` (float: the fit of
  :data:`cosmo_dask.gravity.truncated.ERFCX_FIT`; double: exact); its coefficients are the
  only generated text, defines from :func:`cosmo_dask.gravity.truncated.fit_defines`.

The loader: :func:`source` gives the text a compiler sees, ``#define NAME VALUE`` lines
for the defines, then ``#line 1 "<name>.cu"`` (compiler errors name the file and its
line), then the file. :func:`module` compiles that text with NVRTC through
``cupy.RawModule``, cached per (device, name, defines, options), with one option set:
:data:`OPTIONS` (one C++ standard), the exactness flags a module asks for (``--fmad=false``
where results must match the CPU bit for bit: :data:`NO_FMAD`) and
:func:`include_options`. CuPy keys its own cache by source text and options, so an edited
``.cu`` file (read into the source) or header (the digest define) compiles afresh.
``tests/support/cuda_host.py`` compiles the same :func:`source` text as C++ on the host. CuPy is
imported only when a module is compiled. The numba twins of the softening functions are
:mod:`cosmo_dask.gravity.softening_kernels`.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["HEADER_DIR", "HEADERS", "KERNEL_SOURCES", "OPTIONS", "NO_FMAD", "C_TYPE",
           "include_options", "header_text", "source", "define_lines", "module"]

#: the folder holding the ``.cu`` sources and ``.cuh`` headers (installed with the package)
HEADER_DIR = Path(__file__).resolve().parent
#: the shared headers
HEADERS = ("periodic.cuh", "softening.cuh", "tet_clip.cuh", "truncated.cuh",
           "truncated_fit.cuh")
#: the kernel sources (``<name>.cu``)
KERNEL_SOURCES = ("center", "fof", "integrator", "let", "mex", "octree", "octree_morton", "p2p",
                  "pair_count", "paint", "pm", "scf", "tessellation", "tet_volume",
                  "tet_volume_lattice", "tree")
#: the options every source is compiled with: one C++ standard
OPTIONS = ("--std=c++17",)
#: the exactness flag of sources whose results must equal the CPU's bit for bit: no fused
#: multiply-adds
NO_FMAD = ("--fmad=false",)
#: the C type of each floating NumPy dtype name, for the sources' type defines
C_TYPE = {"float32": "float", "float64": "double"}


def header_text(name: str) -> str:
    """The text of one shared header (``name`` one of :data:`HEADERS`)."""
    if name not in HEADERS:
        from ..core.errors import ParameterError

        raise ParameterError(f"name must be one of {HEADERS}, got {name!r}")
    return (HEADER_DIR / name).read_text()


@functools.cache
def include_options() -> tuple[str, ...]:
    """NVRTC options that make the shared headers includable: ``-I<HEADER_DIR>`` and a
    define carrying a digest of the headers' text.

    CuPy's kernel cache keys a module by its source and options, not by the files it
    includes; the digest makes an edited header compile afresh instead of reusing a
    stale cached binary.
    """
    digest = hashlib.sha256("".join(header_text(h) for h in HEADERS).encode()).hexdigest()
    return (f"-I{HEADER_DIR}", f"-DCOSMO_DASK_CUDA_HEADERS=0x{digest[:12]}")


def _defines(defines) -> tuple[tuple[str, str], ...]:
    """``defines`` (a mapping or ``(name, value)`` pairs; bools as 0/1) as sorted pairs."""
    items = defines.items() if isinstance(defines, Mapping) else defines
    out = {}
    for k, v in items:
        out[str(k)] = str(int(v)) if isinstance(v, bool) else str(v)
    return tuple(sorted(out.items()))


def define_lines(defines: Mapping | Iterable = ()) -> str:
    """``#define NAME VALUE`` lines, one per define (sorted by name)."""
    return "".join(f"#define {k} {v}\n" for k, v in _defines(defines))


def source(name: str, defines: Mapping | Iterable = ()) -> str:
    """The text compiled for the kernel source ``<name>.cu`` with ``defines``.

    Parameters
    ----------
    name : str
        One of :data:`KERNEL_SOURCES`.
    defines : mapping or iterable of (str, value) pairs
        Preprocessor defines (types, sizes, switches); ``True``/``False`` become 1/0.

    Returns
    -------
    str
        The ``#define`` lines, ``#line 1 "<name>.cu"`` and the file's text.
    """
    if name not in KERNEL_SOURCES:
        from ..core.errors import ParameterError

        raise ParameterError(f"CUDA source name must be one of {KERNEL_SOURCES}, got {name!r}")
    text = (HEADER_DIR / f"{name}.cu").read_text()
    return define_lines(defines) + f'#line 1 "{name}.cu"\n' + text


def module(name: str, defines: Mapping | Iterable = (), options: Iterable[str] = ()):
    """The compiled ``cupy.RawModule`` of ``<name>.cu`` on the current device (cached per
    device, name, defines and options).

    Parameters
    ----------
    name : str
        One of :data:`KERNEL_SOURCES`.
    defines : mapping or iterable of (str, value) pairs
        Preprocessor defines, see :func:`source`.
    options : iterable of str
        NVRTC options beyond :data:`OPTIONS` and :func:`include_options`: the exactness
        flags (:data:`NO_FMAD`, ``-ftz=true``) and diagnostics (``-lineinfo``).

    Returns
    -------
    cupy.RawModule
        Kernels by ``module.get_function(kernel_name)``.
    """
    import cupy

    return _module(cupy.cuda.runtime.getDevice(), name, _defines(defines), tuple(options))


@functools.cache
def _module(device_id: int, name: str, defines: tuple, options: tuple):
    import cupy

    code = source(name, defines)
    with cupy.cuda.Device(device_id):
        return cupy.RawModule(code=code, options=OPTIONS + options + include_options())
