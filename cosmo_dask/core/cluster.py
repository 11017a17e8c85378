"""Connecting to a Dask cluster: an existing scheduler, a LocalCUDACluster or a LocalCluster.

``connect()`` picks, in order:

1. an explicit ``address`` or ``scheduler_file``;
2. the ``COSMO_DASK_SCHEDULER`` environment variable (an address, or a path to
   a scheduler file), then dask config ``cosmo_dask.scheduler``;
3. a ``dask_cuda.LocalCUDACluster`` (one worker per GPU) when ``gpu`` is
   "auto" or True and a GPU, CuPy and dask-cuda are present;
4. a ``distributed.LocalCluster``.

The returned client closes a cluster it started when it is closed (use it as a
context manager), and at interpreter exit.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
from typing import Any

import dask
import dask.system

from .backend import gpu_available, gpu_count
from .errors import ClusterError, DeviceError, ParameterError

ENV_VAR = "COSMO_DASK_SCHEDULER"
#: the environment a nanny sets before it starts its worker process: cosmo_dask's
#: ``worker_malloc_trim_threshold`` replaces dask's 65536 there (None leaves it unset;
#: :mod:`cosmo_dask.core.config`)
_TRIM_KEY = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"


def _dask_cuda_installed() -> bool:
    return importlib.util.find_spec("dask_cuda") is not None


def _silence_distributed_logs(caller_pid: int) -> None:
    import logging

    if os.getpid() == caller_pid:  # an in-process worker: the caller's own loggers
        return
    names = [n for n in logging.root.manager.loggerDict if n.split(".")[0] == "distributed"]
    for name in ["distributed", *names]:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def quiet_workers(client) -> None:
    """Silence the ``distributed`` loggers of ``client``'s worker and nanny processes.

    Called just before a cluster that cosmo_dask started is closed on purpose: its
    worker processes otherwise log, at ERROR and with a traceback, heartbeats that
    meet the scheduler already gone ("Failed to communicate with scheduler during
    heartbeat"), which alarms and says nothing. While the cluster works, their
    warnings (memory, lost workers) still show. Never raises.
    """
    if getattr(client, "status", None) != "running":
        return
    for nanny in (False, True):
        try:
            client.run(_silence_distributed_logs, os.getpid(), nanny=nanny,
                       on_error="ignore")
        except Exception:  # noqa: BLE001 - closing anyway; a failed courtesy is no error
            return


@functools.cache
def _client_class():
    """distributed's Client, closed again when it fails to start.

    A Client registers itself as dask's default client and names itself in dask's
    ``scheduler`` config before it connects. One that fails to connect stays
    registered, "connecting", for as long as anything (a traceback) holds it. While it
    does, every later default Client skips putting the config back when it closes, so
    later computations fail with "no Client active". So a Client that fails to start
    is closed at once, and the config is put back.
    """
    from distributed import Client

    class _Client(Client):
        def __init__(self, *args, **kwargs):
            before = dask.config.get("scheduler", None)
            try:
                super().__init__(*args, **kwargs)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.close(timeout=5)
                if dask.config.get("scheduler", None) != before:
                    dask.config.set(scheduler=before)
                raise

    return _Client


def _owning_client(cluster, quiet: bool):
    """A Client that also closes ``cluster`` when it is closed."""

    class _ClusterClient(_client_class()):
        def close(self, *args, **kwargs):
            try:
                quiet_workers(self)
                return super().close(*args, **kwargs)
            finally:
                cluster.close()

    try:
        client = _ClusterClient(cluster)
    except BaseException:
        cluster.close()
        raise
    return client


#: where a local cluster's dashboard listens unless asked otherwise: this machine only
LOCAL_DASHBOARD = "127.0.0.1:8787"


def _resolve_target(address, scheduler_file):
    if address is not None and scheduler_file is not None:
        raise ParameterError("give either address or scheduler_file, not both")
    if address is not None and "://" not in str(address) and os.path.isfile(address):
        return None, address  # a scheduler file given as the address, as the CLI accepts
    if address is not None or scheduler_file is not None:
        return address, scheduler_file
    env = os.environ.get(ENV_VAR) or dask.config.get("cosmo_dask.scheduler", None)
    if env:
        if "://" in env or (":" in env and not os.path.exists(env)):
            return env, None
        return None, env
    return None, None


def _local_cuda_cluster(n_workers, threads_per_worker, rmm_pool_size, rmm_cupy, **kwargs):
    from dask_cuda import LocalCUDACluster

    options: dict[str, Any] = dict(kwargs)
    if n_workers is not None:
        options["n_workers"] = n_workers
    if threads_per_worker is not None:
        options["threads_per_worker"] = threads_per_worker
    if rmm_pool_size is not None or rmm_cupy:
        if importlib.util.find_spec("rmm") is None:
            raise ClusterError(
                "an RMM pool or the CuPy-through-RMM allocator was asked for but the 'rmm' "
                "package is not installed (pip install rmm-cu12), or leave rmm_pool_size unset"
            )
        if rmm_pool_size is not None:
            options["rmm_pool_size"] = rmm_pool_size
        if rmm_cupy:
            options["rmm_allocator_external_lib_list"] = ["cupy"]
    return LocalCUDACluster(**options)


def connect(
    address: str | None = None,
    *,
    scheduler_file: str | os.PathLike | None = None,
    gpu: bool | str = "auto",
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    rmm_pool_size: str | int | None = None,
    rmm_cupy: bool = False,
    quiet: bool = False,
    dashboard_address: str | None = None,
    security=None,
    **cluster_kwargs,
):
    """Connect to (or start) a Dask cluster and return a ``distributed.Client``.

    Parameters
    ----------
    address : str, optional
        Scheduler address, e.g. ``"tcp://10.0.0.5:8786"``, or the path of an
        existing scheduler file.
    scheduler_file : path, optional
        A scheduler file written by ``dask scheduler --scheduler-file``.
    gpu : {"auto", True, False}
        For a new local cluster: "auto" starts a LocalCUDACluster when a GPU and
        dask-cuda are present, True requires it (DeviceError otherwise), False
        starts a CPU LocalCluster. Ignored when connecting to an existing scheduler.
    n_workers, threads_per_worker : int, optional
        For a new local cluster (default: one worker per GPU, or dask's CPU default).
    rmm_pool_size : str or int, optional
        GPU only: an RMM memory pool per worker (e.g. "20GB"); needs ``rmm``.
    rmm_cupy : bool
        GPU only: route CuPy allocations through RMM.
    quiet : bool
        Do not print the dashboard link.
    dashboard_address : str, optional
        For a new local cluster: where its dashboard listens. Default: dask config
        ``cosmo_dask.dashboard_address``, ``127.0.0.1:8787``, this machine only
        (dask's own default serves all interfaces); ``":8787"`` opens it to the
        network, ``":0"`` takes a free port.
    security : distributed.Security, optional
        TLS credentials: for an existing ``tls://`` scheduler, the client's
        (CA file, certificate, key); for a new local cluster, the cluster's own
        (``Security.temporary()`` makes throwaway ones), which then speaks TLS.
        Without it, dask's ``distributed.comm.tls.*`` configuration applies.
    **cluster_kwargs
        Passed to the LocalCluster / LocalCUDACluster constructor.

    Returns
    -------
    distributed.Client
        Use it as a context manager; closing it also closes a cluster it started.
    """
    from distributed import LocalCluster

    if gpu not in ("auto", True, False):
        raise ParameterError(f"gpu must be 'auto', True or False, got {gpu!r}")
    for label, value in (("n_workers", n_workers), ("threads_per_worker", threads_per_worker)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ParameterError(f"{label} must be a positive integer, got {value!r}")

    target, sched_file = _resolve_target(address, scheduler_file)
    if target is not None or sched_file is not None:
        if sched_file is not None and not os.path.exists(sched_file):
            raise ClusterError(f"scheduler file {sched_file} does not exist")
        where = target or _scheduler_file_address(sched_file)
        named = f" (named by the scheduler file {sched_file})" if sched_file else ""
        _probe(where, named)
        _check_tls(where, security)
        extra = {} if security is None else {"security": security}
        try:
            client = _client_class()(
                target,
                scheduler_file=None if sched_file is None else str(sched_file),
                timeout=dask.config.get("distributed.comm.timeouts.connect", "30s"),
                **extra,
            )
        except OSError as exc:
            raise ClusterError(
                f"cannot reach the Dask scheduler at {where}{named}: {exc}"
            ) from None
        except (MemoryError, ValueError, TypeError, AssertionError) as exc:
            # what distributed raises when the peer answers with something else than Dask
            raise ClusterError(
                f"{where}{named}: the server there does not speak Dask's protocol "
                f"({type(exc).__name__}); is it a Dask scheduler's address?") from None
    else:
        cores = dask.system.CPU_COUNT
        if n_workers is not None and n_workers > cores and gpu is not True:
            raise ParameterError(
                f"n_workers={n_workers}: this machine has {cores} CPU cores, and a local "
                "cluster runs at most one worker process per core; use threads_per_worker "
                "for more threads, or connect to a larger cluster")
        cluster_kwargs.setdefault("dashboard_address", dashboard_address or dask.config.get(
            "cosmo_dask.dashboard_address", LOCAL_DASHBOARD))
        if security is not None:
            cluster_kwargs.setdefault("security", security)
            cluster_kwargs.setdefault("protocol", "tls://")
        use_gpu = False
        if gpu is True:
            if not gpu_available():
                raise DeviceError(
                    "connect(gpu=True): no CUDA GPU is visible (or CuPy is not "
                    "installed); use gpu='auto' or gpu=False"
                )
            if not _dask_cuda_installed():
                raise DeviceError(
                    "connect(gpu=True): dask-cuda is not installed; pip install 'cosmo_dask[gpu]'"
                )
            if n_workers is not None and n_workers > gpu_count():
                raise DeviceError(
                    f"connect(gpu=True): {n_workers} GPU workers asked for but {gpu_count()} "
                    "GPU(s) are visible; a GPU cluster runs one worker per GPU"
                )
            use_gpu = True
        elif gpu == "auto":
            # one worker per GPU: more workers than GPUs means a CPU cluster
            use_gpu = (
                _dask_cuda_installed()
                and gpu_available()
                and (n_workers is None or n_workers <= gpu_count())
            )
        if not use_gpu and (rmm_pool_size is not None or rmm_cupy):
            raise ParameterError("rmm_pool_size/rmm_cupy apply only to a GPU cluster")
        # pandas fully imported before the scheduler's dashboard exists: its bokeh callbacks
        # (run in the event-loop thread once a page is open, dashboard_of's check included)
        # test `pandas.Series`, and met a pandas half imported by this thread (xarray's
        # import), an AttributeError with a traceback on stderr
        import pandas  # noqa: F401

        with dask.config.set({_TRIM_KEY: dask.config.get(
                "cosmo_dask.worker_malloc_trim_threshold")}):  # read by each nanny
            if use_gpu:
                cluster = _local_cuda_cluster(
                    n_workers, threads_per_worker, rmm_pool_size, rmm_cupy, **cluster_kwargs
                )
            else:
                options = dict(cluster_kwargs)
                if n_workers is not None:
                    options["n_workers"] = n_workers
                if threads_per_worker is not None:
                    options["threads_per_worker"] = threads_per_worker
                cluster = LocalCluster(**options)
        client = _owning_client(cluster, quiet)
        _compile_once(client)
    if not quiet:
        kind = type(getattr(client, "cluster", None)).__name__
        kind = "existing scheduler" if kind == "NoneType" else kind
        print(
            f"cosmo_dask: connected to {client.scheduler.address} ({kind}, "
            f"{len(client.scheduler_info().get('workers', {}))} workers); "
            f"dashboard: {dashboard_of(client)}",
            file=sys.stderr,
            flush=True,
        )
    return client


def _compile_once(client) -> None:
    """Make the processes of a local cluster that cosmo_dask started (its workers and
    this client) compile each numba kernel once between them: the first to need it
    compiles it, the others wait and load it from numba's cache
    (:mod:`cosmo_dask.core.compile_cache`)."""
    from .compile_cache import CompileLockPlugin, install

    install()
    client.register_plugin(CompileLockPlugin())


def dashboard_of(client, timeout: float = 2.0) -> str:
    """The dashboard link of ``client``'s scheduler, checked: a scheduler started without
    its dashboard (``dask scheduler --no-dashboard``) still answers HTTP on the port but
    serves no status page, and a link there would mislead.

    The check is a ``HEAD`` request: the status page's handler takes ``GET`` only, so a
    served page answers 405 (a proxy may answer 200) and a missing one 404. A ``GET``
    would build a whole Bokeh document for the page in the scheduler's process, and
    tear it down later: 0.7-0.9 s of CPU on a 2-core VM, paid by every command that
    connects."""
    import urllib.error
    import urllib.request

    services = client.scheduler_info().get("services", {}) or {}
    if "dashboard" not in services:
        return "none (the scheduler runs without a dashboard)"
    link = client.dashboard_link
    try:
        with urllib.request.urlopen(urllib.request.Request(link, method="HEAD"),
                                    timeout=timeout):
            return link
    except urllib.error.HTTPError as exc:
        if exc.code == 405:  # the page is there, for GET
            return link
        if exc.code == 404:
            return "none (the scheduler runs without a dashboard)"
        return f"{link} (answers HTTP {exc.code})"
    except (OSError, ValueError):
        return f"{link} (not reachable from here)"


def _scheduler_file_address(path) -> str:
    """The address a scheduler file names ('' when unreadable: Client says why)."""
    import json

    try:
        with open(path) as f:
            return str(json.load(f).get("address", ""))
    except (OSError, ValueError, AttributeError):
        return ""


#: seconds to wait for a TCP answer from a scheduler address before giving up
PROBE_TIMEOUT = 5.0


def _probe(address: str, named: str = "") -> None:
    """ClusterError at once when nothing listens at a tcp/tls ``address`` (refused), or
    nothing answers within :data:`PROBE_TIMEOUT` s; distributed itself retries for its whole
    connect timeout (30 s) before saying so."""
    import socket

    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, loc = parse_address(address)
        host, port = parse_host_port(loc)
    except (ValueError, TypeError):
        return  # not a host:port address: distributed says what is wrong with it
    if scheme not in ("tcp", "tls") or not port:
        return
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT):
            return
    except ConnectionRefusedError:
        why = "connection refused: no scheduler listens there"
    except TimeoutError:
        why = f"no answer within {PROBE_TIMEOUT:g} s"
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
    stale = "; the scheduler has stopped: start it again or remove the stale file" \
        if named else ""
    raise ClusterError(f"cannot reach the Dask scheduler at {address}{named} ({why}){stale}")


def _check_tls(address: str, security) -> None:
    """ClusterError for a ``tls://`` scheduler without credentials (given or configured),
    before dask tries to connect (it fails late, with a TypeError or AssertionError)."""
    if not str(address).startswith("tls://") or security is not None:
        return
    configured = dask.config.get("distributed.comm.tls.ca-file", None)
    if not configured:
        raise ClusterError(
            f"the Dask scheduler at {address} speaks TLS and no credentials were given: pass "
            "security=distributed.Security(tls_ca_file=..., tls_client_cert=..., "
            "tls_client_key=..., require_encryption=True) (CLI: --tls-ca-file, --tls-cert, "
            "--tls-key) or set dask's distributed.comm.tls.ca-file and "
            "distributed.comm.tls.client.cert/key")


def describe(client) -> dict[str, Any]:
    """Workers, threads, GPUs and memory of the cluster behind ``client``."""
    info = client.scheduler_info()
    workers = info.get("workers", {})
    n_gpus = sum(
        len(w.get("gpu", {}).get("name", []) or []) if isinstance(w.get("gpu"), dict) else 0
        for w in workers.values()
    )
    return {
        "scheduler": info.get("address"),
        "workers": len(workers),
        "threads": sum(w.get("nthreads", 0) for w in workers.values()),
        "memory_bytes": sum(w.get("memory_limit", 0) or 0 for w in workers.values()),
        "dashboard": dashboard_of(client),
        "gpu_workers": n_gpus,
    }


__all__ = ["connect", "describe", "ENV_VAR", "DeviceError"]
