"""numba compile seconds of each kernel the demo runs, from a cold cache, biggest first.

The demo's stages (``cosmo_dask.cli.demo_stages.STAGES``, or the ones named with ``--stages``) run
in ONE fresh subprocess on dask's threaded scheduler (no cluster: the compiles happen in
the measuring process), with ``NUMBA_CACHE_DIR`` a new empty temporary directory, so
every kernel a run dispatches compiles exactly as on a first run. numba's compile events
(``numba.core.event``, kind ``"numba:compile"``, one per dispatcher and signature)
are recorded with their wall time:

* ``seconds``: inclusive, the kernel and the jitted functions it compiles on the way
  (callees compiled as their own dispatchers, not those inlined);
* ``self_seconds``: less the compiles nested inside it;
* ``cpu_seconds``, ``self_cpu_seconds``: the same in CPU seconds of the compiling
  thread (less sensitive to other load on a shared machine);
* ``top``: true when no other compile was running around it (a kernel called from
  Python, which is what a run waits for);
* ``outer``: for the others, the top-level kernel whose compile it is part of.

Prints one JSON object per (kernel, signature), biggest ``seconds`` first, then one
``summary`` object (compile seconds of the top-level kernels together, the stages'
wall time, the numba version) and appends them all to
``benchmarks/results/compile.jsonl``. ``--warm`` runs the stages a second time in a new
subprocess on the same cache and reports that run's compiles (none expected: every
kernel loads from the cache) and its cache hits.

    python -m benchmarks compile [--n-side 64] [--stages halos pse] [--warm]
        [--top 10] [--no-append]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.common import ROOT, append, emit, parser, start  # noqa: E402

_CHILD = r"""
import json, os, sys, time, threading
import numba
import numba.core.event as ev


def install_recorder():
    if hasattr(ev, "_bench_records"):
        return
    records = ev._bench_records = []
    lock = threading.Lock()
    stack = threading.local()

    def kernel_name(event):
        fn = getattr((event.data or {}).get("dispatcher"), "py_func", None)
        return (f"{fn.__module__}.{fn.__qualname__}" if fn is not None
                else repr((event.data or {}).get("dispatcher")))

    class Recorder(ev.Listener):
        def on_start(self, event):
            st = getattr(stack, "s", None)
            if st is None:
                st = stack.s = []
            st.append([time.perf_counter(), 0.0, time.thread_time(), 0.0, kernel_name(event)])

        def on_end(self, event):
            st = getattr(stack, "s", None)
            if not st:
                return
            t0, nested, c0, cnested, name = st.pop()
            dt = time.perf_counter() - t0
            dc = time.thread_time() - c0
            if st:
                st[-1][1] += dt
                st[-1][3] += dc
            data = event.data or {}
            with lock:
                records.append({
                    "kernel": name,
                    "signature": "(" + ", ".join(str(a) for a in data.get("args", ())) + ")",
                    "seconds": round(dt, 3),
                    "self_seconds": round(dt - nested, 3),
                    "cpu_seconds": round(dc, 3),
                    "self_cpu_seconds": round(dc - cnested, 3),
                    "top": not st,
                    "outer": st[0][4] if st else None,
                    "pid": os.getpid(),
                })

    ev.register("numba:compile", Recorder())


def cache_hits():
    import gc
    from numba.core.registry import CPUDispatcher
    hits = 0
    for obj in gc.get_objects():
        try:
            if isinstance(obj, CPUDispatcher):
                hits += sum(obj.stats.cache_hits.values())
        except Exception:
            pass
    return hits


def records():
    return ev._bench_records


install_recorder()
from cosmo_dask.cli import demo_stages as demo
n_side, mode, want = int(sys.argv[1]), sys.argv[2], set(sys.argv[3:])
stages = [s for s in demo.STAGES if not want or s.__name__.removeprefix("stage_") in want]
needed = {"halos", "density", "pse"} & {s.__name__.removeprefix("stage_") for s in stages}
if needed and "simulate" not in want:  # the analysis stages need the evolved box
    stages = [s for s in demo.STAGES if s.__name__ in ("stage_generate", "stage_simulate")
              and s not in stages] + stages
demo.STAGES[:] = stages
say = lambda s: print(s, file=sys.stderr)
if mode == "cluster":  # the CLI's local cluster; the workers record their compiles too
    import cosmo_dask
    client = cosmo_dask.connect(gpu=False, quiet=True, dashboard_address=":0")
    client.run(install_recorder)
else:
    client = None
t0 = time.perf_counter()
demo.run_demo(n_side=n_side, say=say, client=client)
wall = time.perf_counter() - t0
recs, hits = list(records()), cache_hits()
if client is not None:
    for worker_recs in client.run(records).values():
        recs += worker_recs
    hits += sum(client.run(cache_hits).values())
    client.close()
print(json.dumps({"records": recs, "wall": wall, "cache_hits": hits,
                  "numba": numba.__version__}))
"""


def run_child(n_side: int, stages: list[str], cache_dir: str, mode: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(n_side), mode, *stages], env=env,
                         check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def report(res: dict, run: str, mode: str, n_side: int, stages: list[str],
           top: int) -> list[dict]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    common = {"date": stamp, "commit": _commit(), "run": run, "mode": mode, "n_side": n_side,
              "load": round(os.getloadavg()[0], 2)}
    rows = sorted(res["records"], key=lambda r: -r["seconds"])
    out = [dict(common, **r) for r in rows]
    for r in out[:top] if top else out:
        emit(r, save=False)
    tops = [r for r in rows if r["top"]]
    summary = dict(common, summary=True, stages=stages or "all",
                   compile_seconds=round(sum(r["seconds"] for r in tops), 2),
                   compile_cpu_seconds=round(sum(r["cpu_seconds"] for r in tops), 2),
                   n_compiles=len(rows), n_top_level=len(tops),
                   n_processes=len({r["pid"] for r in rows}),
                   stages_wall_seconds=round(res["wall"], 2), cache_hits=res["cache_hits"],
                   numba=res["numba"])
    emit(summary, save=False)
    return [*out, summary]


def main(argv=None) -> int:
    ap = parser(__doc__, devices=("cpu",))
    ap.add_argument("--n-side", type=int, default=64, help="the demo's particles per side")
    ap.add_argument("--stages", nargs="*", default=[],
                    help="demo stages to run (names without 'stage_'; default all)")
    ap.add_argument("--mode", choices=("threads", "cluster"), default="threads",
                    help="threads: one process, dask's threaded scheduler (default); "
                    "cluster: the CLI's local cluster, compiles of every process")
    ap.add_argument("--warm", action="store_true", help="also a second run on the same cache")
    ap.add_argument("--top", type=int, default=0, help="print only the N biggest (0: all)")
    ap.add_argument("--no-append", action="store_true", help="do not append to compile.jsonl")
    args = ap.parse_args(argv)
    start(args, "compile")
    rows = []
    with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache:
        for run in ("cold", "warm") if args.warm else ("cold",):
            res = run_child(args.n_side, args.stages, cache, args.mode)
            rows += report(res, run, args.mode, args.n_side, args.stages, args.top)
    if not args.no_append:
        append(rows)  # every row, also those --top leaves off the screen
    return 0


if __name__ == "__main__":
    sys.exit(main())
