"""Fault injection: what each kind of fault does to a user's run, end to end through the
``cosmo-dask`` command (one subprocess per run, its own local cluster, a wall-clock limit
so that a hang is recorded as a hang instead of stopping the benchmark).

Every row names a fault, the command it hits and the outcome, one of

- ``error``: the command failed (status != 0) within the limit with one line on stderr;
- ``identical``: the command succeeded and its result equals the fault-free result;
- ``recovered``: the target holds a complete, valid store afterwards (old or new);

and ``ok`` says whether the outcome is the one wanted: no data lost, no silent wrong
answer, no hang. One JSON line per row on stdout, appended to
``benchmarks/results/faults.jsonl``::

    python -m benchmarks faults [--n-side 16] [--limit 120] [--only NAME,...]

Sizes are small on purpose (16^3 to 32^3 particles): what is measured is the outcome and
how long a user waits for it, which the cluster's start dominates (about 3-10 s on
2 cores).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import emit, parser, start  # noqa: E402

MANIFEST = "cosmo_dask_chunks"


# --------------------------------------------------------------------------- helpers

def cli(args, *, cwd, limit, env=None):
    """Run ``python -m cosmo_dask ARGS`` with a wall-clock limit: (rc or None on a hang,
    seconds, stderr lines)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "cosmo_dask", "--workers", "2", *args],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})},
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=limit)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        rc = None
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[")]
    return rc, time.perf_counter() - t0, lines


def chunk_path(store: Path, array: str, index: int) -> Path:
    return store / array / "c" / str(index) / "0"


def refresh_manifest(store: Path, array: str) -> None:
    """Recompute the recorded CRC-32 and size of every chunk file of ``array`` (what a
    producer that wrote bad values itself would have recorded)."""
    meta_path = store / array / "zarr.json"
    meta = json.loads(meta_path.read_text())
    manifest = meta["attributes"][MANIFEST]
    for i in range(len(manifest["crc32"])):
        data = chunk_path(store, array, i).read_bytes()
        manifest["crc32"][i] = zlib.crc32(data)
        manifest["sizes"][i] = len(data)
    meta_path.write_text(json.dumps(meta, indent=2))


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 + 3 if offset is None else offset
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def put_nan(store: Path, array: str) -> None:
    """One NaN in the first chunk of ``array``, written through zarr (any codec), with the
    manifest refreshed so that only the value check can find it."""
    import zarr

    z = zarr.open_array(str(store / array), mode="r+")
    z[5, 1] = np.nan
    refresh_manifest(store, array)


def tree_hash(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def valid_store(cwd: Path, path: str, limit: float) -> bool:
    rc, _, _ = cli(["info", path], cwd=cwd, limit=limit)
    return rc == 0


# --------------------------------------------------------------------------- the faults

def errors_row(fault, command, rc, seconds, lines, limit):
    """A row for a run that should fail: one ``cosmo-dask: ...`` line, no traceback, a
    non-zero status within ``limit`` (the cluster's connection line and progress lines
    are information, not errors)."""
    hang = rc is None
    said = [ln for ln in lines if ln.startswith("cosmo-dask:")]
    traceback = any("Traceback" in ln or "Compute Failed" in ln for ln in lines)
    ok = (not hang) and rc != 0 and len(said) == 1 and not traceback
    return {"fault": fault, "command": " ".join(command[:1]), "outcome":
            "hang" if hang else ("error" if rc != 0 else "silent"), "rc": rc,
            "seconds": round(seconds, 2), "error_lines": len(said),
            "traceback": traceback, "message": (said or lines or [""])[-1][:200],
            "ok": ok, "limit_s": limit}


def fault_error(name, work: Path, base: Path, inject, command, limit):
    """Copy the clean store (``blobs-*`` rows: the Lagrangian-free one), inject the fault,
    run ``command`` (with ``{s}`` the store and ``{o}`` a fresh output path) and expect a
    one-line error within ``limit``."""
    if name.startswith("blobs-"):
        base = work / "blobs.zarr"
    d = work / name
    d.mkdir()
    shutil.copytree(base, d / "s.zarr")
    inject(d / "s.zarr")
    args = [a.format(s="s.zarr", o="out.zarr") for a in command]
    rc, sec, lines = cli(args, cwd=d, limit=limit)
    row = errors_row(name, args, rc, sec, lines, limit)
    row["output_left"] = (d / "out.zarr").exists()
    row["ok"] = row["ok"] and not row["output_left"]
    return row


def kill_when(name, d: Path, args, *, ready, limit, check):
    """Start ``args`` in ``d`` (stdout and stderr to ``d/stdout.txt``), SIGKILL its process
    group once ``ready(d)`` holds (polled every 20 ms, at most ``limit`` s), then let
    ``check(d)`` say what is left (``(outcome, ok)``)."""
    d.mkdir(exist_ok=True)
    with open(d / "stdout.txt", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cosmo_dask", "--workers", "2",
                                 *args], cwd=d, stdout=log, stderr=log,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                start_new_session=True)
        t0 = time.perf_counter()
        while proc.poll() is None and not ready(d) and time.perf_counter() - t0 < limit:
            time.sleep(0.02)
        killed = proc.poll() is None
        if killed:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    outcome, ok = check(d)
    return {"fault": name, "command": args[0], "killed_running": killed,
            "killed_after_s": round(time.perf_counter() - t0, 2), "outcome": outcome,
            "ok": ok and killed, "limit_s": limit}


def stdout_has(text):
    return lambda d: text in (d / "stdout.txt").read_text()


def exists(pattern):
    return lambda d: any(d.glob(pattern))


WORKER_KILL = """
import os, signal, threading, time, numpy as np
from distributed import Client, LocalCluster
from cosmo_dask import Snapshot
from cosmo_dask.halos import fof

def snap():
    rng = np.random.default_rng(3)
    c = rng.random((12, 3)) * 10.0
    pos = c[rng.integers(0, 12, 200000)] + 0.2 * rng.normal(size=(200000, 3))
    return Snapshot.from_arrays(pos % 10.0, rng.normal(size=(200000, 3)),
                                ids=np.arange(200000), box_size=10.0, particle_mass=1.0,
                                chunks=25000)

def run():
    r = fof(snap(), 0.2, centers=("mbp",))
    return np.asarray(r.labels.compute()), r.catalog["mass"].values

if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cl, Client(cl) as client:
        ref = run()
        pids = client.run(os.getpid)
        threading.Timer(1.0, lambda: os.kill(sorted(pids.values())[0], signal.SIGKILL)).start()
        t0 = time.time()
        got = run()
        print("RUN_SECONDS", time.time() - t0)
        same = all(np.array_equal(a, b) for a, b in zip(ref, got))
        print("OUTCOME", "identical" if same else "different")
"""

MEMORY_PAUSE = """
import numpy as np, dask.array as da
from distributed import Client, LocalCluster
from cosmo_dask import Snapshot
from cosmo_dask.halos import fof

if __name__ == "__main__":
    import dask
    dask.config.set({"distributed.worker.memory.terminate": False})  # paused, not killed
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", memory_limit="250MB") as cl, Client(cl) as client:
        n = 2**22
        pos = da.random.default_rng(1).random((n, 3), chunks=(n // 8, 3)) * 100.0
        def hold(dask_worker):  # unmanaged memory past the pause fraction (80%)
            dask_worker.hog = np.ones(2**25)  # 256 MiB
        client.run(hold)
        snap = Snapshot.from_arrays(pos, box_size=100.0, particle_mass=1.0)
        try:
            fof(snap, 0.2, centers=()).labels.compute()
            print("OUTCOME", "finished")
        except Exception as e:
            print("OUTCOME", "error", type(e).__name__, str(e).splitlines()[0][:150])
"""


def api_row(name, script, limit):
    """Run an API script with a wall-clock limit; its last ``OUTCOME`` line is the
    outcome (``identical`` and ``error`` are the wanted ones)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return {"fault": name, "outcome": "hang", "ok": False,
                "seconds": round(time.perf_counter() - t0, 2), "limit_s": limit}
    lines = [ln for ln in out.splitlines() if ln.startswith("OUTCOME")]
    outcome = lines[-1][len("OUTCOME "):] if lines else f"crashed (rc {proc.returncode})"
    ok = outcome.startswith("identical") or outcome.startswith("error")
    run = [float(ln.split()[1]) for ln in out.splitlines() if ln.startswith("RUN_SECONDS")]
    return {"fault": name, "outcome": outcome, "ok": ok,
            "faulted_run_s": round(run[-1], 2) if run else None,
            "seconds": round(time.perf_counter() - t0, 2), "limit_s": limit}


def main(argv=None) -> None:
    ap = parser(__doc__, devices=("cpu",))
    ap.add_argument("--n-side", type=int, default=16)
    ap.add_argument("--limit", type=float, default=120.0,
                    help="seconds after which a run counts as hung")
    ap.add_argument("--only", default="", help="comma-separated row names")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    start(args, "faults")
    only = {s for s in args.only.split(",") if s}
    limit = args.limit
    n = args.n_side
    rows = []
    env = {"bench": "faults", "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
           "n_side": n}

    def record(row):
        row = {**env, **row}
        rows.append(row)
        emit(row, save=not args.no_save)

    def want(name):
        return not only or name in only

    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        work = Path(tmp)
        # the clean input: a Zel'dovich box at z = 0 (halos present), 4 chunks
        rc, _, lines = cli(["generate", "zeldovich", "base.zarr", "--n-side", str(n),
                            "--box-size", "32", "--redshift", "0", "--seed", "3"],
                           cwd=work, limit=limit)
        if rc != 0:
            raise SystemExit(f"could not generate the input: {lines}")
        base = work / "base.zarr"
        # a store without a Lagrangian grid (nothing but n_particles to check shapes by)
        cli(["generate", "blobs", "blobs.zarr", "--n", "4096", "--box-size", "32", "--seed",
             "2"], cwd=work, limit=limit)
        npos = len(list((base / "pos" / "c").iterdir()))

        def flip(s):
            flip_byte(chunk_path(s, "pos", npos // 2))

        def truncate(s):
            p = chunk_path(s, "pos", 0)
            p.write_bytes(p.read_bytes()[:-16])

        def delete(s):
            chunk_path(s, "pos", npos - 1).unlink()

        def edit_shape(s):
            for a in ("pos", "vel", "ids"):
                m = s / a / "zarr.json"
                if m.exists():
                    meta = json.loads(m.read_text())
                    meta["shape"][0] -= 96
                    m.write_text(json.dumps(meta))

        def huge_shape(s):
            for a in ("pos", "vel", "ids"):
                m = s / a / "zarr.json"
                if m.exists():
                    meta = json.loads(m.read_text())
                    meta["shape"][0] = 10**12
                    m.write_text(json.dumps(meta))

        error_cases = {
            "byte-flip/halos": (flip, ["halos", "{s}", "{o}"]),
            "byte-flip/power": (flip, ["power", "{s}", "--n-mesh", "32"]),
            "nan/halos": (lambda s: put_nan(s, "pos"), ["halos", "{s}", "{o}"]),
            "nan/pse": (lambda s: put_nan(s, "pos"),
                        ["density", "{s}", "{o}", "--method", "pse", "--max-level", "2"]),
            "nan-vel/power": (lambda s: put_nan(s, "vel"),
                              ["halos", "{s}", "{o}", "--centers", "mbp"]),
            "truncated/halos": (truncate, ["halos", "{s}", "{o}"]),
            "deleted/power": (delete, ["power", "{s}", "--n-mesh", "32"]),
            "edited-shape/info": (edit_shape, ["info", "{s}"]),
            "blobs-edited-shape/info": (edit_shape, ["info", "{s}"]),
            "huge-shape/info-quick": (huge_shape, ["info", "{s}", "--quick"]),
        }
        for name, (inject, command) in error_cases.items():
            if want(name):
                record(fault_error(name.replace("/", "-"), work, base, inject, command, limit))

        def ics(d):
            d.mkdir()
            cli(["ics", "ic.zarr", "--n-side", str(n), "--box-size", "32", "--redshift",
                 "19", "--seed", "1"], cwd=d, limit=limit)

        sim = ["simulate", "ic.zarr", "run", "--steps", "8", "--checkpoint-every", "2",
               "--outputs", "1"]

        def last_pos(run: Path):
            import zarr

            last = sorted((run / "outputs").iterdir())[-1]
            return zarr.open_array(str(last / "snapshot" / "pos"), mode="r")[:]

        # a checkpoint altered in place, then --resume: refused
        if want("checkpoint-flip"):
            d = work / "checkpoint-flip"
            ics(d)

            def flip_and_resume(d):
                target = d / "run" / "checkpoint" / "pos" / "c" / "0" / "0"
                if not target.exists():
                    return "no checkpoint", False
                flip_byte(target)
                rc, sec, lines = cli([*sim, "--resume"], cwd=d, limit=limit)
                row = errors_row("", sim, rc, sec, lines, limit)
                return f"{row['outcome']} in {row['seconds']} s: {row['message']}", row["ok"]
            record(kill_when("checkpoint-flip", d, sim, ready=stdout_has("step 5/"),
                           limit=limit, check=flip_and_resume))

        # a simulation killed mid-run resumes to the uninterrupted result, bit for bit
        if want("kill-during-simulate"):
            d = work / "kill-during-simulate"
            ics(d)
            cli([*sim[:2], "ref", *sim[3:]], cwd=d, limit=limit)

            def resume_same(d):
                rc, _, lines = cli([*sim, "--resume"], cwd=d, limit=limit)
                if rc != 0:
                    return f"resume failed (rc {rc}): {lines[-1:]}", False
                same = np.array_equal(last_pos(d / "ref"), last_pos(d / "run"))
                return ("identical" if same else "different"), same
            record(kill_when("kill-during-simulate", d, sim, ready=stdout_has("step 5/"),
                           limit=limit, check=resume_same))

        # --overwrite of a finished simulation, killed after its first step: the old
        # simulation is still there, complete
        if want("kill-during-simulate-overwrite"):
            d = work / "kill-during-simulate-overwrite"
            ics(d)
            cli(sim, cwd=d, limit=limit)
            before = last_pos(d / "run")

            def old_kept(d):
                try:
                    same = np.array_equal(last_pos(d / "run"), before)
                except (OSError, IndexError, ValueError) as exc:
                    return f"lost ({type(exc).__name__})", False
                return ("old simulation kept" if same else "changed"), same
            record(kill_when("kill-during-simulate-overwrite", d, [*sim, "--overwrite"],
                           ready=stdout_has("step 2/"), limit=limit, check=old_kept))

        # killed writes: the target is absent (a fresh write) or still the old store
        def target_state(d, before=None):
            target = d / "k.zarr"
            if not target.exists():
                cli(["clean", "k.zarr"], cwd=d, limit=limit)  # what a user does next
            if not target.exists():
                return ("absent", True) if before is None else ("lost", False)
            if not valid_store(d, "k.zarr", limit):
                return "partial", False
            if before is None:
                return "new store", True
            return ("old store" if tree_hash(target) == before else "new store"), True

        big = ["generate", "zeldovich", "k.zarr", "--n-side", "48", "--box-size", "64",
               "--redshift", "0", "--seed", "2"]
        if want("kill-during-write"):
            record(kill_when("kill-during-write", work / "kill-during-write", big,
                           ready=exists(".k.zarr.tmp-*/pos"), limit=limit,
                           check=target_state))

        if want("kill-during-replace"):
            d = work / "kill-during-replace"
            d.mkdir()
            shutil.copytree(base, d / "k.zarr")
            before = tree_hash(d / "k.zarr")
            record(kill_when("kill-during-replace", d, [*big, "--overwrite"],
                           ready=exists(".k.zarr.tmp-*/pos"), limit=limit,
                           check=lambda d: target_state(d, before)))

        # a replace killed between its two renames (the old store moved aside, the new
        # one not yet in place; made by hand, the window is microseconds): `clean` puts
        # a complete store back at the target
        if want("kill-between-renames"):
            d = work / "kill-between-renames"
            d.mkdir()
            token = "0123456789ab"
            shutil.copytree(base, d / f".k.zarr.old-{token}")
            shutil.copytree(base, d / f".k.zarr.tmp-{token}")
            # the writer's marker, naming a process that has ended (a killed writer)
            gone = subprocess.Popen([sys.executable, "-c", "pass"])
            gone.wait()
            (d / f".k.zarr.tmp-{token}.writer").write_text(json.dumps(
                {"host": socket.gethostname(), "pid": gone.pid, "start": time.time() - 5}))
            t0 = time.perf_counter()
            state, ok = target_state(d, tree_hash(base))
            record({"fault": "kill-between-renames", "command": "clean", "outcome": state,
                  "ok": ok, "seconds": round(time.perf_counter() - t0, 2)})

        # API rows on a 2-process cluster: a worker killed mid-FOF, workers paused for memory
        if want("worker-kill/fof"):
            record(api_row("worker-kill-fof", WORKER_KILL, 3 * limit))
        if want("memory-pause/fof"):
            record(api_row("memory-pause-fof", MEMORY_PAUSE, limit))

    bad = [r["fault"] for r in rows if not r.get("ok")]
    print(f"{len(rows) - len(bad)} of {len(rows)} rows ok" + (f"; not ok: {bad}" if bad
                                                               else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
