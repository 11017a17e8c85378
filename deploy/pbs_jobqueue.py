"""Example: run cosmo_dask on a PBS Pro / Torque cluster through dask-jobqueue.

An example to adapt. CI renders its job scripts (tests/system/test_deploy.py) but runs no
PBS. Works like
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

from jobqueue_common import jobqueue, run, start_cluster

PROLOGUE = [
    "cd $PBS_O_WORKDIR",
    "export HDF5_USE_FILE_LOCKING=FALSE  # Gadget HDF5 reads on Lustre/GPFS",
]


def cpu_options(queue: str, account: str | None, *, walltime: str = "01:00:00",
                cores: int = 32, processes: int = 8, memory: str = "128GB",
                interface: str | None = None) -> dict:
    """One PBS job per node with ``processes`` worker processes (``cores/processes`` threads)."""
    return dict(
        queue=queue,
        account=account,
        walltime=walltime,
        cores=cores,
        processes=processes,
        memory=memory,
        interface=interface,
        resource_spec=f"select=1:ncpus={cores}:mem={memory.lower()}",
        local_directory="${TMPDIR:-/tmp}",
        log_directory="dask-logs",
        job_script_prologue=PROLOGUE,
    )


def gpu_options(queue: str, account: str | None, *, walltime: str = "01:00:00",
                gpus_per_node: int = 4, cpus_per_node: int = 32, node_memory: str = "256GB",
                host_memory_per_gpu: str = "60GB", threads_per_gpu: int = 1,
                interface: str | None = None) -> dict:
    """One PBS job per GPU node running ``dask cuda worker`` (one worker per GPU)."""
    return dict(
        worker_command="dask_cuda.cli",
        queue=queue,
        account=account,
        walltime=walltime,
        cores=threads_per_gpu,  # --nthreads of each GPU worker
        processes=1,  # dask cuda worker starts one process per GPU itself
        memory=host_memory_per_gpu,  # --memory-limit of each GPU worker
        interface=interface,
        resource_spec=(f"select=1:ncpus={cpus_per_node}:ngpus={gpus_per_node}"
                       f":mem={node_memory.lower()}"),
        local_directory="${TMPDIR:-/tmp}",
        log_directory="dask-logs",
        job_script_prologue=PROLOGUE,
    )


def cpu_cluster(queue: str, account: str | None, **kwargs):
    """A started ``PBSCluster`` with :func:`cpu_options` (its scheduler runs here)."""
    return start_cluster(jobqueue().PBSCluster, cpu_options(queue, account, **kwargs))


def gpu_cluster(queue: str, account: str | None, **kwargs):
    """A started ``PBSCluster`` with :func:`gpu_options` (its scheduler runs here)."""
    return start_cluster(jobqueue().PBSCluster, gpu_options(queue, account, **kwargs))


def main(argv: list[str] | None = None) -> None:
    run(__doc__.splitlines()[0], "PBS", "PBSCluster", cpu_options, gpu_options, argv)


if __name__ == "__main__":
    main()
