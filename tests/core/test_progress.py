"""progress.compute/persist: stage label, task kinds with counts, time; terminal or file."""

from __future__ import annotations

import io
import re
import sys
import time
import uuid

import dask
import pytest

from cosmo_dask.core import progress


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def _sleep_then(x, seconds):
    time.sleep(seconds)
    return x


def _graph(n=4, seconds=0.2):
    """``n`` named ``fof-domain`` tasks and one ``fof-merge`` (unique keys per call)."""
    tag = uuid.uuid4().hex[:8]
    parts = [dask.delayed(_sleep_then)(i, seconds, dask_key_name=f"fof-domain-{tag}-{i}")
             for i in range(n)]
    return dask.delayed(sum)(parts, dask_key_name=f"fof-merge-{tag}")


def _lines(err):
    return [ln for ln in err.splitlines() if ln]


@pytest.fixture(params=["local", "distributed"])
def where(request):
    """Run on dask's threaded scheduler or on the shared distributed client."""
    if request.param == "local":
        with dask.config.set(scheduler="threads"):
            yield "local"
    else:
        with request.getfixturevalue("client").as_current():
            yield "distributed"


def test_redirected_stream_gets_start_and_end_lines(where, capsys):
    (total,) = progress.compute(_graph(), label="halos", show=True)
    assert total == 6
    captured = capsys.readouterr()
    assert captured.out == ""  # stdout stays for results
    err = captured.err
    assert "\r" not in err
    lines = _lines(err)
    assert len(lines) == 2, err
    start, end = lines
    # tasks finished before the scheduler plugin starts are not counted (distributed)
    assert start.startswith("[halos] ") and start.endswith("| started")
    assert re.search(r"fof-domain \d/4", start) and "fof-merge 0/1" in start
    assert start.index("fof-domain") < start.index("fof-merge")  # most tasks first
    assert re.fullmatch(r"\[halos\] fof-domain (4/4|\d/\d), fof-merge 1/1 \| done in "
                        r"\d+\.\d s", end), end


def test_redirected_stream_gets_a_line_per_interval(where, capsys, monkeypatch):
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.25)
    progress.compute(_graph(n=4, seconds=0.5), label="slow stage", show=True)
    lines = _lines(capsys.readouterr().err)
    assert lines[0].endswith("| started") and "done in" in lines[-1]
    middle = lines[1:-1]
    assert 2 <= len(middle) <= 8, lines
    assert all(re.search(r"\| \d+\.\d s elapsed", ln) for ln in middle), lines


def test_terminal_redraws_in_place(where, monkeypatch):
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    progress.compute(_graph(n=4, seconds=0.3), label="gravity", show=True)
    out = tty.getvalue()
    assert out.count("\r") >= 3  # redrawn while it runs (~every 0.1 s)
    assert out.endswith("\n") and out.count("\n") == 1  # one line, ended when done
    frames = [f.rstrip() for f in out.rstrip("\n").split("\r") if f]
    assert frames[0].startswith("[gravity] fof-domain")
    assert any("elapsed" in f for f in frames)
    assert re.search(r"fof-merge 1/1 \| done in \d+\.\d s$", frames[-1])


def test_persist_and_unlabelled_short_computations(where, capsys):
    (persisted,) = progress.persist(_graph(n=2, seconds=0.0), label="columns", show=True)
    assert persisted.compute() == 1
    err = capsys.readouterr().err
    assert "[columns]" in err and "done in" in err
    progress.compute(_graph(n=2, seconds=0.0), show=True)  # no label, well under 0.5 s
    assert capsys.readouterr().err == ""


def test_off_by_default_and_on_by_config(capsys):
    progress.compute(_graph(n=2, seconds=0.0), label="quiet")
    assert capsys.readouterr().err == ""
    with dask.config.set({"cosmo_dask.progress": True}):
        progress.compute(_graph(n=2, seconds=0.0), label="loud")
    assert "[loud]" in capsys.readouterr().err


def test_failed_stage_says_so(where, capsys):
    def boom(x):
        raise RuntimeError("bad chunk")

    bad = dask.delayed(boom)(_graph(n=2, seconds=0.0),
                             dask_key_name=f"pse-leaf-{uuid.uuid4().hex[:8]}")
    with pytest.raises(RuntimeError, match="bad chunk"):
        progress.compute(bad, label="pse", show=True)
    lines = _lines(capsys.readouterr().err)
    assert lines[0].startswith("[pse] ") and "pse-leaf 0/1" in lines[0]
    assert re.search(r"\| failed after \d+\.\d s$", lines[-1])


# --------------------------------------------------------------------------- the text itself
def test_estimate_weights_kinds_by_task_duration():
    p = progress.StageProgress("x", io.StringIO())
    p.set_counts({"a": 10, "b": 1, "finalize-hlgfinalizecompute": 1}, {"a": 5},
                 {"a": 1.0, "b": 10.0})
    # 5 of 10 one-second tasks took 5 s; left: 5 x 1 s + 1 x 10 s of work at that rate
    assert p.remaining(elapsed=5.0) == pytest.approx(15.0)
    assert p.remaining(elapsed=0.5) is None  # too early to say
    assert p.line(p._running_tail(5.0)) == "[x] a 5/10, b 0/1 | 5.0 s elapsed, ~15 s left"
    p.set_counts({"a": 10, "b": 1}, {"a": 10, "b": 0}, {"a": 1.0, "b": 10.0})
    assert p.remaining(elapsed=10.0) == pytest.approx(10.0)
    p = progress.StageProgress("x", io.StringIO())
    p.set_counts({"a": 10, "b": 1}, {"a": 5}, {"a": 1.0})  # b's cost is not known yet
    assert p.remaining(elapsed=5.0) is None
    assert p.line(p._running_tail(5.0)) == "[x] a 5/10, b 0/1 | 5.0 s elapsed"
    p.set_counts({"a": 10, "b": 1}, {"a": 10, "b": 1}, {"a": 1.0})
    assert p.remaining(elapsed=5.0) is None  # nothing left


def test_many_kinds_are_summed():
    p = progress.StageProgress("x", io.StringIO())
    totals = {f"k{i}": 10 - i for i in range(9)}
    p.set_counts(totals, {"k0": 10, "k1": 9})
    text = p.kinds_text()
    # unfinished kinds are named first; the rest, finished ones included, summed
    assert text.split(", ")[0] == "k2 0/8" and text.endswith("+4 kinds 19/24")
    assert text.count("/") == progress.MAX_KINDS


@pytest.mark.parametrize("t, text", [(0.04, "0.0 s"), (12.34, "12.3 s"), (59.96, "1 min 00 s"),
                                     (245, "4 min 05 s"), (7380, "2 h 03 min")])
def test_format_seconds(t, text):
    assert progress.format_seconds(t) == text


def test_worker_count_and_threads_follow_the_active_client(client):
    """What domain and slab counts are sized by: the workers and threads of the client
    dask would use now, this machine's cores without one."""
    import os

    assert progress.worker_count() == len(client.scheduler_info()["workers"]) == 2
    assert progress.worker_threads() == sum(client.nthreads().values()) == 2
    with dask.config.set(scheduler="threads"):  # the client exists but is not used
        assert progress.worker_count() == 1
        assert progress.worker_threads() == (os.cpu_count() or 1)
