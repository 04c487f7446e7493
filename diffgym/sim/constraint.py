"""Constraint assembly: contact and joint-limit rows of the velocity-level problem.

For contact k (frame ``R_k = [t1 t2 n]``, n from geom 1 to geom 2) the three rows map the
generalized velocity to the velocity of geom 2 relative to geom 1 at the contact point, in the
contact frame: ``sigma_k = R_k^T (J_p2 - J_p1) v_next + b_k``. For a joint limit
``sign * (q - bound) >= 0`` the row is ``sign * v_next[idx_v] + b``.

Baumgarte / speculative offset (documented gains): with signed distance ``d`` and a contact
skin ``s`` (default 1 mm),

    b = erp * d / dt                      if d <= s  (Baumgarte: a penetration is removed
                                                      geometrically, a fraction ``erp`` per step)
    b = (d - s) / dt + erp * s / dt       if d > s   (speculative: a gap closes exactly within
                                                      the step, so nothing tunnels)

so the position-level gain is ``Kp = erp / dt`` (default ``erp = 0.2``) and there is no
velocity-level damping term (``Kd = 0``): the velocity rows are exact. ``b`` is continuous and
smooth around ``d = 0``, where resting contacts settle, so step derivatives there are those of
one smooth piece; its only kink is at ``d = s``, away from resting states.

Depenetration speed cap (``SolverSettings.max_depenetration_speed``, default
``MAX_DEPENETRATION_SPEED`` = 1 m/s, like PhysX's / Unity's ``maxDepenetrationVelocity``): a
contact's push-out ``-erp * d / dt`` is capped at this speed, ``b = max(erp * d / dt, -cap)``. A model starting deep in the floor or in
another body (a robot's reference pose with its feet 1 m below the ground: 0.2 * 1 m / 2 ms =
100 m/s per contact) then comes out at that speed instead of being launched (Talos: 606 m/s on
its first step). Where the cap acts, the offset no longer depends on ``d`` (its gain in the step
Jacobian is 0). The limit applies to contact rows only (joint limits are in rad). It is a
per-simulator setting passed to the kernels at each step (``sim.solver.settings``; a value that
is not a speed > 0 is refused, ``inf`` turns the cap off); the module constant
``MAX_DEPENETRATION_SPEED`` is the default of new settings.

Redundant contacts (``realizable_bias``, ``SolverSettings.realizable_bias``, on by default):
where an island's stage 1 fails on these offsets, the step solves it once more with the
offsets of its touching rows projected onto the range of those rows of J (the closest drift
correction one generalized velocity realizes) and keeps that solution where stage 1
then succeeds; every other step uses the offsets above. The step Jacobian includes the
projection's derivative (``derivatives._realizable_terms``, from the step's record of what it
projected, ``Constraints.projected``; README, "The steady push").

Restitution (Newton's impact law, ``restitution_bias``): a contact of a pair with coefficient
``e > 0`` whose normal velocity at the start of the step, ``u = J_N v`` (the pre-step ``v``, at
the step's contact frame), is closing faster than the threshold (``u < -thr``) and that closes
within the step (``u_free < 0`` after the free motion and ``d + dt min(u, u_free) < 0``) gets
the normal row
``sigma_N = v_N + e u + a_n ((1 + e) T + (e - 1) dt / 2) + erp min(d, 0) / dt``:
complementarity of ``lam_N`` with that (equality while it pushes) instead of ``v_N``; the
positive Baumgarte / speculative part of ``b`` is dropped (it would take velocity off the
rebound), the penetration correction kept. Every other row is as above (friction cone and De
Saxce act on the same ``sigma``). Such a contact that closes within the skin but not within the
step (``0 <= d + dt min(u, u_free) < s``) gets ``b = d / dt`` (the free motion is left as it is:
the impact comes in a later step, at the contact, not up to ``s`` above it).

Gravity in the rebound: ``a_n = (u_free - u) / dt`` is the free normal acceleration and ``T``
the time into the step at which the impact acts (:mod:`diffgym.sim.impact_time`). The
semi-implicit step ``v1 = v + dt a``, ``q1 = q + dt v1`` is exact for a constant acceleration
when its velocities are read half a step back (``v`` is the velocity at ``t - dt/2``, ``v1`` at
``t + dt/2``). Then the velocity at the impact is ``u + a_n (dt/2 + T)``, after it ``-e`` times
that, and the post-impact branch read at ``t + dt/2`` is ``v1_N = -e u - a_n ((1 + e) T + (e -
1) dt / 2)``, the row's equality. (With ``b = e u`` alone a ball dropped with e = 0.9 from 1 m
at dt = 1 ms rebounded 7.3 mm short of e^2 h0; with the gravity term, 0.03 mm above.)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .collision_driver import Contacts
from .jit import njit
from .model import SimModel
from .solver_kernels import BODY_MIN_ROWS, _uf_find, project_block


@dataclass
class Constraints:
    J: np.ndarray          # (m, nv) rows: 3 per contact [t1, t2, n], then 1 per active limit
    b: np.ndarray          # (m,) offsets: sigma = J v_next + b
    nc: int                # number of contact points
    mu: np.ndarray         # (nc,)
    frames: np.ndarray     # (nc, 3, 3) columns t1, t2, n
    contacts: Contacts
    limits: np.ndarray     # (nl,) indices into SimModel.limits of the active limit rows
    limit_dist: np.ndarray  # (nl,) signed distance to the limit
    dist: np.ndarray       # (nc,) contact signed distances
    # (nc,) coefficient of restitution of each contact whose normal row carries Newton's impact
    # law this step (restitution_bias), 0 elsewhere; None: no restitution
    restitution: np.ndarray | None = None
    # (nc,) the time into the step at which each such contact's impact acts (restitution_bias's
    # T), -1 where an impact-law contact closes but not within the step (b = dist / dt), 0
    # elsewhere
    restitution_time: np.ndarray | None = None
    # the step's record of its realizable drift correction (SolverSettings.realizable_bias,
    # solver_kernels.solve_stage1's retry), read by the derivatives: (per row the island whose
    # offsets were projected, -1 for none (m,) int64; the raw offsets before the projection
    # (m,)); None where the projection acted on no row
    projected: tuple | None = None

    @property
    def m(self) -> int:
        return int(self.J.shape[0])


from .frames import tangent_frames  # noqa: E402


@njit
def _active_limits(q, v, lim_q, lim_v, lim_bound, lim_sign, limit_margin, dt):
    """Indices and signed distances of the limits within reach this step (as active_limits)."""
    n = 0
    L = lim_q.shape[0]
    dist = np.empty(L)
    for i in range(L):
        dist[i] = lim_sign[i] * (q[lim_q[i]] - lim_bound[i])
        if dist[i] < limit_margin + dt * abs(v[lim_v[i]]):
            n += 1
    idx = np.empty(n, dtype=np.int64)
    dd = np.empty(n)
    n = 0
    for i in range(L):
        if dist[i] < limit_margin + dt * abs(v[lim_v[i]]):
            idx[n] = i
            dd[n] = dist[i]
            n += 1
    return idx, dd


# m/s: the fastest push-out of a penetrating contact (module docstring)
MAX_DEPENETRATION_SPEED = 1.0


@njit
def _offset(d, dt, erp, skin):
    """The Baumgarte / speculative offset b of a signed distance d (module docstring), without
    the depenetration cap (joint limits)."""
    return (d - skin) / dt + erp * skin / dt if d > skin else erp * d / dt


@njit
def _push(d, dt, erp, cap=MAX_DEPENETRATION_SPEED):
    """The Baumgarte push-out offset ``erp d / dt`` of a contact, at least ``-cap``
    (``SolverSettings.max_depenetration_speed``)."""
    return max(erp * d / dt, -cap)


@njit
def _push_gain(d, dt, erp, cap=MAX_DEPENETRATION_SPEED):
    """d _push / d d: ``erp / dt``, 0 where the cap acts."""
    return erp / dt if erp * d / dt > -cap else 0.0


@njit
def _contact_offset(d, dt, erp, skin, cap=MAX_DEPENETRATION_SPEED):
    """The Baumgarte / speculative offset b of a contact's signed distance d, with the
    depenetration cap."""
    return (d - skin) / dt + erp * skin / dt if d > skin else _push(d, dt, erp, cap)


@njit
def contact_gain(d, dt, erp, skin, cap=MAX_DEPENETRATION_SPEED):
    """d _contact_offset / d d."""
    return 1.0 / dt if d > skin else _push_gain(d, dt, erp, cap)


@njit
def restitution_bias(J, b, g, v, dist, pair, pair_rest, nc, dt, erp, skin, thr, j1, j2,
                     joint_tree, spent, cap=MAX_DEPENETRATION_SPEED):
    """Newton's impact law on the normal rows (module docstring): for each contact k whose pair
    has ``e = pair_rest[pair[k]] > 0``, pre-step normal velocity ``u = J[3k+2] . v`` below
    ``-thr`` and that closes within the step (``u_free < 0`` and ``dist + dt min(u, u_free) <
    skin``, ``u_free = g - b`` of the row: the normal velocity after the free motion), sets
    ``b = e u + a_n ((1 + e) T + (e - 1) dt / 2) + erp min(dist, 0) / dt`` with ``a_n = (u_free
    - u) / dt`` and updates ``g`` (in place).

    ``T``, the time into the step at which the impact acts, is that of
    :func:`diffgym.sim.impact_time.impact_times`: ``spent`` empty (the step's first pass), the
    earliest ``clip(dist / -u, 0, dt)`` of the impact-law contacts of the contact's island
    (kinematic trees, ``joint_tree`` of the geoms' joints ``j1``/``j2``, linked by the contacts);
    ``spent`` (nv,) (a later pass of ``impact_substep``, from the configuration at the time of
    impact), the time already drifted by the dofs of the contact's tree.
    A contact that closes that fast but whose free motion ends the step short of contact
    (``0 <= dist + rem min(u, u_free) < skin``, ``rem = dt``, or ``dt - spent`` on a later pass:
    the time left to move) gets ``b = dist / rem`` instead of the Baumgarte / speculative offset
    (whose skin would stop it inelastically up to ``skin`` short of contact, where the impact
    would then be declared) and ``T = -1`` as its mark.
    Returns (2, nc): the coefficient of each contact where the law applies, 0 elsewhere, and
    its ``T``."""
    nv = J.shape[1]
    out = np.zeros((2, nc))
    if pair_rest.shape[0] == 0:
        return out
    un = np.zeros(nc)
    an = np.zeros(nc)
    found = False
    tree = np.empty(nc, dtype=np.int64)
    for k in range(nc):
        t = joint_tree[j1[k]]
        tree[k] = t if t >= 0 else joint_tree[j2[k]]
    for k in range(nc):
        e = pair_rest[pair[k]]
        if e <= 0.0:
            continue
        r = 3 * k + 2
        u = 0.0
        for i in range(nv):
            u += J[r, i] * v[i]
        if not u < -thr:
            continue
        # the time left in the step: dt, or on a later pass what the first drifts left of it
        # (the bodies move (dt - spent) v1 after this pass, impact_time.displacement)
        rem = dt
        later = spent.shape[0] > 0 and tree[k] >= 0
        if later:
            rem = dt - spent[tree[k]]
        uf = g[r] - b[r]
        reach = dist[k] + rem * min(u, uf)
        if not (uf < 0.0 and (reach < skin or later)):
            continue                   # (the free motion separates it, or it does not close)
        if reach >= 0.0:
            # closing fast, but the free motion ends the step short of contact: no impact yet,
            # and no skin (the plain row would stop it up to `skin` short, inelastically):
            # b = dist / rem leaves the free motion as it is (a gap ahead of the impact). On a
            # later pass: the first drift's estimate of the time of impact fell short (a
            # curved pair's distance is convex along the drift) and the contact is not reached
            # in the time left (even beyond the skin: the plain row's offset, made for a
            # motion over the whole dt, would stop it inelastically); the impact comes the next
            # step at its time (declaring it here put it at the drifted configuration, up to
            # millimetres short of contact)
            nb = dist[k] / rem
            g[r] += nb - b[r]
            b[r] = nb
            out[1, k] = -1.0
            continue
        out[0, k] = e
        un[k] = u
        an[k] = (uf - u) / dt
        found = True
    if not found:
        return out
    if spent.shape[0]:
        for k in range(nc):
            if out[0, k] > 0.0 and tree[k] >= 0:
                out[1, k] = spent[tree[k]]
    else:
        # the islands of impact_times: trees linked by any contact; each takes its earliest
        parent = _tree_components(j1, j2, joint_tree, nv)
        first = np.full(max(nv, 1), np.inf)
        for k in range(nc):
            if out[0, k] > 0.0 and tree[k] >= 0:
                t = min(max(dist[k] / -un[k], 0.0), dt)
                rk = _uf_find(parent, tree[k])
                if t < first[rk]:
                    first[rk] = t
        for k in range(nc):
            if out[0, k] > 0.0 and tree[k] >= 0:
                out[1, k] = first[_uf_find(parent, tree[k])]
    for k in range(nc):
        e = out[0, k]
        if not e > 0.0:
            continue
        r = 3 * k + 2
        nb = e * un[k] + an[k] * ((1.0 + e) * out[1, k] + 0.5 * (e - 1.0) * dt) \
            + (_push(dist[k], dt, erp, cap) if dist[k] < 0.0 else 0.0)
        g[r] += nb - b[r]
        b[r] = nb
    return out


@njit
def _tree_components(j1, j2, joint_tree, nv):
    """Union-find over the kinematic trees (named by their first dof) linked by the contacts
    between joints ``j1`` and ``j2``: the parent array (``solver_kernels._uf_find`` gives each
    tree's root, the smallest tree of its component)."""
    parent = np.arange(max(nv, 1))
    for k in range(j1.shape[0]):
        a, b = joint_tree[j1[k]], joint_tree[j2[k]]
        if a >= 0 and b >= 0:
            ra, rb = _uf_find(parent, a), _uf_find(parent, b)
            if ra != rb:
                if ra < rb:
                    parent[rb] = ra
                else:
                    parent[ra] = rb
    return parent


@njit
def row_islands(j1, j2, joint_tree, lim_idx, lim_v, tree_lo):
    """The islands of the constraint rows: connected components of the kinematic trees (the
    subtrees of the children of the world, named by their first dof ``tree_lo``) linked by
    contacts; a contact with a static geom and a joint limit belong to the island of their one
    tree. Returns (island of each contact (nc,), of each active limit (nl,), island count),
    islands numbered in the order of their first row."""
    nc = j1.shape[0]
    nl = lim_idx.shape[0]
    nv = tree_lo.shape[0]
    parent = _tree_components(j1, j2, joint_tree, nv)
    label = np.full(max(nv, 1), -1, dtype=np.int64)
    isl_c = np.empty(nc, dtype=np.int64)
    isl_l = np.empty(nl, dtype=np.int64)
    n = 0
    for k in range(nc):
        t = joint_tree[j1[k]]
        if t < 0:
            t = joint_tree[j2[k]]
        if t < 0:                  # (two static geoms: not produced by collision; own island)
            isl_c[k] = n
            n += 1
            continue
        r = _uf_find(parent, t)
        if label[r] < 0:
            label[r] = n
            n += 1
        isl_c[k] = label[r]
    for i in range(nl):
        r = _uf_find(parent, tree_lo[lim_v[lim_idx[i]]])
        if label[r] < 0:
            label[r] = n
            n += 1
        isl_l[i] = label[r]
    return isl_c, isl_l, n


@njit
def island_rows(isl_c, isl_l, nis):
    """The rows of each island (contacts' 3 rows in order, then its limits), as CSR:
    (ptr (nis + 1,), rows (m,), contacts' ptr (nis + 1,), contacts (nc,), limits' ptr, limits)."""
    nc = isl_c.shape[0]
    nl = isl_l.shape[0]
    cptr = np.zeros(nis + 1, dtype=np.int64)
    lptr = np.zeros(nis + 1, dtype=np.int64)
    for k in range(nc):
        cptr[isl_c[k] + 1] += 1
    for i in range(nl):
        lptr[isl_l[i] + 1] += 1
    for s in range(nis):
        cptr[s + 1] += cptr[s]
        lptr[s + 1] += lptr[s]
    cs = np.empty(nc, dtype=np.int64)
    ls = np.empty(nl, dtype=np.int64)
    fc = cptr[:-1].copy()
    fl = lptr[:-1].copy()
    for k in range(nc):
        cs[fc[isl_c[k]]] = k
        fc[isl_c[k]] += 1
    for i in range(nl):
        ls[fl[isl_l[i]]] = i
        fl[isl_l[i]] += 1
    ptr = np.zeros(nis + 1, dtype=np.int64)
    rows = np.empty(3 * nc + nl, dtype=np.int64)
    n = 0
    for s in range(nis):
        for t in range(cptr[s], cptr[s + 1]):
            for a in range(3):
                rows[n] = 3 * cs[t] + a
                n += 1
        for t in range(lptr[s], lptr[s + 1]):
            rows[n] = 3 * nc + ls[t]
            n += 1
        ptr[s + 1] = n
    return ptr, rows, cptr, cs, lptr, ls


@njit
def constraint_rows(pos, frames, j1, j2, dist, Jw, support, sup_ptr, sup_idx, tree_lo, lim_idx,
                    lim_dist, lim_v, lim_sign, dt, erp, skin, cap=MAX_DEPENETRATION_SPEED):
    """The rows of the contacts (3 each, in their frames) and active limits over their nonzero
    columns only (at most the dofs supporting the row's two bodies; a dof supporting both
    cancels): ``Jv[r, t]`` at dof ``nz[r, t]``, ``t < nnz[r]``, the offsets ``b`` and the (at
    most two) trees of each row ``rt`` (m, 2), each by its first dof, -1 where there is none.
    For ``assemble_sparse`` (which scatters them into J) and ``assemble_blocks``."""
    nc = pos.shape[0]
    nl = lim_idx.shape[0]
    m = 3 * nc + nl
    b = np.zeros(m)
    wmax = 1
    for k in range(nc):
        w = (sup_ptr[j1[k] + 1] - sup_ptr[j1[k]]) + (sup_ptr[j2[k] + 1] - sup_ptr[j2[k]])
        if w > wmax:
            wmax = w
    nz = np.zeros((m, wmax), dtype=np.int64)
    Jv = np.zeros((m, wmax))
    nnz = np.zeros(m, dtype=np.int64)
    for k in range(nc):
        p0, p1, p2 = pos[k, 0], pos[k, 1], pos[k, 2]
        for side in range(2):
            ja, jb = (j2[k], j1[k]) if side == 0 else (j1[k], j2[k])
            sg = 1.0 if side == 0 else -1.0
            for t in range(sup_ptr[ja], sup_ptr[ja + 1]):
                d = sup_idx[t]
                if support[jb, d]:
                    continue
                wx, wy, wz = Jw[3, d], Jw[4, d], Jw[5, d]
                r0 = sg * (Jw[0, d] - (p1 * wz - p2 * wy))
                r1 = sg * (Jw[1, d] - (p2 * wx - p0 * wz))
                r2 = sg * (Jw[2, d] - (p0 * wy - p1 * wx))
                for a in range(3):
                    row = 3 * k + a
                    Jv[row, nnz[row]] = (frames[k, 0, a] * r0 + frames[k, 1, a] * r1
                                         + frames[k, 2, a] * r2)
                    nz[row, nnz[row]] = d
                    nnz[row] += 1
        b[3 * k + 2] = _contact_offset(dist[k], dt, erp, skin, cap)
    for i in range(nl):
        row = 3 * nc + i
        d = lim_v[lim_idx[i]]
        Jv[row, 0] = lim_sign[lim_idx[i]]
        nz[row, 0] = d
        nnz[row] = 1
        b[row] = _offset(lim_dist[i], dt, erp, skin)
    # the (at most two) trees of each row
    rt = np.full((m, 2), -1, dtype=np.int64)
    for r in range(m):
        for t in range(nnz[r]):
            lo = tree_lo[nz[r, t]]
            if rt[r, 0] < 0 or rt[r, 0] == lo:
                rt[r, 0] = lo
            else:
                rt[r, 1] = lo
    return Jv, nz, nnz, b, rt


@njit
def rows_by_tree(rows, n, rt, nv):
    """The rows of each kinematic tree (by its first dof) as positions in ``rows[:n]`` (the
    islands' row order), increasing: tree t's at ``tpos[tptr[t]:tptr[t + 1]]`` (a counting
    sort over each row's at most two trees ``rt``). Two rows couple in G only if they share a
    tree, so G's nonzero entries are found from these lists without a test of every pair."""
    tptr = np.zeros(nv + 1, dtype=np.int64)
    for ia in range(n):
        r = rows[ia]
        for u in range(2):
            t = rt[r, u]
            if t >= 0:
                tptr[t + 1] += 1
    for t in range(nv):
        tptr[t + 1] += tptr[t]
    tpos = np.empty(tptr[nv], dtype=np.int64)
    fill = tptr[:nv].copy()
    for ia in range(n):
        r = rows[ia]
        for u in range(2):
            t = rt[r, u]
            if t >= 0:
                tpos[fill[t]] = ia
                fill[t] += 1
    return tptr, tpos


@njit
def assemble_sparse(pos, frames, j1, j2, dist, Jw, support, sup_ptr, sup_idx, tree_lo, tree_hi,
                    joint_tree, lim_idx, lim_dist, lim_v, lim_sign, dt, erp, skin, Minv, v_free,
                    cap=MAX_DEPENETRATION_SPEED):
    """The rows J (m, nv) and offsets b of the contacts (3 each) and active limits, the
    velocity-level problem ``G = J M^-1 J^T``, ``g = J v_free + b``, ``M^-1 J^T`` and the
    islands of the rows (``row_islands``).

    Work and memory follow the structure: a contact row touches only the dofs supporting its two
    bodies (``sup_idx[sup_ptr[j]:sup_ptr[j + 1]]``, the dofs moving joint j; a dof supporting
    both cancels), ``M^-1`` is block diagonal over the kinematic trees (dof d's tree is the
    contiguous range ``tree_lo[d]:tree_hi[d]``, read from pinocchio's computeMinverse, of which
    only the upper triangle is filled), and ``G`` couples only rows of one island sharing a
    tree: only those entries are computed (the others are zero). Also returns the (at most two)
    trees of each row, ``rt`` (m, 2), each by its first dof, -1 where there is none."""
    nc = pos.shape[0]
    nl = lim_idx.shape[0]
    nv = Jw.shape[1]
    m = 3 * nc + nl
    Jv, nz, nnz, b, rt = constraint_rows(pos, frames, j1, j2, dist, Jw, support, sup_ptr,
                                         sup_idx, tree_lo, lim_idx, lim_dist, lim_v, lim_sign,
                                         dt, erp, skin, cap)
    J = np.zeros((m, nv))
    for r in range(m):
        for t in range(nnz[r]):
            J[r, nz[r, t]] = Jv[r, t]
    MJt = np.zeros((nv, m))
    for r in range(m):
        for t in range(nnz[r]):
            d = nz[r, t]
            x = J[r, d]
            for i in range(tree_lo[d], tree_hi[d]):
                MJt[i, r] += (Minv[i, d] if i <= d else Minv[d, i]) * x
    g = b.copy()
    for r in range(m):
        for t in range(nnz[r]):
            d = nz[r, t]
            g[r] += J[r, d] * v_free[d]
    isl_c, isl_l, nis = row_islands(j1, j2, joint_tree, lim_idx, lim_v, tree_lo)
    ptr, rows = island_rows(isl_c, isl_l, nis)[:2]
    G = np.zeros((m, m))
    # an entry (r, c) is computed once, from the row coming first in the islands' row order,
    # for each pair of rows sharing a tree (rows of different islands share none)
    tptr, tpos = rows_by_tree(rows, ptr[nis], rt, nv)
    seen = np.full(ptr[nis], -1, dtype=np.int64)
    for ia in range(ptr[nis]):
        r = rows[ia]
        for u in range(2):
            t = rt[r, u]
            if t < 0:
                continue
            for e in range(tptr[t], tptr[t + 1]):
                ib = tpos[e]
                if ib < ia or seen[ib] == ia:
                    continue
                seen[ib] = ia
                c = rows[ib]
                acc = 0.0
                for q in range(nnz[r]):
                    d = nz[r, q]
                    acc += J[r, d] * MJt[d, c]
                G[r, c] = acc
                G[c, r] = acc
    return J, b, G, g, MJt, isl_c, isl_l, nis, rt


def support_lists(support, tree_lo):
    """CSR lists of the dofs supporting each joint and each joint's tree (-1: the world).

    Plain numpy, run once at model load: a compiled kernel here would make ``gym.make`` compile
    (and, on a first use under load, announce it)."""
    support = np.asarray(support, dtype=np.bool_)
    tree_lo = np.asarray(tree_lo, dtype=np.int64)
    nj = support.shape[0]
    counts = support.sum(axis=1)
    ptr = np.zeros(nj + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    idx = np.nonzero(support)[1].astype(np.int64)    # row-major: each joint's dofs ascending
    tree = np.full(nj, -1, dtype=np.int64)
    has = counts > 0
    tree[has] = tree_lo[idx[ptr[:-1][has]]]
    return ptr, idx, tree


@njit
def assemble_problem(pos, frames, j1, j2, dist, Jw, support, sup_ptr, sup_idx, joint_tree, tree_lo,
                     tree_hi, lim_idx, lim_dist, lim_v, lim_sign, dt, erp, skin, Minv, v_free,
                     cap=MAX_DEPENETRATION_SPEED):
    """``assemble_sparse`` (support lists from ``support_lists``), returning (J, b, G, g,
    M^-1 J^T, M^-1 with both triangles) (``Minv``: pinocchio's computeMinverse, upper
    triangle filled)."""
    J, b, G, g, MJt = assemble_sparse(pos, frames, j1, j2, dist, Jw, support, sup_ptr, sup_idx,
                                      tree_lo, tree_hi, joint_tree, lim_idx, lim_dist, lim_v,
                                      lim_sign, dt, erp, skin, Minv, v_free, cap)[:5]
    nv = Jw.shape[1]
    Ms = np.empty((nv, nv))                     # M^-1, both triangles
    for i in range(nv):
        for d in range(i, nv):
            Ms[i, d] = Ms[d, i] = Minv[i, d]
    return J, b, G, g, MJt, Ms


# -- the drift correction made realizable (issue 16: redundant contacts) ------------------------
TOUCH_DIST = 1e-9    # m: a pair with a point this close touches (the rounding of resting poses)


@njit
def _pairs_in_contact(pair, dist):
    """(nc,) bool: whether contact k's pair (``pair``: the candidate pair of each contact) has a
    contact point at ``dist <= TOUCH_DIST`` (touching, to the rounding of a resting pose's
    distances, or penetrating)."""
    nc = pair.shape[0]
    out = np.zeros(nc, np.bool_)
    if nc == 0:
        return out
    order = np.argsort(pair)
    a = 0
    while a < nc:
        e = a
        hit = False
        while e < nc and pair[order[e]] == pair[order[a]]:
            if dist[order[e]] <= TOUCH_DIST:
                hit = True
            e += 1
        if hit:
            for t in range(a, e):
                out[order[t]] = True
        a = e
    return out


@njit
def _bias_row_ok(r, nc, touch, dist, skin, rest, lim_dist):
    """Whether row r's offset is a drift correction that ``realizable_bias`` may project: a row
    of a contact within the skin (``dist <= skin``: the Baumgarte branch, ``b = erp d / dt``,
    its tangent rows ``b = 0``) of a pair in contact (``touch``: ``_pairs_in_contact``; the
    other points of a patch of which one touches or penetrates are included; a pair merely
    within the skin is a gap whose offset allows approach, not a drift to correct: projecting
    that allowance would push the rows that do touch, e.g. racked billiard balls 1 mm apart)
    whose normal row does not carry Newton's impact law or the ``d / dt`` of a contact closing
    ahead of its impact (``rest``: restitution_bias's (2, nc), empty: none), or of a joint
    limit at or beyond its bound (``lim_dist <= 0``)."""
    if r < 3 * nc:
        k = r // 3
        if rest.shape[1] and (rest[0, k] != 0.0 or rest[1, k] != 0.0):
            return False
        return touch[k] and dist[k] <= skin
    return lim_dist[r - 3 * nc] <= 0.0


_project_block = project_block    # (solver_kernels: solve_stage1's retry projects with it)


@njit
def realizable_bias(G, b, g, nc, pair, dist, skin, rest, lim_dist, isl_c, isl_l, nis):
    """Makes the drift correction of each island realizable (in place on ``b`` and ``g = J
    v_free + b``; ``G`` the dense Delassus matrix, ``pair`` each contact's candidate pair,
    ``isl_c``/``isl_l``/``nis`` the islands of ``row_islands``; ``rest`` as ``_bias_row_ok``).
    Returns how many islands changed. With ``SolverSettings.realizable_bias`` (on by default)
    the step applies it to an island only where stage 1 failed on the raw offsets
    (``solver_kernels.solve_stage1``'s retry, with ``project_block``, for every caller) and keeps
    the result only where stage 1 then succeeds; every other step solves the raw problem.

    Redundant contacts (a box on its face, a rod flat against it) make J's rows dependent: the
    offsets ``b`` of the touching rows can then ask for velocities that no motion produces (a
    penetration of the rod's end removed by a yaw whose tangential slip the sticking rod
    contacts forbid; the table's lift of a box whose sticking rod cannot rise), the mode
    equations of such an active set have no solution, and the active-set Newton stalls at a
    least-squares point (the steady push of DiffPush-v0 left stage 1 on 58 of 200 steps, 3
    ended unconverged). The offsets of the touching rows (``_bias_row_ok``) of each island are
    replaced by their orthogonal projection onto the range of those rows of J,
    ``b_S <- J_S J_S^+ b_S`` (computed as ``G_SS G_SS^+ b_S``, the same projector, by the
    solver's own least squares): the closest correction (least squares over the rows) that
    one generalized velocity realizes, every row, tangent rows included, getting its image, so
    that every active set among those rows is consistent. This changes the drift correction
    only, by its unrealizable part (measured on the steady push: up to 5e-6 m/s on the rod's
    tangent rows, the table's lift halved where the rod holds the box); islands whose touching
    rows are independent are not touched. Rows of pairs only within the skin (gaps),
    impacts and restitution keep their offsets, and so do islands of ``BODY_MIN_ROWS`` touching
    rows or more (not implemented in body space)."""
    m = b.shape[0]
    ptr, rows = island_rows(isl_c, isl_l, nis)[:2]
    touch = _pairs_in_contact(pair, dist)
    nchanged = 0
    for s in range(nis):
        r0 = ptr[s]
        ms = ptr[s + 1] - r0
        Gs = np.empty((ms, ms))
        for a in range(ms):
            ra = rows[r0 + a]
            for c in range(ms):
                Gs[a, c] = G[ra, rows[r0 + c]]
        nchanged += realizable_bias_island(Gs, b, g, rows, r0, ms, nc, touch, dist, skin,
                                           rest, lim_dist)
    return nchanged


@njit
def realizable_bias_island(Gs, b, g, rows, r0, ms, nc, touch, dist, skin, rest, lim_dist):
    """``realizable_bias`` on one island (rows ``rows[r0:r0 + ms]``, Delassus block ``Gs``;
    ``touch``: ``_pairs_in_contact``), in place on the step's ``b`` and ``g``; 1 if it changed
    them, else 0. (The per-island storage of ``island_step`` calls it with its block.)"""
    keep = np.zeros(ms, np.bool_)
    bs = np.empty(ms)
    for a in range(ms):
        keep[a] = _bias_row_ok(rows[r0 + a], nc, touch, dist, skin, rest, lim_dist)
        bs[a] = b[rows[r0 + a]]
    changed, nb = _project_block(Gs, bs, keep)
    if not changed:
        return 0
    t = 0
    for a in range(ms):
        if keep[a]:
            ra = rows[r0 + a]
            g[ra] += nb[t] - b[ra]
            b[ra] = nb[t]
            t += 1
    return 1


_NO_SPENT = np.zeros(0)   # restitution_bias's ``spent`` on a step's first pass
_NO_REST = np.zeros((2, 0))   # realizable_bias's ``rest`` where no contact has restitution


def baumgarte_gain(dist: np.ndarray, dt: float, erp: float, skin: float,
                   cap: float = MAX_DEPENETRATION_SPEED) -> np.ndarray:
    """d b / d dist of contact rows (0 where the depenetration cap ``cap`` acts)."""
    return np.where(dist > skin, 1.0 / dt, np.where(erp * dist / dt > -cap, erp / dt, 0.0))


def check_depenetration_speed(value) -> float:
    """``SolverSettings.max_depenetration_speed`` checked: a real number > 0 (m/s; ``inf``: no
    cap), else ValueError naming the setting and the value."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not (ok and value > 0.0):          # (NaN fails the comparison)
        raise ValueError("SolverSettings.max_depenetration_speed must be a speed > 0 (m/s; inf: "
                         f"no cap), got {value!r}")
    return float(value)


def depenetration_speed(solver) -> float:
    """The depenetration cap (m/s) a step with ``solver`` uses: its settings'
    ``max_depenetration_speed``, or ``MAX_DEPENETRATION_SPEED`` for a solver whose settings
    have no such field (a user's own solver)."""
    return float(getattr(getattr(solver, "settings", None), "max_depenetration_speed",
                         MAX_DEPENETRATION_SPEED))


class ConstraintBuilder:
    def __init__(self, sm: SimModel, erp: float = 0.2, limit_margin: float = 1e-3,
                 skin: float = 1e-3, restitution_threshold: float | None = None):
        self.sm = sm
        # restitution: per candidate pair (SimModel.pair_restitution); the closing speed below
        # which an impact stays inelastic (None: 2 |gravity| dt, at least 1e-3 m/s)
        self.restitution_threshold = restitution_threshold
        self.gravity_norm = float(np.linalg.norm(sm.model.gravity.linear))
        self.refresh_restitution()
        self.erp = float(erp)
        self.skin = float(skin)
        self.limit_margin = float(limit_margin)
        self.nv = sm.model.nv
        self.geom_joint = np.array([g.parentJoint for g in sm.geom_model.geometryObjects], dtype=np.int64)
        L = sm.limits
        self.lim_q = np.array([l.idx_q for l in L], dtype=np.int64)
        self.lim_v = np.array([l.idx_v for l in L], dtype=np.int64)
        self.lim_bound = np.array([l.bound for l in L], dtype=float)
        self.lim_sign = np.array([l.sign for l in L], dtype=float)
        # per joint: the velocity components that move it (row 0, the world: none)
        model = sm.model
        self.support = np.zeros((model.njoints, self.nv), dtype=np.bool_)
        for j in range(1, model.njoints):
            jm = model.joints[j]
            self.support[j] = self.support[model.parents[j]]
            self.support[j, jm.idx_v:jm.idx_v + jm.nv] = True
        self._no_limits = (np.zeros(0, dtype=np.int64), np.zeros(0))
        self.has_limits = bool(len(self.lim_q))
        # each dof's kinematic tree (the subtree of a child of the world), as the range of its
        # dofs, where M^-1 is block diagonal; one dense block if a tree's dofs are not contiguous
        self.tree_lo = np.zeros(self.nv, dtype=np.int64)
        self.tree_hi = np.full(self.nv, self.nv, dtype=np.int64)
        roots: dict[int, list[int]] = {}
        for j in range(1, model.njoints):
            r = j
            while model.parents[r] != 0:
                r = model.parents[r]
            jm = model.joints[j]
            roots.setdefault(r, []).extend(range(jm.idx_v, jm.idx_v + jm.nv))
        self.trees_contiguous = all(max(d) + 1 - min(d) == len(d) for d in roots.values() if d)
        if self.trees_contiguous:
            for dofs in roots.values():
                if dofs:
                    self.tree_lo[dofs] = min(dofs)
                    self.tree_hi[dofs] = max(dofs) + 1
        # the dofs supporting each joint (CSR) and each joint's tree (its tree_lo; -1: world)
        self.sup_ptr, self.sup_idx, self.joint_tree = support_lists(self.support, self.tree_lo)

    def refresh_restitution(self) -> None:
        """Read the model's per-pair coefficients (empty when every one is 0: no work)."""
        pr = getattr(self.sm, "pair_restitution", None)
        self.pair_restitution = np.zeros(0) if pr is None or not np.any(pr) else \
            np.ascontiguousarray(pr, dtype=float)

    def restitution_thr(self, dt: float) -> float:
        """The closing speed (m/s) below which an impact stays inelastic: the setting, or by
        default ``2 |gravity| dt`` (at least 1e-3 m/s), above what gravity adds in a step, so
        resting contacts and the last hops of a bouncing body do not bounce forever."""
        t = self.restitution_threshold
        return float(t) if t is not None else max(2.0 * self.gravity_norm * dt, 1e-3)

    def active_limits(self, q: np.ndarray, v: np.ndarray, dt: float):
        """Indices (into SimModel.limits) and signed distances of the limits within reach of
        this step: ``sign (q - bound) < limit_margin + dt |v|``."""
        if not len(self.lim_q):
            return self._no_limits
        return _active_limits(q, v, self.lim_q, self.lim_v, self.lim_bound, self.lim_sign,
                              self.limit_margin, dt)

    def assemble(self, Jw: np.ndarray, contacts: Contacts, limits, dt: float, Minv: np.ndarray,
                 v_free: np.ndarray, v: np.ndarray | None = None,
                 spent: np.ndarray | None = None, cap: float = MAX_DEPENETRATION_SPEED,
                 drift: np.ndarray | None = None):
        """Constraints and the problem (G, g, M^-1 J^T) from the world-frame joint Jacobians
        ``Jw`` (pinocchio's data.J after computeJointJacobians) in one compiled pass. ``v``: the
        pre-step velocity (Newton's impact law); ``spent``: the time already drifted per dof (a
        later pass of ``impact_time.impact_substep``); ``cap``: the depenetration cap (m/s,
        ``SolverSettings.max_depenetration_speed``); ``drift``: (nc,) terms added to the normal
        rows' offsets (support_drift), or None."""
        lim_idx, lim_dist = limits
        nc = len(contacts)
        frames = contacts.frames
        if frames is None:
            frames = tangent_frames(contacts.normal) if nc else np.zeros((0, 3, 3))
        J, b, G, g, MJt, Ms = assemble_problem(
            contacts.pos, frames, self.geom_joint[contacts.geom1], self.geom_joint[contacts.geom2],
            contacts.dist, Jw, self.support, self.sup_ptr, self.sup_idx, self.joint_tree,
            self.tree_lo, self.tree_hi, lim_idx, lim_dist, self.lim_v, self.lim_sign, dt, self.erp,
            self.skin, Minv, v_free, float(cap))
        rest = rtime = None
        pr = self.pair_restitution
        j1, j2 = self.geom_joint[contacts.geom1], self.geom_joint[contacts.geom2]
        rb = _NO_REST
        if nc and v is not None and len(pr):
            # (v: the velocity at the start of the step, for Newton's impact law)
            rb = restitution_bias(
                J, b, g, np.ascontiguousarray(v, dtype=float), contacts.dist, contacts.pair, pr,
                nc, dt, self.erp, self.skin, self.restitution_thr(dt), j1, j2, self.joint_tree,
                _NO_SPENT if spent is None else np.ascontiguousarray(spent, dtype=float),
                float(cap))
            rest, rtime = rb
        if drift is not None and nc:
            b[2:3 * nc:3] += drift
            g[2:3 * nc:3] += drift
        cons = Constraints(J, b, nc, contacts.mu, frames, contacts, lim_idx, lim_dist, contacts.dist,
                           rest, rtime)
        return cons, G, g, MJt, Ms

    def realizable_rows(self, cons: Constraints) -> np.ndarray:
        """(m,) bool: the rows of ``cons`` whose drift offset ``solve_stage1``'s retry may make
        realizable (``_bias_row_ok``). The stage-by-stage step passes them to
        ``NCPSolver.solve`` for the whole problem at once (its Delassus matrix is block
        diagonal over the islands, so the projection is the islands' own, except that a
        problem of ``BODY_MIN_ROWS`` such rows or more is left as it is)."""
        nc = cons.nc
        m = cons.m
        c = cons.contacts
        dist = np.ascontiguousarray(cons.dist, dtype=float)
        touch = _pairs_in_contact(np.ascontiguousarray(c.pair, dtype=np.int64), dist) if nc \
            else np.zeros(0, np.bool_)
        rest = _NO_REST
        if getattr(cons, "restitution", None) is not None:
            rest = np.ascontiguousarray(np.vstack([cons.restitution, cons.restitution_time]),
                                        dtype=float)
        lim_dist = np.ascontiguousarray(cons.limit_dist, dtype=float)
        return np.array([_bias_row_ok(r, nc, touch, dist, self.skin, rest, lim_dist)
                         for r in range(m)], dtype=np.bool_)


# -- per-island storage (no (m, nv) or (m, m) matrix) ------------------------------------------
@njit
def _minv_at(Mb, moff, tree_lo, tree_hi, i, d):
    """M^-1[i, d] of two dofs of one tree from the per-tree blocks (trees.minverse_blocks)."""
    lo = tree_lo[d]
    return Mb[moff[lo] + (i - lo) * (tree_hi[d] - lo) + (d - lo)]


@njit
def assemble_blocks(pos, frames, j1, j2, dist, Jw, support, sup_ptr, sup_idx, tree_lo, tree_hi,
                    joint_tree, lim_idx, lim_dist, lim_v, lim_sign, dt, erp, skin, Mb, moff,
                    v_free, cap=MAX_DEPENETRATION_SPEED, gbuf=None):
    """``assemble_sparse`` in storage that grows with the rows, not with rows x dofs:

    * J row by row over its nonzero columns: ``Jv[r, t]`` at dof ``nz[r, t]``, ``t < nnz[r]``;
    * ``M^-1 J^T`` column by column over the dofs of the row's (at most two) trees: ``MJc[r, t]``
      at dof ``rt[r, 0] + t`` for ``t < w0 = tree size``, then at ``rt[r, 1] + t - w0``;
    * ``G`` island by island: island s's block (its rows ``rows[ptr[s]:ptr[s + 1]]``, in that
      order) row-major at ``Gb[gptr[s]:gptr[s + 1]]``;
    * ``M^-1`` per tree (``Mb``, ``moff``: trees.minverse_blocks).

    Every entry is computed by the same operations in the same order as assemble_sparse's
    (which the per-island solve gathers from its dense G), so the two give the same bits.
    ``gbuf`` (optional, 1-D): memory for ``Gb`` where it is large enough (its first entries,
    zeroed here; ``island_step.g_buffer``: a step reusing pages already mapped instead of
    faulting in fresh ones). Returns (Jv, nz, nnz, b, g, rt, MJc, isl_c, isl_l, nis, ptr, rows, cptr, cs, lptr, ls, gptr,
    Gb)."""
    nc = pos.shape[0]
    m = 3 * nc + lim_idx.shape[0]
    Jv, nz, nnz, b, rt = constraint_rows(pos, frames, j1, j2, dist, Jw, support, sup_ptr,
                                         sup_idx, tree_lo, lim_idx, lim_dist, lim_v, lim_sign,
                                         dt, erp, skin, cap)
    tmax = 1
    for r in range(m):
        w = 0
        for a in range(2):
            if rt[r, a] >= 0:
                w += tree_hi[rt[r, a]] - rt[r, a]
        if w > tmax:
            tmax = w
    # M^-1 J^T over the row's trees (the order of assemble_sparse's accumulation)
    MJc = np.zeros((m, tmax))
    for r in range(m):
        w0 = tree_hi[rt[r, 0]] - rt[r, 0] if rt[r, 0] >= 0 else 0
        for t in range(nnz[r]):
            d = nz[r, t]
            x = Jv[r, t]
            lo = tree_lo[d]
            base = 0 if lo == rt[r, 0] else w0
            for i in range(lo, tree_hi[d]):
                mi = (_minv_at(Mb, moff, tree_lo, tree_hi, i, d) if i <= d
                      else _minv_at(Mb, moff, tree_lo, tree_hi, d, i))
                MJc[r, base + i - lo] += mi * x
    g = b.copy()
    for r in range(m):
        for t in range(nnz[r]):
            g[r] += Jv[r, t] * v_free[nz[r, t]]
    isl_c, isl_l, nis = row_islands(j1, j2, joint_tree, lim_idx, lim_v, tree_lo)
    ptr, rows, cptr, cs, lptr, ls = island_rows(isl_c, isl_l, nis)
    gptr = np.zeros(nis + 1, dtype=np.int64)
    for s in range(nis):
        ms = ptr[s + 1] - ptr[s]
        gptr[s + 1] = gptr[s] + ms * ms
    if gbuf is not None and gbuf.shape[0] >= gptr[nis]:
        Gb = gbuf[:gptr[nis]]
        Gb[:] = 0.0
    else:
        Gb = np.zeros(gptr[nis])
    # each pair of rows sharing a tree, once (from the row first in the islands' order): the
    # other entries of an island's block are zero (a test of every pair cost O(m^2) a step)
    nv = Jw.shape[1]
    tptr, tpos = rows_by_tree(rows, ptr[nis], rt, nv)
    seen = np.full(ptr[nis], -1, dtype=np.int64)
    for s in range(nis):
        r0 = ptr[s]
        ms = ptr[s + 1] - r0
        o = gptr[s]
        for ia in range(ms):
            r = rows[r0 + ia]
            for u in range(2):
                tr = rt[r, u]
                if tr < 0:
                    continue
                for e in range(tptr[tr], tptr[tr + 1]):
                    ib = tpos[e] - r0
                    if ib < ia or seen[r0 + ib] == ia:
                        continue
                    seen[r0 + ib] = ia
                    c = rows[r0 + ib]
                    c0, c1 = rt[c, 0], rt[c, 1]
                    w0 = tree_hi[c0] - c0
                    acc = 0.0
                    for t in range(nnz[r]):
                        d = nz[r, t]
                        lo = tree_lo[d]
                        if lo == c0:
                            mj = MJc[c, d - lo]
                        elif lo == c1:
                            mj = MJc[c, w0 + d - lo]
                        else:
                            mj = 0.0
                        acc += Jv[r, t] * mj
                    Gb[o + ia * ms + ib] = acc
                    Gb[o + ib * ms + ia] = acc
    return (Jv, nz, nnz, b, g, rt, MJc, isl_c, isl_l, nis, ptr, rows, cptr, cs, lptr, ls, gptr,
            Gb)


@njit
def blocks_dense(Jv, nz, nnz, rt, MJc, ptr, rows, gptr, Gb, tree_hi, nv):
    """The dense (J (m, nv), M^-1 J^T (nv, m), G (m, m)) of per-island storage
    (``assemble_blocks``): the arrays assemble_sparse returns, bit for bit (for whoever needs
    them dense: the step derivatives, a failed island's later stages)."""
    m = Jv.shape[0]
    J = np.zeros((m, nv))
    MJt = np.zeros((nv, m))
    for r in range(m):
        for t in range(nnz[r]):
            J[r, nz[r, t]] = Jv[r, t]
        base = 0
        for a in range(2):
            lo = rt[r, a]
            if lo >= 0:
                for i in range(lo, tree_hi[lo]):
                    MJt[i, r] = MJc[r, base + i - lo]
                base += tree_hi[lo] - lo
    G = np.zeros((m, m))
    for s in range(ptr.shape[0] - 1):
        r0 = ptr[s]
        ms = ptr[s + 1] - r0
        o = gptr[s]
        for ia in range(ms):
            for ib in range(ms):
                G[rows[r0 + ia], rows[r0 + ib]] = Gb[o + ia * ms + ib]
    return J, MJt, G


@njit
def blocks_minv_dense(Mb, moff, tree_lo, tree_hi, nv):
    """M^-1 (nv, nv) with both triangles from its per-tree blocks."""
    M = np.zeros((nv, nv))
    d = 0
    while d < nv:
        lo, hi = tree_lo[d], tree_hi[d]
        w = hi - lo
        for i in range(w):
            for j in range(w):
                M[lo + i, lo + j] = Mb[moff[lo] + i * w + j]
        d = hi
    return M
