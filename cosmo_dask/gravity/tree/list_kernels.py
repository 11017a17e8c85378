"""numba kernels evaluating group interaction lists: M2P (monopole + quadrupole) and P2P.

Conventions (``docs/gravity.md``, Conventions): ``a_i = -G sum_j m_j K(r) (x_i - x_j)``,
``phi_i = -G sum_j m_j P(r)``; pairs at zero separation (self-pairs) are skipped.

P2P (leaf lists)
----------------
Per group, the particles of all its list leaves are gathered once into
contiguous buffers with positions relative to the group centre (computed in
float64, minimum image with ``box_size``, then cast to the arithmetic dtype:
float32 or float64); every target then sweeps the whole buffer in one
vectorisable loop. Kernels: Plummer ``K = (r^2+eps^2)^{-3/2}``,
``P = (r^2+eps^2)^{-1/2}``; Gadget-2 cubic spline with support ``h = 2.8 eps``;
times the truncated factors ``T(x)``, ``erfc(x)`` (``x = r/(2 rs)``, exact
``math.erfc``/``math.exp``) and a sharp cut at ``r_cut`` for the short range.

M2P (cell lists), float64
-------------------------
For a cell of mass ``M``, centre of mass ``c``, traceless quadrupole ``Q``
(``sum m (3 d d - d^2 I)``) and trace ``S = sum m d^2``, with ``x = x_i - c`` and
``g(r)`` the pair potential kernel, ``D1 = g'/r``, ``D2 = D1'/r``, ``D3 = D2'/r``::

    phi = -G [M g + (D2 x.Q.x + S (D2 r^2 + 3 D1)) / 6]
    a   =  G [(M D1 + D3 (x.Q.x + S r^2) / 6 + 5 S D2 / 6) x + D2 Q.x / 3]

(for the Newtonian kernel the ``S`` terms cancel). The monopole uses the
softened kernel itself (Plummer or spline, times ``T``/``erfc``); the quadrupole
terms use the unsoftened (Newtonian or truncated) derivatives at ``u =
sqrt(r^2 + eps^2)`` for Plummer softening -- exact for the Plummer-softened
Newtonian potential -- and at ``r`` for the spline, whose quadrupole terms are
dropped inside its support ``r < h`` (the monopole there is the spline's).
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np

from ...core.errors import ParameterError
from ..parameters import KERNELS
from ..softening_kernels import plummer_kp, spline_kp
from .walk import _walk_one, _walk_params

__all__ = ["evaluate_lists", "KERNEL_CODES"]

KERNEL_CODES = {name: code for code, name in enumerate(KERNELS)}
_SQRT_PI = math.sqrt(math.pi)
_FM = {"reassoc", "contract", "arcp"}  # reductions vectorise; no nnan/ninf assumptions


# --------------------------------------------------------------------------- pair kernels
@numba.njit(cache=True, error_model="numpy", inline="always")
def _pair_kp(r2, eps2, h, kern, alpha):
    """(K, P) of one pair at squared distance r2 > 0 (float64 math)."""
    if kern == 0:
        k, p = plummer_kp(r2, eps2)
    else:
        k, p = spline_kp(math.sqrt(r2), h)
    if alpha > 0.0:
        x = math.sqrt(r2) * alpha
        e = math.erfc(x)
        k *= e + (2.0 / _SQRT_PI) * x * math.exp(-x * x)
        p *= e
    return k, p


@numba.njit(cache=True, error_model="numpy", inline="always")
def _derivs(r, alpha):
    """(g, D1, D2, D3) of the Newtonian (alpha=0) or truncated kernel at r > 0."""
    inv = 1.0 / r
    inv2 = inv * inv
    if alpha == 0.0:
        return inv, -inv * inv2, 3.0 * inv * inv2 * inv2, -15.0 * inv * inv2 * inv2 * inv2
    x = r * alpha
    ec = math.erfc(x)
    ex = math.exp(-x * x)
    t = ec + (2.0 / _SQRT_PI) * x * ex
    a3 = alpha * alpha * alpha / _SQRT_PI * ex
    d1 = -t * inv * inv2
    d2 = 3.0 * t * inv * inv2 * inv2 + 4.0 * a3 * inv2
    d3 = (-15.0 * t * inv * inv2 * inv2 * inv2 - 20.0 * a3 * inv2 * inv2
          - 8.0 * a3 * alpha * alpha * inv2)
    return ec * inv, d1, d2, d3


# --------------------------------------------------------------------------- P2P sweeps
# P2P sweeps of one target over a gathered source buffer; the arithmetic dtype
# ``ft`` is the buffers' (float32 or float64). Module-level functions, not
# closures over ``ft``: numba's cache keys a closure by its pickled cells, which
# for other jitted functions differ in every process (no cache hits).
@numba.njit(nogil=True, cache=True, fastmath=_FM, error_model="numpy")
def _p2p_plummer(tx, ty, tz, sx, sy, sz, sm, ns, eps2):
    ft = sx.dtype.type
    ax = ft(0.0)
    ay = ft(0.0)
    az = ft(0.0)
    pp = ft(0.0)
    e2 = ft(eps2)
    for j in range(ns):
        dx = tx - sx[j]
        dy = ty - sy[j]
        dz = tz - sz[j]
        r2 = dx * dx + dy * dy + dz * dz
        m = sm[j] if r2 > ft(0.0) else ft(0.0)
        r2s = r2 + e2 if r2 > ft(0.0) else ft(1.0)
        inv = ft(1.0) / math.sqrt(r2s)
        minv = m * inv
        k = minv * inv * inv
        ax -= k * dx
        ay -= k * dy
        az -= k * dz
        pp -= minv
    return ax, ay, az, pp


@numba.njit(cache=True, error_model="numpy", inline="always")
def _p2p_general(tx, ty, tz, sx, sy, sz, sm, ns, eps2, h, kern, alpha, cut2, box):
    ft = sx.dtype.type
    ax = 0.0
    ay = 0.0
    az = 0.0
    pp = 0.0
    fbox = ft(box)
    for j in range(ns):
        dx = tx - sx[j]
        dy = ty - sy[j]
        dz = tz - sz[j]
        if box > 0.0:
            dx -= fbox * ft(np.rint(dx / fbox))
            dy -= fbox * ft(np.rint(dy / fbox))
            dz -= fbox * ft(np.rint(dz / fbox))
        r2 = np.float64(dx * dx + dy * dy + dz * dz)
        if r2 == 0.0 or r2 >= cut2:
            continue
        k, p = _pair_kp(r2, eps2, h, kern, alpha)
        m = np.float64(sm[j])
        ax -= m * k * dx
        ay -= m * k * dy
        az -= m * k * dz
        pp -= m * p
    return ax, ay, az, pp


# --------------------------------------------------------------------------- M2P sweep
@numba.njit(nogil=True, cache=True, fastmath=_FM, error_model="numpy")
def _m2p_plummer(x0, y0, z0, cx, cy, cz, cm, q, cs, nc, eps2, use_q):
    """Newtonian Plummer M2P of one target over gathered cells (float64; q is (6, nc))."""
    ax = 0.0
    ay = 0.0
    az = 0.0
    pp = 0.0
    if not use_q:
        for c in range(nc):
            x = x0 - cx[c]
            y = y0 - cy[c]
            z = z0 - cz[c]
            inv = 1.0 / math.sqrt(x * x + y * y + z * z + eps2)
            mono = cm[c] * inv * inv * inv
            ax -= mono * x
            ay -= mono * y
            az -= mono * z
            pp -= cm[c] * inv
        return ax, ay, az, pp
    q0 = q[0]
    q1 = q[1]
    q2 = q[2]
    q3 = q[3]
    q4 = q[4]
    q5 = q[5]
    for c in range(nc):
        x = x0 - cx[c]
        y = y0 - cy[c]
        z = z0 - cz[c]
        r2 = x * x + y * y + z * z
        inv = 1.0 / math.sqrt(r2 + eps2)
        inv2 = inv * inv
        d1 = -inv * inv2
        d2 = -3.0 * d1 * inv2
        d3 = -5.0 * d2 * inv2
        qx = q0[c] * x + q1[c] * y + q2[c] * z
        qy = q1[c] * x + q3[c] * y + q4[c] * z
        qz = q2[c] * x + q4[c] * y + q5[c] * z
        xqx = x * qx + y * qy + z * qz
        s = cs[c]
        mono = (cm[c] * d1 + d3 * (xqx + s * r2) * (1.0 / 6.0) + s * d2 * (5.0 / 6.0))
        qf = d2 * (1.0 / 3.0)
        ax += mono * x + qf * qx
        ay += mono * y + qf * qy
        az += mono * z + qf * qz
        pp -= cm[c] * inv + (d2 * xqx + s * (d2 * r2 + 3.0 * d1)) * (1.0 / 6.0)
    return ax, ay, az, pp


@numba.njit(cache=True, error_model="numpy", inline="always")
def _m2p_general(x0, y0, z0, cx, cy, cz, cm, q, cs, nc, eps2, h, kern, alpha, box, use_q):
    ax = 0.0
    ay = 0.0
    az = 0.0
    pp = 0.0
    for c in range(nc):
        x = x0 - cx[c]
        y = y0 - cy[c]
        z = z0 - cz[c]
        if box > 0.0:
            x -= box * np.rint(x / box)
            y -= box * np.rint(y / box)
            z -= box * np.rint(z / box)
        r2 = x * x + y * y + z * z
        if r2 == 0.0:
            continue
        k, p = _pair_kp(r2, eps2, h, kern, alpha)
        mono = -cm[c] * k
        phi = cm[c] * p
        if use_q:
            if kern == 0:
                reff = math.sqrt(r2 + eps2)
                doq = True
            else:
                reff = math.sqrt(r2)
                doq = reff >= h
            if doq:
                _, d1, d2, d3 = _derivs(reff, alpha)
                qx = q[0, c] * x + q[1, c] * y + q[2, c] * z
                qy = q[1, c] * x + q[3, c] * y + q[4, c] * z
                qz = q[2, c] * x + q[4, c] * y + q[5, c] * z
                xqx = x * qx + y * qy + z * qz
                s = cs[c]
                mono += d3 * (xqx + s * r2) / 6.0 + s * d2 * (5.0 / 6.0)
                phi += (d2 * xqx + s * (d2 * r2 + 3.0 * d1)) / 6.0
                qf = d2 / 3.0
                ax += qf * qx
                ay += qf * qy
                az += qf * qz
        ax += mono * x
        ay += mono * y
        az += mono * z
        pp -= phi
    return ax, ay, az, pp


# --------------------------------------------------------------------------- group driver
@numba.njit(cache=True, error_model="numpy", inline="always")
def _nearest(d, box):
    """Separation ``d`` (float64) of the nearest periodic image, for ``box > 0``."""
    return d - box * np.rint(d / box)


@numba.njit(cache=True, error_model="numpy", inline="always")
def _relative(x, y, z, c0, c1, c2, box):
    """``(x, y, z) - (c0, c1, c2)`` (float64), the nearest periodic image when ``box > 0``."""
    dx = np.float64(x) - c0
    dy = np.float64(y) - c1
    dz = np.float64(z) - c2
    if box > 0.0:
        dx = _nearest(dx, box)
        dy = _nearest(dy, box)
        dz = _nearest(dz, box)
    return dx, dy, dz


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _evaluate_group(g, proto, tpos, g_start, g_count, g_centre, cell_ptr, cells, leaf_ptr,
                    leaves, s_pos, s_pmass, s_start, s_count, n_mass, n_com, n_quad, n_trace,
                    G, eps2, h, kern, alpha, cut2, box, use_q, acc, pot,
                    walk, g_lo, g_hi, s_first, s_nchild, s_lo, s_hi, s_bmax, inv_theta2, bcap,
                    missing, general):
    """Group ``g``'s forces (rows ``g_start[g] : g_start[g] + g_count[g]`` of ``acc`` and
    ``pot``); ``proto`` (an empty array) carries the P2P arithmetic dtype. ``general``:
    ``None`` for the Plummer, open, untruncated kernel (the fast sweeps), else True (the
    general ones); numba drops the branch that a ``None`` or a bool rules out before
    compiling, so a run compiles only the sweeps it uses."""
    ft = proto.dtype.type
    cut = cut2 != np.inf
    if walk:  # fused: walk this group now into local lists
        cap_c = 1024
        cap_l = 128
        while True:
            cells_g = np.empty(cap_c, dtype=np.int64)
            leaves_g = np.empty(cap_l, dtype=np.int64)
            n_c, n_l, n_m = _walk_one(g_lo[g], g_hi[g], s_first, s_nchild, s_start,
                                      s_lo, s_hi, n_com, s_bmax, inv_theta2, box,
                                      cut2 if cut else 0.0, cut, bcap, cells_g,
                                      leaves_g, np.bool_(True))
            if n_c <= cap_c and n_l <= cap_l:
                break
            cap_c = max(cap_c, n_c)
            cap_l = max(cap_l, n_l)
        missing[g] = n_m
        cells_g = cells_g[:n_c]
        leaves_g = leaves_g[:n_l]
    else:
        cells_g = cells[cell_ptr[g]:cell_ptr[g + 1]]
        leaves_g = leaves[leaf_ptr[g]:leaf_ptr[g + 1]]
    t0 = g_start[g]
    nt = g_count[g]
    c0 = g_centre[g, 0]
    c1 = g_centre[g, 1]
    c2 = g_centre[g, 2]
    # ---- gather P2P sources relative to the group centre
    ns = 0
    for li in range(leaves_g.shape[0]):
        ns += s_count[leaves_g[li]]
    sx = np.empty(ns, dtype=proto.dtype)
    sy = np.empty(ns, dtype=proto.dtype)
    sz = np.empty(ns, dtype=proto.dtype)
    sm = np.empty(ns, dtype=proto.dtype)
    k = 0
    for li in range(leaves_g.shape[0]):
        nd = leaves_g[li]
        for p in range(s_start[nd], s_start[nd] + s_count[nd]):
            dx, dy, dz = _relative(s_pos[p, 0], s_pos[p, 1], s_pos[p, 2], c0, c1, c2, box)
            sx[k] = dx
            sy[k] = dy
            sz[k] = dz
            sm[k] = s_pmass[p]
            k += 1
    # ---- gather M2P cells (float64) relative to the group centre
    nc = cells_g.shape[0]
    cx = np.empty(nc)
    cy = np.empty(nc)
    cz = np.empty(nc)
    cm = np.empty(nc)
    cs = np.empty(nc)
    cq = np.empty((6, nc))
    for ci in range(nc):
        nd = cells_g[ci]
        dx, dy, dz = _relative(n_com[nd, 0], n_com[nd, 1], n_com[nd, 2], c0, c1, c2, box)
        cx[ci] = dx
        cy[ci] = dy
        cz[ci] = dz
        cm[ci] = n_mass[nd]
        cs[ci] = n_trace[nd]
        for a in range(6):
            cq[a, ci] = n_quad[nd, a]
    # ---- targets
    for i in range(t0, t0 + nt):
        x0, y0, z0 = _relative(tpos[i, 0], tpos[i, 1], tpos[i, 2], c0, c1, c2, box)
        if general is None:
            bx, by, bz, bp = _p2p_plummer(ft(x0), ft(y0), ft(z0), sx, sy, sz, sm,
                                         np.int64(ns), eps2)
            mx, my, mz, mp = _m2p_plummer(x0, y0, z0, cx, cy, cz, cm, cq, cs, nc,
                                          eps2, use_q)
        else:
            # sources and target are relative to the group centre (minimum image): a
            # pair closer than r_cut needs no other image when the target lies within
            # box/2 - r_cut of the centre (a pair that would is cut as it stands)
            pair_box = box
            if box > 0.0 and cut:
                reach = max(abs(x0), abs(y0), abs(z0)) + math.sqrt(cut2)
                if reach < 0.5 * box * (1.0 - 1e-5):
                    pair_box = 0.0
            bx, by, bz, bp = _p2p_general(ft(x0), ft(y0), ft(z0), sx, sy, sz, sm, ns,
                                         eps2, h, kern, alpha, cut2, pair_box)
            mx, my, mz, mp = _m2p_general(x0, y0, z0, cx, cy, cz, cm, cq, cs, nc,
                                          eps2, h, kern, alpha, box, use_q)
        acc[i, 0] = G * (np.float64(bx) + mx)
        acc[i, 1] = G * (np.float64(by) + my)
        acc[i, 2] = G * (np.float64(bz) + mz)
        pot[i] = G * (np.float64(bp) + mp)


@numba.njit(nogil=True, cache=True, parallel=True, error_model="numpy")
def _evaluate(proto, tpos, g_start, g_count, g_centre, cell_ptr, cells, leaf_ptr, leaves,
              s_pos, s_pmass, s_start, s_count, n_mass, n_com, n_quad, n_trace,
              G, eps2, h, kern, alpha, cut2, box, use_q, acc, pot,
              walk, g_lo, g_hi, s_first, s_nchild, s_lo, s_hi, s_bmax, inv_theta2, bcap,
              missing, general):
    """Every group's forces (:func:`_evaluate_group`, groups in parallel)."""
    for g in numba.prange(g_start.shape[0]):
        _evaluate_group(np.int64(g), proto, tpos, g_start, g_count, g_centre, cell_ptr,
                        cells, leaf_ptr, leaves, s_pos, s_pmass, s_start, s_count, n_mass,
                        n_com, n_quad, n_trace, G, eps2, h, kern, alpha, cut2, box, use_q,
                        acc, pot, walk, g_lo, g_hi, s_first, s_nchild, s_lo, s_hi, s_bmax,
                        inv_theta2, bcap, missing, general)


