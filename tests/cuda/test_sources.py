"""The package's CUDA C lives in ``cosmo_dask/cuda/*.cu`` and is loaded by one loader.

* no Python string of the package holds more than 20 lines of CUDA;
* every ``.cu`` file is a kernel source loaded by some module (``cuda.module`` /
  ``cuda.source`` with its name), every named source exists, and both are package data;
* no module builds a ``RawModule`` / ``RawKernel`` (or passes ``code=``) but the loader;
* :func:`cosmo_dask.cuda.source` puts the defines before ``#line 1 "<name>.cu"`` and the
  file's text; :func:`cosmo_dask.cuda.module` compiles it with one option set (checked
  with a stand-in for CuPy that records the calls), cached per device, name, defines and
  options;
* every kernel source, with the defines its module gives, preprocesses on the host (g++)
  into its kernels' names, and compiles through the loader on the GPU (``gpu`` mark);
* every GPU module imports without CuPy.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

from cosmo_dask import cuda
from cosmo_dask.core.errors import ParameterError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cosmo_dask"
MARKERS = ("__global__", "__device__", 'extern "C"')
GPU_MODULES = ("gravity.p2p_kernels_gpu", "gravity.pm_kernels_gpu", "gravity.tree.forces_gpu",
               "gravity.tree.let_gpu", "gravity.truncated", "density.tessellation_kernels_gpu",
               "density.paint_kernels_gpu", "density.tet_volume_gpu", "spatial.octree_gpu",
               "halos.center_kernels_gpu", "halos.fof_kernels_gpu",
               "expansion.scf_kernels_gpu", "expansion.mex_kernels_gpu",
               "simulation.integrator_kernels_gpu")


def _trees():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text())


def test_no_cuda_in_python_strings():
    """At most 20 lines in any string constant (f-string parts included) that holds
    CUDA code; the kernel sources are ``.cu`` files."""
    long = []
    for path, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if any(m in node.value for m in MARKERS) and node.value.count("\n") > 20:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not long, f"CUDA in Python strings of more than 20 lines: {long}"


def _loaded_names() -> dict[str, list[str]]:
    """``name -> modules`` of every ``cuda.module("name", ...)`` / ``cuda.source("name",
    ...)`` call of the package."""
    out: dict[str, list[str]] = {}
    for path, tree in _trees():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("module", "source")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "cuda"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                out.setdefault(node.args[0].value, []).append(path.name)
    return out


def test_every_cu_file_is_loaded_and_packaged():
    files = sorted(p.stem for p in cuda.HEADER_DIR.glob("*.cu"))
    assert files == sorted(cuda.KERNEL_SOURCES)
    loaded = _loaded_names()
    assert sorted(loaded) == files, (f"orphan sources: {set(files) - set(loaded)}, "
                                     f"missing: {set(loaded) - set(files)}")
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["cosmo_dask.cuda"]
    for name in [f"{n}.cu" for n in files] + list(cuda.HEADERS):
        assert any(Path(name).match(p) for p in patterns), name


def test_only_the_loader_builds_modules():
    loader = cuda.HEADER_DIR / "__init__.py"
    found = []
    for path, tree in _trees():
        if path == loader:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name in ("RawModule", "RawKernel") or any(k.arg == "code"
                                                              for k in node.keywords):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"kernels built outside cosmo_dask.cuda.module: {found}"


def test_source_text():
    text = cuda.source("mex", {"REAL": "float", "LMAX": 4})
    file_text = (cuda.HEADER_DIR / "mex.cu").read_text()
    assert text == '#define LMAX 4\n#define REAL float\n#line 1 "mex.cu"\n' + file_text
    assert cuda.source("scf", [("SCF_EVAL", True), ("WHAT", 2)]).startswith(
        "#define SCF_EVAL 1\n#define WHAT 2\n#line 1 \"scf.cu\"\n")
    assert cuda.source("octree").startswith('#line 1 "octree.cu"\n')
    with pytest.raises(ParameterError, match="CUDA source name must be one of"):
        cuda.source("missing")


def test_truncated_fit_is_its_header_with_generated_coefficients():
    from cosmo_dask.gravity import truncated as tr

    assert tr.CUDA_SOURCE == cuda.header_text("truncated.cuh")
    assert tr.CUDA_FIT_SOURCE == (cuda.define_lines(tr.fit_defines())
                                  + cuda.header_text("truncated_fit.cuh"))
    assert len(tr.fit_defines()) == len(tr.ERFCX_FIT) == 13


class _FakeCupy(types.ModuleType):
    """Records ``RawModule`` constructions; ``device`` is the current device."""

    def __init__(self):
        super().__init__("cupy")
        self.built = []
        self.device = 0
        fake = self

        class RawModule:
            def __init__(self, *, code, options):
                fake.built.append((fake.device, code, options))

        class Device:
            def __init__(self, i):
                self.i = i

            def __enter__(self):
                self.prev, fake.device = fake.device, self.i

            def __exit__(self, *exc):
                fake.device = self.prev

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(Device=Device, runtime=types.SimpleNamespace(
            getDevice=lambda: fake.device))


def test_module_options_and_cache(monkeypatch):
    fake = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    cuda._module.cache_clear()
    try:
        a = cuda.module("fof", {"COORD_T": "double", "SORT_T": "double", "IDX_T": "int"},
                        cuda.NO_FMAD)
        assert cuda.module("fof", {"IDX_T": "int", "SORT_T": "double", "COORD_T": "double"},
                           cuda.NO_FMAD) is a             # same key, defines in any order
        cuda.module("fof", {"COORD_T": "float", "SORT_T": "double", "IDX_T": "int"},
                    cuda.NO_FMAD)
        cuda.module("pm", {"REAL_T": "double", "POS_T": "double", "MESH_T": "double"})
        fake.device = 1
        cuda.module("pm", {"REAL_T": "double", "POS_T": "double", "MESH_T": "double"})
    finally:
        cuda._module.cache_clear()
    assert [b[0] for b in fake.built] == [0, 0, 0, 1]   # compiled on the device it is for
    device, code, options = fake.built[0]
    assert code == cuda.source("fof", {"COORD_T": "double", "SORT_T": "double",
                                       "IDX_T": "int"})
    assert options == ("--std=c++17", "--fmad=false") + cuda.include_options()
    assert fake.built[2][2] == ("--std=c++17",) + cuda.include_options()
    # one C++ standard flag, spelled one way, in every compile
    assert all(sum(o.startswith(("-std", "--std")) for o in b[2]) == 1 for b in fake.built)


def test_gpu_modules_import_without_cupy():
    code = ("import sys; sys.modules['cupy'] = None\n"
            + "".join(f"import cosmo_dask.{m}\n" for m in GPU_MODULES))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]


def _variants():
    """``(name, defines, options, kernels)``: each kernel source with one set of the defines
    its module gives (the modules' own helpers where they have one)."""
    import numpy as np

    from cosmo_dask.density.tet_volume_gpu import lattice_defines
    from cosmo_dask.gravity.p2p_kernels_gpu import kernel_defines
    from cosmo_dask.gravity.truncated import fit_defines
    from cosmo_dask.halos.fof_kernels_gpu import _KERNEL_NAMES, cuda_defines

    spec = dict(threads=256, per_thread=4, unroll=8, kernel=1, trunc=1, level=2,
                periodic=True, potential=True, check=True, excl=1)
    scf = {"NMAX": 6, "LMAX": 4, "REAL": "float"}
    return [
        ("center", {"REAL": "float", "SEG_POT": "seg_pot_f32", "BLOCK": 128}, (),
         ("seg_pot_f32",)),
        ("fof", cuda_defines("float", "double", "long long"), cuda.NO_FMAD, _KERNEL_NAMES),
        ("integrator", {"POS_T": "float", "MOM_T": "float", "KICK_T": "float"}, cuda.NO_FMAD,
         ("drift", "kick")),
        ("let", {}, cuda.NO_FMAD, ("let_mark",)),
        ("mex", {"REAL": "double", "LMAX": 8}, (), ("mex_terms", "mex_eval")),
        ("octree", {}, (), ("child_bounds", "leaf_moments", "parent_moments", "node_bmax")),
        ("octree_morton", {}, (), ()),
        ("p2p", kernel_defines(np.float32, **spec), ("-ftz=true",), ("p2p_tile",)),
        ("pair_count", {"PC_SHARED": 1}, cuda.NO_FMAD, ("pair_count",)),
        ("paint", {"ORDER": 3, "POS_T": "double", "MASS_T": "float", "MESH_T": "double"}, (),
         ("paint",)),
        ("pm", {"REAL_T": "float", "POS_T": "double", "MESH_T": "float"}, (),
         ("green", "interp")),
        ("scf", {**scf, "SCF_COEFF": 1, "USE_SHARED": 1}, (), ("scf_coeff",)),
        ("scf", {**scf, "SCF_EVAL": 1, "WHAT": 1, "COEF_SHARED": 0}, (), ("scf_eval",)),
        ("tessellation", {}, cuda.NO_FMAD, ("column_tets", "column_bboxes")),
        ("tet_volume", {"REAL": "double"}, cuda.NO_FMAD, ("tet_cube_pairs",)),
        ("tet_volume_lattice", lattice_defines("float", WARPS=2), (), ("deposit_lattice",)),
        ("tree", {"REAL_IS_DOUBLE": 0, "SPLINE": 1, "TRUNC": 1, "BLOCK": 128,
                  **fit_defines()}, (), ("tree_walk", "group_forces")),
    ]


def test_variants_cover_every_source():
    assert sorted({v[0] for v in _variants()}) == sorted(cuda.KERNEL_SOURCES)


@pytest.mark.parametrize("k", range(17))
def test_sources_preprocess_on_the_host(k):
    """The text of :func:`cosmo_dask.cuda.source` through the C preprocessor: includes
    found, no ``#error`` (a missing define), the kernels' names come out."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    name, defines, _, kernels = _variants()[k]
    run = subprocess.run(["g++", "-E", "-P", "-x", "c++", f"-I{cuda.HEADER_DIR}", "-"],
                         input=cuda.source(name, defines), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    for kernel in kernels:
        assert f" {kernel}(" in run.stdout or f"\n{kernel}(" in run.stdout, kernel
    # without its defines a source that needs them fails in the preprocessor or names
    # an undefined type; the fit header says what is missing
    if name == "tree":
        bare = subprocess.run(["g++", "-E", "-P", "-x", "c++", f"-I{cuda.HEADER_DIR}", "-"],
                              input=cuda.source("tree"), capture_output=True, text=True)
        assert bare.returncode != 0 and "CD_ERFCX_FIT_0" in bare.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("k", range(17))
def test_sources_compile_through_the_loader(k):
    """Every kernel source compiles with NVRTC through :func:`cosmo_dask.cuda.module` and
    holds its kernels."""
    pytest.importorskip("cupy")
    name, defines, options, kernels = _variants()[k]
    if name == "octree_morton":   # the preamble of an elementwise kernel: octree tests
        pytest.skip("compiled by cupy.ElementwiseKernel (tests/spatial/test_octree.py)")
    mod = cuda.module(name, defines, options)
    for kernel in kernels:
        assert mod.get_function(kernel) is not None
