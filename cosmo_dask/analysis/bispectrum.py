"""Bispectrum of a periodic particle set or of a density mesh: the FFT shell estimator.

Method (over the one mesh path, ``docs/fft.md``, as :func:`~cosmo_dask.analysis.power_spectrum`):
the particles are painted in slabs (:func:`cosmo_dask.density.painting.paint_meshes`,
with interlacing), the mesh less its mean is transformed by the distributed real FFT
(:func:`cosmo_dask.spatial.fft.rfftn`), and each k-space slab is interlaced and divided
by the assignment window ``W(k)`` (``prod sinc(k_i H / 2)^p``) once. Then, for every
``|k|`` bin ``i``, the shell field and the shell's count field are transformed back
(:func:`cosmo_dask.spatial.fft.irfftn`, real slabs)::

    I_i(x) = IFFT[F(k) 1_i(k)],        J_i(x) = IFFT[1_i(k)],

with ``F`` the window-compensated unnormalised FFT of the mesh and ``1_i`` the indicator
of ``k_lo,i <= |k| < k_hi,i`` (``k != 0``). With NumPy's conventions
``sum_x I_i I_j I_k = n^-6 sum_{k1 + k2 + k3 = 0} F(k1) F(k2) F(k3)`` over the mode
triangles with ``k1`` in bin ``i``, ``k2`` in ``j``, ``k3`` in ``k`` (``k1``, ``k2``,
``k3`` each counted as a vector, so ``-k`` apart from ``k``; closure modulo the mesh,
which for bins up to the Nyquist wavenumber only matters on the Nyquist planes), and
``sum_x J_i J_j J_k = n^-6 N_ijk`` with ``N_ijk`` the number of those triangles. Every
real-space slab's task sums these products for all triangles (and ``I_i^2``, ``J_i^2``
for the power), and the slabs' sums are added. The estimator::

    B_ijk = V^2 sum_x I_i I_j I_k / (M^3 sum_x J_i J_j J_k)
    P_i   = V   sum_x I_i^2       / (M^2 sum_x J_i^2)

(``V`` the box volume, ``M`` the total mass of the mesh, so ``F / M`` is the continuous
``delta_k``), the average of ``Re(delta_1 delta_2 delta_3)`` over the bin's triangles
times ``V^2``, and ``P`` the same power as :func:`~cosmo_dask.analysis.power_spectrum`
(Parseval).

Triangle bins: all ``i <= j <= k`` whose bin centres close, ``c_k <= c_i + c_j``
(:func:`~cosmo_dask.analysis.parameters.closed_triangles`), or the chosen
``configurations``.

Shot noise (particles, Poisson; window and aliasing corrections to it neglected, exact at
``k << k_Nyquist``)::

    B_shot = S2 (P_i + P_j + P_k - 3 S2) + S3,   S2 = V sum m^2 / (sum m)^2,
                                                  S3 = V^2 sum m^3 / (sum m)^3

(``(P1 + P2 + P3) / nbar + 1 / nbar^2`` with the shot-noise-subtracted ``P``, for equal
masses ``S2 = 1 / nbar``, ``S3 = 1 / nbar^2``). It is reported, never subtracted from
``bispectrum``. The reduced bispectrum ``Q = (B - B_shot) / (P~_i P~_j + P~_j P~_k +
P~_k P~_i)`` with ``P~ = P - S2``, or without any subtraction for a mesh input or
``subtract_shot_noise=False`` (a lattice, e.g. initial conditions, has no Poisson noise).

Gaussian errors (the disconnected six-point term, Scoccimarro 2000)::

    sigma_B^2 = s_B V P_i P_j P_k / N_ijk,   sigma_Q = sigma_B / (P_i P_j + P_j P_k + P_k P_i)

with ``s_B = 6, 2, 1`` for equilateral, isosceles and other bins
(:func:`~cosmo_dask.analysis.parameters.symmetry_factor`), ``P`` the measured power shot
noise included, ``N_ijk`` the triangle count as above (``sigma_Q`` neglects the
errors of ``P``).

Memory: the ``2 n_bins`` shell fields of one real slab meet in its reduction task, so
about ``2 n_bins + 3`` meshes are alive over the cluster at the peak (``n_bins = 10`` at
``256^3`` in float64: 2.9 GiB), checked before any work against the workers' memory
(:func:`~cosmo_dask.density.painting.mesh_slabs`, which also picks the slab count).
Work: one forward FFT (two with interlacing), ``2 n_bins`` inverse FFTs of ``n^3``, and
per real slab, in cache-sized sub-blocks, the products of the distinct bin pairs and one
matrix product (pairs x cells) @ (cells x bins) for the data and for the count shells:
about ``2 n_pairs n_bins n^3`` multiply-adds (BLAS; cuBLAS on the GPU).
"""