def _evaluator(dtype):
    """:func:`_evaluate` with P2P arithmetic in ``dtype`` (float32 or float64)."""
    proto = np.empty(0, dtype=np.float32 if np.dtype(dtype).name == "float32" else np.float64)
    return functools.partial(_evaluate, proto)


def evaluate_lists(tpos: np.ndarray, g_start: np.ndarray, g_count: np.ndarray,
                   g_centre: np.ndarray, lists, source, trace: np.ndarray, *, G: float,
                   softening: float = 0.0, softening_kernel: str = "plummer",
                   precision: str = "float64", quadrupole: bool = True,
                   box_size: float | None = None, rs: float | None = None,
                   r_cut: float | None = None, theta: float | None = None,
                   g_lo: np.ndarray | None = None,
                   g_hi: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Accelerations and potentials of target groups from their interaction lists.

    With ``lists=None`` the walk is fused into the evaluation: each group walks
    ``source`` (:func:`cosmo_dask.gravity.tree.walk.interaction_lists` semantics,
    with ``theta``, ``rs``, ``r_cut`` and the group boxes ``g_lo``/``g_hi``) into local lists that
    are evaluated at once and never stored -- same lists, same arithmetic, one
    pass instead of three.

    Parameters
    ----------
    tpos : (N_t, 3) float array
        Target positions (length); group ``g`` owns rows
        ``g_start[g] : g_start[g] + g_count[g]``.
    g_start, g_count : (G,) int64
    g_centre : (G, 3) float64
        Centre of each group (length): positions are taken relative to it before
        the arithmetic (float32 safety, periodic images).
    lists : InteractionLists or None
        From :func:`cosmo_dask.gravity.tree.walk.interaction_lists` against
        ``source``; None: fused walk (needs ``theta``, ``g_lo``, ``g_hi``).
    source : Octree
        Source tree (node multipoles and, for list leaves, particles).
    trace : (M,) float64
        ``sum m |x - com|^2`` per source node (see
        :func:`cosmo_dask.spatial.octree.node_second_moment`); zeros are exact
        for the unsoftened Newtonian kernel.
    G : float
        Gravitational constant.
    softening : float
        Plummer-equivalent softening ``eps`` (length), >= 0.
    softening_kernel : {"plummer", "spline"}
    precision : {"float32", "float64"}
        Arithmetic dtype of P2P (M2P and the sums over cells are float64).
    quadrupole : bool
        Include the quadrupole (and trace) terms of M2P.
    box_size : float, optional
        Periodic box side: minimum-image separations.
    rs, r_cut : float, optional
        Truncated short-range kernel with split scale ``rs`` and sharp cut at
        ``r_cut`` (both length); ``rs=None`` means Newtonian.
    theta : float, optional
        Opening angle of the fused walk.
    g_lo, g_hi : (G, 3) float64, optional
        Group boxes of the fused walk.

    Returns
    -------
    acc : (N_t, 3) float64, pot : (N_t,) float64
        In the target row order (``G`` included).
    """
    n_t = tpos.shape[0]
    acc = np.zeros((n_t, 3))
    pot = np.zeros(n_t)
    if n_t == 0:
        return acc, pot
    eps = float(softening)
    kern = KERNEL_CODES[softening_kernel]
    eps2 = eps * eps if kern == 0 else 0.0
    h = 2.8 * eps
    alpha = 0.0 if rs is None else 1.0 / (2.0 * float(rs))
    cut2 = np.inf if r_cut is None else float(r_cut) ** 2
    box = 0.0 if box_size is None else float(box_size)
    fn = _evaluator(precision)
    n_g = np.asarray(g_start).shape[0]
    walk = lists is None
    empty = np.zeros(0, dtype=np.int64)
    missing = np.zeros(n_g, dtype=np.int64)
    if walk:
        if theta is None or g_lo is None or g_hi is None:
            raise ParameterError("the fused walk (lists=None) needs theta, g_lo and g_hi")
        inv_theta2, _, _, _, bcap = _walk_params(theta, box_size, r_cut, rs)
        ptrs = (np.zeros(n_g + 1, np.int64), empty, np.zeros(n_g + 1, np.int64), empty)
        boxes = (np.ascontiguousarray(g_lo, dtype=np.float64).reshape(n_g, 3),
                 np.ascontiguousarray(g_hi, dtype=np.float64).reshape(n_g, 3))
    else:
        inv_theta2 = 1.0
        bcap = math.inf
        ptrs = (lists.cell_ptr, lists.cells, lists.leaf_ptr, lists.leaves)
        boxes = (np.zeros((n_g, 3)), np.zeros((n_g, 3)))
    fn(np.ascontiguousarray(tpos), np.ascontiguousarray(g_start, dtype=np.int64),
       np.ascontiguousarray(g_count, dtype=np.int64),
       np.ascontiguousarray(g_centre, dtype=np.float64), *ptrs,
       np.ascontiguousarray(source.pos),
       np.ascontiguousarray(source.pmass), np.asarray(source.start), np.asarray(source.count),
       np.asarray(source.mass), np.asarray(source.com), np.asarray(source.quad),
       np.ascontiguousarray(trace, dtype=np.float64), float(G), eps2, h, kern, alpha, cut2, box,
       bool(quadrupole), acc, pot, walk, *boxes, np.asarray(source.first_child),
       np.asarray(source.n_child), np.asarray(source.lo), np.asarray(source.hi),
       np.asarray(source.bmax), inv_theta2, bcap, missing,
       None if kern == 0 and alpha == 0.0 and box == 0.0 and cut2 == np.inf else True)
    if missing.any():
        raise ParameterError(
            f"{int((missing > 0).sum())} target groups need particles that the pruned source "
            "tree (LET) does not hold: the groups lie outside the box it was cut for")
    return acc, pot
