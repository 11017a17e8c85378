"""Layer 3, the Zarr stores: reading (:mod:`.zarr_read`) and writing (:mod:`.zarr_write`)
chunked arrays, chunk manifests and checksums (:mod:`.chunk_manifest`), atomic writes and
the recovery of interrupted ones (:mod:`.atomic`), store validation
(:mod:`.validation`) and snapshots (:mod:`.snapshot`: :func:`open_snapshot`,
:class:`Snapshot`). A capability's own store (density meshes and octrees, simulation
outputs) lives in that capability and builds on these."""
