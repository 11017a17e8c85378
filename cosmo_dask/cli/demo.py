"""``cosmo-dask demo``: the demo of every capability (its stages in
:mod:`.demo_stages`)."""

from __future__ import annotations

from . import common
from .messages import _say


def cmd_demo(args) -> int:
    from ..core.checks import check_seed
    from ..models import lpt_ics
    from ..simulation.runner import check_run
    from .demo_stages import run_demo

    # the demo's ICs (lazy: nothing computed) and its PM run, checked before the cluster
    ics = lpt_ics(args.n_side, box_size=args.box_size, redshift=args.redshift, order=2,
                  seed=check_seed(args.seed))
    check_run(ics, z_final=0.0, n_steps=args.n_steps, method="pm")
    with common._cluster(args) as client:
        run_demo(
            directory=args.dir,
            n_side=args.n_side,
            box_size=args.box_size,
            redshift=args.redshift,
            n_steps=args.n_steps,
            seed=args.seed,
            client=client,
            say=_say,
        )
    return 0
