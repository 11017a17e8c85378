"""What the SLURM and PBS examples share: the dask_jobqueue import, the GPU
worker-command guard and the command-line driver. Kept beside them so each
example still runs as ``python deploy/<name>.py``."""

from __future__ import annotations

import argparse
import sys


def jobqueue():
    """Import dask_jobqueue, or exit with a message naming the missing extra."""
    try:
        import dask_jobqueue
    except ImportError:
        sys.exit(
            "dask-jobqueue is not installed; install the deploy extra: "
            "pip install 'cosmo_dask[deploy]'"
        )
    return dask_jobqueue


def gpu_job_cluster(cluster_class, **kwargs):
    """``cluster_class(worker_command="dask_cuda.cli", **kwargs)``, i.e. `dask cuda worker`
    on each node, with a clear exit when dask-jobqueue is too old for it."""
    try:
        return cluster_class(worker_command="dask_cuda.cli", **kwargs)
    except TypeError as exc:
        if "worker_command" in str(exc):
            sys.exit("GPU workers need dask-jobqueue >= 0.9 (worker_command); "
                     "pip install -U dask-jobqueue")
        raise


def run(description: str, system: str, cpu_cluster, gpu_cluster, argv=None,
        with_interface: bool = False) -> None:
    """Parse the example's options, start the cluster, connect and compute."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("snapshot", nargs="?", help="snapshot store to compute on (optional)")
    parser.add_argument("--gpu", action="store_true", help="GPU nodes with dask cuda worker")
    parser.add_argument("--queue", required=True, help=f"{system} queue/partition")
    parser.add_argument("--account", default=None, help=f"{system} account (-A)")
    parser.add_argument("--walltime", default="01:00:00")
    parser.add_argument("--jobs", type=int, default=2, help=f"{system} jobs (nodes) to start")
    if with_interface:
        parser.add_argument("--interface", default=None, help="network interface, e.g. ib0")
    parser.add_argument("--print-script", action="store_true",
                        help="print the worker job script and exit (submits nothing)")
    args = parser.parse_args(argv)

    make = gpu_cluster if args.gpu else cpu_cluster
    extra = {"interface": args.interface} if with_interface else {}
    cluster = make(args.queue, args.account, walltime=args.walltime, **extra)
    if args.print_script:
        print(cluster.job_script())
        cluster.close()
        return

    import cosmo_dask

    with cluster:
        cluster.scale(jobs=args.jobs)
        # Any address works; cluster.get_client() would return a plain Client too.
        with cosmo_dask.connect(cluster.scheduler_address) as client:
            client.wait_for_workers(1, timeout=1800)  # queue wait
            print(cosmo_dask.cluster.describe(client))
            if args.snapshot:
                snap = cosmo_dask.open_snapshot(args.snapshot,
                                                device="gpu" if args.gpu else "cpu")
                print(snap)
                print("centre of mass:", snap.pos.mean(axis=0).compute())