from __future__ import annotations

import os

import dask.array as da
import numpy as np
import xarray as xr

from ..core.backend import array_module, host, resolve_precision
from ..core.errors import ParameterError
from ..core.progress import compute
from ..density import parameters as dp
from ..density.painting import (
    SINGLE_SLAB_MESHES,
    centred,
    interlace_kslab,
    mesh_slabs,
    mesh_statistic_input,
    paint_meshes,
)
from ..plot.bispectrum import plot_reduced_bispectrum  # noqa: F401  (public here)
from ..spatial.fft import irfftn, map_kslabs, reduce_kslabs, rfftn, slab_chunks
from ..units.products import product_units
from .parameters import (
    BISPECTRUM_FORMAT,
    INTERLACE_DEFAULT,
    check_bispectrum_bins,
    check_configurations,
    closed_triangles,
    symmetry_factor,
)

__all__ = ["FORMAT", "bispectrum", "open_bispectrum", "plot_reduced_bispectrum",
           "tree_level_bispectrum", "write_bispectrum"]

#: the ``format`` attribute of a bispectrum product store
FORMAT = BISPECTRUM_FORMAT
FORMAT_VERSION = 1


# --------------------------------------------------------------------------- k-space slabs
def _compensated_kslab(f0, kx, ky, kz, f1=None, *, n, box, scheme):
    """``bispec-delta``: one k-space slab interlaced (``f1``) and divided by the window
    ``W(k)``, complex128, ``k = 0`` set to zero."""
    xp = array_module(f0)
    h = box / n
    f = f0.astype(np.complex128)
    if f1 is not None:
        f = interlace_kslab(f, kx, ky, kz, f1.astype(np.complex128), cell=h)
    if scheme is not None:
        p = dp.SCHEMES[scheme]
        w = (xp.sinc(kx * h / (2 * np.pi)) * xp.sinc(ky * h / (2 * np.pi))
             * xp.sinc(kz * h / (2 * np.pi))) ** p
        f /= w
    zero = (kx == 0) & (ky == 0) & (kz == 0)
    return xp.where(zero, 0.0, f)


def _bin_index(kx, ky, kz, edges, xp):
    kk = xp.sqrt(kx * kx + ky * ky + kz * kz)
    idx = xp.searchsorted(xp.asarray(edges), kk, side="right") - 1
    idx[(kk == 0) | (idx >= len(edges) - 1)] = -1
    return idx, kk


def _shell_kslab(block, kx, ky, kz, *, edges, index, count):
    """``bispec-shell``: the slab times the indicator of bin ``index`` (``count``: the
    indicator itself, the counting shell)."""
    xp = array_module(block)
    idx, _ = _bin_index(kx, ky, kz, edges, xp)
    mask = idx == index
    if count:
        return mask.astype(block.dtype)
    return xp.where(mask, block, 0)


