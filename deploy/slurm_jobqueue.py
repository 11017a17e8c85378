"""Example: run cosmo_dask on a SLURM cluster through dask-jobqueue.

An example to adapt, not tested in CI (CI has no SLURM). The Dask scheduler runs
in this Python process (on a login node or in a small long-running job); each
SLURM job started by ``cluster.scale`` runs workers that connect back to it.
The workers must see the same Python environment and the same (shared)
filesystem paths as this process.

Needs the ``deploy`` extra (``pip install 'cosmo_dask[deploy]'``); GPU jobs also
need dask-jobqueue >= 0.9 (for ``worker_command``) and the ``gpu`` extra on the
compute nodes.

Examples
--------
Show the job script without submitting anything::

    python deploy/slurm_jobqueue.py --queue cpu --account abc123 --print-script

Four GPU nodes, then a small computation on a snapshot store::

    python deploy/slurm_jobqueue.py --gpu --queue gpu --account abc123 --jobs 4 snap.zarr
"""

from __future__ import annotations

import argparse
import sys


def _jobqueue():
    """Import dask_jobqueue, or exit with a message naming the missing extra."""
    try:
        import dask_jobqueue
    except ImportError:
        sys.exit(
            "dask-jobqueue is not installed; install the deploy extra: "
            "pip install 'cosmo_dask[deploy]'"
        )
    return dask_jobqueue


# Lines run at the top of every worker job, before the worker starts. Workers are
# started with this process's Python (sys.executable; change with python=...), so
# that interpreter and its environment must exist on the compute nodes.
PROLOGUE = [
    "# module load cuda/12.4   # site modules, if any",
    "export HDF5_USE_FILE_LOCKING=FALSE  # Gadget HDF5 reads on Lustre/GPFS",
]


def cpu_cluster(queue: str, account: str | None, *, walltime: str = "01:00:00",
                cores: int = 32, processes: int = 8, memory: str = "128GB",
                interface: str | None = None):
    """One SLURM job per node, ``processes`` worker processes of ``cores/processes`` threads.

    ``memory`` is the whole node's memory for Dask; each worker process gets
    ``memory / processes`` before spilling to ``local_directory``.
    """
    jq = _jobqueue()
    return jq.SLURMCluster(
        queue=queue,
        account=account,
        walltime=walltime,
        cores=cores,
        processes=processes,
        memory=memory,
        interface=interface,  # e.g. "ib0" for InfiniBand
        local_directory="${TMPDIR:-/tmp}",
        log_directory="dask-logs",
        job_script_prologue=PROLOGUE,
    )


def gpu_cluster(queue: str, account: str | None, *, walltime: str = "01:00:00",
                gpus_per_node: int = 4, cpus_per_node: int = 32,
                host_memory_per_gpu: str = "60GB", threads_per_gpu: int = 1,
                interface: str | None = None):
    """One SLURM job per GPU node running ``dask cuda worker`` (one worker per GPU).

    dask-jobqueue runs ``python -m dask_cuda.cli`` (the ``dask cuda worker``
    command), which starts one worker per visible GPU with
    ``threads_per_gpu`` threads and ``host_memory_per_gpu`` of host memory
    before spilling. The SLURM request (CPUs, memory, GPUs) is given separately.
    """
    jq = _jobqueue()
    try:
        return jq.SLURMCluster(
            queue=queue,
            account=account,
            walltime=walltime,
            cores=threads_per_gpu,  # becomes --nthreads of each GPU worker
            processes=1,  # dask cuda worker itself starts one process per GPU
            memory=host_memory_per_gpu,  # becomes --memory-limit of each GPU worker
            job_cpu=cpus_per_node,
            job_mem="0",  # SLURM: all memory of the node
            job_extra_directives=[f"--gres=gpu:{gpus_per_node}"],
            worker_command="dask_cuda.cli",
            interface=interface,
            local_directory="${TMPDIR:-/tmp}",
            log_directory="dask-logs",
            job_script_prologue=PROLOGUE,
        )
    except TypeError as exc:
        if "worker_command" in str(exc):
            sys.exit("GPU workers need dask-jobqueue >= 0.9 (worker_command); "
                     "pip install -U dask-jobqueue")
        raise


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", nargs="?", help="snapshot store to compute on (optional)")
    parser.add_argument("--gpu", action="store_true", help="GPU nodes with dask cuda worker")
    parser.add_argument("--queue", required=True, help="SLURM partition")
    parser.add_argument("--account", default=None, help="SLURM account (-A)")
    parser.add_argument("--walltime", default="01:00:00")
    parser.add_argument("--jobs", type=int, default=2, help="SLURM jobs (nodes) to start")
    parser.add_argument("--interface", default=None, help="network interface, e.g. ib0")
    parser.add_argument("--print-script", action="store_true",
                        help="print the worker job script and exit (submits nothing)")
    args = parser.parse_args(argv)

    make = gpu_cluster if args.gpu else cpu_cluster
    cluster = make(args.queue, args.account, walltime=args.walltime, interface=args.interface)
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


if __name__ == "__main__":
    main()
