"""The kernel contracts of gravity (:mod:`cosmo_dask.gravity.dispatch`): one test per
contract, run on each backend (NumPy chunks reach the CPU kernel, CuPy chunks the GPU
kernel), through the dispatch object, against float64 references written here (direct
sums, brute-force CIC, the Green's function's formula). Where a GPU kernel used to be
compared with its CPU twin, that comparison is made here too."""

from __future__ import annotations

import numpy as np
import pytest

from cosmo_dask.gravity import dispatch as kernels
from cosmo_dask.spatial.fft import kslab_wavenumbers
from tests.support.gravity import reference, rel_err
from tests.support.kernels import cpu_implementation

BACKENDS = [pytest.param("cpu"), pytest.param("gpu", marks=pytest.mark.gpu)]


def _xp(backend: str):
    return pytest.importorskip("cupy") if backend == "gpu" else np


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def _plummer(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.0, 0.999, n)
    r = 1.0 / np.sqrt(u ** (-2.0 / 3.0) - 1.0)
    v = rng.normal(size=(n, 3))
    return r[:, None] * v / np.linalg.norm(v, axis=1)[:, None]


def _direct_at(x, m, idx, *, G=1.0, eps=0.0, box=None, rs=None, r_cut=None):  # noqa: N803
    """float64 direct sum (Plummer softening, minimum image and truncated kernel when
    asked) at rows ``idx``, self pairs excluded."""
    from scipy.special import erfc

    d = x[idx, None, :] - x[None, :, :]
    if box is not None:
        d -= box * np.round(d / box)
    r2 = (d * d).sum(-1)
    self_pair = np.arange(len(x))[None, :] == np.asarray(idx)[:, None]
    s2 = np.where(self_pair, 1.0, r2 + eps * eps)
    f, p = s2 ** -1.5, s2 ** -0.5
    if rs is not None:
        r = np.sqrt(np.where(self_pair, 1.0, r2))
        u = r / (2 * rs)
        f = f * (erfc(u) + 2 * u / np.sqrt(np.pi) * np.exp(-u * u))
        p = p * erfc(u)
        far = r >= r_cut
        f, p = np.where(far, 0.0, f), np.where(far, 0.0, p)
    f, p = np.where(self_pair, 0.0, f), np.where(self_pair, 0.0, p)
    return -G * (m[None, :, None] * d * f[..., None]).sum(1), -G * (m[None, :] * p).sum(1)


