"""Merger trees (issue 33 item 2): member ids at halo outputs, the distributed id join
against a brute-force NumPy join, ytree reading the consistent-trees file, median mass
accretion histories against Correa et al. (2015), bad input and store integrity.

One module-scoped PM run (48^3 particles in 32 Mpc/h from z = 19, 20 steps, halos at six
outputs z = 1.5 ... 0, no particles written) serves every test that needs a tree.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from cosmo_dask.cli import main
from cosmo_dask.core.errors import ChecksumError, ParameterError, SnapshotError
from cosmo_dask.halos import correa2015_mah, fof, merger_tree, open_merger_tree
from cosmo_dask.halos.members import member_arrays
from cosmo_dask.halos.merger_trees import mass_bins
from cosmo_dask.models import zeldovich
from cosmo_dask.simulation import open_simulation, run
from cosmo_dask.store.snapshot import Snapshot
from tests.support.devices import DEVICES, to_host
from tests.support.halos import brute_potentials, plummer

OUTPUTS = [0.25, 0.5, 0.75, 1.0, 1.5]


@pytest.fixture(scope="module")
def sim_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("trees") / "sim"
    ics = zeldovich(48, box_size=32.0, redshift=19.0, seed=3, precision="float32")
    run(ics, n_steps=20, outputs=OUTPUTS, out=out, analyses=["halos"],
        write_particles=False, analysis_options={"halos": {"centers": ()}})
    return out


@pytest.fixture(scope="module")
def tree(sim_path):
    return merger_tree(open_simulation(sim_path))


# ----------------------------------------------------------------------------- members
@pytest.mark.parametrize("device", DEVICES)
def test_members_are_ranked_by_exact_binding_energy(device):
    """Two Plummer halos (one across the periodic boundary): every member's stored energy
    equals phi / a + |v - v_halo|^2 / 2 from a plain NumPy double sum, ids in that order
    (on GPU chunks the potentials come from the CUDA segment_potentials)."""
    rng = np.random.default_rng(4)
    box, a, G = 50.0, 0.5, 43.0
    p1 = plummer(rng, 600, a=0.3, rmax=2.0) + 10.0
    p2 = np.mod(plummer(rng, 400, a=0.2, rmax=1.5) + [49.5, 25.0, 25.0], box)
    pos = np.concatenate([p1, p2, rng.uniform(0, box, (200, 3))])
    vel = rng.normal(0, 50.0, pos.shape) + np.repeat([[100.0, 0, 0], [0, -80.0, 0],
                                                      [0, 0, 0]], [600, 400, 200], axis=0)
    ids = rng.permutation(pos.shape[0]).astype(np.int64) * 7 + 3
    mass = rng.uniform(0.5, 1.5, pos.shape[0])
    snap = Snapshot.from_arrays(pos, vel, ids, mass, box_size=box, scale_factor=a, G=G,
                                chunks=300)
    if device == "gpu":
        snap = snap.to_device("gpu")
    res = fof(snap, 0.3, absolute=True, min_members=50, centers=())
    assert res.n_halos == 2
    soft = 0.03
    ids_s, e_s, off, attrs = member_arrays(snap, res, softening=soft, n_buckets=2)
    ids_s, e_s = ids_s.compute(), e_s.compute()
    labels = to_host(res.labels.compute())
    for h in range(2):
        sel = np.flatnonzero(labels == h)
        phi = brute_potentials(pos[sel], mass[sel], [0, sel.size], eps=soft, box=box, G=G)
        vh = (mass[sel, None] * vel[sel]).sum(0) / mass[sel].sum()
        e = phi / a + 0.5 * ((vel[sel] - vh) ** 2).sum(1)
        order = np.argsort(e)
        np.testing.assert_array_equal(ids_s[off[h]:off[h + 1]], ids[sel][order])
        np.testing.assert_allclose(e_s[off[h]:off[h + 1]], e[order], rtol=1e-9)
    assert attrs["energy_units"]


def test_members_grid_potential_for_large_halos():
    """Above exact_max the grid potential ranks the members: the 20 most bound by the exact
    sum are mostly among the 40 most bound by the grid."""
    rng = np.random.default_rng(5)
    pos = plummer(rng, 3000, a=0.5, rmax=4.0) + 25.0
    vel = rng.normal(0, 30.0, pos.shape)
    snap = Snapshot.from_arrays(pos, vel, np.arange(3000), None, box_size=50.0,
                                particle_mass=1.0, scale_factor=1.0, G=1.0)
    res = fof(snap, 0.4, absolute=True, min_members=100, centers=())
    exact, _, off, _ = member_arrays(snap, res, softening=0.02)
    grid, _, _, _ = member_arrays(snap, res, softening=0.02, exact_max=100)
    exact, grid = exact.compute()[:off[1]], grid.compute()[:off[1]]
    assert set(exact) == set(grid)
    assert len(set(exact[:20]) & set(grid[:40])) >= 15


def test_members_stored_at_outputs(sim_path):
    """Every halo output holds its members (also without particles): counts equal the
    catalog's n_members, ids unique, energies ascending within each halo, units."""
    sim = open_simulation(sim_path)
    assert all(e["members"] and not e["snapshot"] for e in sim.outputs)
    for z in sim.redshifts:
        m, cat = sim.members(z), sim.halos(z)
        off = m["offsets"].values
        np.testing.assert_array_equal(np.diff(off), cat["n_members"].values)
        ids, e = m["ids"].values, m["binding_energy"].values
        assert np.unique(ids).size == ids.size
        h = np.repeat(np.arange(off.size - 1), np.diff(off))
        assert np.all((np.diff(e) >= 0) | (np.diff(h) > 0))
        assert m["binding_energy"].attrs["units"] == "km2 / s2"
        assert m["ids"].attrs["units"] == "1"


