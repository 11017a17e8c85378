"""connect(): explicit address, scheduler file, environment variable, local clusters."""

from __future__ import annotations

import dask
import dask.system
import numpy as np
import pytest
from distributed import LocalCluster

from cosmo_dask import SnapshotError, connect, open_snapshot
from cosmo_dask.core.backend import gpu_available, gpu_count
from cosmo_dask.core.cluster import ENV_VAR
from cosmo_dask.core.errors import ClusterError, DeviceError, ParameterError
from tests.support.stores import snapshot_store as _store


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as c:
        yield c


def test_local_cluster_is_started_printed_and_closed(capsys):
    with connect(gpu=False, n_workers=2, threads_per_worker=1, processes=False) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        assert sum(client.nthreads().values()) == 2
        own = client.cluster
        assert client.submit(lambda x: x + 1, 41).result() == 42
    err = capsys.readouterr().err
    assert "LocalCluster" in err and "dashboard: http" in err
    assert own.status.name == "closed"


def test_the_dashboard_check_builds_no_page(monkeypatch):
    """dashboard_of asks with HEAD: the status page's handler answers 405 without building
    a Bokeh document (a GET builds one, 0.7-0.9 s of CPU); a page that is not there is
    404, and no dashboard is then named."""
    import urllib.request

    from cosmo_dask.core.cluster import dashboard_of

    methods = []
    real = urllib.request.urlopen

    def spy(req, *a, **k):
        methods.append(req.get_method() if isinstance(req, urllib.request.Request) else "GET")
        return real(req, *a, **k)

    monkeypatch.setattr(urllib.request, "urlopen", spy)
    with connect(gpu=False, n_workers=1, threads_per_worker=1, processes=False,
                 dashboard_address="127.0.0.1:0", quiet=True) as client:
        # (an in-process cluster's dashboard_link names the host's address, whatever the
        # socket: the page is asked for where the socket listens)
        port = client.cluster.scheduler.http_server.port
        for page, said in (("status", f"http://127.0.0.1:{port}/status"),
                           ("no-such-page", "none (the scheduler runs without a dashboard)")):
            monkeypatch.setattr(type(client), "dashboard_link",
                                property(lambda self, p=page: f"http://127.0.0.1:{port}/{p}"))
            assert dashboard_of(client) == said
    assert methods == ["HEAD", "HEAD"]


def test_explicit_address_does_not_close_the_cluster(cluster):
    with connect(cluster.scheduler_address, quiet=True) as client:
        assert client.submit(sum, [1, 2]).result() == 3
    assert cluster.status.name == "running"


def test_scheduler_file_and_environment_variable(cluster, tmp_path, monkeypatch):
    path = tmp_path / "scheduler.json"
    with connect(cluster.scheduler_address, quiet=True) as client:
        client.write_scheduler_file(str(path))
    with connect(scheduler_file=path, quiet=True) as client:
        assert client.scheduler.address == cluster.scheduler_address
    with connect(str(path), quiet=True) as client:  # a file given as the address
        assert client.scheduler.address == cluster.scheduler_address
    monkeypatch.setenv(ENV_VAR, cluster.scheduler_address)
    with connect(quiet=True) as client:
        assert client.scheduler.address == cluster.scheduler_address
    monkeypatch.setenv(ENV_VAR, str(path))
    with connect(quiet=True) as client:
        assert client.scheduler.address == cluster.scheduler_address


def test_explicit_address_wins_over_environment(cluster, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "tcp://127.0.0.1:1")  # nothing listens there
    with connect(cluster.scheduler_address, quiet=True) as client:
        assert client.scheduler.address == cluster.scheduler_address


def test_unreachable_scheduler_is_a_cluster_error():
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}), \
            pytest.raises(ClusterError, match="cannot reach the Dask scheduler"):
        connect("tcp://127.0.0.1:1", quiet=True)
    with pytest.raises(ClusterError, match="does not exist"):
        connect(scheduler_file="/no/such/scheduler.json", quiet=True)


