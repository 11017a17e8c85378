"""Defaults cosmo_dask registers in the dask config (``dask.config.get("cosmo_dask....")``).

``cosmo_dask.chunk_size``   particles per chunk of new arrays (2**20)
``cosmo_dask.precision``    default floating precision of kernels and generators ("float64")
``cosmo_dask.read_chunk_size``  particles per dask chunk when opening a store (None: the
                            store's own chunks on CPU, >= 2**24 on GPU)
``cosmo_dask.scheduler``    address used by ``connect()`` when none is given (None; the
                            ``COSMO_DASK_SCHEDULER`` environment variable wins over it)
``cosmo_dask.verify``      check each chunk read from a store cosmo_dask wrote against the
                            CRC-32 recorded when it was written (True; ``--no-verify``)
``cosmo_dask.dashboard_address``  where a local cluster's dashboard listens
                            ("127.0.0.1:8787": this machine only; ":8787" for every
                            interface, "127.0.0.1:0" for a free port)
``cosmo_dask.pause_timeout``  seconds a computation waits while every worker is paused
                            (memory above ``distributed.worker.memory.pause``) before it
                            fails with a ClusterError (30; None waits for ever)
``cosmo_dask.worker_malloc_trim_threshold``  ``MALLOC_TRIM_THRESHOLD_`` of the worker
                            processes of a local cluster that ``connect()`` starts (None:
                            not set, glibc's adaptive thresholds; dask sets 65536, which
                            also fixes glibc's mmap threshold at 128 KiB, so that every
                            large temporary array is mapped, faulted in page by page and
                            unmapped again: the demo's PSE deposit took 1.6x as long;
                            unset, freed memory stays with the worker for reuse: about
                            90 MB more resident after the demo's PSE)

Override with ``dask.config.set({"cosmo_dask.chunk_size": 2**22})``, a YAML file in
``~/.config/dask/`` or the environment variable ``DASK_COSMO_DASK__CHUNK_SIZE``.
"""

import dask

DEFAULTS = {
    "cosmo_dask": {
        "chunk_size": 2**20,
        "precision": "float64",
        "read_chunk_size": None,
        "scheduler": None,
        "dashboard_address": "127.0.0.1:8787",
        "verify": True,
        "pause_timeout": 30,
        "worker_malloc_trim_threshold": None,
    }
}

dask.config.update_defaults(DEFAULTS)
