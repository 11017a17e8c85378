"""Example: run cosmo_dask on a SLURM cluster through dask-jobqueue.

An example to adapt. CI renders its job scripts (tests/system/test_deploy.py) and runs it
for real on a one-node SLURM started on 127.0.0.1 (tests/system/test_slurm_jobqueue.py:
two worker jobs, FOF with centres compared with the local answer). The Dask
scheduler runs
in this Python process (on a login node or in a small long-running job); each
SLURM job started by ``cluster.scale`` runs workers that connect back to it.
The workers must see the same Python environment and the same (shared)
filesystem paths as this process.

Needs the ``deploy`` extra (``pip install 'cosmo_dask[deploy]'``); GPU jobs also
need dask-jobqueue >= 0.9 (for ``worker_command``) and the ``gpu`` extra on the
compute nodes.

Examples
--------
Show the job script (no scheduler is started, nothing is submitted)::

    python deploy/slurm_jobqueue.py --queue cpu --account abc123 --cores 16 \\
        --processes 4 --memory 64GB --walltime 02:00:00 --print-script

Four GPU nodes, then a small computation on a snapshot store::

    python deploy/slurm_jobqueue.py --gpu --queue gpu --account abc123 --jobs 4 snap.zarr
"""

from __future__ import annotations

from jobqueue_common import jobqueue, run, start_cluster

# Lines run at the top of every worker job, before the worker starts. Workers are
# started with this process's Python (sys.executable; change with python=...), so
# that interpreter and its environment must exist on the compute nodes.
PROLOGUE = [
    "# module load cuda/12.4   # site modules, if any",
    "export HDF5_USE_FILE_LOCKING=FALSE  # Gadget HDF5 reads on Lustre/GPFS",
]


def cpu_options(queue: str, account: str | None, *, walltime: str = "01:00:00",
                cores: int = 32, processes: int = 8, memory: str = "128GB",
                interface: str | None = None) -> dict:
    """One SLURM job per node, ``processes`` worker processes of ``cores/processes`` threads.

    ``memory`` is the whole job's memory for Dask; each worker process gets
    ``memory / processes`` before spilling to ``local_directory``.
    """
    return dict(
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


def gpu_options(queue: str, account: str | None, *, walltime: str = "01:00:00",
                gpus_per_node: int = 4, cpus_per_node: int = 32,
                host_memory_per_gpu: str = "60GB", threads_per_gpu: int = 1,
                interface: str | None = None) -> dict:
    """One SLURM job per GPU node running ``dask cuda worker`` (one worker per GPU).

    dask-jobqueue runs ``python -m dask_cuda.cli`` (the ``dask cuda worker``
    command), which starts one worker per visible GPU with
    ``threads_per_gpu`` threads and ``host_memory_per_gpu`` of host memory
    before spilling. The SLURM request (CPUs, memory, GPUs) is given separately.
    """
    return dict(
        worker_command="dask_cuda.cli",
        queue=queue,
        account=account,
        walltime=walltime,
        cores=threads_per_gpu,  # becomes --nthreads of each GPU worker
        processes=1,  # dask cuda worker itself starts one process per GPU
        memory=host_memory_per_gpu,  # becomes --memory-limit of each GPU worker
        job_cpu=cpus_per_node,
        job_mem="0",  # SLURM: all memory of the node
        job_extra_directives=[f"--gres=gpu:{gpus_per_node}"],
        interface=interface,
        local_directory="${TMPDIR:-/tmp}",
        log_directory="dask-logs",
        job_script_prologue=PROLOGUE,
    )


def cpu_cluster(queue: str, account: str | None, **kwargs):
    """A started ``SLURMCluster`` with :func:`cpu_options` (its scheduler runs here)."""
    return start_cluster(jobqueue().SLURMCluster, cpu_options(queue, account, **kwargs))


def gpu_cluster(queue: str, account: str | None, **kwargs):
    """A started ``SLURMCluster`` with :func:`gpu_options` (its scheduler runs here)."""
    return start_cluster(jobqueue().SLURMCluster, gpu_options(queue, account, **kwargs))


def main(argv: list[str] | None = None) -> None:
    run(__doc__.splitlines()[0], "SLURM", "SLURMCluster", cpu_options, gpu_options, argv)


if __name__ == "__main__":
    main()
