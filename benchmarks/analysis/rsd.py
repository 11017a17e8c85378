"""Redshift space: the Kaiser multipoles of 2LPT initial conditions, and the cost of the shift.

Workload: ``lpt_ics(n_side, box_size=BOX, redshift=Z, order=2, fixed_amplitude=...)``
(float64, seed ``--seed``), held in memory (``persist``), then
``snap.to_redshift_space("z")``; ``power_spectrum`` with ``n_mesh = n_side`` of both
(real space: monopole; redshift space: l = 0, 2, 4 along the snapshot's own line of
sight). For every bin with ``k_min < k_Nyquist / 2``:

* ``P_0^s / P_0^r`` and ``P_2^s / P_0^r`` against Kaiser's factor summed over the
  bin's own modes, ``sum w (2l+1) (1 + f mu^2)^2 L_l(mu) / sum w`` (``w`` = the linear
  P(k); ``tests/support/kaiser.py``), ``f`` from ``Cosmology.growth_rate``: the row's
  ``max_dev_0``, ``max_dev_2`` (largest |measured / expected - 1|) and the per-bin
  lists ``k``, ``n_modes``, ``ratio_0/2/4``, ``expected_0/2/4``;
* the continuum factors ``1 + 2f/3 + f^2/5`` and ``4f/3 + 4f^2/7`` for reference
  (``kaiser_0``, ``kaiser_2``), and the modes' average of the discrete expectation.

One row per (size, scheme, fixed amplitudes or not): ``--schemes cic,pcs`` shows why the
tests paint with PCS (a lattice's particles sit on the kink of CIC's kernel), and
``--fixed both`` shows what random amplitudes add (the weights ``|delta_r(k)|^2`` of a
bin's modes are then not the smooth P(k)). Timed (wall clock, after the ICs are held):
``shift_s``, the shifted positions computed and reduced (a sum per chunk);
``power_s``, the redshift-space ``power_spectrum``.

GPU (``--device gpu``): the ICs are made on the GPU (CuPy chunks); the rest is the same.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--sizes", default="128", help="n_side values, comma separated")
    ap.add_argument("--box", type=float, default=1000.0, help="box side, Mpc/h")
    ap.add_argument("--redshift", type=float, default=20.0)
    ap.add_argument("--schemes", default="pcs,cic", help="mass assignments, comma separated")
    ap.add_argument("--fixed", choices=("yes", "no", "both"), default="both",
                    help="fixed-amplitude ICs, random ones, or both")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    start(args, "rsd")

    from cosmo_dask.analysis import power_spectrum
    from cosmo_dask.core.progress import compute
    from cosmo_dask.models.cosmology import Cosmology
    from cosmo_dask.models.lpt import lpt_ics
    from tests.support.kaiser import kaiser_bin_ratios, kaiser_continuum

    fixed_list = {"yes": (True,), "no": (False,), "both": (True, False)}[args.fixed]
    for n_side in (int(v) for v in args.sizes.split(",")):
        for fixed in fixed_list:
            t0 = time.perf_counter()
            ics = lpt_ics(n_side, box_size=args.box, redshift=args.redshift, order=2,
                          fixed_amplitude=fixed, seed=args.seed, precision="float64",
                          device=args.device).persist()
            compute(ics.pos.sum(), label=None, show=False)
            ics_s = time.perf_counter() - t0
            cosmo = Cosmology.coerce(ics.cosmology)
            f = float(cosmo.growth_rate(ics.scale_factor))
            rs = ics.to_redshift_space("z")
            t0 = time.perf_counter()
            compute(rs.pos.map_blocks(lambda x: x.sum(axis=0, keepdims=True),
                                      chunks=(1, 3)).sum(axis=0), label=None, show=False)
            shift_s = time.perf_counter() - t0
            for scheme in args.schemes.split(","):
                real = power_spectrum(ics, n_mesh=n_side, scheme=scheme)
                t0 = time.perf_counter()
                red = power_spectrum(rs, n_mesh=n_side, scheme=scheme, poles=(0, 2, 4))
                power_s = time.perf_counter() - t0
                edges = np.r_[real["k_min"].values, real["k_max"].values[-1]]
                n_modes, expected = kaiser_bin_ratios(n_side, args.box, edges, rs.los, f,
                                                      weight=cosmo.power_spectrum)
                assert np.array_equal(n_modes, red["n_modes"].values)
                sel = red["k_min"].values < red.attrs["k_nyquist"] / 2
                ratio = red["multipoles"].values[:, sel] / real["power"].values[sel]
                exp = expected[:, sel]
                dev = ratio / exp - 1.0
                cont = kaiser_continuum(f)
                mean = (exp * n_modes[sel]).sum(axis=1) / n_modes[sel].sum()
                emit(n_side=n_side, box=args.box, redshift=args.redshift, f=f, scheme=scheme,
                     fixed=fixed, n_bins=int(sel.sum()),
                     k_max=float(red["k_max"].values[sel][-1]),
                     max_dev_0=float(np.abs(dev[0]).max()),
                     max_dev_2=float(np.abs(dev[1]).max()),
                     max_dev_2_low=float(np.abs(dev[1][:len(dev[1]) // 2]).max()),
                     kaiser_0=cont[0], kaiser_2=cont[2],
                     discrete_mean_0=float(mean[0]), discrete_mean_2=float(mean[1]),
                     ics_s=ics_s, shift_s=shift_s, power_s=power_s,
                     k=[round(float(v), 6) for v in red["k"].values[sel]],
                     n_modes=[int(v) for v in n_modes[sel]],
                     **{f"ratio_{ell}": [round(float(v), 5) for v in ratio[j]]
                        for j, ell in enumerate((0, 2, 4))},
                     **{f"expected_{ell}": [round(float(v), 5) for v in exp[j]]
                        for j, ell in enumerate((0, 2, 4))})


if __name__ == "__main__":
    main()