def test_a_flipped_byte_in_the_members_store_is_refused(sim_path, tmp_path):
    import shutil

    sim = open_simulation(sim_path)
    copy = tmp_path / "sim"
    shutil.copytree(sim_path, copy)
    name = sim.outputs[-1]["name"]
    chunk = next((copy / "outputs" / name / "members" / "ids" / "c").iterdir())
    data = bytearray(chunk.read_bytes())
    data[40] ^= 0x01
    chunk.write_bytes(bytes(data))
    with pytest.raises(ChecksumError):
        open_simulation(copy).members(0.0)["ids"].compute()


# ----------------------------------------------------------------------------- links
def _brute_links(sim, n_tracers):
    """Descendants by a dictionary join in plain Python/NumPy."""
    out = []
    zs = sim.redshifts
    for k in range(len(zs) - 1):
        m0, m1 = sim.members(zs[k]), sim.members(zs[k + 1])
        off0, ids0 = m0["offsets"].values, m0["ids"].values
        off1, ids1 = m1["offsets"].values, m1["ids"].values
        dmass = sim.halos(zs[k + 1])["mass"].values
        where = {int(i): h for h in range(off1.size - 1) for i in ids1[off1[h]:off1[h + 1]]}
        desc, shared = [], []
        for h in range(off0.size - 1):
            tracers = ids0[off0[h]:off0[h] + min(n_tracers, off0[h + 1] - off0[h])]
            c = Counter(where[int(i)] for i in tracers if int(i) in where)
            if not c:
                desc.append(-1)
                shared.append(0)
                continue
            best = max(c.items(), key=lambda kv: (kv[1], dmass[kv[0]], -kv[0]))
            desc.append(best[0])
            shared.append(best[1])
        out.append((np.array(desc), np.array(shared)))
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_links_equal_a_brute_force_join(sim_path, tree, device):
    sim = open_simulation(sim_path)
    t = tree if device == "cpu" else merger_tree(sim, device=device)
    if device != "cpu":
        assert t.parameters["device"] == "gpu"
    t7 = merger_tree(sim, n_tracers=7, n_buckets=3)
    for tr, n_tr in ((t, 20), (t7, 7)):
        for k, (desc, shared) in enumerate(_brute_links(sim, n_tr)):
            np.testing.assert_array_equal(tr.descendants(k), desc)
            sel = tr.links["prog_output"].values == k
            np.testing.assert_array_equal(tr.links["shared"].values[sel], shared)
    links = t.links
    assert links["prog_mass"].attrs["units"] == "1e10 Msun/h"
    assert (links["desc_halo"].values >= 0).mean() > 0.8  # most halos have a descendant