def _modes_kslab(block, kx, ky, kz, *, n, edges):
    """``bispec-modes``: per bin, the modes (full k space) and the sum of their ``|k|``."""
    xp = array_module(block)
    idx, kk = _bin_index(kx, ky, kz, edges, xp)
    mult = np.full(kz.shape[2], 2.0)  # kz > 0 stands for itself and its conjugate
    mult[0] = 1.0
    if n % 2 == 0:
        mult[-1] = 1.0
    w = xp.broadcast_to(xp.asarray(mult)[None, None, :], idx.shape).ravel()
    nb = len(edges) - 1
    keep = idx.ravel() >= 0
    i, w, kk = idx.ravel()[keep], w[keep], kk.ravel()[keep]
    out = xp.stack([xp.bincount(i, weights=w, minlength=nb)[:nb],
                    xp.bincount(i, weights=w * kk, minlength=nb)[:nb]])
    return host(out)


# --------------------------------------------------------------------------- real slabs
#: cells of a real slab summed per vectorised step of :func:`_triangle_block` (its
#: shells' sub-blocks, their pair products and one matrix product stay in a CPU's cache; a
#: GPU wants few, large steps)
_TRIANGLE_CELLS = {"cpu": 2**14, "gpu": 2**22}


def _triangle_plan(tri):
    """``(pair_i, pair_j, pair_of_triangle)``: the distinct ``(i, j)`` of the triangles and
    each triangle's index among them."""
    pairs = sorted({(int(i), int(j)) for i, j, _ in tri})
    where = {p: n for n, p in enumerate(pairs)}
    return (np.array([p[0] for p in pairs], dtype=np.int64),
            np.array([p[1] for p in pairs], dtype=np.int64),
            np.array([where[(int(i), int(j))] for i, j, _ in tri], dtype=np.int64))


def _triangle_block(*blocks, n_bins, tri, plan):
    """``bispec-triangles``: one real slab's sums ``(4, max(n_tri, n_bins))``: rows
    ``sum I_i I_j I_k``, ``sum J_i J_j J_k`` per triangle, ``sum I_i^2``, ``sum J_i^2`` per
    bin (float64 whatever the shells' dtype).

    Per sub-block of cells the shells are stacked (``F``, bins x cells), the products of
    the distinct pairs formed once (``P``, pairs x cells), and ``P F^T`` (one matrix
    product) holds every ``sum F_i F_j F_k`` of the sub-block."""
    xp = array_module(blocks[0])
    pi, pj, pt = (xp.asarray(a) for a in plan)
    kt = xp.asarray(tri[:, 2])
    fields = [b.astype(np.float64, copy=False).ravel() for b in blocks]
    size = fields[0].size
    step = _TRIANGLE_CELLS["cpu" if xp is np else "gpu"]
    n_tri = len(tri)
    acc = xp.zeros((4, max(n_tri, n_bins)))
    for s0 in range(0, size, step):
        s1 = min(size, s0 + step)
        for src, row in ((fields[:n_bins], 0), (fields[n_bins:], 1)):
            f = xp.stack([a[s0:s1] for a in src])
            g = (f[pi] * f[pj]) @ f.T  # (pairs, bins): sum over the cells of F_i F_j F_k
            acc[row, :n_tri] += g[pt, kt]
            acc[2 + row, :n_bins] += (f * f).sum(axis=1)
    return host(acc)[None, None]


def _reduce_real_slabs(fields, *, n_bins, tri):
    """Sum over the real slabs of :func:`_triangle_block` (a dask array (4, m))."""
    width = max(len(tri), n_bins)
    s = len(fields[0].chunks[0])
    parts = da.map_blocks(_triangle_block, *fields, n_bins=n_bins, tri=tri,
                          plan=_triangle_plan(tri), dtype=np.float64,
                          chunks=((1,) * s, (1,), (4,), (width,)), new_axis=[3],
                          meta=np.empty((0, 0, 0, 0), dtype=np.float64),
                          name="bispec-triangles")
    return parts.sum(axis=(0, 1))


