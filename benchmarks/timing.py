"""Shared by the benchmark scripts: one JSON line per measurement, wall-clock medians."""

from __future__ import annotations

import json
import statistics
import time


def emit(env: dict, **fields) -> None:
    """Print one measurement as a JSON line (environment fields first)."""
    print(json.dumps({**env, **fields}), flush=True)


def wall_median(fn, repeat: int, warm: int = 1) -> float:
    """Median wall-clock seconds of ``repeat`` calls of ``fn`` after ``warm`` warm-up calls."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def box_parser(doc: str, *, n_side: int, box: float, steps: int, method: bool = True):
    """An argument parser with the evolved-box options of the simulation benchmarks:
    ``--n-side``, ``--box`` (Mpc/h), ``--z-init``, ``--steps`` (and ``--method``), and
    the env fields every line of such a benchmark carries (``env_of(args)``)."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--n-side", type=int, default=n_side)
    ap.add_argument("--box", type=float, default=box)
    ap.add_argument("--z-init", type=float, default=19.0)
    ap.add_argument("--steps", type=int, default=steps)
    if method:
        ap.add_argument("--method", choices=("pm", "treepm"), default="pm")
    return ap


def env_of(bench: str, args) -> dict:
    """The environment fields of a simulation benchmark's lines."""
    import os

    env = {"bench": bench, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
           "n_side": args.n_side, "box": args.box, "z_init": args.z_init, "steps": args.steps}
    if hasattr(args, "method"):
        env["method"] = args.method
    return env


def gpu_seconds(fn, repeat: int, warm: int = 1):
    """``(median, times, last result)`` of ``repeat`` calls of ``fn`` after ``warm``
    warm-up calls, wall-clock seconds with the CUDA device synchronised around each."""
    import cupy

    out = None
    for _ in range(warm):
        out = fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times, out
