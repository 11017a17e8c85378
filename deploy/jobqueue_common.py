"""What the SLURM and PBS examples share: the dask_jobqueue import, rendering a job
script without a scheduler, the GPU worker-command guard and the command-line driver.
Kept beside them so each example still runs as ``python deploy/<name>.py``."""

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


#: the scheduler address written into a job script rendered without a scheduler
PLACEHOLDER_SCHEDULER = "tcp://SCHEDULER-ADDRESS:8786"


def job_script(cluster_class, options: dict) -> str:
    """The worker job script ``cluster_class(**options)`` would submit, rendered by its
    job class alone: no scheduler is started (the address is a placeholder)."""
    job = _new_enough(lambda: cluster_class.job_cls(
        scheduler=PLACEHOLDER_SCHEDULER, name="cosmo-dask-worker", **options))
    return job.job_script()


def start_cluster(cluster_class, options: dict):
    """``cluster_class(**options)`` (starts the scheduler in this process)."""
    return _new_enough(lambda: cluster_class(**options))


def _new_enough(make):
    """``make()``, exiting with a clear message when dask-jobqueue predates the
    ``worker_command`` the GPU options pass."""
    try:
        return make()
    except TypeError as exc:
        if "worker_command" in str(exc):
            sys.exit("GPU workers need dask-jobqueue >= 0.9 (worker_command); "
                     "pip install -U dask-jobqueue")
        raise


def run(description: str, system: str, cluster_class_name: str, cpu_options, gpu_options,
        argv=None) -> None:
    """Parse the example's options; print the job script, or start the cluster, connect and
    compute."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("snapshot", nargs="?", help="snapshot store to compute on (optional)")
    parser.add_argument("--gpu", action="store_true", help="GPU nodes with dask cuda worker")
    parser.add_argument("--queue", required=True, help=f"{system} queue/partition")
    parser.add_argument("--account", default=None, help=f"{system} account (-A)")
    parser.add_argument("--walltime", default="01:00:00", help="per job, HH:MM:SS")
    parser.add_argument("--jobs", type=int, default=2, help=f"{system} jobs (nodes) to start")
    parser.add_argument("--cores", type=int, default=None,
                        help="CPU jobs: cores per job (default 32); GPU jobs: CPUs per node")
    parser.add_argument("--memory", default=None,
                        help="CPU jobs: memory per job for Dask, e.g. 8GB (default 128GB); "
                        "GPU jobs: host memory per GPU worker (default 60GB)")
    parser.add_argument("--processes", type=int, default=None,
                        help="CPU jobs: worker processes per job (default 8)")
    parser.add_argument("--interface", default=None, help="network interface, e.g. ib0 or lo")
    parser.add_argument("--print-script", action="store_true",
                        help="print the worker job script and exit (no scheduler is started, "
                        "nothing is submitted)")
    args = parser.parse_args(argv)

    common = {"walltime": args.walltime, "interface": args.interface}
    if args.gpu:
        if args.processes is not None:
            parser.error("--processes applies to CPU jobs (dask cuda worker starts one "
                         "process per GPU)")
        sizes = {k: v for k, v in (("cpus_per_node", args.cores),
                                   ("host_memory_per_gpu", args.memory)) if v is not None}
        options = gpu_options(args.queue, args.account, **common, **sizes)
    else:
        sizes = {k: v for k, v in (("cores", args.cores), ("memory", args.memory),
                                   ("processes", args.processes)) if v is not None}
        options = cpu_options(args.queue, args.account, **common, **sizes)
    cluster_class = getattr(jobqueue(), cluster_class_name)
    if args.print_script:
        print(job_script(cluster_class, options))
        return

    import cosmo_dask

    with start_cluster(cluster_class, options) as cluster:
        cluster.scale(jobs=args.jobs)
        # Any address works; cluster.get_client() would return a plain Client too.
        with cosmo_dask.connect(cluster.scheduler_address) as client:
            client.wait_for_workers(1, timeout=1800)  # queue wait
            print(cosmo_dask.core.cluster.describe(client))
            if args.snapshot:
                snap = cosmo_dask.open_snapshot(args.snapshot,
                                                device="gpu" if args.gpu else "cpu")
                print(snap)
                print("centre of mass:", snap.pos.mean(axis=0).compute())