# --------------------------------------------------------------------------- p2p_block
@pytest.fixture(scope="module")
def cloud():
    rng = np.random.default_rng(21)
    n = 1500      # not a multiple of any GPU tile: exercises the padding
    x = rng.normal(size=(n, 3)) + 50.0
    m = rng.uniform(0.5, 1.5, n)
    return x, m


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kernel", ["plummer", "spline"])
@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_p2p_block(backend, cloud, kernel, eps):
    xp = _xp(backend)
    x, m = cloud
    a0, p0 = reference(x, m, G=1.5, eps=eps, kernel=kernel)
    xd, md = xp.asarray(x), xp.asarray(m)
    a, p = kernels.p2p_block(xd, xd, md, G=1.5, softening=eps, softening_kernel=kernel,
                             precision="float64", exclude="index")
    assert isinstance(a, xp.ndarray) and a.dtype == np.float64
    assert rel_err(_host(a), a0).max() < 1e-11
    assert rel_err(_host(p), p0).max() < 1e-11
    a, p = kernels.p2p_block(xd, xd, md, G=1.5, softening=eps, softening_kernel=kernel,
                             precision="float32", exclude="index")
    assert a.dtype == np.float32
    ea = rel_err(_host(a), a0)
    # float32 pair arithmetic (and on the GPU float32 sums) over 1500 sources
    assert np.median(ea) < 3e-6 and ea.max() < 1e-4
    assert rel_err(_host(p), p0).max() < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_p2p_block_periodic_and_truncated(backend):
    xp = _xp(backend)
    rng = np.random.default_rng(5)
    box = 8.0
    x = rng.uniform(0, box, size=(1200, 3))
    m = rng.uniform(1, 2, 1200)
    xd, md = xp.asarray(x), xp.asarray(m)
    a0, p0 = reference(x, m, eps=0.02, box=box)
    a, p = kernels.p2p_block(xd, xd, md, softening=0.02, box_size=box, exclude="index")
    assert rel_err(_host(a), a0).max() < 1e-10 and rel_err(_host(p), p0).max() < 1e-11
    rs, r_cut = 0.5, 2.25
    a0, p0 = reference(x, m, eps=0.02, box=box, rs=rs, r_cut=r_cut)
    scale = np.linalg.norm(a0, axis=1)
    for level, tol in ((None, 1e-11), (2, 1e-6), (4, 1e-10)):
        a, p = kernels.p2p_block(xd, xd, md, softening=0.02, box_size=box, rs=rs, r_cut=r_cut,
                                 table_level=level, exclude="index")
        assert np.max(np.linalg.norm(_host(a) - a0, axis=1) / scale) < tol
        assert rel_err(_host(p), p0).max() < 1e-11
        a, p = kernels.p2p_block(xd, xd, md, softening=0.02, box_size=box, rs=rs, r_cut=r_cut,
                                 table_level=level, exclude="index", precision="float32")
        assert np.median(np.linalg.norm(_host(a) - a0, axis=1) / scale) < 2e-5
        assert np.median(rel_err(_host(p), p0)) < 2e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_p2p_block_exclude_zero_and_separate_blocks(backend):
    xp = _xp(backend)
    rng = np.random.default_rng(8)
    x = rng.normal(size=(600, 3))
    m = rng.uniform(1, 2, 600)
    a0, p0 = reference(x, m, eps=0.1)
    xd = xp.asarray(x)
    a, p = kernels.p2p_block(xd, xd, xp.asarray(m), softening=0.1, exclude="zero")
    assert rel_err(_host(a), a0).max() < 1e-11 and rel_err(_host(p), p0).max() < 1e-11
    # separate targets and sources (no self pairs in the block), and a scalar mass
    a, p = kernels.p2p_block(xd[:200], xd[200:], 2.0, softening=0.1)
    b0, q0 = reference(x, np.where(np.arange(len(x)) < 200, 0.0, 2.0), eps=0.1)
    assert rel_err(_host(a), b0[:200]).max() < 1e-11
    assert rel_err(_host(p), q0[:200]).max() < 1e-11


# --------------------------------------------------------------------------- green_kslab
def _green_reference(fk, kx, ky, kz, *, cell, rs, scale):
    """``scale exp(-k^2 rs^2) / (k^2 prod_a sinc^4(k_a H / 2)) fk`` in float64 (no
    window and no Gaussian without a split), 0 at k = 0."""
    k2 = kx**2 + ky**2 + kz**2
    g = np.ones_like(k2)
    if rs > 0:
        w = [np.sinc(k * cell / (2 * np.pi)) ** 4 for k in (kx, ky, kz)]  # sin(x)/x
        g = np.exp(-k2 * rs * rs) / (w[0] * w[1] * w[2])
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(k2 == 0, 0.0, scale * g / k2)
    return fk.astype(np.complex128) * f


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rs", [0.0, 0.05])
def test_green_kslab(backend, rs):
    """The Green's function on a k-space slab (rows 5..11 of a 24^3 mesh), complex128 and
    complex64, against its formula; on the GPU also against the CPU kernel."""
    xp = _xp(backend)
    rng = np.random.default_rng(0)
    shape, box = (24, 24, 24), 2.0
    fk = (rng.standard_normal((24, 7, 13)) + 1j * rng.standard_normal((24, 7, 13)))
    k = kslab_wavenumbers(shape, box, slice(5, 12))
    kb = kslab_wavenumbers(shape, box, slice(5, 12), xp=xp)
    kw = dict(cell=box / 24, rs=rs, scale=-4 * np.pi * 1.5 / (box / 24) ** 3)
    ref = _green_reference(fk, *k, **kw)
    out = kernels.green_kslab(xp.asarray(fk), *kb, **kw)
    assert isinstance(out, xp.ndarray) and out.dtype == np.complex128
    assert np.abs(_host(out) - ref).max() <= 1e-14 * np.abs(ref).max()
    o32 = kernels.green_kslab(xp.asarray(fk.astype(np.complex64)), *kb, **kw)
    assert o32.dtype == np.complex64
    assert np.abs(_host(o32) - ref).max() <= 1e-6 * np.abs(ref).max()
    if backend == "gpu":
        cpu = cpu_implementation(kernels.green_kslab)(fk, *k, **kw)
        assert np.abs(_host(out) - cpu).max() <= 1e-14 * np.abs(cpu).max()
        assert np.abs(_host(o32) - cpu).max() <= 1e-6 * np.abs(cpu).max()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("rs,kind", [(0.0, "fd4"), (0.05, "spectral")])
