"""The CLI pipeline, stage by stage, as a user runs it: seconds per command.

Each stage is one ``cosmo-dask`` command run in a subprocess (``--gpu`` or
``--cpu``), so its wall time includes what a user waits for: interpreter start,
imports, the local cluster's start, reading the store, the kernels, writing the
product. Next to the wall time each line gives the time the command itself
reports for its work (``compute_s``, parsed from its summary line), the bytes
it read and wrote, and, for the stages that read the particle store, the time
to read those arrays alone on the same device (``read_s``: ``open_snapshot``
then a reduction over each array, in this process, with the same
``read_chunk_size``), so each stage splits into startup (wall - compute),
read, and the rest (kernels, scheduling and the write).

Workload: Zel'dovich ICs at z = 0 with ``n_side^3`` particles in a box of
``1.5625 n_side`` Mpc/h (the demo's spacing), float32 positions and
velocities, int64 ids. The expansions (SCF, MEX) expand the same box about its
centre; ``generate-hernquist`` (not run by default) times a Hernquist store of
the same N.

    python -m benchmarks pipeline --device gpu --n-side 256 512
    python -m benchmarks pipeline --device cpu --n-side 128

Prints one JSON object per stage and a summary per size.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402

STAGES = ("generate", "info", "halos", "power", "density-cic", "density-pse", "gravity-pm",
          "gravity-treepm", "gravity-tree", "expand-scf", "expand-mex", "generate-hernquist")
#: the arrays of the store each stage reads (for read_s and bytes_read)
READS = {"info": ("pos", "vel", "ids"), "halos": ("pos", "vel", "ids"), "power": ("pos",),
         "density-cic": ("pos",), "density-pse": ("pos", "ids"), "gravity-pm": ("pos",),
         "gravity-treepm": ("pos",), "gravity-tree": ("pos",), "expand-scf": ("pos",),
         "expand-mex": ("pos",)}


def commands(n_side: int, box: float, pse_max_level: int | None = None) -> dict[str, list[str]]:
    n = str(n_side)
    eps = f"{0.02 * box / n_side:.6g}"  # 1/50 of the mean spacing
    center = ",".join([f"{box / 2:g}"] * 3)
    return {
        "generate": ["generate", "zeldovich", "s.zarr", "--n-side", n, "--box-size", f"{box:g}",
                     "--redshift", "0", "--seed", "1", "--precision", "float32"],
        "info": ["info", "s.zarr"],
        "halos": ["halos", "s.zarr", "h.zarr", "--centers", "mbp,mcp"],
        "power": ["power", "s.zarr", "--n-mesh", n, "--out", "pk.csv"],
        "density-cic": ["density", "s.zarr", "m.zarr", "--method", "cic", "--n-mesh", n],
        "density-pse": ["density", "s.zarr", "p.zarr", "--method", "pse"] + (
            [] if pse_max_level is None else ["--max-level", str(pse_max_level)]),
        "gravity-pm": ["gravity", "s.zarr", "g_pm.zarr", "--method", "pm", "--n-mesh", n],
        "gravity-treepm": ["gravity", "s.zarr", "g_treepm.zarr", "--method", "treepm",
                           "--n-mesh", n],
        "gravity-tree": ["gravity", "s.zarr", "g_tree.zarr", "--method", "tree",
                         "--softening", eps],
        "generate-hernquist": ["generate", "hernquist", "hq.zarr", "--n", str(n_side**3),
                               "--seed", "4", "--precision", "float32"],
        # the box expanded about its centre (positions unwrapped around it), so the
        # expansions run on the same N without generating a second store
        "expand-scf": ["expand", "s.zarr", "scf.zarr", "--method", "scf", "--accelerations",
                       "--center", center, "--scale-radius", f"{box / 4:g}"],
        "expand-mex": ["expand", "s.zarr", "mex.zarr", "--method", "mex", "--center", center],
    }


def dir_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def output_of(argv: list[str]) -> str | None:
    if argv[0] == "generate":
        return argv[2]
    if argv[0] in ("halos", "density", "gravity", "expand"):
        return argv[2]
    if "--out" in argv:
        return argv[argv.index("--out") + 1]
    return None


def read_seconds(store: Path, names, device: str) -> tuple[float, int]:
    """Seconds to read ``names`` of ``store`` onto ``device`` (one reduction per array)."""
    import dask

    from cosmo_dask import open_snapshot

    snap = open_snapshot(store, device=device)
    arrays = [snap.arrays[n] for n in names if n in snap.arrays]
    sums = [a.sum() for a in arrays]
    t0 = time.perf_counter()
    dask.compute(*sums, scheduler="threads" if device == "cpu" else "sync")
    return time.perf_counter() - t0, sum(a.nbytes for a in arrays)


def run_stage(argv, cwd: Path, device: str, env: dict, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "cosmo_dask", f"--{device}", *argv]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                             timeout=timeout)
        rc, stdout, stderr = out.returncode, out.stdout, out.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = "timeout", exc.stdout or "", exc.stderr or ""
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
        stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
    wall = time.perf_counter() - t0
    summary = [line for line in stdout.splitlines() if line.strip()]
    summary = summary[-1] if summary else ""
    m = re.findall(r"([0-9.]+) s\b", summary)  # the command's own time: its last "x.xx s"
    compute = float(m[-1]) if m and rc == 0 else None
    return {"exit": rc, "wall_s": round(wall, 3), "compute_s": compute,
            "summary": summary[:300], "stderr_tail": stderr[-1500:] if rc != 0 else
            stderr[-600:]}  # a command that worked should print nothing alarming either


def main(argv=None) -> list[dict]:
    ap = parser(__doc__)
    ap.add_argument("--n-side", type=int, nargs="+", default=[128])
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES[:-1]))
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--read-chunk-size", type=int, default=None,
                    help="cosmo_dask.read_chunk_size for every command (default: store chunks)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per stage")
    ap.add_argument("--keep", action="store_true", help="keep the stores")
    ap.add_argument("--pse-max-level", type=int, default=None,
                    help="density-pse --max-level (default: the command's, finest cells half "
                         "the Lagrangian spacing)")
    args = ap.parse_args(argv)
    start(args, "pipeline")

    env = dict(os.environ, MPLBACKEND="Agg")
    if args.read_chunk_size:
        env["DASK_COSMO_DASK__READ_CHUNK_SIZE"] = str(args.read_chunk_size)
        os.environ["DASK_COSMO_DASK__READ_CHUNK_SIZE"] = str(args.read_chunk_size)
    device_name = platform.processor() or platform.machine()
    if args.device == "gpu":
        import cupy

        device_name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    base = {"bench": "pipeline", "device": args.device, "device_name": device_name,
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}
    rows = []
    for n_side in args.n_side:
        work = Path(args.dir or tempfile.mkdtemp(prefix="bench_pipeline_")) / f"n{n_side}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        box = 1.5625 * n_side
        cmds = commands(n_side, box, args.pse_max_level)
        total = 0.0
        for stage in args.stages:
            row = {**base, "n_side": n_side, "n_particles": n_side**3, "box": box,
                   "stage": stage, "command": "cosmo-dask --" + args.device + " "
                   + " ".join(cmds[stage])}
            row.update(run_stage(cmds[stage], work, args.device, env, args.timeout))
            out = output_of(cmds[stage])
            if out and (work / out).exists():
                row["bytes_written"] = dir_bytes(work / out)
            store = work / "s.zarr"
            if stage in READS and row["exit"] == 0 and store.exists():
                row["read_s"], row["bytes_read"] = read_seconds(store, READS[stage],
                                                                args.device)
                row["read_s"] = round(row["read_s"], 3)
            total += row["wall_s"]
            rows.append(row)
            emit(row)
        emit({**base, "n_side": n_side, "summary": True,
                          "total_wall_s": round(total, 1),
                          "failed": [r["stage"] for r in rows
                                     if r.get("n_side") == n_side and r["exit"] != 0]})
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return rows


if __name__ == "__main__":
    main()