# --------------------------------------------------------------------------- estimator
def bispectrum(snap_or_mesh, k_bins, *, n_mesh=None, box_size=None, scheme=dp.SCHEME_DEFAULT,
               interlace=INTERLACE_DEFAULT, configurations=None, mass=None,
               subtract_shot_noise=True, precision="float64", split_every=None,
               length_unit=None, slabs=None) -> xr.Dataset:
    """Bispectrum ``B(k1, k2, k3)`` of a periodic particle set or of a mesh, in triangle
    bins of ``|k|``, by the FFT shell estimator (module docstring).

    Parameters
    ----------
    snap_or_mesh : Snapshot, array (N, 3) or array (n, n, n)
        A periodic snapshot, particle positions (NumPy/CuPy/dask; CuPy chunks run on
        the GPU), or a painted mesh (mass or density per cell, positive mean), used as
        is (no interlacing).
    k_bins : int or array of edges
        ``|k|`` bin edges in ``2 pi /`` box units (``h/Mpc`` for Mpc/h), increasing, the
        last at most ``k_Nyquist = pi n / L``, each bin holding a mode; or an int ``m``:
        ``m`` bins of width ``k_f = 2 pi / L`` centred on ``k_f, ..., m k_f``.
    n_mesh : int
        Cells per side for particles (required); for a mesh, must match if given.
    box_size : float, optional
        Required for raw positions, a mesh, or a snapshot without ``box_size``.
    scheme : {"ngp", "cic", "tsc", "pcs"} or None
        Mass assignment for particles, its window divided out; for a mesh input the
        scheme it was painted with (None: no compensation).
    interlace : bool
        Particles only: a second mesh shifted by half a cell, averaged in k space.
    configurations : array (m, 3) of int, optional
        Bin triples ``(i, j, k)`` to measure (each sorted); default every closed
        triangle bin, ``i <= j <= k`` and ``c_k <= c_i + c_j`` in bin centres.
    mass : array (N,) or float, optional
        Particle masses (default the snapshot's; 1 for raw positions).
    subtract_shot_noise : bool
        Particles: ``reduced`` subtracts the Poisson shot noise from ``B`` and ``P``
        (False for a lattice such as initial conditions). Ignored for a mesh.
    precision : {"float64", "float32"}
        Dtype of the painted meshes and their forward FFT; the shells and sums are
        float64.
    split_every : int, optional
        Fan-in of a slab's partial deposits (:func:`~cosmo_dask.density.paint`).
    length_unit : str, optional
        Unit of positions and box (default the snapshot's ``units["length"]``).
    slabs : int, optional
        Slabs of the mesh path; checked with the shells' memory.

    Returns
    -------
    xarray.Dataset
        Dimension ``triangle``: coordinates ``bin1, bin2, bin3`` (bin indices),
        ``k1, k2, k3`` (the bins' mean ``|k|``); ``bispectrum`` (``B``, no shot noise
        subtracted, length^6), ``shot_noise`` (``B_shot``, NaN for a mesh), ``reduced``
        (``Q``), ``bispectrum_error`` and ``reduced_error`` (Gaussian), ``n_triangles``
        (int, ``N_ijk``), ``symmetry`` (``s_B``). Dimension ``k``: coordinates ``k``,
        ``k_min``, ``k_max``; ``power`` (``P_i`` from the shells, shot noise not
        subtracted, length^3), ``n_modes``. Scalar ``power_shot_noise`` (``S2``).
        Attributes as :func:`~cosmo_dask.analysis.power_spectrum`'s, plus
        ``shot_noise_subtracted`` (in ``reduced`` only), ``triangle_criterion``.
        Every variable has a ``units`` attribute.

    Raises
    ------
    ParameterError
        One line, before any work: bad ``n_mesh``, scheme, box, masses, ``k_bins``
        (unsorted, past Nyquist, an empty bin), configurations, or shells that do not
        fit the workers' memory.
    """
    what = "bispectrum"
    if scheme is not None:
        scheme = dp.check_scheme(scheme, what)
    split_every = dp.check_split_every(split_every, what)
    dtype = resolve_precision(precision)
    given = mesh_statistic_input(snap_or_mesh, n_mesh=n_mesh, box_size=box_size, scheme=scheme,
                                 mass=mass, length_unit=length_unit, what=what)
    pu = product_units({"length": given.length_unit} if given.length_unit else None)
    n, box, is_mesh, gpu = given.n, given.box_size, given.is_mesh, given.gpu
    n_part, pos, m, mesh = given.n_particles, given.pos, given.mass, given.mesh
    if is_mesh:
        n = dp.check_n_mesh(n, what)
    if n < 4:
        raise ParameterError(f"{what}: n_mesh must be at least 4 for a bispectrum, got {n}")
    edges = check_bispectrum_bins(k_bins, n, box, what)
    nb = len(edges) - 1
    tri = closed_triangles(edges) if configurations is None else \
        check_configurations(configurations, nb, what)
    if len(tri) == 0:
        raise ParameterError(f"{what}: the k bins close no triangle (c_k <= c_i + c_j); "
                             "pass more or wider bins, or configurations=")
    # the shells: 2 n_bins float64 meshes at once, besides the painted and k-space meshes
    held = 2 * nb + 3
    count = mesh_slabs(n, np.float64, slabs, gpu=gpu, what=what, meshes=held,
                       one_slab_meshes=held + SINGLE_SLAB_MESHES)
    if is_mesh:
        if not isinstance(mesh, da.Array):
            mesh = da.from_array(mesh, chunks=(slab_chunks(n, count), n, n), asarray=False)
        else:
            mesh = mesh.rechunk((slab_chunks(n, count), n, n))
        mesh0, mesh1 = mesh.astype(dtype), None
        sums = None
    else:
        shifts = (0.0, 0.5) if interlace else (0.0,)
        meshes, _ = paint_meshes(pos, m, n_mesh=n, box_size=box, scheme=scheme, shifts=shifts,
                                 dtype=dtype, slabs=count, split_every=split_every, what=what)
        mesh0, mesh1 = meshes[0], (meshes[1] if interlace else None)
        sums = None if not isinstance(m, da.Array) else [
            (m.astype(np.float64) ** p).sum() for p in (1, 2, 3)]

    shape = (n, n, n)
    kmeshes = [rfftn(centred(mesh0))] + ([rfftn(centred(mesh1))] if mesh1 is not None else [])
    delta = map_kslabs(_compensated_kslab, *kmeshes, shape=shape, box_size=box,
                       name="bispec-delta", dtype=np.complex128, kdtype=np.float64, n=n,
                       box=box, scheme=scheme)
    shells = [irfftn(map_kslabs(_shell_kslab, delta, shape=shape, box_size=box,
                                name="bispec-shell", kdtype=np.float64, edges=edges,
                                index=i, count=count_shell), shape)
              for count_shell in (False, True) for i in range(nb)]
    sums_tri = _reduce_real_slabs(shells, n_bins=nb, tri=tri)
    modes = reduce_kslabs(_modes_kslab, delta, shape=shape, box_size=box, name="bispec-modes",
                          out_shape=(2, nb), n=n, edges=edges)
    total = mesh0.sum(dtype=np.float64)
    extra = sums if sums is not None else []
    res = compute(sums_tri, modes, total, *extra, label="bispectrum")
    s, md = (np.asarray(r, dtype=np.float64) for r in res[:2])
    tot = float(res[2])  # a CuPy scalar for GPU meshes: float(), not np.asarray
    volume = box**3
    if is_mesh:
        s2 = s3 = float("nan")
    elif sums is not None:
        m1, m2, m3 = (float(x) for x in res[3:])
        s2, s3 = volume * m2 / m1**2, volume**2 * m3 / m1**3
    else:
        s2, s3 = volume / n_part, volume**2 / float(n_part) ** 2

    nt = len(tri)
    big = float(n) ** 6
    with np.errstate(invalid="ignore", divide="ignore"):
        power = volume * s[2, :nb] / (s[3, :nb] * tot**2)
        n_modes = np.rint(float(n) ** 3 * s[3, :nb]).astype(np.int64)
        kmean = np.where(md[0] > 0, md[1] / md[0], 0.5 * (edges[1:] + edges[:-1]))
        n_tri = np.rint(big * s[1, :nt]).astype(np.int64)
        b = np.where(n_tri > 0, volume**2 * s[0, :nt] / (s[1, :nt] * tot**3), np.nan)
        p1, p2, p3 = (power[tri[:, c]] for c in range(3))
        sym = np.array([symmetry_factor(*t) for t in tri], dtype=np.int64)
        sigma_b = np.sqrt(sym * volume * p1 * p2 * p3 / n_tri)
        subtract = bool(subtract_shot_noise) and not is_mesh
        if is_mesh:
            b_shot = np.full(nt, np.nan)
        else:
            b_shot = s2 * (p1 + p2 + p3 - 3 * s2) + s3
        if subtract:
            q1, q2, q3 = p1 - s2, p2 - s2, p3 - s2
            q = (b - b_shot) / (q1 * q2 + q2 * q3 + q3 * q1)
        else:
            q = b / (p1 * p2 + p2 * p3 + p3 * p1)
        sigma_q = sigma_b / np.abs(p1 * p2 + p2 * p3 + p3 * p1)
    k_unit, p_unit, b_unit = pu["inverse_length"], pu["volume"], pu["volume_squared"]
    coords = {
        "bin1": ("triangle", tri[:, 0], {"units": "1", "long_name": "k bin of k1"}),
        "bin2": ("triangle", tri[:, 1], {"units": "1", "long_name": "k bin of k2"}),
        "bin3": ("triangle", tri[:, 2], {"units": "1", "long_name": "k bin of k3"}),
        "k1": ("triangle", kmean[tri[:, 0]], {"units": k_unit}),
        "k2": ("triangle", kmean[tri[:, 1]], {"units": k_unit}),
        "k3": ("triangle", kmean[tri[:, 2]], {"units": k_unit}),
        "k": ("k", kmean, {"units": k_unit, "long_name": "mean |k| of the bin's modes"}),
        "k_min": ("k", edges[:-1], {"units": k_unit}),
        "k_max": ("k", edges[1:], {"units": k_unit}),
    }
    data = {
        "bispectrum": ("triangle", b, {"long_name": "B(k1, k2, k3), shot noise not "
                                       "subtracted", "units": b_unit}),
        "shot_noise": ("triangle", b_shot, {"long_name": "Poisson shot noise of B, "
                                            "S2 (P1 + P2 + P3 - 3 S2) + S3", "units": b_unit}),
        "reduced": ("triangle", q, {"long_name": "Q = B / (P1 P2 + P2 P3 + P3 P1)"
                                    + (", shot noise subtracted" if subtract else ""),
                                    "units": "1"}),
        "bispectrum_error": ("triangle", sigma_b, {
            "long_name": "Gaussian sigma_B = sqrt(s_B V P1 P2 P3 / N_triangles)",
            "units": b_unit}),
        "reduced_error": ("triangle", sigma_q, {
            "long_name": "sigma_B / (P1 P2 + P2 P3 + P3 P1)", "units": "1"}),
        "n_triangles": ("triangle", n_tri, {
            "long_name": "mode triangles k1 + k2 + k3 = 0 in the bins (vectors, k and -k "
                         "apart)", "units": "1"}),
        "symmetry": ("triangle", sym, {"long_name": "s_B: 6 equilateral, 2 isosceles, 1 "
                                       "other", "units": "1"}),
        "power": ("k", power, {"long_name": "P(k) of the shells, shot noise not subtracted",
                               "units": p_unit}),
        "n_modes": ("k", n_modes, {"long_name": "modes in the bin (k and -k counted "
                                   "separately)", "units": "1"}),
        "power_shot_noise": ((), s2, {"long_name": "S2 = V sum m^2 / (sum m)^2 (1 / nbar)",
                                      "units": p_unit}),
    }
    attrs = {"box_size": box, "length_unit": pu["length"], "n_mesh": n,
             "scheme": scheme if scheme else "none", "interlace": int(mesh1 is not None),
             "n_particles": -1 if n_part is None else int(n_part),
             "shot_noise_subtracted": int(subtract),
             "k_fundamental": 2 * np.pi / box, "k_nyquist": np.pi * n / box,
             "triangle_criterion": ("i <= j <= k, bin centres c_k <= c_i + c_j"
                                    if configurations is None else "configurations"),
             "estimator": "FFT shells, window-compensated (sinc^p), "
                          + ("interlaced" if mesh1 is not None else "not interlaced")}
    return xr.Dataset(data, coords=coords, attrs=attrs)