def test_green_kslab_gradient(backend, axis, rs, kind):
    """One acceleration component's k-space slab (the Green's function and the gradient
    in one pass) against ``-i D(k)`` times the Green's-function formula, D the 4-point
    difference ``(8 sin kH - sin 2kH) / 6H`` or the spectral ``k`` (0 at Nyquist)."""
    xp = _xp(backend)
    rng = np.random.default_rng(1)
    shape, box = (24, 24, 24), 2.0
    fk = (rng.standard_normal((24, 7, 13)) + 1j * rng.standard_normal((24, 7, 13)))
    cell = box / 24
    k = kslab_wavenumbers(shape, box, slice(5, 12))
    kb = kslab_wavenumbers(shape, box, slice(5, 12), xp=xp)
    kw = dict(cell=cell, rs=rs, scale=-4 * np.pi / cell**3)
    ka = np.broadcast_to(k[axis], fk.shape)
    if kind == "fd4":
        d = (8 * np.sin(ka * cell) - np.sin(2 * ka * cell)) / (6 * cell)
    else:
        d = np.where(np.isclose(np.abs(ka) * cell, np.pi), 0.0, ka)
    ref = _green_reference(fk, *k, **kw) * (-1j * d)
    out = kernels.green_kslab(xp.asarray(fk), *kb, axis=axis, kind=kind, **kw)
    assert np.abs(_host(out) - ref).max() <= 1e-14 * np.abs(ref).max()
    o32 = kernels.green_kslab(xp.asarray(fk.astype(np.complex64)), *kb, axis=axis, kind=kind,
                              **kw)
    assert o32.dtype == np.complex64
    assert np.abs(_host(o32) - ref).max() <= 1e-6 * np.abs(ref).max()


# --------------------------------------------------------------------------- fd4_gradient
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("x_lo, nx", [(0, 20), (3, 5), (18, 2), (7, 1)])
def test_fd4_gradient(backend, axis, x_lo, nx):
    """One acceleration component of a slab of a real periodic potential (planes x_lo ..
    x_lo + nx - 1 of a 20 x 12 x 10 mesh, with the two planes before and after it) against
    the 4-point difference applied in Fourier space, ``-i (8 sin kH - sin 2kH) / 6H``
    times the potential's transform (numpy.fft, float64); float32 slabs within their
    rounding."""
    xp = _xp(backend)
    rng = np.random.default_rng(3 + axis)
    shape, cell = (20, 12, 10), 0.3
    phi = rng.standard_normal(shape)
    k = [2 * np.pi * np.fft.fftfreq(s, d=cell) for s in shape]
    d = (8 * np.sin(k[axis] * cell) - np.sin(2 * k[axis] * cell)) / (6 * cell)
    d = d.reshape([-1 if a == axis else 1 for a in range(3)])
    ref = np.fft.ifftn(-1j * d * np.fft.fftn(phi)).real
    rows = np.arange(x_lo - 2, x_lo + nx + 2) % shape[0]
    for dtype, tol in ((np.float64, 1e-13), (np.float32, 1e-6)):
        p = phi.astype(dtype)
        out = kernels.fd4_gradient(xp.asarray(p[rows[2:-2]]), xp.asarray(p[rows[:2]]),
                                   xp.asarray(p[rows[-2:]]), axis=axis, cell=cell)
        assert out.dtype == dtype and out.shape == (nx, 12, 10)
        assert np.abs(_host(out) - ref[rows[2:-2]]).max() <= tol * np.abs(ref).max()


def _pm_host_kernel(name: str, mesh_t: str):
    """Kernel ``name`` of ``cuda/pm.cu`` compiled for the host (float64 positions, meshes
    of ``mesh_t``); skips without a host C++ compiler."""
    from tests.support import cuda_host

    if cuda_host.compiler() is None:
        pytest.skip("no host C++ compiler")
    return cuda_host.host_kernels("pm", {"REAL_T": "double", "POS_T": "double",
                                         "MESH_T": "float" if mesh_t == "float32" else
                                         "double"})[name]