def test_main_branch(tree):
    """The main branch follows the most massive progenitor whose descendant is the
    current halo at every step."""
    br = tree.main_branch(0)
    assert br.sizes["output"] == len(OUTPUTS) + 1 and br["halo"].values[-1] == 0
    assert br["mass"].attrs["units"] == "1e10 Msun/h"
    chain = br["halo"].values
    for k in range(len(chain) - 1):
        if chain[k] < 0:
            continue
        desc = tree.descendants(k)
        progs = np.flatnonzero(desc == chain[k + 1])
        masses = tree.catalogs[k]["mass"].values
        assert chain[k] == progs[np.argmax(masses[progs])]
    with pytest.raises(ParameterError, match="halo must be an index"):
        tree.main_branch(10**6)


def test_ytree_finds_one_tree_per_final_halo(tree, tmp_path):
    ytree = pytest.importorskip("ytree")
    info = tree.to_ytree(tmp_path / "trees.dat")
    n_final = int(tree.outputs["n_halos"].values[-1])
    arbor = ytree.load(str(tmp_path / "trees.dat"))
    assert arbor.size == n_final == info["n_trees"]
    root = arbor[0]
    # the root's main progenitor line equals the tree's main branch (ytree: most massive)
    masses = root["prog", "mass"].to("Msun/h").value
    br = tree.main_branch(int(root["Orig_halo_ID"]))
    want = br["mass"].values[::-1]
    want = want[np.isfinite(want)] * 1e10
    np.testing.assert_allclose(masses, want, rtol=1e-5)
    assert (tmp_path / "trees.dat.crc32").is_file()


# ----------------------------------------------------------------------------- MAH
def test_median_mah_against_correa2015(tree):
    """Median M(z)/M0 of the final halos of >= 100 members in two mass bins (>= 10 halos
    each) against Correa et al. (2015) at each bin's median M0.

    Criterion (the scatter this 32 Mpc/h, 48^3 PM box allows): at every output with
    z <= 1 the fit lies inside the 16-84 % range of the individual histories (ended
    branches counted as 0), and at every z > 0 the medians are ordered as the fit orders
    them (the more massive bin assembled later: lower M/M0). At z = 1.5 the progenitors
    have a few tens of particles and the measured median of the massive bin is about half
    the fit (docs/structure.md discusses the offset), so that output is left out of the
    first check."""
    mah = tree.mass_accretion_histories()
    z = mah["redshift"].values
    m0 = mah["mass0"].values
    cosmo = tree.parameters["cosmology"]
    bins = mass_bins(tree, 2, min_particles=100)
    assert len(bins) == 2 and all(b.sum() >= 10 for b in bins)
    medians, fits = [], []
    for mask in bins:
        sub = mah["mah"].values[:, mask]
        filled = np.where(np.isfinite(sub), sub, 0.0)
        lo, med, hi = np.percentile(filled, [16, 50, 84], axis=1)
        fit = correa2015_mah(np.median(m0[mask]), z, cosmo)
        resolved = z <= 1.0
        assert np.all((fit >= lo)[resolved] & (fit <= hi)[resolved]), (z, lo, med, hi, fit)
        medians.append(med)
        fits.append(fit)
    later = z > 0
    assert np.all(fits[1][later] < fits[0][later])
    assert np.all(medians[1][later] < medians[0][later])


def test_correa2015_fit_values():
    """Independent numbers: alpha and beta from their definitions by hand for the
    default cosmology at M0 = 1e12 Msun (Correa et al. 2015 eqs. 17-23)."""
    from cosmo_dask.halos import sigma_of_mass
    from cosmo_dask.models.cosmology import Cosmology

    c = Cosmology.coerce(None)
    m0 = 1e12 * c.h / 1e10
    zf = -0.0064 * 12.0**2 + 0.0237 * 12.0 + 1.8837
    q = 4.137 * zf**-0.9476
    f = (sigma_of_mass(m0 / q, c) ** 2 - sigma_of_mass(m0, c) ** 2) ** -0.5
    alpha = (1.686 * np.sqrt(2 / np.pi) * -c.growth_rate(1.0) + 1) * f
    z = np.array([0.0, 1.0, 2.0])
    np.testing.assert_allclose(correa2015_mah(m0, z, c), (1 + z) ** alpha * np.exp(-f * z),
                               rtol=1e-12)
    assert 0.3 < correa2015_mah(m0, 1.0, c) < 0.7  # a Milky-Way halo: about half at z = 1
    with pytest.raises(ParameterError, match="mass0"):
        correa2015_mah(-1.0, 0.0)


