"""``python -m cosmo_dask`` runs the ``cosmo-dask`` command."""

import sys

from .cli import main

sys.exit(main())
