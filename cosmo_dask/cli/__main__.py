"""``python -m cosmo_dask.cli`` runs the ``cosmo-dask`` command (as ``python -m cosmo_dask``
does)."""

import sys

from .app import main

sys.exit(main())
