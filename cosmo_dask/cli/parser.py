"""The ``cosmo-dask`` argument parser (:func:`build_parser`) and the argument types
of its options."""

from __future__ import annotations

import argparse
import math

from ..core.checks import PRECISIONS
from ..core.version import __version__
from . import clustering, data, demo, density, expand, gravity, halos, structure, subhalos
from .data import CONVERT_FORMATS


# --------------------------------------------------------------------------- helpers
def _cosmology_overrides(text: str) -> dict[str, float]:
    """``Omega_m=0.31,sigma8=0.81`` -> {"Omega_m": 0.31, "sigma8": 0.81}."""
    from ..models.cosmology import THEORY_KEYS

    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in (*THEORY_KEYS, "Omega_L"):
            raise argparse.ArgumentTypeError(
                f"expected KEY=VALUE pairs with keys among {', '.join((*THEORY_KEYS, 'Omega_L'))}"
                f", got {item!r}")
        try:
            out[key] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key}: expected a number, got {value!r}") from None
        if not math.isfinite(out[key]):
            raise argparse.ArgumentTypeError(f"{key}: expected a finite number, got {value!r}")
    return out


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    """``0,2,4`` -> (0, 2, 4)."""
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 0,2,4, got {text!r}") from None


def _k_bins(text: str) -> int | tuple[float, ...]:
    """``8`` (a number of bins) or ``0.01,0.02,0.04`` (edges) for ``--k-bins``."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bins or edges like "
                                         f"0.01,0.02,0.04, got {text!r}") from None


def _finite_float(text: str) -> float:
    """A finite number (``nan``, ``inf`` and overflowing values such as ``1e999`` refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``PROG: error: MESSAGE (see PROG
    --help)``, exit status 2 (argparse's own prints the whole usage first)."""

    def error(self, message: str):
        text = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {text} (see '{self.prog} --help')\n")


def _add_cluster_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group("cluster")
    group.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=default,
        help="Dask scheduler address or scheduler file (else COSMO_DASK_SCHEDULER, "
        "else a local cluster)",
    )
    dev = group.add_mutually_exclusive_group()
    dev.add_argument(
        "--gpu",
        dest="gpu",
        action="store_const",
        const=True,
        default=default,
        help="require a local GPU cluster (dask-cuda)",
    )
    dev.add_argument(
        "--cpu",
        dest="gpu",
        action="store_const",
        const=False,
        default=default,
        help="use a CPU LocalCluster even if GPUs are present",
    )
    group.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        default=default,
        help="workers of a new local cluster",
    )
    group.add_argument(
        "--dashboard-address",
        metavar="HOST:PORT",
        default=default,
        help="dashboard of a new local cluster (default 127.0.0.1:8787, this machine only; "
        "':8787' serves every interface)",
    )
    for flag, what in (("--tls-ca-file", "certificate authority (PEM) of a tls:// scheduler"),
                       ("--tls-cert", "this client's TLS certificate (PEM)"),
                       ("--tls-key", "this client's TLS private key (PEM)")):
        group.add_argument(flag, metavar="FILE", default=default, help=what + " (or dask's "
                           "distributed.comm.tls.* configuration)")
    group.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="show tracebacks and more detail",
    )
    group.add_argument(
        "--no-verify",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="read input stores without checking each chunk against the CRC-32 recorded "
        "when it was written (checked by default)",
    )


def _redshift_list(text: str) -> tuple[float, ...]:
    """``3,1,0`` -> (3.0, 1.0, 0.0)."""
    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected redshifts like 3,1,0, got {text!r}") from None


def _observer(text: str) -> tuple[float, float, float]:
    """``25,25,25`` -> (25.0, 25.0, 25.0) (the lightcone's observer, in the box's units)."""
    try:
        values = tuple(float(t) for t in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"expected X,Y,Z (three numbers in the box's length "
                                         f"units), got {text!r}")
    return values


def _unit_triple(text: str) -> dict[str, str]:
    """``Mpc/h,km/s,1e10 Msun/h`` -> {length, velocity, mass} (empty entries: unchanged)."""
    parts = [t.strip() for t in text.split(",")]
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(
            f"expected LENGTH,VELOCITY,MASS (e.g. Mpc/h,km/s,1e10 Msun/h; an empty entry "
            f"keeps that unit), got {text!r}")
    return {q: t for q, t in zip(("length", "velocity", "mass"), parts, strict=True) if t}


