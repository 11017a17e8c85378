"""What every benchmark shares: one argument set and ``Config``, the timing helpers, the
environment record, and the output.

A workload module builds its parser with :func:`parser` (the common options ``--device``,
``--repeat``, ``--warmup``, ``--out``, ``--label`` plus its own), calls :func:`start`
after parsing, and reports each measurement with :func:`emit`: the row, preceded by the
environment record (workload, device, label, host, cores, GPU name, date, git commit),
is printed as one JSON line on stdout and appended to ``<out>/<workload>.jsonl``
(``--out`` defaults to ``benchmarks/results/``; ``--out -`` prints only).
``python -m benchmarks`` then prints the rows as a table on stderr.

Without :func:`start` (a worker subprocess of a benchmark, an imported helper),
:func:`emit` prints the row alone, as the scripts did before they shared this module.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

#: keys of the environment record (left out of the printed table)
ENV_KEYS = ("bench", "device", "label", "host", "cpus", "gpu", "date", "commit")


@dataclass
class Config:
    """The options every workload shares.

    Attributes
    ----------
    workload : str
        The workload's name (``python -m benchmarks --list``).
    device : str
        ``"cpu"`` or ``"gpu"``.
    repeat : int or None
        Timed runs per measurement (median), where the workload takes a count.
    warmup : int
        Untimed runs before the timed ones (``wall_median``, ``gpu_seconds``).
    out : Path or None
        Folder of the JSON-lines files; None prints only.
    label : str
        Names the source tree or the variant in every line.
    env : dict
        The environment record every line starts with.
    """

    workload: str
    device: str = "cpu"
    repeat: int | None = None
    warmup: int = 1
    out: Path | None = RESULTS
    label: str = ""
    env: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)


#: the running workload's configuration (set by :func:`start`)
CONFIG: Config | None = None


def git_commit() -> str:
    """The short commit of the repository holding this file ('' outside git), or
    ``$BENCH_COMMIT`` when set (a lent GPU host's copy of the tree may carry another git
    HEAD than the commit it was copied from)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def gpu_name() -> str | None:
    """The name of CUDA device 0, or None without CuPy or a GPU."""
    try:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: no GPU name
        return None
    return name.decode() if isinstance(name, bytes) else str(name)


def environment(workload: str, device: str = "cpu", label: str = "") -> dict:
    """The environment record: workload, device, label, host, cores, GPU, date, commit."""
    env = {"bench": workload, "device": device, "label": label, "host": platform.node(),
           "cpus": os.cpu_count(), "date": datetime.date.today().isoformat(),
           "commit": git_commit()}
    if device == "gpu":
        env["gpu"] = gpu_name()
    return env


def add_common(ap: argparse.ArgumentParser, *, repeat: int | None = None,
               devices=("cpu", "gpu"), device: str | None = None) -> argparse.ArgumentParser:
    """Add the common options to ``ap``: ``--device`` (one of ``devices``, default
    ``device`` or the first), ``--repeat`` (where ``repeat`` is given, its default),
    ``--warmup``, ``--out`` and ``--label``."""
    g = ap.add_argument_group("common options (every workload)")
    g.add_argument("--device", choices=tuple(devices), default=device or devices[0])
    if repeat is not None:
        g.add_argument("--repeat", type=int, default=repeat, help="timed runs (median)")
    g.add_argument("--warmup", type=int, default=1, help="untimed runs before the timed ones")
    g.add_argument("--out", default=str(RESULTS),
                   help="folder of <workload>.jsonl (default benchmarks/results/; - prints only)")
    g.add_argument("--label", default="", help="names the source tree or variant in each line")
    return ap


def parser(doc: str | None, *, repeat: int | None = None, devices=("cpu", "gpu"),
           device: str | None = None) -> argparse.ArgumentParser:
    """An argument parser described by the first paragraph of ``doc``, with the common
    options (:func:`add_common`)."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_common(ap, repeat=repeat, devices=devices, device=device)


def start(args: argparse.Namespace, workload: str) -> Config:
    """The :class:`Config` of parsed common options; it becomes :data:`CONFIG`, so that
    :func:`emit` and the timing helpers use it."""
    global CONFIG
    out = getattr(args, "out", str(RESULTS))
    device = getattr(args, "device", "cpu")
    label = getattr(args, "label", "")
    CONFIG = Config(workload=workload, device=device, repeat=getattr(args, "repeat", None),
                    warmup=getattr(args, "warmup", 1),
                    out=None if out in (None, "-") else Path(out), label=label,
                    env=environment(workload, device, label))
    return CONFIG


def emit(env: dict | None = None, *, file: str | None = None, save: bool = True,
         **fields) -> dict:
    """Report one measurement: ``{**env, **fields}`` after the environment record, as a
    JSON line on stdout and appended to ``<out>/<file or workload>.jsonl`` (not with
    ``save=False``). Returns the line's dict."""
    row = {**(env or {}), **fields}
    if CONFIG is None:
        print(json.dumps(row, default=str), flush=True)
        return row
    row = {**CONFIG.env, **row}
    print(json.dumps(row, default=str), flush=True)
    CONFIG.rows.append(row)
    if save:
        append([row], file=file, env=False)
    return row


