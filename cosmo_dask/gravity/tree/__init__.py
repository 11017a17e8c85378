"""Octree (Barnes-Hut) gravity with group interaction lists: the Dask graph over domains
and locally essential trees (:mod:`.graph`), the group walks (:mod:`.walk`), the numba
list-evaluation kernels (:mod:`.list_kernels`), the one-process CPU and GPU pipelines
(:mod:`.forces`, :mod:`.forces_gpu`) and the GPU locally essential trees (:mod:`.let_gpu`)."""