def _part_types(text: str) -> int | list[int] | str:
    """``--part-type``: ``1`` -> 1, ``0,1,4`` -> [0, 1, 4], ``all`` -> "all" (the reader
    checks the numbers against its format's types)."""
    text = text.strip()
    if text == "all":
        return text
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a particle type (1), a comma list of types (0,1,4) or 'all', got "
            f"{text!r}") from None
    return values if "," in text else values[0]


# --------------------------------------------------------------------------- expand
def _center_arg(text: str):
    from ..expansion.parameters import CENTERS

    if text in CENTERS:
        return text
    try:
        c = [float(v) for v in text.split(",")]
    except ValueError:
        c = []
    if len(c) != 3:
        raise argparse.ArgumentTypeError(f"expected {', '.join(CENTERS)} or x,y,z; got {text!r}")
    return c


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    from ..analysis import parameters as ap
    from ..density import parameters as dp
    from ..expansion import parameters as ep
    from ..gravity import parameters as gp
    from ..gravity.parameters import (
        KERNELS,
        METHODS,
        R_CUT_SPLITS,
        R_SPLIT_CELLS,
        THETA_DEFAULT,
        THETA_MAX,
    )
    from ..halos import parameters as hp
    from ..models import parameters as mp
    from ..simulation import parameters as sp

    parser = _Parser(
        prog="cosmo-dask",
        description="Distributed N-body analysis on Dask (CPU or GPU workers).",
    )
    parser.add_argument("--version", action="version", version=f"cosmo_dask {__version__}")
    _add_cluster_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def _add_theory_options(parser):
        parser.add_argument("--sigma8", type=_positive_float, default=None,
                            help="sigma8 of the --plot theory curve (Gadget headers have none)")
        parser.add_argument("--cosmology", type=_cosmology_overrides, default=None,
                            metavar="KEY=VALUE,...",
                            help="cosmological parameters of the --plot theory curve, on top "
                            "of the snapshot's (Omega_m, Omega_b, Omega_L, h, sigma8, n_s)")

    def _add_generator_outputs(parser):
        """The options of commands that generate a snapshot store: dtype, chunks, overwrite."""
        parser.add_argument("--precision", choices=PRECISIONS, default=None)
        parser.add_argument("--chunk-size", type=_positive_int, default=None,
                            help="particles per chunk (default: dask config "
                            "cosmo_dask.chunk_size)")
        parser.add_argument("--overwrite", action="store_true",
                            help="replace an existing store")

    def subparser(name, **kw):
        p = sub.add_parser(name, **kw)
        _add_cluster_options(p, suppress=True)
        return p

    g = subparser(
        "generate",
        help="write a synthetic snapshot",
        description="Generate a synthetic snapshot into a Zarr store.",
    )
    g.add_argument("model", choices=mp.MODELS)
    g.add_argument("out", metavar="OUT.zarr")
    g.add_argument("--n", type=_positive_int,
                   help="particles (plummer, hernquist, ferrers, blobs)")
    g.add_argument("--n-side", type=_positive_int, help="particles per side (lattice, zeldovich)")
    g.add_argument(
        "--box-size", type=float, help="periodic box side (lattice: box units; zeldovich: Mpc/h)"
    )
    g.add_argument("--redshift", type=float, help="zeldovich: output redshift")
    g.add_argument("--seed", type=int, default=mp.SEED_DEFAULT)
    g.add_argument("--scale", type=float, default=mp.SCALE_DEFAULT,
                   help="plummer/hernquist scale radius")
    g.add_argument("--mass", type=float, default=mp.MASS_DEFAULT,
                   help="total mass (isolated models)")
    g.add_argument(
        "--axes",
        type=float,
        nargs=3,
        default=mp.FERRERS_AXES_DEFAULT,
        metavar=("A", "B", "C"),
        help="ferrers semi-axes",
    )
    g.add_argument("--index", type=int, default=mp.FERRERS_INDEX_DEFAULT,
                   help="ferrers index n")
    g.add_argument("--n-halos", type=_positive_int, default=mp.N_HALOS_DEFAULT,
                   help="blobs: number of Plummer halos")
    g.add_argument(
        "--amplitude", type=float, default=mp.LATTICE_AMPLITUDE_DEFAULT,
        help="lattice: offset amplitude in cells"
    )
    _add_generator_outputs(g)
    g.set_defaults(func=data.cmd_generate)

    ic = subparser("ics", help="cosmological initial conditions (Zel'dovich or 2LPT)",
                   description="Initial conditions for a periodic LambdaCDM box: particles "
                   "on a lattice displaced by first- (Zel'dovich) or second-order (2LPT) "
                   "Lagrangian perturbation theory; positions in Mpc/h, peculiar velocities "
                   "in km/s, masses in 1e10 Msun/h.")
    ic.add_argument("out", metavar="OUT.zarr")
    ic.add_argument("--n-side", type=_positive_int, required=True, help="particles per side")
    ic.add_argument("--box-size", type=float, required=True, help="box side in Mpc/h")
    ic.add_argument("--redshift", type=float, required=True, help="starting redshift")
    ic.add_argument("--order", type=int, choices=mp.LPT_ORDERS, default=mp.LPT_ORDER_DEFAULT,
                    help=f"Lagrangian perturbation order (default {mp.LPT_ORDER_DEFAULT})")
    ic.add_argument("--power", default=None, metavar="camb|class|FILE",
                    help="linear P(k) at z = 0: 'camb' or 'class' (computed when installed) "
                    "or a two-column table (k in h/Mpc, P in (Mpc/h)^3); default: Eisenstein "
                    "& Hu no-wiggle normalised to sigma8")
    ic.add_argument("--cosmology", type=_cosmology_overrides, default=None,
                    metavar="KEY=VALUE,...", help="cosmological parameters (Omega_m, Omega_b, "
                    "Omega_L, h, sigma8, n_s) on top of the Planck 2018-like defaults")
    ic.add_argument("--seed", type=int, default=mp.SEED_DEFAULT)
    ic.add_argument("--fixed-amplitude", action="store_true",
                    help="every mode's amplitude set to sqrt(P(k)) (random phases kept): "
                    "much less sample variance in P(k) and the mass function")
    ic.add_argument("--paired", action="store_true",
                    help="the sign-flipped field (the pair of a paired-and-fixed set)")
    ic.add_argument("--slabs", type=_positive_int, default=None,
                    help="mesh slabs of the FFTs (default: one per 64 MiB of the complex "
                    "mesh and per worker thread on the CPU, per 256 MiB with --gpu)")
    _add_generator_outputs(ic)
    ic.set_defaults(func=data.cmd_ics)

    sm = subparser("simulate", help="evolve cosmological ICs with PM or TreePM",
                   description="Evolve periodic cosmological initial conditions (a store "
                   "from `cosmo-dask ics`) to --z-final: kick-drift-kick leapfrog in the "
                   "scale factor, forces from PM or TreePM, snapshots at the --outputs "
                   "redshifts in a simulation store (see docs/simulation.md). One line per "
                   "step: a, z, step and force seconds.")
    sm.add_argument("ics", metavar="ICS.zarr")
    sm.add_argument("out", metavar="OUT", help="simulation store (a directory)")
    sm.add_argument("--z-final", type=float, default=sp.Z_FINAL_DEFAULT,
                    help=f"final redshift (default {sp.Z_FINAL_DEFAULT:g})")
    sm.add_argument("--steps", dest="n_steps", type=_positive_int, required=True,
                    help="steps from the ICs to --z-final (TreePM: 128 for P(k) converged "
                    "to 1%% up to k = 1 h/Mpc at 1 Mpc/h spacing, see docs/simulation.md)")
    sm.add_argument("--schedule", choices=sp.STEP_KINDS, default=None,
                    help="steps uniform in log a or in a (default: "
                    f"{', '.join(f'{v} for {k}' for k, v in sp.DEFAULT_STEPS.items())})")
    sm.add_argument("--method", choices=sp.METHODS, default=sp.METHOD_DEFAULT,
                    help="PM (FastPM kick/drift factors) or TreePM (default "
                    f"{sp.METHOD_DEFAULT})")
    sm.add_argument("--n-mesh", type=_positive_int, default=None,
                    help="PM mesh per side (default: twice the particles per side for pm, "
                    "once for treepm)")
    sm.add_argument("--softening", type=float, default=None,
                    help="TreePM Plummer softening in Mpc/h (default 1/30 of the mean "
                    "interparticle spacing)")
    sm.add_argument("--theta", type=float, default=THETA_DEFAULT,
                    help=f"TreePM opening angle, in (0, {THETA_MAX})")
    sm.add_argument("--outputs", type=_redshift_list, default=None, metavar="Z,Z,...",
                    help="output redshifts (--z-final is always one)")
    sm.add_argument("--analyses", default=None, metavar=",".join(sp.ANALYSES),
                    help="P(k) and/or FOF catalogs computed at each output")
    sm.add_argument("--no-particles", action="store_true",
                    help="store only the analyses of each output, not its particles")
    sm.add_argument("--checkpoint-every", type=_positive_int, default=None, metavar="K",
                    help="write a checkpoint every K steps (atomically)")
    sm.add_argument("--resume", action="store_true",
                    help="continue the run in OUT from its last checkpoint")
    sm.add_argument("--precision", choices=PRECISIONS, default=None)
    sm.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    sm.add_argument("--lightcone", type=float, default=None, metavar="Z_MAX",
                    help="record the observer's past light cone up to redshift Z_MAX "
                    "(at most the ICs'), under OUT/lightcone")
    sm.add_argument("--observer", type=_observer, default=None, metavar="X,Y,Z",
                    help="the lightcone's observer in the box, in its length units "
                    "(default: the box centre)")
    sm.set_defaults(func=data.cmd_simulate)

    i = subparser("info", help="describe and validate a snapshot")
    i.add_argument("snapshot", metavar="SNAP")
    i.add_argument("--quick", action="store_true", help="metadata only (reads no particle data)")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=data.cmd_info)

    c = subparser("convert", help="convert a foreign snapshot to a cosmo_dask store")
    c.add_argument("format", choices=tuple(CONVERT_FORMATS),
                   help="gadget: Gadget/AREPO HDF5; gadget-binary: Gadget format 1 or 2; "
                   "swift: SWIFT HDF5 (single, distributed or virtual file)")
    c.add_argument("input", metavar="IN", help="file, first file of a set, base name or glob")
    c.add_argument("out", metavar="OUT.zarr")
    c.add_argument("--part-type", type=_part_types, default=1, metavar="TYPE[,TYPE...]|all",
                   help="particle type (Gadget 0..5, SWIFT 0..6; 1: dark matter), a comma "
                   "list (0,1,4) or 'all': several types give one snapshot with a ptype array "
                   "and per-particle masses")
    c.add_argument("--units", type=_unit_triple, default=None, metavar="LENGTH,VELOCITY,MASS",
                   help="convert to these units while writing, e.g. 'Mpc/h,,1e10 Msun/h' "
                   "(an empty entry keeps that unit)")
    c.add_argument("--overwrite", action="store_true")
    c.set_defaults(func=data.cmd_convert)

    h = subparser("halos", help="friends-of-friends halos and their catalog",
                  description="Find friends-of-friends halos and write labels + catalog.")
    h.add_argument("snapshot", metavar="SNAP")
    h.add_argument("out", metavar="OUT.zarr")
    h.add_argument("--linking-length", type=float, default=hp.LINKING_LENGTH_DEFAULT,
                   help="in mean interparticle spacings (box units with --absolute; "
                   f"default {hp.LINKING_LENGTH_DEFAULT:g})")
    h.add_argument("--absolute", action="store_true", help="linking length in box units")
    h.add_argument("--min-members", type=int, default=hp.MIN_MEMBERS_DEFAULT,
                   help=f"smallest halo kept (>= {hp.MIN_MEMBERS_MIN})")
    h.add_argument("--min-friends", type=int, default=hp.MIN_FRIENDS_DEFAULT,
                   help=f"friends a particle needs to link (>= {hp.MIN_FRIENDS_MIN}; 1: "
                   "classic FOF)")
    h.add_argument("--centers", default=",".join(hp.CLI_CENTERS_DEFAULT),
                   help=f"comma list of {', '.join(hp.CENTERS)} (empty for none)")
    h.add_argument("--domains", type=_positive_int, default=None, help="domain count")
    h.add_argument("--so", metavar=",".join(hp.DELTAS), default=None,
                   help="also spherical-overdensity masses and radii (comma list of "
                   f"{', '.join(hp.DELTAS)}), profiles, V_max and NFW concentrations, "
                   "around the mbp centre (mcp when --centers has mcp but no mbp; mbp is "
                   "added when --centers has neither), written into the catalog")
    h.add_argument("--plot", metavar="PNG", default=None, help="mass function plot (with "
                   "the Warren and Watson fits when the cosmology is known)")
    _add_theory_options(h)
    h.add_argument("--overwrite", action="store_true")
    h.set_defaults(func=halos.cmd_halos)

    hd = subparser("hod", help="HOD galaxy mock of a halo catalog",
                   description="Populate the halos of a halo store (cosmo-dask halos) with "
                   "galaxies (Zheng et al. 2007 occupation: Bernoulli centrals at the halo "
                   "centres, Poisson satellites on member particles or an NFW profile) and "
                   "write them as a snapshot store (fields host_id, is_central, host_mass).")
    hd.add_argument("input", metavar="CATALOG", help="halo store")
    hd.add_argument("out", metavar="OUT.zarr")
    hd.add_argument("--model", choices=hp.HOD_MODELS, default=hp.HOD_MODELS[0])
    hod_defaults = hp.HOD_DEFAULTS[hp.HOD_MODELS[0]]
    for name, flag, what in (("logMmin", "--logMmin", "log10 Mmin [Msun/h]"),
                             ("sigma_logM", "--sigma-logM", "width of the central step (> 0)"),
                             ("logM0", "--logM0", "log10 M0 [Msun/h], satellites' cut-off"),
                             ("logM1", "--logM1", "log10 M1 [Msun/h]"),
                             ("alpha", "--alpha", "satellites' slope (>= 0)")):
        hd.add_argument(flag, dest=name, type=float, default=None,
                        help=f"{what} (default {hod_defaults[name]:g})")
    hd.add_argument("--satellites", choices=hp.HOD_SATELLITES, default=hp.HOD_SATELLITES[0],
                    help="satellites on random member particles (needs the halos' snapshot) "
                    "or on an NFW profile")
    hd.add_argument("--mass", choices=hp.HOD_MASSES, default=None,
                    help="halo mass of the occupation (default: the first of these the "
                    "catalog has)")
    hd.add_argument("--snapshot", metavar="SNAP", default=None,
                    help="the halos' snapshot (default: the path the halo store records)")
    hd.add_argument("--seed", type=int, default=0)
    hd.add_argument("--plot", metavar="PNG", default=None,
                    help="measured <N(M)> of centrals and satellites against the model")
    hd.add_argument("--overwrite", action="store_true")
    hd.set_defaults(func=halos.cmd_hod)

    sh = subparser("subhalos", help="bound subhalos inside the FOF halos of a halo store",
                   description="Find bound subhalos inside the FOF halos of a halo store "
                   "(cosmo-dask halos) of SNAP: a hierarchical phase-space (6-D) FOF in each "
                   "halo, then iterative unbinding; write the subhalo catalog as a store.")
    sh.add_argument("snapshot", metavar="SNAP")
    sh.add_argument("halos", metavar="HALOS", help="halo store of SNAP")
    sh.add_argument("out", metavar="OUT.zarr")
    sh.add_argument("--min-members", type=int, default=hp.SUBHALO_MIN_MEMBERS_DEFAULT,
                    help=f"bound particles a subhalo needs (>= {hp.SUBHALO_MIN_MEMBERS_MIN})")
    sh.add_argument("--link-fraction", type=float, default=hp.SUBHALO_LINK_FRACTION_DEFAULT,
                    help="fraction of a group's particles its 6-D linking length links "
                    f"(default {hp.SUBHALO_LINK_FRACTION_DEFAULT:g}, ROCKSTAR's)")
    sh.add_argument("--softening", type=float, default=None,
                    help="Plummer softening of the unbinding potentials, length units "
                    "(default: the halo catalog's potential softening)")
    sh.add_argument("--tree-threshold", type=int, default=hp.SUBHALO_TREE_THRESHOLD_DEFAULT,
                    help="candidates above this many particles get octree potentials")
    sh.add_argument("--labels", action="store_true",
                    help="also store each particle's subhalo")
    sh.add_argument("--plot", metavar="PNG", default=None,
                    help="satellite mass function N(>m) with its fitted slope")
    sh.add_argument("--overwrite", action="store_true")
    sh.set_defaults(func=subhalos.cmd_subhalos)

    e = subparser("expand", help="SCF or MEX expansion of an isolated snapshot",
                  description="Fit an SCF (Hernquist-Ostriker) or MEX (multipole) expansion "
                  "and write coefficients and/or accelerations to a Zarr store.")
    e.add_argument("snapshot", metavar="SNAP")
    e.add_argument("out", metavar="OUT.zarr")
    e.add_argument("--method", choices=ep.METHODS, default=ep.METHODS[0])
    e.add_argument("--nmax", type=int, default=ep.NMAX_DEFAULT,
                   help=f"SCF radial order (0 to {ep.NMAX_LIMIT})")
    e.add_argument("--lmax", type=int, default=ep.LMAX_DEFAULT,
                   help=f"angular order (0 to {ep.LMAX_LIMIT})")
    e.add_argument("--scale-radius", type=float, default=ep.SCALE_RADIUS_DEFAULT,
                   help="SCF basis scale radius")
    e.add_argument("--softening", type=float, default=ep.SOFTENING_DEFAULT,
                   help="MEX softening length")
    e.add_argument("--center", type=_center_arg, default=ep.CENTER_DEFAULT,
                   help=f"{', '.join(ep.CENTERS)} or x,y,z (needed for periodic snapshots)")
    e.add_argument("--precision", choices=PRECISIONS, default=ep.PRECISION_DEFAULT)
    e.add_argument("--accelerations", action="store_true",
                   help="SCF: also store accelerations and potentials at the particles "
                   "(MEX always does)")
    e.add_argument("--overwrite", action="store_true")
    e.set_defaults(func=expand.cmd_expand)

    m = subparser("density", help="PSE density on an adaptive octree, or a painted mesh",
                  description="--method pse: phase-space-element density (exact tetrahedron "
                  "deposits) on an adaptive octree of grid patches, written as a multiscale "
                  "Zarr group. --method ngp|cic|tsc|pcs: mass per cell on a periodic mesh.")
    m.add_argument("snapshot", metavar="SNAP")
    m.add_argument("out", metavar="OUT.zarr")
    m.add_argument("--method", choices=(*dp.SCHEMES, "pse"), default=dp.SCHEME_DEFAULT)
    m.add_argument("--n-mesh", type=_positive_int, default=dp.CLI_N_MESH_DEFAULT)
    m.add_argument("--box-size", type=float, default=None, help="for isolated snapshots")
    m.add_argument("--patch-size", type=_positive_int, default=dp.PATCH_SIZE_DEFAULT,
                   help="pse: cells per leaf patch side (a power of two)")
    m.add_argument("--strategy", choices=dp.STRATEGIES, default=dp.STRATEGIES[0],
                   help="pse: scheduling of the leaf deposits")
    m.add_argument("--max-level", type=int, default=None,
                   help="pse: deepest octree level, at most "
                   f"{dp.MAX_LEVEL_MAX} (default: finest cells = half the Lagrangian spacing)")
    m.add_argument("--max-tets-per-node", type=float, default=None,
                   help="pse: refine nodes overlapped by more tetrahedra (default patch^3)")
    m.add_argument("--block", type=_positive_int, default=dp.BLOCK_DEFAULT,
                   help="pse: Lagrangian sub-block side in cells")
    m.add_argument("--plot", metavar="PNG", default=None, help="log-density slice plot")
    m.add_argument("--overwrite", action="store_true")
    m.set_defaults(func=density.cmd_density)

    p = subparser("power", help="power spectrum P(k) of a snapshot",
                  description="Window-compensated, interlaced P(k) with mode counts and shot "
                  "noise (not subtracted).")
    p.add_argument("snapshot", metavar="SNAP")
    p.add_argument("--n-mesh", type=_positive_int, default=dp.CLI_N_MESH_DEFAULT)
    p.add_argument("--scheme", choices=tuple(dp.SCHEMES), default=dp.SCHEME_DEFAULT)
    p.add_argument("--no-interlace", action="store_true")
    p.add_argument("--los", type=int, choices=tuple(ap.LOS_AXES.values()), default=None,
                   help="line-of-sight axis for multipoles (default: a redshift-space "
                   "snapshot's own)")
    p.add_argument("--poles", type=_int_list, default=",".join(map(str, ap.POLES_DEFAULT)),
                   help=f"Legendre multipoles out of {', '.join(map(str, ap.POLES))}, "
                   "e.g. 0,2,4")
    p.add_argument("--out", default=None, help="write the table (.csv or .nc)")
    p.add_argument("--plot", metavar="PNG", default=None, help="P(k) plot (with linear theory "
                   "when the cosmology is known)")
    _add_theory_options(p)
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing --out and --plot files")
    p.set_defaults(func=density.cmd_power)

    x = subparser("xi", help="pair counts and the correlation function of a snapshot",
                  description="Periodic pair counts DD(r) and xi(r) = DD/RR - 1 (analytic RR), "
                  "or xi(s, mu) and its Legendre multipoles along a line of sight, written to "
                  "a Zarr store (distinct pairs, each once).")
    x.add_argument("snapshot", metavar="SNAP")
    x.add_argument("out", metavar="OUT.zarr")
    x.add_argument("--r-max", type=_positive_float, required=True,
                   help="largest separation (snapshot length units, at most half the box)")
    x.add_argument("--bins", type=_positive_int, default=ap.XI_BINS_DEFAULT,
                   help="equal separation bins")
    x.add_argument("--r-min", type=_finite_float, default=0.0, help="smallest separation")
    x.add_argument("--mu-bins", type=_positive_int, default=None,
                   help="equal mu bins on [0, 1]: xi(s, mu) and multipoles")
    x.add_argument("--los", choices=tuple(ap.LOS_AXES) + tuple(map(str, ap.LOS_AXES.values())),
                   default=None, help=f"line of sight with --mu-bins (default {ap.XI_LOS_DEFAULT})")
    x.add_argument("--poles", type=_int_list, nargs="+", default=None,
                   help=f"Legendre multipoles out of {', '.join(map(str, ap.POLES))} with "
                   "--mu-bins, e.g. 0 2 4 or 0,2,4 (default all)")
    x.add_argument("--domains", type=_positive_int, default=None, help="domain count")
    x.add_argument("--plot", metavar="PNG", default=None,
                   help="r^2 xi(r) (or s^2 xi_l(s)) plot")
    x.add_argument("--overwrite", action="store_true",
                   help="replace an existing store and --plot file")
    x.set_defaults(func=clustering.cmd_xi)
    bs = subparser("bispectrum", help="bispectrum B(k1, k2, k3) and Q of a snapshot",
                   description="FFT shell estimator of the bispectrum in triangle bins of "
                   "|k| (all closed bin triples), window-compensated and interlaced, with the "
                   "Poisson shot noise (reported, subtracted only in Q), the reduced "
                   "bispectrum Q and Gaussian errors, written as a Zarr product store.")
    bs.add_argument("snapshot", metavar="SNAP")
    bs.add_argument("out", metavar="OUT.zarr")
    bs.add_argument("--n-mesh", type=_positive_int, default=dp.CLI_N_MESH_DEFAULT)
    bs.add_argument("--k-bins", type=_k_bins, default=ap.CLI_K_BINS_DEFAULT,
                    help="a number of bins of width 2 pi / L from pi / L, or increasing "
                    "edges in the snapshot's inverse length, up to the Nyquist wavenumber "
                    f"(default {ap.CLI_K_BINS_DEFAULT})")
    bs.add_argument("--scheme", choices=tuple(dp.SCHEMES), default=dp.SCHEME_DEFAULT)
    bs.add_argument("--no-interlace", action="store_true")
    bs.add_argument("--no-shot-noise", action="store_true",
                    help="Q without subtracting the Poisson shot noise (lattices, ICs)")
    bs.add_argument("--plot", metavar="PNG", default=None, help="Q against the triangle "
                    "angle (with tree-level theory when the cosmology is known)")
    _add_theory_options(bs)
    bs.add_argument("--overwrite", action="store_true",
                    help="replace an existing OUT bispectrum store")
    bs.set_defaults(func=density.cmd_bispectrum)

    gr = subparser("gravity", help="accelerations and potentials of every particle",
                   description="Gravitational accelerations and potentials of every particle "
                   "of a snapshot (tree, direct summation, PM or TreePM), written to a Zarr "
                   "store in the snapshot's particle order.")
    gr.add_argument("snapshot", metavar="SNAP")
    gr.add_argument("out", metavar="OUT.zarr")
    gr.add_argument("--method", choices=METHODS, default=METHODS[0])
    gr.add_argument("--theta", type=float, default=THETA_DEFAULT,
                    help=f"tree opening angle, in (0, {THETA_MAX})")
    gr.add_argument("--softening", type=float, default=gp.SOFTENING_DEFAULT,
                    help="Plummer-equivalent softening length (snapshot length units)")
    gr.add_argument("--softening-kernel", choices=KERNELS, default=KERNELS[0])
    gr.add_argument("--precision", choices=PRECISIONS,
                    default=gp.PRECISION_DEFAULT)
    gr.add_argument("--n-mesh", type=int, default=None,
                    help="pm/treepm mesh cells per side (default: the smallest power of two "
                    ">= N^(1/3), at least 16)")
    gr.add_argument("--r-split", type=float, default=None,
                    help=f"treepm force-split scale (default {R_SPLIT_CELLS:g} box / n_mesh)")
    gr.add_argument("--r-cut", type=float, default=None,
                    help=f"treepm short-range cutoff (default {R_CUT_SPLITS:g} r_split)")
    gr.add_argument("--max-leaf", type=int, default=gp.MAX_LEAF_DEFAULT,
                    help="tree leaf size (particles)")
    gr.add_argument("--max-group", type=int, default=gp.MAX_GROUP_DEFAULT,
                    help="tree group size (particles)")
    gr.add_argument("--G", dest="G", type=float, default=None,
                    help="gravitational constant (default: the snapshot's G attribute)")
    gr.add_argument("--no-potential", action="store_true", help="accelerations only")
    gr.add_argument("--overwrite", action="store_true")
    gr.set_defaults(func=gravity.cmd_gravity)

    tr = subparser("trees", help="merger trees of a simulation's halo outputs",
                   description="Link the halos of a simulation store's halo outputs (run "
                   "with --analyses halos) to their descendants by their most-bound members "
                   "and write a merger tree store OUT: the links, main branches' inputs "
                   "and trees.dat, a consistent-trees file that ytree.load reads.")
    tr.add_argument("simulation", metavar="SIM", help="simulation store")
    tr.add_argument("out", metavar="OUT", help="merger tree store to write")
    tr.add_argument("--n-tracers", type=int, default=hp.N_TRACERS_DEFAULT,
                    help="most-bound members of each halo followed (default "
                    f"{hp.N_TRACERS_DEFAULT})")
    tr.add_argument("--buckets", type=_positive_int, default=None,
                    help="buckets of the id shuffle (default: automatic)")
    tr.add_argument("--plot", metavar="FILE", default=None,
                    help="median mass accretion histories in two mass bins with the "
                    "Correa et al. 2015 fit (log M/M0 against z)")
    tr.add_argument("--plot-tree", metavar="FILE", default=None,
                    help="draw the merger tree of one final halo (--halo)")
    tr.add_argument("--halo", type=int, default=None,
                    help="final halo of --plot-tree (default 0, the most massive)")
    tr.add_argument("--overwrite", action="store_true")
    tr.set_defaults(func=structure.cmd_trees)

    cl = subparser("clean", help="settle what killed writes left (temporary stores)",
                   description="Settle what writes to PATH killed outright left next to it "
                   "(and, for a simulation store, next to its checkpoint and outputs): a "
                   "replace interrupted between its renames is finished or undone (the "
                   "complete store put at its path), .NAME.tmp-<hex> directories whose "
                   "writer is gone are removed. Those whose writer may still be running "
                   "are kept. The next open of or write to PATH does the same.")
    cl.add_argument("path", metavar="PATH", help="the store path that was being written")
    cl.set_defaults(func=data.cmd_clean)

    d = subparser("demo", help="run the end-to-end demo on a local cluster")
    d.add_argument(
        "--dir",
        default=None,
        help="directory for the demo's stores (default: a temporary directory, removed afterwards)",
    )
    d.add_argument("--n-side", type=_positive_int, default=64)
    d.add_argument("--box-size", type=float, default=100.0)
    d.add_argument("--redshift", type=float, default=49.0,
                   help="redshift of the ICs, evolved to z = 0 (default 49)")
    d.add_argument("--steps", dest="n_steps", type=_positive_int, default=10,
                   help="PM steps from the ICs to z = 0 (default 10)")
    d.add_argument("--seed", type=int, default=1)
    d.set_defaults(func=demo.cmd_demo)
    return parser
