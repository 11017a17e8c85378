"""Layer 2, every figure and the HTML reprs: formatting for reprs (:mod:`.html`), density
slices (:mod:`.density`), power spectra (:mod:`.power`) and mass functions
(:mod:`.mass_function`), each on axes from :mod:`.figure`. These modules take arrays,
datasets or duck-typed objects and import only ``core`` and ``units``; the capabilities'
``plot*`` functions and methods delegate here. matplotlib is imported inside the
functions, on first use."""