def append(rows: list[dict], *, file: str | None = None, env: bool = True) -> None:
    """Append ``rows`` (after the environment record, unless ``env=False``) to
    ``<out>/<file or workload>.jsonl``; nothing without :func:`start` or with ``--out -``."""
    if CONFIG is None or CONFIG.out is None:
        return
    CONFIG.out.mkdir(parents=True, exist_ok=True)
    with open(CONFIG.out / f"{file or CONFIG.workload}.jsonl", "a") as f:
        for row in rows:
            f.write(json.dumps({**CONFIG.env, **row} if env else row, default=str) + "\n")


def table(rows: list[dict], *, max_cols: int = 12, width: int = 18) -> str:
    """The rows' scalar fields (the environment record left out) as a text table."""
    cols: list[str] = []
    for r in rows:
        for k, v in r.items():
            if k not in ENV_KEYS and k not in cols and (v is None or isinstance(
                    v, (str, int, float, bool))):
                cols.append(k)
    cols = cols[:max_cols]
    if not cols:
        return ""

    def cell(v):
        if isinstance(v, float):
            v = f"{v:.4g}"
        s = "" if v is None else str(v)
        return s if len(s) <= width else s[: width - 1] + "~"

    cells = [[cell(r.get(c)) for c in cols] for r in rows]
    w = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(cols)),
             "  ".join("-" * x for x in w)]
    lines += ["  ".join(v.ljust(w[i]) for i, v in enumerate(row)) for row in cells]
    return "\n".join(lines)


def _warm(warm):
    if warm is not None:
        return warm
    return CONFIG.warmup if CONFIG is not None else 1


def wall_median(fn, repeat: int, warm: int | None = None) -> float:
    """Median wall-clock seconds of ``repeat`` calls of ``fn`` after ``warm`` warm-up
    calls (default: the ``--warmup`` option, else 1)."""
    for _ in range(_warm(warm)):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def gpu_seconds(fn, repeat: int, warm: int | None = None):
    """``(median, times, last result)`` of ``repeat`` calls of ``fn`` after ``warm``
    warm-up calls, wall-clock seconds with the CUDA device synchronised around each."""
    import cupy

    out = None
    for _ in range(_warm(warm)):
        out = fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times, out


def cuda_event_seconds(fn, repeat: int, warm: int | None = None, before=None):
    """``(median, times)``: seconds of ``repeat`` calls of ``fn`` timed by CUDA events on
    the current stream after ``warm`` warm-up calls (default: the ``--warmup`` option,
    else 1); ``before()``, when given, runs untimed before every call (e.g. zeroing an
    output)."""
    import cupy

    for _ in range(_warm(warm)):
        if before:
            before()
        fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        if before:
            before()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return statistics.median(times), times


def box_parser(doc: str, *, n_side: int, box: float, steps: int, method: bool = True,
               devices=("cpu", "gpu")):
    """A :func:`parser` with the evolved-box options of the simulation benchmarks:
    ``--n-side``, ``--box`` (Mpc/h), ``--z-init``, ``--steps`` (and ``--method``)."""
    ap = parser(doc, devices=devices)
    ap.add_argument("--n-side", type=int, default=n_side)
    ap.add_argument("--box", type=float, default=box)
    ap.add_argument("--z-init", type=float, default=19.0)
    ap.add_argument("--steps", type=int, default=steps)
    if method:
        ap.add_argument("--method", choices=("pm", "treepm"), default="pm")
    return ap


def env_of(bench: str, args) -> dict:
    """The fields of a simulation benchmark's lines (box and run)."""
    env = {"bench": bench, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
           "n_side": args.n_side, "box": args.box, "z_init": args.z_init, "steps": args.steps}
    if hasattr(args, "method"):
        env["method"] = args.method
    return env


def stderr(msg: str) -> None:
    """A progress line on stderr (stdout holds the JSON lines)."""
    print(msg, file=sys.stderr, flush=True)