# --------------------------------------------------------------------------- tree level
def _shell_vectors(lo: float, hi: float, kf: float) -> np.ndarray:
    """Integer wave vectors ``n`` with ``lo <= kf |n| < hi`` (``n != 0``), (m, 3) int64."""
    top = int(np.floor(hi / kf)) + 1
    v = np.arange(-top, top + 1)
    g = np.stack(np.meshgrid(v, v, v, indexing="ij"), -1).reshape(-1, 3)
    kk = kf * np.sqrt((g * g).sum(1).astype(np.float64))
    return g[(kk >= lo) & (kk < hi) & (kk > 0)]


def _f2(a, b, a2, b2):
    """The SPT kernel F2 of wave vectors ``a``, ``b`` (rows), ``a2 = |a|^2``, ``b2``."""
    ab = (a * b).sum(1)
    return 5.0 / 7.0 + 0.5 * ab * (1.0 / a2 + 1.0 / b2) + (2.0 / 7.0) * ab * ab / (a2 * b2)


def tree_level_bispectrum(ds: xr.Dataset, power, *, max_modes: int | None = 4000,
                          seed: int = 0, batch: int = 2**21) -> xr.Dataset:
    """Tree-level (SPT) ``B`` and ``Q`` averaged over the mode triangles of ``ds``'s bins.

    ``B_tree = 2 F2(k1, k2) P(k1) P(k2) + 2 F2(k2, k3) P(k2) P(k3) + 2 F2(k3, k1) P(k3)
    P(k1)`` averaged over the triangles ``k1 + k2 + k3 = 0`` of the mesh's modes with
    ``k1``, ``k2``, ``k3`` in the bins (as the estimator averages), and ``Q_tree =
    <B_tree> / (P_1 P_2 + P_2 P_3 + P_3 P_1)`` with ``P_i`` the average of ``P`` over
    the bin's modes (as the measured ``Q`` is formed). Exact (every triangle) when the
    first bin of a triangle has at most ``max_modes`` modes, else over a random subset
    of ``max_modes`` of its modes (``seed``) with all their partners (None: always
    exact).

    Parameters
    ----------
    ds : xarray.Dataset
        From :func:`bispectrum` (its bins, ``box_size`` and triangles are used).
    power : callable
        Linear ``P(k)``, ``k`` in ``ds``'s inverse length, ``P`` in its volume (e.g.
        :func:`~cosmo_dask.analysis.linear_power`).

    Returns
    -------
    xarray.Dataset
        Dimension ``triangle`` (as ``ds``): ``bispectrum_tree``, ``reduced_tree``,
        ``n_triangles_tree`` (the triangles averaged over); dimension ``k``:
        ``power_tree`` (bin averages of ``power``).
    """
    box = float(ds.attrs["box_size"])
    kf = 2 * np.pi / box
    lo, hi = ds["k_min"].values, ds["k_max"].values
    nb = lo.size
    vecs = [_shell_vectors(lo[i], hi[i], kf) for i in range(nb)]
    pbar = np.array([np.mean(power(kf * np.sqrt((v * v).sum(1).astype(float))))
                     for v in vecs])
    rng = np.random.default_rng(seed)
    tri = np.stack([ds[c].values for c in ("bin1", "bin2", "bin3")], 1)
    b_out, n_out = np.zeros(len(tri)), np.zeros(len(tri), dtype=np.int64)
    for row, (i, j, k) in enumerate(tri):
        a = vecs[i]
        if max_modes is not None and len(a) > max_modes:
            a = a[rng.choice(len(a), max_modes, replace=False)]
        b = vecs[j]
        step = max(1, batch // max(1, len(b)))
        acc, cnt = 0.0, 0
        lo2, hi2 = (lo[k] / kf) ** 2, (hi[k] / kf) ** 2
        for s0 in range(0, len(a), step):
            a1 = a[s0:s0 + step]
            c = -(a1[:, None, :] + b[None, :, :])
            c2 = (c * c).sum(2)
            keep = (c2 >= lo2) & (c2 < hi2) & (c2 > 0)
            ia, ib = np.nonzero(keep)
            if ia.size == 0:
                continue
            v1 = a1[ia].astype(np.float64) * kf
            v2 = b[ib].astype(np.float64) * kf
            v3 = c[ia, ib].astype(np.float64) * kf
            q1, q2, q3 = ((v * v).sum(1) for v in (v1, v2, v3))
            pa, pb, pc = (power(np.sqrt(q)) for q in (q1, q2, q3))
            bt = 2 * (_f2(v1, v2, q1, q2) * pa * pb + _f2(v2, v3, q2, q3) * pb * pc
                      + _f2(v3, v1, q3, q1) * pc * pa)
            acc += float(bt.sum())
            cnt += int(ia.size)
        b_out[row] = acc / cnt if cnt else np.nan
        n_out[row] = cnt
    p1, p2, p3 = (pbar[tri[:, c]] for c in range(3))
    q = b_out / (p1 * p2 + p2 * p3 + p3 * p1)
    bu = ds["bispectrum"].attrs.get("units", "")
    data = {"bispectrum_tree": ("triangle", b_out, {"units": bu, "long_name": "tree-level "
                                                     "B averaged over the bin's triangles"}),
            "reduced_tree": ("triangle", q, {"units": "1", "long_name": "tree-level Q"}),
            "n_triangles_tree": ("triangle", n_out, {"units": "1"}),
            "power_tree": ("k", pbar, {"units": ds["power"].attrs.get("units", "")})}
    return xr.Dataset(data, coords={c: ds[c] for c in ("bin1", "bin2", "bin3", "k")})


# --------------------------------------------------------------------------- product store
def write_bispectrum(ds: xr.Dataset, path: str | os.PathLike, *, overwrite: bool = False,
                     inputs=()) -> str:
    """Write a :func:`bispectrum` Dataset as a Zarr v3 product store, atomically and
    with every chunk's checksum in the manifest (group ``bispectrum``)."""
    from ..store.zarr_write import write_dataset_store

    return write_dataset_store(ds, path, group="bispectrum", fmt=FORMAT,
                               version=FORMAT_VERSION, what="bispectrum store",
                               overwrite=overwrite, inputs=inputs)


def open_bispectrum(path: str | os.PathLike) -> xr.Dataset:
    """The Dataset of a store written by :func:`write_bispectrum` (chunks verified)."""
    from ..store.zarr_read import open_dataset_store

    return open_dataset_store(path, group="bispectrum", fmt=FORMAT, version=FORMAT_VERSION,
                              what="bispectrum store")
