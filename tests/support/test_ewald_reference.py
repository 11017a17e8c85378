"""The Ewald reference of the PM/TreePM tests checked on its own.

Checks (all float64): the answer does not depend on the splitting parameter;
a simple cubic lattice has zero force and the Madelung potential; one particle
alone feels no force and has the Madelung self-potential; a close pair feels
Newton plus the background's linear pull ``+ (4 pi G m / 3 L^3) r_vec``.
"""

from __future__ import annotations

import numpy as np

from tests.support.ewald_reference import MADELUNG_SC, ewald, ewald_long_range, ewald_parameters


def test_split_independence(rng):
    """real_cut = L/2 (alpha L = 10.1, 17 wave numbers per half axis) vs 1.3 L (alpha L =
    3.9, 7): measured max difference 2e-13 (force) and 7e-13 (potential), relative."""
    box = 2.0
    pos = rng.random((64, 3)) * box
    mass = rng.random(64) + 0.5
    a1, p1 = ewald(pos, mass, box)
    a2, p2 = ewald(pos, mass, box, real_cut=1.3 * box)
    assert ewald_parameters(box)[0] > 2 * ewald_parameters(box, real_cut=1.3 * box)[0]
    assert np.abs(a1 - a2).max() <= 1e-10 * np.abs(a1).max()
    assert np.abs(p1 - p2).max() <= 1e-10 * np.abs(p1).max()


def test_simple_cubic_lattice():
    """4^3 particles on a cubic lattice (spacing a): a = 0 (measured 8e-11 of G m / a^2)
    and phi = 2.8372974794806 G m / a (measured to 1e-12 relative)."""
    box, n, m, G = 2.0, 4, 1.5, 0.7
    a = box / n
    pos = (np.indices((n, n, n)).reshape(3, -1).T + 0.3) * a
    acc, pot = ewald(pos, m, box, G=G)
    assert np.abs(acc).max() <= 1e-9 * G * m / a**2
    np.testing.assert_allclose(pot, MADELUNG_SC * G * m / a, rtol=1e-10)


def test_single_particle():
    box, m = 3.0, 2.0
    acc, pot = ewald(np.array([[0.1, 0.2, 2.9]]), m, box)
    assert np.abs(acc).max() <= 1e-12 * m / box**2
    np.testing.assert_allclose(pot, MADELUNG_SC * m / box, rtol=1e-11)


def test_close_pair_newton_plus_background():
    """At r = 0.011 L the periodic pair force is -m r/r^3 + (4 pi m / 3 L^3) r_vec up to
    a hexadecapole term ~ r^3 / L^5 (measured difference 1.3e-9 relative); leaving out the
    background term would err by 5e-6."""
    box = 2.0
    r = np.array([0.02, -0.01, 0.005])
    pos = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]) + np.array([[0, 0, 0], r])
    acc, _ = ewald(pos, 1.0, box)
    d = -r
    ref = -d / np.linalg.norm(d) ** 3 + 4 * np.pi / (3 * box**3) * d
    assert np.abs(acc[0] - ref).max() <= 1e-8 * np.abs(ref).max()
    np.testing.assert_allclose(acc[1], -acc[0], rtol=1e-12)


def test_long_range_part_is_total_minus_short(rng):
    """ewald_long_range(rs) = full Ewald - the real-space erfc sum (alpha = 1/(2 rs)) -
    the constants; checked via the force with the real-space part written here directly."""
    from scipy.special import erfc

    box, rs = 1.0, 0.04
    pos = rng.random((40, 3)) * box
    mass = rng.random(40) + 0.5
    full, _ = ewald(pos, mass, box)
    lr, _ = ewald_long_range(pos, mass, box, rs=rs)
    d = pos[:, None, :] - pos[None, :, :]
    d -= box * np.rint(d / box)
    r = np.linalg.norm(d, axis=-1)
    np.fill_diagonal(r, np.inf)
    x = r / (2 * rs)
    with np.errstate(invalid="ignore"):
        t = erfc(x) + 2 * x / np.sqrt(np.pi) * np.exp(-x * x)
    w = np.where(np.isinf(r), 0.0, mass[None, :] * t / r**3)
    short = -np.einsum("ij,ijk->ik", w, d)  # x <= 6.25 at r = L/2
    np.testing.assert_allclose(lr + short, full, atol=1e-9 * np.abs(full).max())