@pytest.mark.parametrize("mesh_t", ["float64", "float32"])
def test_fd4_cuda_text_on_host(mesh_t):
    """The CUDA kernel ``fd4`` of ``cuda/pm.cu`` compiled for the host
    (tests/support/cuda_host.py) gives the CPU kernel's values bit for bit, slab and
    ghosts as in the graph, each axis: a 9 x 6 x 5 mesh (planes 4 .. 6), axes of one and
    two points (every neighbour wraps more than once), a whole mesh as one slab."""
    from cosmo_dask.gravity.pm_kernels import fd4_gradient

    kern = _pm_host_kernel("fd4", mesh_t)
    rng = np.random.default_rng(11)
    for shape, planes in (((9, 6, 5), (4, 7)), ((5, 2, 1), (2, 3)), ((6, 1, 3), (0, 6))):
        phi = rng.standard_normal(shape).astype(mesh_t)
        a, b = planes
        n0 = shape[0]
        slab = np.ascontiguousarray(phi[a:b])
        lo = np.ascontiguousarray(phi[[(a - 2) % n0, (a - 1) % n0]])
        hi = np.ascontiguousarray(phi[[b % n0, (b + 1) % n0]])
        for axis in range(3):
            out = np.zeros_like(slab)
            kern((4,), (7,), (slab, lo, hi, np.int64(b - a), np.int64(shape[1]),
                              np.int64(shape[2]), np.int32(axis),
                              np.float64(-1.0 / (12.0 * 0.7)), out))
            ref = fd4_gradient(slab, lo, hi, axis=axis, cell=0.7)
            np.testing.assert_array_equal(out, ref)