@pytest.mark.parametrize("kwargs, match", [
    ({"gpu": "maybe"}, "gpu must be"),
    ({"n_workers": 0}, "n_workers must be a positive integer"),
    ({"threads_per_worker": 1.5}, "threads_per_worker"),
    ({"address": "tcp://a:1", "scheduler_file": "f"}, "either address or scheduler_file"),
    ({"gpu": False, "rmm_pool_size": "1GB"}, "only to a GPU cluster"),
])
def test_bad_parameters(kwargs, match):
    with pytest.raises(ParameterError, match=match):
        connect(quiet=True, **kwargs)


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU error")
def test_gpu_true_without_gpu_is_a_clear_error():
    with pytest.raises(DeviceError, match="no CUDA GPU is visible"):
        connect(gpu=True, quiet=True)


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU fallback")
def test_gpu_auto_without_gpu_starts_a_cpu_cluster():
    with connect(gpu="auto", n_workers=1, processes=False, quiet=True) as client:
        assert type(client.cluster).__name__ == "LocalCluster"


def test_a_scheduler_without_a_dashboard_is_said_to_have_none(tmp_path, capsys):
    import subprocess
    import sys
    import time

    sched = subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1",
                              "--port", "0", "--no-dashboard", "--scheduler-file",
                              str(tmp_path / "s.json")], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not (tmp_path / "s.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        with connect(scheduler_file=tmp_path / "s.json"):
            pass
    finally:
        sched.terminate()
        sched.wait(timeout=30)
    err = capsys.readouterr().err
    assert "dashboard: none (the scheduler runs without a dashboard)" in err
    assert "8787" not in err


@pytest.mark.parametrize("case", ["refused", "stale file", "not dask", "too many workers"])
def test_bad_cluster_input_is_one_line_within_seconds(tmp_path, case):
    """State of the bounds: refused addresses and stale scheduler files fail at once (no
    30 s of retries), a server that is no Dask scheduler is named as such, a local cluster
    larger than the machine is refused before it starts."""
    import json
    import socket
    import threading
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()
    if case == "not dask":  # answers every connection with bytes that are no Dask frame
        server.listen()
        server.settimeout(0.2)

        def serve():
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except OSError:
                    continue
                with conn:
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"\xff" * 64)
        threading.Thread(target=serve, daemon=True).start()
    else:
        server.close()  # nothing listens on this port any more
    address = f"tcp://127.0.0.1:{port}"
    t0 = time.perf_counter()
    try:
        if case == "refused":
            with pytest.raises(ClusterError, match="connection refused: no scheduler listens"):
                connect(address, quiet=True)
        elif case == "stale file":
            path = tmp_path / "scheduler.json"
            path.write_text(json.dumps({"type": "Scheduler", "address": address}))
            with pytest.raises(ClusterError, match="named by the scheduler file .*stale file"):
                connect(scheduler_file=path, quiet=True)
        elif case == "not dask":
            with dask.config.set({"distributed.comm.timeouts.connect": "5s"}), \
                    pytest.raises(ClusterError, match="does not speak Dask's protocol"):
                connect(address, quiet=True)
        else:
            with pytest.raises(ParameterError, match=r"n_workers=\d+: this machine has"):
                connect(gpu=False, n_workers=dask.system.CPU_COUNT + 1, quiet=True)
    finally:
        stop.set()
        server.close()
    # well under the 30 s of connection retries this guards against, with room for a
    # loaded CI machine (two pytest processes on two cores)
    assert time.perf_counter() - t0 < 20
    # a client that failed to start does not stay named as dask's scheduler (later
    # computations would fail with "no Client active"), nor registered as the default
    # client (a later default client would then leave the config set when it closes)
    assert dask.config.get("scheduler", None) is None
    from distributed import default_client

    with pytest.raises(ValueError, match="No clients found"):
        default_client()
    with connect(gpu=False, n_workers=1, threads_per_worker=1, processes=False,
                 dashboard_address=":0", quiet=True) as client:
        assert client.submit(lambda x: x + 1, 1).result() == 2
    assert dask.config.get("scheduler", None) is None


def _distributed_levels():
    import logging

    return (logging.getLogger("distributed").getEffectiveLevel(),
            logging.getLogger("distributed.worker").getEffectiveLevel())


def test_closing_an_owned_cluster_quiets_its_worker_processes_only():
    """A cluster cosmo_dask started is closed with its worker processes' distributed
    loggers at CRITICAL (no heartbeat tracebacks while the scheduler goes first); the
    caller's own loggers, and in-process workers (the caller's process), are left."""
    import logging

    from cosmo_dask.core.cluster import quiet_workers

    before = _distributed_levels()
    with connect(gpu=False, n_workers=1, threads_per_worker=1, processes=True,
                 dashboard_address=":0", quiet=True) as client:
        assert client.run(_distributed_levels)  # workers answer
        quiet_workers(client)
        levels = list(client.run(_distributed_levels).values())
        assert levels == [(logging.CRITICAL, logging.CRITICAL)]
        assert client.submit(lambda x: 2 * x, 21).result() == 42  # still works
    assert _distributed_levels() == before
    with connect(gpu=False, n_workers=1, threads_per_worker=1, processes=False,
                 dashboard_address=":0", quiet=True) as client:
        quiet_workers(client)
        assert _distributed_levels() == before


