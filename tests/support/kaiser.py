"""Kaiser's linear redshift-space multipoles, continuous and on a box's discrete modes.

In linear theory each Fourier mode of the redshift-space density is the real-space one
times ``1 + f mu^2`` (Kaiser 1987), ``mu`` the cosine between k and the line of sight.
The multipoles ``P_l = (2l + 1) <|delta_s|^2 L_l(mu)>`` of a bin are then the bin's average
over its modes of ``(2l + 1) (1 + f mu^2)^2 L_l(mu) |delta_r|^2``; on the continuum
(isotropic modes) the ratios to ``P_0`` in real space are ``1 + 2f/3 + f^2/5``,
``4f/3 + 4f^2/7`` and ``8f^2/35``. In a finite box the mu of a shell's modes take
discrete values: :func:`kaiser_bin_ratios` sums over exactly the modes that
``cosmo_dask.analysis.power_spectrum`` puts in each bin (full k-space, ``k = 0`` left
out, a mode in the bin whose edges ``e_i <= |k| < e_(i+1)``), written independently of
it, with a weight per mode (the real-space power: the bin's P(k) is not flat).
Shared by tests/store/test_snapshot_redshift_space.py and the ``rsd`` benchmark.
"""

from __future__ import annotations

import numpy as np


def legendre(ell: int, mu):
    """Legendre polynomial ``L_ell(mu)`` for ell = 0, 2, 4."""
    mu = np.asarray(mu, dtype=np.float64)
    return {0: np.ones_like(mu), 2: 1.5 * mu**2 - 0.5,
            4: (35.0 * mu**4 - 30.0 * mu**2 + 3.0) / 8.0}[ell]


def kaiser_continuum(f: float) -> dict[int, float]:
    """``P_l^s / P_0^r`` of isotropic modes: ``{0: 1 + 2f/3 + f^2/5, 2: 4f/3 + 4f^2/7,
    4: 8f^2/35}``."""
    return {0: 1.0 + 2.0 * f / 3.0 + f * f / 5.0, 2: 4.0 * f / 3.0 + 4.0 * f * f / 7.0,
            4: 8.0 * f * f / 35.0}


def kaiser_bin_ratios(n_mesh: int, box_size: float, edges, los, f: float,
                      poles=(0, 2, 4), weight=None) -> tuple[np.ndarray, np.ndarray]:
    """``(n_modes, ratios)``: per bin of ``edges`` (|k|, in 1/box units), the number of
    modes and, for each pole, ``sum_modes w (2l+1) (1 + f mu^2)^2 L_l(mu) / sum_modes w``
    (shape ``(len(poles), n_bins)``; NaN where a bin is empty), the modes being those of
    the ``n_mesh^3`` FFT grid of a box of side ``box_size``. ``w`` is ``weight(|k|)``
    (e.g. the linear power spectrum) or 1."""
    n = int(n_mesh)
    kf = 2.0 * np.pi / box_size
    k1 = np.fft.fftfreq(n, d=1.0 / n) * kf
    kx, ky, kz = np.meshgrid(k1, k1, k1, indexing="ij")
    kk = np.sqrt(kx**2 + ky**2 + kz**2).ravel()
    los = np.asarray(los, dtype=np.float64)
    los = los / np.linalg.norm(los)
    kdotn = (kx * los[0] + ky * los[1] + kz * los[2]).ravel()
    keep = kk > 0
    kk, kdotn = kk[keep], kdotn[keep]
    mu = kdotn / kk
    edges = np.asarray(edges, dtype=np.float64)
    nb = len(edges) - 1
    idx = np.searchsorted(edges, kk, side="right") - 1
    inside = (idx >= 0) & (idx < nb)
    idx, mu, kk = idx[inside], mu[inside], kk[inside]
    w = np.ones_like(kk) if weight is None else np.asarray(weight(kk), dtype=np.float64)
    n_modes = np.bincount(idx, minlength=nb)[:nb]
    wsum = np.bincount(idx, weights=w, minlength=nb)[:nb]
    kaiser = (1.0 + f * mu * mu) ** 2
    out = np.empty((len(poles), nb))
    with np.errstate(invalid="ignore", divide="ignore"):
        for j, ell in enumerate(poles):
            num = np.bincount(idx, weights=w * (2 * ell + 1) * kaiser * legendre(ell, mu),
                              minlength=nb)[:nb]
            out[j] = np.where(n_modes > 0, num / wsum, np.nan)
    return n_modes, out