# ----------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def small_sims(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    ics = zeldovich(16, box_size=32.0, redshift=9.0, seed=1, precision="float32")
    run(ics, n_steps=2, outputs=[1.0], out=d / "power", analyses=["power"],
        write_particles=False)
    run(ics, n_steps=2, out=d / "one", analyses=["halos"], write_particles=False,
        analysis_options={"halos": {"min_members": 5, "centers": ()}})
    run(ics, n_steps=3, outputs=[6.0, 1.0], out=d / "early", analyses=["halos"],
        write_particles=False, analysis_options={"halos": {"min_members": 5, "centers": ()}})
    return d


def test_an_output_without_halos(small_sims, tmp_path):
    """The first output (z = 6) has no halos: no links from it, every branch begins
    later, ytree still finds one tree per final halo."""
    sim = open_simulation(small_sims / "early")
    assert sim.halos(6.0).sizes.get("halo", 0) == 0 and sim.members(6.0)["ids"].size == 0
    t = merger_tree(sim)
    assert np.all(t.links["prog_output"].values == 1)
    assert t.main_branch(0)["halo"].values[0] == -1
    ytree = pytest.importorskip("ytree")
    t.to_ytree(tmp_path / "t.dat")
    assert ytree.load(str(tmp_path / "t.dat")).size == int(t.outputs["n_halos"].values[-1])


def test_bad_input_is_one_line_before_work(small_sims, tmp_path):
    with pytest.raises(ParameterError, match="no halo outputs"):
        merger_tree(open_simulation(small_sims / "power"))
    with pytest.raises(ParameterError, match="at least two halo outputs"):
        merger_tree(small_sims / "one")
    with pytest.raises(ParameterError, match="n_tracers"):
        merger_tree(small_sims / "one", n_tracers=0)


@pytest.mark.parametrize("which, extra, piece", [
    ("power", [], "no halo outputs"),
    ("one", [], "at least two halo outputs"),
])
def test_cli_refuses_before_work_and_writes_nothing(small_sims, tmp_path, capsys, which,
                                                    extra, piece):
    out = tmp_path / "trees"
    assert main(["trees", str(small_sims / which), str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and piece in err[0]
    assert not out.exists() and not list(tmp_path.iterdir())


def test_cli_writes_the_store_and_plots(sim_path, tmp_path, capsys):
    out = tmp_path / "trees"
    assert main(["trees", str(sim_path), str(out), "--plot", str(tmp_path / "mah.png"),
                 "--plot-tree", str(tmp_path / "tree.png")]) == 0
    assert (tmp_path / "mah.png").stat().st_size > 0
    assert (tmp_path / "tree.png").stat().st_size > 0
    t = open_merger_tree(out)
    direct = merger_tree(open_simulation(sim_path))
    np.testing.assert_array_equal(t.links["desc_halo"].values,
                                  direct.links["desc_halo"].values)
    capsys.readouterr()
    # OUT exists: refused without --overwrite; a bad --plot format before any work
    assert main(["trees", str(sim_path), str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["trees", str(sim_path), str(tmp_path / "t2"), "--plot",
                 str(tmp_path / "x.nosuchformat")]) == 2
    assert not (tmp_path / "t2").exists()
    for bad, piece in ((["--halo", "100000"], "--halo 100000"), (["--n-tracers", "0"],
                                                                 "--n-tracers")):
        assert main(["trees", str(sim_path), str(tmp_path / "t3"), *bad]) == 2
        assert piece in capsys.readouterr().err
        assert not (tmp_path / "t3").exists()
    # the consistent-trees file is checked against its recorded CRC-32
    data = bytearray((out / "trees.dat").read_bytes())
    data[-3] ^= 0x01
    (out / "trees.dat").write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="CRC-32"):
        open_merger_tree(out)
