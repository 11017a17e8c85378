"""Power spectrum (and Legendre multipoles) of particles or of a density mesh.

Method (the mesh path, ``docs/fft.md``): the particles are painted
in slabs along x (:func:`cosmo_dask.density.painting.paint_meshes`; CPU numba or
GPU CuPy by chunk type), the mesh less its mean (only ``k = 0`` changes; a
float32 FFT is more accurate without the mean) is transformed by the
distributed real FFT (:func:`cosmo_dask.spatial.fft.rfftn`: ``scipy.fft`` or
``cupy.fft`` per slab, a transpose between) in the ``precision`` dtype, and
every k-space slab is binned by its own ``power-bin`` task
(:func:`cosmo_dask.spatial.fft.reduce_kslabs`), the bins summed over slabs:
no task holds the whole mesh unless it is one slab (the default for a complex
mesh up to 256 MiB). The total mass (the sum of the mesh) normalises
``delta_k = FFT(mesh) / total`` for ``k != 0``. With ``interlace=True`` a
second mesh is painted with positions shifted by half a cell and, per k-space
slab, the two transforms are averaged with the phase factor
``exp(i (kx + ky + kz) H / 2)``, which cancels the odd aliasing images
(Sefusatti et al. 2016). Each mode is divided by the assignment window
``W(k)^2``, ``W = prod_i sinc(k_i H / 2)^p`` (``p`` = 1, 2, 3, 4 for NGP, CIC,
TSC, PCS; ``sinc(x) = sin(x)/x``).

The estimator is ``P(k) = V |delta_k|^2`` with ``delta_k`` the continuous
normalisation (``FFT * V_cell / V``), averaged over the modes of each ``|k|``
bin, **without shot-noise subtraction**; the shot noise of the particles is
reported alongside (``V / N`` for equal masses, ``V sum m^2 / (sum m)^2`` in
general). Units: box units cubed (``(Mpc/h)^3`` for a box in Mpc/h); ``k`` in
``2 pi / `` box units (``h/Mpc``).

Multipoles: ``P_l(k) = (2 l + 1) < |delta_k|^2 L_l(mu) >`` with
``mu = k . los / |k|`` (plane-parallel line of sight ``los``).

Mode counting: the real FFT stores the half space ``kz >= 0``; modes with
``0 < kz < k_Nyquist`` stand for themselves and their conjugate ``-k`` (weight
2), those on the ``kz = 0`` and (even ``n``) ``kz = k_Nyquist`` planes appear
with their conjugates already (weight 1). ``n_modes`` therefore counts all
modes of the full ``k`` space in the bin, ``k`` and ``-k`` separately (so the
Gaussian variance of the bin average is ``2 P^2 / n_modes``). ``k = 0`` is
never counted.

Cost: painting O(N p^3) (twice with interlacing), one (two) distributed real
FFT of ``n^3`` (O(n^3 log n)), binning O(n^3) per k-space slab. Memory: about
two meshes (four with interlacing) over the cluster at peak, a few slabs per
task; ``n_mesh`` up to 4096, checked against the workers' memory before any
work.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import xarray as xr

from ..core.backend import array_module, host, resolve_precision
from ..core.errors import ParameterError
from ..core.progress import compute
from ..density import parameters as dp
from ..density.painting import (
    centred,
    interlace_kslab,
    mesh_slabs,
    mesh_statistic_input,
    paint_meshes,
)
from ..plot.power import plot_power_spectrum  # noqa: F401  (public here)
from ..spatial.fft import reduce_kslabs, rfftn, slab_chunks
from ..units import factor
from ..units.products import product_units
from .parameters import INTERLACE_DEFAULT, POLES_DEFAULT, check_los_poles

__all__ = ["linear_power", "power_spectrum", "plot_power_spectrum"]

def _default_edges(n, box):
    kf = 2 * np.pi / box
    return kf * (np.arange(n // 2 + 1) + 0.5)  # bins centred on kf, 2 kf, ..., k_Nyquist


def _legendre(ell, mu):
    if ell == 0:
        return 1.0
    mu2 = mu * mu
    if ell == 2:
        return 1.5 * mu2 - 0.5
    return (35.0 * mu2 * mu2 - 30.0 * mu2 + 3.0) / 8.0


#: modes binned per vectorised step (a k-slab is cut along x into pieces of about this
#: many): CPU caches like small pieces, a GPU wants few kernel launches
_BIN_MODES = {"cpu": 2**19, "gpu": 2**25}


def _bin_kslab(f0, kx, ky, kz, f1=None, *, n, box, scheme, edges, los, poles):
    """``power-bin``: one k-space slab's window-compensated power, binned in ``|k|``.

    ``f0`` (and ``f1``, the half-cell-shifted mesh's slab, combined by
    :func:`~cosmo_dask.density.painting.interlace_kslab`) is the unnormalised FFT of
    the mass mesh; ``kx, ky, kz`` its float64 wavenumbers. Returns a host float64
    array ``(2 + len(poles), n_bins)``: rows = sum of mode weights (n_modes),
    sum of weight*|k|, then sum of weight*|F|^2 / W^2 L_l(mu) per pole.
    """
    xp = array_module(f0)
    h = box / n
    p = dp.SCHEMES[scheme] if scheme is not None else 0

    def window2(k):
        return xp.sinc(k * h / (2 * np.pi)) ** (2 * p)  # np.sinc(x) = sin(pi x)/(pi x)

    wy, wz = window2(ky), window2(kz)
    nk = kz.shape[2]
    mult = np.full(nk, 2.0)  # kz > 0 stands for itself and its conjugate
    mult[0] = 1.0
    if n % 2 == 0:
        mult[-1] = 1.0
    mult = xp.asarray(mult)[None, None, :]
    edges_d = xp.asarray(edges)
    nb = len(edges) - 1
    out = xp.zeros((2 + len(poles), nb), dtype=np.float64)
    per_row = max(1, f0.shape[1] * f0.shape[2])
    sub = max(1, _BIN_MODES["cpu" if xp is np else "gpu"] // per_row)
    for x0 in range(0, f0.shape[0], sub):
        x1 = min(f0.shape[0], x0 + sub)
        f = f0[x0:x1].astype(np.complex128)
        if f1 is not None:
            f = interlace_kslab(f, kx[x0:x1], ky, kz, f1[x0:x1].astype(np.complex128),
                                cell=h)
        kxs = kx[x0:x1]
        kk = xp.sqrt(kxs * kxs + ky * ky + kz * kz)
        power = f.real ** 2 + f.imag ** 2
        power /= window2(kxs) * wy * wz
        idx = xp.searchsorted(edges_d, kk.ravel(), side="right") - 1
        w = xp.broadcast_to(mult, kk.shape).ravel().copy()
        w[(idx < 0) | (idx >= nb) | (kk.ravel() == 0)] = 0.0
        idx = xp.clip(idx, 0, nb - 1)
        out[0] += xp.bincount(idx, weights=w, minlength=nb)[:nb]
        out[1] += xp.bincount(idx, weights=w * kk.ravel(), minlength=nb)[:nb]
        pw = power.ravel() * w
        if los is not None:
            safe = xp.where(kk == 0, 1.0, kk)
            mu = ((kxs * los[0] + ky * los[1] + kz * los[2]) / safe).ravel()
        for j, ell in enumerate(poles):
            if ell == 0:
                out[2 + j] += xp.bincount(idx, weights=pw, minlength=nb)[:nb]
            else:
                out[2 + j] += xp.bincount(idx, weights=pw * _legendre(ell, mu),
                                          minlength=nb)[:nb]
    return host(out)


def power_spectrum(snap_or_mesh, *, n_mesh=None, box_size=None, scheme=dp.SCHEME_DEFAULT,
                   interlace=INTERLACE_DEFAULT, k_bins=None, los=None, poles=POLES_DEFAULT,
                   mass=None, precision="float64",
                   split_every=None, length_unit=None, slabs=None) -> xr.Dataset:
    """Power spectrum of a periodic particle set or of a mesh, binned in ``|k|``.

    Parameters
    ----------
    snap_or_mesh : Snapshot, array (N, 3) or array (n, n, n)
        A periodic snapshot, particle positions (NumPy/CuPy/dask; CuPy chunks
        run on the GPU), or an already painted mesh (mass or density per cell;
        any positive mean) of ``n^3`` cells, which is used as is (no interlacing).
    n_mesh : int
        Cells per side for particles (required for particles; ignored, must
        match if given, for a mesh). ``k_Nyquist = pi n / L``.
    box_size : float, optional
        Required for raw positions, a mesh, or a snapshot without ``box_size``.
    scheme : {"ngp", "cic", "tsc", "pcs"} or None
        Mass assignment for particles; its window ``sinc^p`` is divided out.
        For a mesh input, the scheme it was painted with (None: no compensation).
    interlace : bool
        Particles only: paint a second mesh shifted by half a cell and average
        in Fourier space (suppresses aliasing; twice the painting cost).
    k_bins : array of edges or int, optional
        Bin edges in ``2 pi /`` box units, or a number of linear bins from
        ``k_f / 2`` to ``k_Nyquist + k_f / 2``. Default: width ``k_f = 2 pi / L``,
        centred on ``k_f, 2 k_f, ..., k_Nyquist`` (``n // 2`` bins).
    los : int, str or 3-vector, optional
        Line of sight for multipoles (axis 0/1/2, "x"/"y"/"z" or a vector). Default
        for ``l > 0``: a redshift-space snapshot's own (:meth:`Snapshot.to_redshift_space
        <cosmo_dask.store.snapshot.Snapshot.to_redshift_space>`, its ``los``); others
        need it.
    poles : tuple of int
        Legendre multipoles among 0, 2, 4 (``l > 0`` needs ``los``).
    mass : array (N,) or float, optional
        Particle masses (default: the snapshot's; 1 for raw positions).
    precision : {"float64", "float32"}
        Dtype of the painted meshes and of their FFTs (complex128 or complex64;
        a mesh input is converted to it). float32 halves the memory; its P(k)
        differs from float64's by about 1e-6 relative (the FFT's rounding).
        The binning is float64 in both.
    split_every : int, optional
        Fan-in of the sums of a slab's partial deposits (see
        :func:`~cosmo_dask.density.paint`).
    length_unit : str, optional
        Unit of positions and box (default: the snapshot's ``units["length"]``,
        else the label ``"input length"``): ``k`` is in its inverse (``"h / Mpc"``
        for ``Mpc/h``), ``power`` in its cube (``"Mpc3 / h3"``), as
        :func:`cosmo_dask.units.products.product_units` spells them.
    slabs : int, optional
        Slabs of the mesh path (default:
        :func:`~cosmo_dask.spatial.fft.default_slab_count` or the dask config key
        ``cosmo_dask.mesh_slabs``); checked against the workers' memory.

    Returns
    -------
    xarray.Dataset
        Dimension ``k`` (bins), coordinate ``k`` = mean ``|k|`` of the modes in the
        bin (the bin centre where empty), ``k_min``/``k_max`` the bin edges;
        ``power`` (monopole ``P_0``, NaN where empty), ``n_modes`` (int, full
        k-space count), ``shot_noise`` (scalar; NaN for a mesh input), and, when
        ``poles`` is not ``(0,)``, ``multipoles`` ``(ell, k)``. Attributes:
        ``box_size``, ``n_mesh``, ``scheme``, ``interlace``, ``n_particles``,
        ``shot_noise_subtracted = 0``, ``los``, ``length_unit``. No shot noise is
        subtracted. Every variable and coordinate has a ``units`` attribute.

    Raises
    ------
    ParameterError
        Bad ``n_mesh`` (not a valid mesh side: up to 4096, prime factors 2, 3,
        5, 7), scheme, box, bins, poles, line of sight, masses, ``slabs``, or a
        mesh that does not fit the workers' memory (naming what fits).

    Notes
    -----
    The mesh is painted, transformed and binned slab by slab (module
    docstring): no task holds the whole mesh unless it is one slab. Costs:
    paint O(N p^3) per mesh, FFT O(n^3 log n), binning O(n^3).
    """
    from ..store.snapshot import Snapshot

    what = "power_spectrum"
    if los is None and isinstance(snap_or_mesh, Snapshot) and snap_or_mesh.los is not None \
            and poles is not None and any(p != 0 for p in np.atleast_1d(poles)):
        los = snap_or_mesh.los  # a redshift-space snapshot: its own line of sight
    los_v, poles = check_los_poles(los, poles)
    if scheme is not None:
        scheme = dp.check_scheme(scheme, what)
    split_every = dp.check_split_every(split_every, what)
    dtype = resolve_precision(precision)
    given = mesh_statistic_input(snap_or_mesh, n_mesh=n_mesh, box_size=box_size, scheme=scheme,
                                 mass=mass, length_unit=length_unit, what=what)
    pu = product_units({"length": given.length_unit} if given.length_unit else None)
    length_unit = pu["length"]
    n, box, is_mesh, n_part = given.n, given.box_size, given.is_mesh, given.n_particles
    if is_mesh:
        mesh = given.mesh
        count = mesh_slabs(n, dtype, slabs, gpu=given.gpu, what=what)
        if not isinstance(mesh, da.Array):
            mesh = da.from_array(mesh, chunks=(slab_chunks(n, count), n, n), asarray=False)
        elif len(mesh.chunks[1]) > 1 or len(mesh.chunks[2]) > 1:
            mesh = mesh.rechunk((slab_chunks(n, count), n, n))
        mesh0, mesh1 = mesh.astype(dtype), None
        shot = float("nan")
        sums = None
    else:
        if n < 2:
            raise ParameterError(f"{what}: n_mesh must be at least 2 for a power spectrum, "
                                 f"got {n}")
        pos, m = given.pos, given.mass
        shifts = (0.0, 0.5) if interlace else (0.0,)
        meshes, _ = paint_meshes(pos, m, n_mesh=n, box_size=box, scheme=scheme, shifts=shifts,
                                 dtype=dtype, slabs=slabs, split_every=split_every, what=what)
        mesh0, mesh1 = meshes[0], (meshes[1] if interlace else None)
        sums = None if not isinstance(m, da.Array) else (
            m.astype(np.float64).sum(), (m.astype(np.float64) ** 2).sum())
    if k_bins is None:
        edges = _default_edges(n, box)
    elif isinstance(k_bins, (int, np.integer)) and not isinstance(k_bins, bool):
        if k_bins < 1:
            raise ParameterError(f"{what}: k_bins must be >= 1, got {k_bins}")
        kf = 2 * np.pi / box
        edges = np.linspace(0.5 * kf, np.pi * n / box + 0.5 * kf, int(k_bins) + 1)
    else:
        edges = np.asarray(k_bins, dtype=np.float64)
        if edges.ndim != 1 or edges.size < 2 or not np.all(np.isfinite(edges)) or \
                np.any(np.diff(edges) <= 0) or edges[0] < 0:
            raise ParameterError(f"{what}: k_bins must be increasing non-negative edges "
                                 "(at least 2) or a number of bins")
    req = poles
    poles = poles if 0 in poles else (0,) + poles  # the monopole is always computed
    shape = (n, n, n)
    kmeshes = [rfftn(centred(mesh0))] + ([rfftn(centred(mesh1))] if mesh1 is not None else [])
    binned = reduce_kslabs(_bin_kslab, *kmeshes, shape=shape, box_size=box, name="power-bin",
                           out_shape=(2 + len(poles), len(edges) - 1), n=n, box=box,
                           scheme=scheme, edges=edges, los=los_v, poles=poles)
    total = mesh0.sum(dtype=np.float64)
    if sums is not None:
        res, tot, ms, m2s = compute(binned, total, sums[0], sums[1], label="power spectrum")
        shot = box**3 * float(m2s) / float(ms) ** 2
    else:
        res, tot = compute(binned, total, label="power spectrum")
        if not is_mesh:
            shot = box**3 / n_part
    # delta_k (continuous normalisation) = FFT(mesh / mean - 1) V_cell / V = FFT(mesh) / total
    res = np.array(res, dtype=np.float64)
    res[2:] /= float(tot) ** 2
    volume = box**3
    n_modes = res[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        kmean = np.where(n_modes > 0, res[1] / n_modes, 0.5 * (edges[1:] + edges[:-1]))
        pole_p = np.stack([(2 * ell + 1) * volume * res[2 + j] / n_modes
                           for j, ell in enumerate(poles)])
    pole_p[:, n_modes == 0] = np.nan
    k_unit, p_unit = pu["inverse_length"], pu["volume"]
    coords = {"k": ("k", kmean, {"units": k_unit, "long_name": "mean |k| of the bin's modes"}),
              "k_min": ("k", edges[:-1], {"units": k_unit}),
              "k_max": ("k", edges[1:], {"units": k_unit})}
    mono = pole_p[poles.index(0)]
    data = {
        "power": ("k", mono, {"long_name": "P_0(k), shot noise not subtracted",
                              "units": p_unit}),
        "n_modes": ("k", np.rint(n_modes).astype(np.int64),
                    {"long_name": "modes in the bin (k and -k counted separately)",
                     "units": "1"}),
        "shot_noise": ((), shot, {"long_name": "V sum m^2 / (sum m)^2 (V/N, equal masses)",
                                  "units": p_unit}),
    }
    if tuple(req) != (0,):
        data["multipoles"] = (("ell", "k"), pole_p[[poles.index(ell) for ell in req]],
                              {"long_name": "P_ell(k)", "units": p_unit})
        coords["ell"] = ("ell", np.asarray(req, dtype=np.int64), {"units": "1"})
    attrs = {"box_size": box, "length_unit": length_unit, "n_mesh": n,
             "scheme": scheme if scheme else "none",
             "interlace": int(mesh1 is not None), "shot_noise_subtracted": 0,
             "n_particles": -1 if n_part is None else int(n_part),
             "k_fundamental": 2 * np.pi / box, "k_nyquist": np.pi * n / box,
             "los": [] if los_v is None else [float(v) for v in los_v],
             "estimator": "FFT, window-compensated (sinc^p), "
                          + ("interlaced" if mesh1 is not None else "not interlaced")}
    return xr.Dataset(data, coords=coords, attrs=attrs)


def linear_power(cosmology, scale_factor: float, length_unit: str = "Mpc/h"):
    """Linear-theory ``P(k)`` at ``scale_factor`` as a function of ``k`` in the inverse of
    ``length_unit``, giving ``P`` in its cube (the reference curve of
    :func:`plot_power_spectrum` in the data's own units).

    ``cosmology`` is a :class:`~cosmo_dask.models.cosmology.Cosmology` (EH98 no-wiggle,
    normalised to its ``sigma8``, which is defined in Mpc/h); the conversion from
    h/Mpc and (Mpc/h)^3 uses :mod:`cosmo_dask.units` (and ``h`` where ``length_unit``
    has no ``/h``).
    """
    to_mpc = factor(length_unit, "Mpc/h", "length", h=cosmology.h)  # data length -> Mpc/h
    growth2 = float(cosmology.growth_factor(scale_factor)) ** 2

    def reference(k):
        k = np.asarray(k, dtype=np.float64)
        return cosmology.power_spectrum(k / to_mpc) * growth2 / to_mpc**3

    reference.label = f"linear theory (z = {1 / scale_factor - 1:.3g})"
    return reference