# -------------------- on the GPU (formerly tests/test_gpu.py)
# CuPy-backed snapshots and a LocalCUDACluster (run on an H100/H200 host).


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


@pytest.mark.gpu
def test_local_cuda_cluster_computes_on_gpu_workers(tmp_path, rng, cupy):
    path, (pos, *_rest) = _store(tmp_path, rng, n=20000, chunks=3000)
    with connect(gpu=True, quiet=True) as client:
        workers = client.scheduler_info()["workers"]
        assert len(workers) == gpu_count()
        assert type(client.cluster).__name__ == "LocalCUDACluster"
        snap = open_snapshot(path, device="gpu")
        mean = client.compute(snap.pos.mean(axis=0), sync=True)
        assert isinstance(mean, cupy.ndarray)
        np.testing.assert_allclose(mean.get(), pos.astype(np.float64).mean(axis=0), rtol=1e-12)
        assert snap.validate(full=True).ok
    # the cluster the client started is closed with it
    assert client.status == "closed"


@pytest.mark.gpu
def test_gpu_check_errors_cross_the_cluster(tmp_path, rng, cupy):
    from tests.support.stores import good_attrs, write_raw_store

    pos = rng.random((4000, 3))
    pos[2500] = [1.0, 0.5, 0.5]  # == box_size: outside [0, 1)
    path = write_raw_store(tmp_path / "o.zarr", {"pos": pos}, good_attrs(box_size=1.0),
                           chunks=500)
    with connect(gpu=True, quiet=True) as client:
        snap = open_snapshot(path, device="gpu")
        with pytest.raises(SnapshotError, match="particle 2500 at \\[1.0, 0.5, 0.5\\]"):
            client.compute(snap.pos.sum(), sync=True)
        wrapped = open_snapshot(path, device="gpu", wrap=True).pos
        assert float(client.compute(wrapped.max(), sync=True)) < 1.0


@pytest.mark.gpu
def test_rmm_options_need_rmm(cupy):
    import importlib.util

    from cosmo_dask.core.errors import ClusterError

    if importlib.util.find_spec("rmm") is not None:
        with connect(gpu=True, rmm_pool_size="1GB", rmm_cupy=True, quiet=True) as client:
            assert len(client.scheduler_info()["workers"]) == gpu_count()
    else:
        with pytest.raises(ClusterError, match="'rmm' package is not installed"):
            connect(gpu=True, rmm_pool_size="1GB", quiet=True)


@pytest.mark.gpu
def test_worker_count_against_gpu_count(cupy):
    from cosmo_dask.core.errors import DeviceError

    n = gpu_count()
    with pytest.raises(DeviceError, match=f"{n + 1} GPU workers asked for"):
        connect(gpu=True, n_workers=n + 1, quiet=True)
    # "auto" with more workers than GPUs runs CPU workers
    with connect(gpu="auto", n_workers=n + 1, processes=False, quiet=True) as client:
        assert type(client.cluster).__name__ == "LocalCluster"
        assert len(client.scheduler_info()["workers"]) == n + 1


@pytest.mark.parametrize("setting", [None, 131072])
def test_worker_processes_get_the_malloc_trim_setting(setting, monkeypatch):
    """The worker processes of a local cluster see ``cosmo_dask.worker_malloc_trim_threshold``
    as ``MALLOC_TRIM_THRESHOLD_`` (None: unset, not dask's 65536, which fixes glibc's mmap
    threshold and faults every large temporary array in page by page)."""
    import os

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)  # the workers inherit ours
    assert dask.config.get("distributed.nanny.pre-spawn-environ")[
        "MALLOC_TRIM_THRESHOLD_"] == 65536  # dask's default, which connect() replaces
    with dask.config.set({"cosmo_dask.worker_malloc_trim_threshold": setting}), \
            connect(gpu=False, n_workers=1, threads_per_worker=1, quiet=True,
                    dashboard_address=":0") as client:
        seen = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
    assert list(seen.values()) == [None if setting is None else str(setting)]
    assert dask.config.get("distributed.nanny.pre-spawn-environ")[
        "MALLOC_TRIM_THRESHOLD_"] == 65536  # dask's own setting is left as it was
