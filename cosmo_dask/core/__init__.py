"""Layer 0, the runtime every other layer builds on: the device backend and kernel
dispatch (:mod:`.backend`, :mod:`.dispatch`), the one graph idiom (:mod:`.task_graph`),
progress and bounded waits (:mod:`.progress`), dask config defaults (:mod:`.config`), the
error classes (:mod:`.errors`), parameter checks (:mod:`.checks`), lazy public names
(:mod:`.lazy`), clusters (:mod:`.cluster`) and the kernel compile cache
(:mod:`.compile_cache`). Nothing here imports from a higher layer (``units``, ``plot``,
``store``, the capabilities, ``cli``); ``tests/system/test_structure.py`` checks it."""
