"""Input preparation shared by SCF and MEX: checks, centres, periodic unwrapping."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask import Snapshot
from cosmo_dask.core.errors import ParameterError
from cosmo_dask.expansion import MEX, SCF, expansion_input


def test_empty_input_is_refused():
    for model in (SCF(2, 2), MEX(2)):
        with pytest.raises(ParameterError, match="no particles"):
            model.fit(np.empty((0, 3)), 1.0)


def test_periodic_snapshot_needs_an_explicit_centre(rng):
    box = 10.0
    pos = rng.random((500, 3)) * box
    snap = Snapshot.from_arrays(pos, box_size=box, mass=np.full(500, 2.0))
    for model in (SCF(2, 2), MEX(2), SCF(2, 2, center="potential_min")):
        with pytest.raises(ParameterError, match="periodic box"):
            model.fit(snap)
    # with a point: positions are unwrapped to the nearest image about it
    c = np.array([0.5, 9.7, 5.0])
    got = expansion_input(snap, center=c)
    d = pos - c
    d -= box * np.round(d / box)
    np.testing.assert_allclose(got.pos.compute(), d, rtol=0, atol=1e-12)
    assert np.all(np.abs(got.pos.compute()) <= box / 2)
    np.testing.assert_array_equal(got.center, c)


def test_centre_of_mass_masses_and_g(rng):
    pos = rng.normal(size=(1000, 3)) + np.array([3.0, -1.0, 0.5])
    mass = rng.uniform(0.5, 2.0, 1000)
    got = expansion_input(pos, mass)
    com = (pos * mass[:, None]).sum(0) / mass.sum()
    np.testing.assert_allclose(got.center, com, rtol=1e-13)
    np.testing.assert_allclose(got.pos.compute(), pos - com, rtol=0, atol=1e-12)
    assert got.G == 1.0
    snap = Snapshot.from_arrays(pos, particle_mass=0.25, G=4.3e-6)
    got = expansion_input(snap)
    assert got.G == 4.3e-6
    np.testing.assert_array_equal(got.mass.compute(), np.full(1000, 0.25))
    with pytest.raises(ParameterError, match="G must be"):
        expansion_input(pos, mass, G=-1.0)
    with pytest.raises(ParameterError, match="center"):
        expansion_input(pos, mass, center=(1.0, 2.0))


def test_deferred_checks_still_refuse_bad_values(rng):
    """With a given centre SCF reads the data once: the checks ride along with the sums."""
    pos = rng.normal(size=(300, 3))
    mass = np.full(300, 1.0)
    bad_mass = mass.copy()
    bad_mass[7] = 0.0
    with pytest.raises(ParameterError, match="positive and finite"):
        SCF(2, 2, center=(0, 0, 0)).fit(pos, bad_mass)
    bad_pos = pos.copy()
    bad_pos[3, 2] = np.inf
    with pytest.raises(ParameterError, match="non-finite"):
        SCF(2, 2, center=(0, 0, 0)).fit(bad_pos, mass)
    inp = expansion_input(pos, mass, center=(0, 0, 0), defer_checks=True)
    assert len(inp.checks) == 1  # one per-chunk table: masses' range, finite positions
    assert expansion_input(pos, mass, defer_checks=True).checks == ()  # "com" reads anyway
