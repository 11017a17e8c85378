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