# --------------------------------------------------------------------------- cic_interpolate
def _cic_reference(pos, meshes, box, shift, x_lo=0):
    """Brute-force CIC interpolation in float64 of ``meshes`` (c, nx, n, n) holding planes
    ``x_lo .. x_lo + nx - 1`` of ``n^3`` meshes, nodes at ``(j + 1/2 - shift) H``."""
    meshes = np.asarray(meshes, dtype=np.float64)
    c, nx, n = meshes.shape[0], meshes.shape[1], meshes.shape[2]
    u = np.asarray(pos, dtype=np.float64) * (n / box) - 0.5 + shift
    i0 = np.floor(u).astype(np.int64)
    f = u - i0
    out = np.zeros((len(u), c))
    for corner in np.ndindex(2, 2, 2):
        w = np.prod([f[:, a] if corner[a] else 1 - f[:, a] for a in range(3)], axis=0)
        j = (i0 + np.array(corner)) % n
        inside = (j[:, 0] >= x_lo) & (j[:, 0] < x_lo + nx)
        lx = np.where(inside, j[:, 0] - x_lo, 0)
        out += np.where(inside, w, 0.0)[:, None] * meshes[:, lx, j[:, 1], j[:, 2]].T
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shift", [0.0, 0.5])
def test_cic_interpolate(backend, shift):
    """Whole meshes and one slab (planes 3..9 of 16) of up to four meshes, float64 and
    float32, against the brute-force sums; on the GPU also against the CPU kernel."""
    xp = _xp(backend)
    rng = np.random.default_rng(1)
    meshes = rng.random((4, 16, 16, 16))
    pos = rng.random((5000, 3)) * 3.0
    ref = _cic_reference(pos, meshes, 3.0, shift)
    out = kernels.cic_interpolate(xp.asarray(pos), xp.asarray(meshes), 3.0, shift)
    assert isinstance(out, xp.ndarray) and out.shape == (5000, 4) and out.dtype == np.float64
    np.testing.assert_allclose(_host(out), ref, rtol=1e-13, atol=1e-15)
    o32 = kernels.cic_interpolate(xp.asarray(pos, dtype=np.float32),
                                  xp.asarray(meshes, dtype=np.float32), 3.0, shift)
    assert np.abs(_host(o32) - ref).max() <= 1e-5
    slab = meshes[:3, 3:10]
    ref_s = _cic_reference(pos, slab, 3.0, shift, x_lo=3)
    out_s = kernels.cic_interpolate(xp.asarray(pos), [xp.asarray(s) for s in slab], 3.0, shift,
                                    x_lo=3)
    np.testing.assert_allclose(_host(out_s), ref_s, rtol=1e-13, atol=1e-15)
    if backend == "gpu":
        cpu = cpu_implementation(kernels.cic_interpolate)
        np.testing.assert_allclose(_host(out), cpu(pos, meshes, 3.0, shift),
                                   rtol=1e-13, atol=1e-15)
        assert np.abs(_host(o32) - cpu(pos, meshes, 3.0, shift)).max() <= 1e-5
        np.testing.assert_allclose(_host(out_s), cpu(pos, slab, 3.0, shift, x_lo=3),
                                   rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("mesh_t", ["float64", "float32"])
def test_interp_cuda_text_on_host(mesh_t):
    """The CUDA kernel ``interp`` of ``cuda/pm.cu`` compiled for the host: whole meshes and
    a slab against the brute-force sums, particles on the box's faces and at its far edge
    included (node indices that wrap); with ``add`` the earlier values plus the sums, bit
    for bit the sum of two launches' results."""
    kern = _pm_host_kernel("interp", mesh_t)
    rng = np.random.default_rng(5)
    n, box = 8, 2.0
    meshes = rng.random((3, n, n, n)).astype(mesh_t)
    pos = rng.random((600, 3)) * box
    pos[:6] = [[0, 0, 0], [box * (1 - 1e-16), 0.1, 0.2], [0.125, 0.125, 0.125],
               [np.nextafter(box, 0), np.nextafter(box, 0), 0.0], [1.0, 2.0 - 1e-9, 1.5],
               [0.0625, 1.9375, 0.0]]

    def run(slabs, shift, x_lo, out, add):
        flat = [np.ascontiguousarray(s) for s in slabs]
        kern((1,), (1,), (pos, *flat, *[flat[0]] * (4 - len(flat)), np.int64(len(pos)),
                          np.int64(n), np.int32(len(flat)), np.float64(n / box),
                          np.float64(shift - 0.5), np.int64(x_lo),
                          np.int64(flat[0].shape[0]), np.int32(add), out))
        return out

    for shift in (0.0, 0.5):
        whole = run(meshes, shift, 0, np.zeros((len(pos), 3)), 0)
        np.testing.assert_allclose(whole, _cic_reference(pos, meshes, box, shift),
                                   rtol=1e-13, atol=1e-15)
        part = run(meshes[:, 2:5], shift, 2, np.zeros((len(pos), 3)), 0)
        np.testing.assert_allclose(part, _cic_reference(pos, meshes[:, 2:5], box, shift,
                                                        x_lo=2), rtol=1e-13, atol=1e-15)
        both = run(meshes[:, 2:5], shift, 2, whole.copy(), 1)
        np.testing.assert_array_equal(both, whole + part)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cic_interpolate_add_to(backend):
    """``add_to``: a second mesh's sums added in place equal, bit for bit, the float64 sum
    of the two separate results (the interlaced pair's mean is taken that way), also for
    a slab; the array returned is ``add_to`` itself; a wrong shape or dtype raises."""
    xp = _xp(backend)
    rng = np.random.default_rng(7)
    m0, m1 = rng.random((3, 12, 12, 12)), rng.random((3, 12, 12, 12)).astype(np.float32)
    pos = xp.asarray(rng.random((4000, 3)) * 2.0)
    first = kernels.cic_interpolate(pos, xp.asarray(m0), 2.0, 0.0)
    second = kernels.cic_interpolate(pos, xp.asarray(m1), 2.0, 0.5)
    want = _host(first) + _host(second)
    acc = first.copy()
    got = kernels.cic_interpolate(pos, xp.asarray(m1), 2.0, 0.5, add_to=acc)
    assert got is acc
    np.testing.assert_array_equal(_host(got), want)
    assert np.abs(want - _host(first)).min() > 0  # the second mesh did add something
    part = kernels.cic_interpolate(pos, [xp.asarray(s) for s in m0[:, 2:7]], 2.0, 0.5, x_lo=2)
    acc = first.copy()
    kernels.cic_interpolate(pos, [xp.asarray(s) for s in m0[:, 2:7]], 2.0, 0.5, x_lo=2,
                            add_to=acc)
    np.testing.assert_array_equal(_host(acc), _host(first) + _host(part))
    with pytest.raises(ValueError, match="add_to"):
        kernels.cic_interpolate(pos, xp.asarray(m0), 2.0, 0.0, add_to=first[:, :2].copy())
    with pytest.raises(ValueError, match="add_to"):
        kernels.cic_interpolate(pos, xp.asarray(m0), 2.0, 0.0, add_to=first.astype(np.float32))


# --------------------------------------------------------------------------- tree_forces
@pytest.mark.parametrize("backend", BACKENDS)
def test_tree_forces(backend):
    """A softened Plummer sphere, theta = 0.5, per-particle masses, against the float64
    direct sum: the error levels of the tree tests."""
    xp = _xp(backend)
    n = 8000
    x = _plummer(n, seed=5)
    m = np.random.default_rng(1).uniform(0.5, 1.5, n) / n
    acc, pot = kernels.tree_forces(xp.asarray(x), xp.asarray(m), G=2.0, theta=0.5,
                                   softening=0.05)
    assert isinstance(acc, xp.ndarray) and acc.shape == (n, 3) and pot.shape == (n,)
    idx = np.arange(0, n, 8)
    ra, rp = _direct_at(x, m, idx, G=2.0, eps=0.05)
    err = rel_err(_host(acc)[idx], ra)
    assert np.median(err) <= 5e-4 and np.percentile(err, 99) <= 5e-3
    assert np.median(np.abs(_host(pot)[idx] - rp) / np.abs(rp)) <= 1e-4


# --------------------------------------------------------------------------- domain trees
def _opts(**kw):
    opts = {"G": 1.0, "theta": 0.5, "softening": 0.0, "softening_kernel": "plummer",
            "precision": "float64", "box_size": None, "rs": None, "r_cut": None,
            "max_leaf": 64, "max_group": 64}
    opts.update(kw)
    return opts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("periodic", [False, True])
def test_domain_tree_let_and_forces(backend, periodic):
    """Two domains (x below / above a plane): each domain's tree, the LET the other sends
    for its box, and its groups' walks against both give the direct sum over all the
    particles (isolated: theta = 0.5; periodic: TreePM's truncated short range)."""
    xp = _xp(backend)
    rng = np.random.default_rng(9)
    if periodic:
        box, rs = 10.0, 0.4
        x = rng.uniform(0, box, (6000, 3))
        x[:2000] = (5.0 + 0.8 * rng.standard_normal((2000, 3))) % box  # a clump
        opts = _opts(box_size=box, rs=rs, r_cut=4.5 * rs)
        split = 5.0
    else:
        x = _plummer(6000, seed=3)
        opts = _opts()
        split = 0.0
    m = rng.uniform(0.5, 1.5, len(x)) / len(x)
    sides = [np.flatnonzero(x[:, 0] < split), np.flatnonzero(x[:, 0] >= split)]
    trees = [kernels.domain_tree(xp.asarray(x[i]), xp.asarray(m[i]), xp.asarray(i), opts)
             for i in sides]
    for d, (own, other) in enumerate(((0, 1), (1, 0))):
        i = sides[own]
        lo, hi = x[i].min(axis=0), x[i].max(axis=0)
        src = trees[other]
        let = kernels.domain_let(src, lo, hi, opts)
        assert let is not None
        index, acc, pot = kernels.domain_forces(trees[own], [let, None], (0, 1), opts)
        assert isinstance(acc, xp.ndarray)
        np.testing.assert_array_equal(_host(index), i)  # increasing global index
        pick = np.arange(0, len(i), 7)
        ra, rp = _direct_at(x, m, i[pick], **({"box": opts["box_size"], "rs": opts["rs"],
                                               "r_cut": opts["r_cut"]} if periodic else {}))
        err = rel_err(_host(acc)[pick], ra)
        perr = np.abs(_host(pot)[pick] / rp - 1)
        if periodic:
            assert np.median(err) <= 1e-3 and np.median(perr) <= 1e-3, d
        else:
            assert np.median(err) <= 5e-4 and np.percentile(err, 99) <= 5e-3, d
            assert np.median(perr) <= 1e-4, d


def test_numpy_and_cupy_only():
    """Any other chunk type gets the contract's clear error."""
    from cosmo_dask.core.errors import DeviceError

    with pytest.raises(DeviceError, match="gravity.p2p_block: no kernel for chunks of type "
                                          "builtins.list; it takes NumPy or CuPy arrays"):
        kernels.p2p_block([[0.0, 0.0, 0.0]], [[1.0, 0.0, 0.0]], 1.0)


@pytest.mark.parametrize("name", kernels.__all__)
def test_one_signature(name):
    """The GPU kernel takes the CPU kernel's parameters, by name and in order (the GPU
    modules import without CuPy); only launch keywords may follow."""
    import inspect

    contract = getattr(kernels, name)
    cpu = list(inspect.signature(cpu_implementation(contract)).parameters)
    gpu = list(inspect.signature(contract.gpu_implementation()).parameters)
    assert gpu[:len(cpu)] == cpu
    assert set(gpu[len(cpu):]) <= {"threads", "per_thread", "splits", "unroll"}
