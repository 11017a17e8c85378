"""Example: run cosmo_dask on a PBS Pro / Torque cluster through dask-jobqueue.

An example to adapt, not tested in CI (CI has no PBS). Works like
``slurm_jobqueue.py``: the scheduler runs in this process, every PBS job runs
workers that connect back to it, and all of them need the same environment and
shared filesystem paths. Resource strings (``-l select=...``) differ between
sites; check yours with ``--print-script`` before submitting.

Needs the ``deploy`` extra; GPU jobs also need dask-jobqueue >= 0.9.

Examples
--------
::

    python deploy/pbs_jobqueue.py --queue workq --account abc123 --print-script
    python deploy/pbs_jobqueue.py --gpu --queue gpuq --account abc123 --jobs 2 snap.zarr
"""

from __future__ import annotations

import argparse
import sys

PROLOGUE = [
    "cd $PBS_O_WORKDIR",
    "export HDF5_USE_FILE_LOCKING=FALSE  # Gadget HDF5 reads on Lustre/GPFS",
]


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


def cpu_cluster(queue: str, account: str | None, *, walltime: str = "01:00:00",
                cores: int = 32, processes: int = 8, memory: str = "128GB"):
    """One PBS job per node with ``processes`` worker processes (``cores/processes`` threads)."""
    jq = _jobqueue()
    return jq.PBSCluster(
        queue=queue,
        account=account,
        walltime=walltime,
        cores=cores,
        processes=processes,
        memory=memory,
        resource_spec=f"select=1:ncpus={cores}:mem={memory.lower()}",
        local_directory="${TMPDIR:-/tmp}",
        log_directory="dask-logs",
        job_script_prologue=PROLOGUE,
    )


def gpu_cluster(queue: str, account: str | None, *, walltime: str = "01:00:00",
                gpus_per_node: int = 4, cpus_per_node: int = 32, node_memory: str = "256GB",
                host_memory_per_gpu: str = "60GB", threads_per_gpu: int = 1):
    """One PBS job per GPU node running ``dask cuda worker`` (one worker per GPU)."""
    jq = _jobqueue()
    try:
        return jq.PBSCluster(
            queue=queue,
            account=account,
            walltime=walltime,
            cores=threads_per_gpu,  # --nthreads of each GPU worker
            processes=1,  # dask cuda worker starts one process per GPU itself
            memory=host_memory_per_gpu,  # --memory-limit of each GPU worker
            resource_spec=(f"select=1:ncpus={cpus_per_node}:ngpus={gpus_per_node}"
                           f":mem={node_memory.lower()}"),
            worker_command="dask_cuda.cli",  # i.e. `dask cuda worker`
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
    parser.add_argument("--queue", required=True, help="PBS queue (-q)")
    parser.add_argument("--account", default=None, help="PBS account (-A)")
    parser.add_argument("--walltime", default="01:00:00")
    parser.add_argument("--jobs", type=int, default=2, help="PBS jobs (nodes) to start")
    parser.add_argument("--print-script", action="store_true",
                        help="print the worker job script and exit (submits nothing)")
    args = parser.parse_args(argv)

    make = gpu_cluster if args.gpu else cpu_cluster
    cluster = make(args.queue, args.account, walltime=args.walltime)
    if args.print_script:
        print(cluster.job_script())
        cluster.close()
        return

    import cosmo_dask

    with cluster:
        cluster.scale(jobs=args.jobs)
        with cosmo_dask.connect(cluster.scheduler_address) as client:
            client.wait_for_workers(1, timeout=1800)  # queue wait
            if args.snapshot:
                snap = cosmo_dask.open_snapshot(args.snapshot,
                                                device="gpu" if args.gpu else "cpu")
                print(snap)
                print("centre of mass:", snap.pos.mean(axis=0).compute())


if __name__ == "__main__":
    main()
