"""The shared device math: CUDA headers of ``cosmo_dask/cuda`` and their numba twins.

* every header is in the package and named in its package data, every ``#include`` of a
  kernel source names one of them, and no kernel source (a ``.cu`` file of
  ``cosmo_dask/cuda``, or a string holding CUDA code in a module of the package or of
  ``benchmarks/``) defines a centralised device function again or spells out the spline
  polynomial, a minimum image or a box wrap itself;
* the numba softening factors (:mod:`cosmo_dask.gravity.softening_kernels`) and the CUDA
  ones (``softening.cuh``, ``periodic.cuh``, compiled as C++ on the host by
  ``tests/support/cuda_host.py``) against independent NumPy float64 formulas;
* the clip of ``tet_clip.cuh`` (``tet_cube_pairs`` compiled on the host) against the numba
  tetrahedron-cube volumes.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from cosmo_dask.core.errors import ParameterError
from cosmo_dask.cuda import HEADER_DIR, HEADERS, OPTIONS, header_text, include_options
from cosmo_dask.gravity.softening_kernels import plummer_kp, spline_kp
from tests.support import cuda_host

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (sorted((ROOT / "cosmo_dask").rglob("*.py")) + sorted(HEADER_DIR.glob("*.cu"))
           + sorted((ROOT / "benchmarks").rglob("*.py")))


def _cuda_strings(path: Path):
    """The CUDA code of a kernel source (``.cu``) or the string constants of a module that
    hold CUDA code."""
    if path.suffix == ".cu":
        yield path.read_text()
        return
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "__global__" in node.value or "__device__" in node.value:
                yield node.value


def _header_functions() -> set[str]:
    names = set()
    for h in HEADERS:
        text = header_text(h)
        names |= set(re.findall(r"__device__[^;{(]*?\b(\w+)\s*\(", text))
        names |= set(re.findall(r"^struct\s+(\w+)", text, flags=re.M))
    return names


def test_headers_are_package_data():
    for h in HEADERS:
        assert (HEADER_DIR / h).is_file(), h
    assert sorted(p.name for p in HEADER_DIR.glob("*.cuh")) == sorted(HEADERS)
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["cosmo_dask.cuda"]
    assert any(Path(h).match(p) for p in patterns for h in HEADERS)
    opts = include_options()
    assert opts[0] == f"-I{HEADER_DIR}" and opts[1].startswith("-DCOSMO_DASK_CUDA_HEADERS=")
    with pytest.raises(ParameterError, match="name must be one of"):
        header_text("missing.cuh")


def test_includes_name_shared_headers():
    found = set()
    for path in SOURCES:
        for src in _cuda_strings(path):
            for inc in re.findall(r'#include\s+"([^"]+)"', src):
                assert inc in HEADERS, f"{path.name} includes {inc}, not a shared header"
                found.add(inc)
    assert found == set(HEADERS)   # each header has a user


def test_centralised_device_functions_defined_once():
    names = _header_functions()
    assert {"cd_rint", "cd_min_image", "cd_wrap_box", "cd_rsqrt", "cd_inv_kp", "cd_spline_kp",
            "clip_volume", "fast_volume", "Tet"} <= names
    definition = re.compile(r"(?:__device__[^;{(]*?\b|^struct\s+)(" + "|".join(names)
                            + r")\b\s*[({]", flags=re.M)
    by_hand = {
        "spline polynomial": re.compile(r"21\.333333333333|2\.133333333333"),
        "minimum image": re.compile(r"\*\s*(?<![.\w])(?:rint|rintf|RINT)\s*\("),
        "box wrap": re.compile(r"\*\s*(?<![.\w])floor\(\s*\w+\s*/\s*\w+\s*\)"),
    }
    for path in SOURCES:
        for src in _cuda_strings(path):
            again = definition.findall(src)
            assert not again, f"{path.relative_to(ROOT)} defines {again} again"
            for what, pattern in by_hand.items():
                assert not pattern.search(src), f"{path.relative_to(ROOT)} writes a {what}"
    # the numba spline is written once too
    for path in (ROOT / "cosmo_dask").rglob("*.py"):
        if path.name != "softening_kernels.py":
            assert not by_hand["spline polynomial"].search(path.read_text()), path.name


# --------------------------------------------------------------- independent references
def _spline_reference(r: np.ndarray, h: float):
    """Gadget-2 cubic spline (Springel 2001, eqs. A1-A2 of Springel, Yoshida & White)
    from exact fractions: ``K = -(1/r) d(phi/m)/dr`` and ``P = -phi/m`` (float64)."""
    u = r / h
    k = np.where(
        u < 0.5,
        (32.0 / 3.0 - 192.0 / 5.0 * u**2 + 32.0 * u**3) / h**3,
        (64.0 / 3.0 - 48.0 * u + 192.0 / 5.0 * u**2 - 32.0 / 3.0 * u**3
         - 1.0 / (15.0 * u**3)) / h**3)
    w = np.where(
        u < 0.5,
        16.0 / 3.0 * u**2 - 48.0 / 5.0 * u**4 + 32.0 / 5.0 * u**5 - 14.0 / 5.0,
        1.0 / (15.0 * u) + 32.0 / 3.0 * u**2 - 16.0 * u**3 + 48.0 / 5.0 * u**4
        - 32.0 / 15.0 * u**5 - 16.0 / 5.0)
    p = -w / h
    outside = u >= 1.0
    return np.where(outside, r**-3.0, k), np.where(outside, 1.0 / r, p)


def _spline_radii(h):
    return np.concatenate([np.linspace(1e-3, 1.5, 3001) * h, [0.5 * h, h, 2.0 * h]])


@pytest.mark.parametrize("h", [0.028, 1.0, 7.5])
def test_numba_spline_against_reference(h):
    r = _spline_radii(h)
    got = np.array([spline_kp(x, h) for x in r])
    ref_k, ref_p = _spline_reference(r, h)
    # the kernels' decimal constants (10.666666666667 for 32/3, ...) limit this to ~1e-12
    np.testing.assert_allclose(got[:, 0], ref_k, rtol=2e-11, atol=0)
    np.testing.assert_allclose(got[:, 1], ref_p, rtol=2e-11, atol=0)
    # continuous at u = 1/2 and u = 1 (the reference is too, so this checks the branches)
    for u in (0.5, 1.0):
        lo, hi = spline_kp(u * h * (1 - 1e-12), h), spline_kp(u * h * (1 + 1e-12), h)
        assert lo[0] == pytest.approx(hi[0], rel=1e-9)
        assert lo[1] == pytest.approx(hi[1], rel=1e-9)


def test_numba_plummer_against_reference():
    r = np.linspace(0.0, 3.0, 2001)
    for eps in (0.01, 0.3):
        got = np.array([plummer_kp(x * x, eps * eps) for x in r])
        s = np.sqrt(r**2 + eps**2)
        np.testing.assert_allclose(got[:, 0], 1.0 / s**3, rtol=1e-14)
        np.testing.assert_allclose(got[:, 1], 1.0 / s, rtol=1e-14)


# --------------------------------------------------------------- the CUDA headers, on the host
_HOST_KERNELS = r"""
#include "periodic.cuh"
#include "softening.cuh"
typedef double real;
extern "C" __global__ void softening(const real* r, const real* m, const long long n,
                                     const real h, const real eps2, real* out)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const real hinv = (real)1 / h;
        real K, P;
        if (r[i] >= h) cd_inv_kp((real)1 / sqrt(r[i] * r[i]), m[i], K, P);
        else cd_spline_kp(r[i] * hinv, m[i] * hinv, m[i] * hinv * hinv * hinv, K, P);
        out[4 * i] = K;
        out[4 * i + 1] = P;
        cd_inv_kp((real)1 / sqrt(r[i] * r[i] + eps2), m[i], K, P);
        out[4 * i + 2] = K;
        out[4 * i + 3] = P;
    }
}
extern "C" __global__ void periodic(const real* x, const long long n, const real box,
                                    real* out)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[3 * i] = cd_min_image(x[i], box, (real)1 / box);
        out[3 * i + 1] = cd_min_image_if(x[i], (real)0, (real)0);
        out[3 * i + 2] = cd_wrap_box(x[i], box);
    }
}
"""


@pytest.fixture(scope="module")
def host():
    if cuda_host.compiler() is None:
        pytest.skip("needs a C++ compiler (g++)")
    return cuda_host.HostKernels(_HOST_KERNELS)


_H, _EPS, _BOX = 0.7, 0.25, 2.5


def _softening_inputs():
    r = _spline_radii(_H)
    return r, np.linspace(0.5, 2.0, r.size)


def _check_softening(out, r, m, rtol_plummer):
    """``out[:, 0:2]``: spline (K, P) times m; ``out[:, 2:4]``: Plummer (K, P) times m."""
    ref_k, ref_p = _spline_reference(r, _H)
    np.testing.assert_allclose(out[:, 0], m * ref_k, rtol=2e-11, atol=0)
    np.testing.assert_allclose(out[:, 1], m * ref_p, rtol=2e-11, atol=0)
    s = np.sqrt(r**2 + _EPS**2)
    np.testing.assert_allclose(out[:, 2], m / s**3, rtol=rtol_plummer)
    np.testing.assert_allclose(out[:, 3], m / s, rtol=rtol_plummer)


def _check_periodic(out, x, atol_wrap):
    """``out[:, 0]``: minimum image, ``out[:, 1]``: open axis, ``out[:, 2]``: box wrap."""
    # minimum image: within half a box, an integer number of boxes from x
    assert np.all(np.abs(out[:, 0]) <= 0.5 * _BOX)
    shifts = (x - out[:, 0]) / _BOX
    np.testing.assert_allclose(shifts, np.round(shifts), atol=1e-12)
    np.testing.assert_array_equal(out[:, 1], x)               # box <= 0: unchanged
    # box wrap: x - L floor(x / L) where outside [0, L), x itself inside
    ref = np.where((x < 0) | (x >= _BOX), x - _BOX * np.floor(x / _BOX), x)
    np.testing.assert_allclose(out[:, 2], ref, rtol=0, atol=atol_wrap)
    assert np.all((out[:, 2] >= 0) & (out[:, 2] <= _BOX))


def test_cuda_softening_on_host_against_reference(host):
    r, m = _softening_inputs()
    out = np.empty((r.size, 4))
    host["softening"]((1,), (1,), (r, m, np.int64(r.size), np.float64(_H),
                                   np.float64(_EPS**2), out))
    _check_softening(out, r, m, 1e-14)
    # the numba twin (its far-branch u^3 term associates differently: not bit for bit)
    got = np.array([spline_kp(x, _H) for x in r])
    np.testing.assert_allclose(out[:, :2], m[:, None] * got, rtol=1e-14, atol=0)


def test_cuda_periodic_on_host_against_reference(host):
    x = np.concatenate([np.linspace(-7.0, 7.0, 1001), [-1e-300, 0.0, _BOX, -_BOX, 1.25, -1.25]])
    out = np.empty((x.size, 3))
    host["periodic"]((1,), (1,), (x, np.int64(x.size), np.float64(_BOX), out))
    _check_periodic(out, x, 0.0)   # unfused float64: the NumPy formula's bits


def test_tet_clip_header_on_host_equals_numba(rng):
    """``tet_cube_pairs`` (the package's GPU kernel, ``tet_clip.cuh``) compiled on the host
    against :func:`cosmo_dask.density.tet_cube_volume` (numba, the same clip)."""
    if cuda_host.compiler() is None:
        pytest.skip("needs a C++ compiler (g++)")
    from cosmo_dask.density import tet_cube_volume
    kern = cuda_host.host_kernels("tet_volume", {"REAL": "double"})
    tets = rng.uniform(-1, 2, size=(60, 4, 3))
    lo = rng.uniform(-1.0, 2.0, size=(40, 3))
    h = rng.uniform(0.1, 1.5, size=40)
    out = np.empty((60, 40))
    kern["tet_cube_pairs"]((1,), (1,), (np.ascontiguousarray(tets), lo, h, np.int64(60),
                                        np.int64(40), out))
    ref = tet_cube_volume(tets, lo, h)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-15)
    assert (ref > 0).mean() > 0.2


@pytest.mark.gpu
def test_headers_through_nvrtc_on_the_gpu():
    """The same kernels compiled by NVRTC with the loader's options (``OPTIONS`` and
    ``include_options()``, as :func:`cosmo_dask.cuda.module` compiles), run on the GPU
    against the float64 references."""
    cp = pytest.importorskip("cupy")
    mod = cp.RawModule(code=_HOST_KERNELS, options=OPTIONS + include_options())
    r, m = _softening_inputs()
    out = cp.empty((r.size, 4))
    mod.get_function("softening")((8,), (128,), (cp.asarray(r), cp.asarray(m),
                                                 np.int64(r.size), np.float64(_H),
                                                 np.float64(_EPS**2), out))
    _check_softening(cp.asnumpy(out), r, m, 1e-13)
    x = np.linspace(-7.0, 7.0, 1001)
    pw = cp.empty((x.size, 3))
    mod.get_function("periodic")((8,), (128,), (cp.asarray(x), np.int64(x.size),
                                                np.float64(_BOX), pw))
    _check_periodic(cp.asnumpy(pw), x, 1e-15)   # fused multiply-adds allowed
