"""The constrained part of a step in per-island storage (issue 16: memory linear in bodies).

The compiled step (``forward._constrained_step``) assembles the rows into dense matrices: J
(m, nv), ``M^-1 J^T`` (nv, m), ``G`` (m, m) and ``M^-1`` (nv, nv), then solves island by island
on blocks gathered from ``G``. For a pile of 1,000 boxes (m about 12,000, nv 6,000) those are
2.3 GB, although each contact row touches at most two trees' velocities and ``G`` couples only
rows of one island. Here the same computation runs on ``constraint.assemble_blocks``'s storage
(J and ``M^-1 J^T`` row by row over the row's trees, ``G`` island by island, ``M^-1`` tree by
tree: ``trees.TreeGroups.minverse_blocks``), with the same operations in the same order, so the
step's state is bit-identical to the dense path's.

Used by ``Simulator._step`` on split models (``trees.TreeGroups``) when the dense matrices
would exceed :data:`BLOCK_MIN_BYTES`, with the compiled NCP solver, no restitution and no
equality rows; otherwise the dense path runs. An island whose compiled stage 1 fails takes the
later stages (``Simulator._solve_failed_islands``) on its own rows and block of ``G``; its
``v1`` is then summed row by row (the dense path's ``M^-1 J^T @ lam`` sums in BLAS's order: the
two agree to rounding, not bit for bit, on such steps). Whoever reads ``cons.J``, ``sim.cache["G"]`` or
``sim.cache["Minv"]`` afterwards (the step derivatives, the smoothing mode, gradcheck) gets the
dense arrays, built on first access from the blocks (``BlockConstraints``, ``BlockCache``): a
forward step stays linear in bodies, a Jacobian step pays the dense matrices its derivatives
read.
"""
from __future__ import annotations

import sys

import numpy as np

from .constraint import (_NO_REST, Constraints, _active_limits, assemble_blocks,
                         blocks_dense)
from .constraint import MAX_DEPENETRATION_SPEED, _pairs_in_contact, depenetration_speed
from .forward import (_add_normal_offsets, _island_bias, _island_gather, _island_keep,
                      _island_scatter, _match_warm_start)
from .jit import njit
from .solver import NCPSolver, SolverResult
from .solver_kernels import (_NO_I, _NO_J, BODY_MIN_ROWS, island_mass, natres, no_body,
                             solve_stage1)

# dense bytes (8 (m^2 + 2 m nv)) above which a split model's step uses per-island storage
BLOCK_MIN_BYTES = 16 * 2 ** 20
# bytes of G's island blocks (at most 8 m^2) from which a step takes them from g_buffer's pool
G_POOL_MIN_BYTES = 16 * 2 ** 20
G_POOL_SIZE = 3


def g_buffer(sim):
    """Memory for the step's island blocks of G (``assemble_blocks``' ``Gb``), or None (it
    allocates its own) until a step of ``sim`` has needed at least :data:`G_POOL_MIN_BYTES`.

    A fresh array that large is served by mmap and freed to the system after the step, so each
    step faulted in every page again: at a rack of 256 balls (one island of 2,208 rows, a 39 MB
    block) 9,700 page faults and 18 ms of system time of a 29 ms constrained call. The pool
    keeps up to :data:`G_POOL_SIZE` such arrays on the simulator, each sized by the largest
    block storage a step of it has needed (``sim._g_need``, recorded by ``block_step``; a
    quarter more, so that a few more contacts fit), and hands out one that nothing outside the
    pool refers to: the blocks of an earlier step stay valid as long as anything (``sim.last``,
    a kept ``Constraints``, the derivatives' cache) holds them, since holding a view holds the
    array. A step needing more than the array handed out allocates its own, once."""
    need = sim.__dict__.get("_g_need", 0)
    if need <= 0 or 8 * need < G_POOL_MIN_BYTES:
        return None
    pool = sim.__dict__.setdefault("_g_pool", [])
    for k in range(len(pool)):
        buf = pool[k]
        # (3: the pool's list, the name buf and getrefcount's argument; numba's views of an
        # array keep a reference to it)
        if sys.getrefcount(buf) <= 3:
            if buf.shape[0] >= need:
                return buf
            del pool[k]                     # (too small and unused: replaced by a larger one)
            break
    if len(pool) >= G_POOL_SIZE:
        return None
    buf = np.empty(need + need // 4)
    pool.append(buf)
    return buf


@njit
def island_body_blocks(Jv, nz, nnz, rows, Mb, moff, tree_lo, tree_hi, nv):
    """``solver_kernels.island_body`` from per-island storage: the island's rows restricted to
    the dofs of the trees they touch (Jb: (values, columns) of each row's nonzeros, columns
    increasing), the mass matrix of those dofs by tree blocks (the inverse of each tree's block
    of M^-1) and each local dof's tree range. Storage grows with the rows' nonzeros."""
    used = np.zeros(nv, np.bool_)
    kmax = 1
    for r in rows:
        k = 0
        for t in range(nnz[r]):
            if Jv[r, t] != 0.0:
                used[tree_lo[nz[r, t]]] = True
                k += 1
        if k > kmax:
            kmax = k
    loc, n, M, tlo, thi = island_mass(used, tree_lo, tree_hi, _NO_J, Mb, moff)
    Jbv = np.zeros((rows.shape[0], kmax))
    Jbc = np.full((rows.shape[0], kmax), -1, np.int64)
    for a in range(rows.shape[0]):
        r = rows[a]
        k = 0
        for t in range(nnz[r]):
            x = Jv[r, t]
            if x != 0.0:
                # (insertion by column: the order of a dense row's scan)
                c = loc[nz[r, t]]
                j = k
                while j > 0 and Jbc[a, j - 1] > c:
                    Jbv[a, j] = Jbv[a, j - 1]
                    Jbc[a, j] = Jbc[a, j - 1]
                    j -= 1
                Jbv[a, j] = x
                Jbc[a, j] = c
                k += 1
    return (Jbv, Jbc), M, tlo, thi


@njit
def verify_blocks(Jv, nz, nnz, b, ptr, rows, gptr, Gb, v1, lam, nc, mu):
    """forward._verify_velocity from per-island storage: the NCP's natural-map residual at
    ``sigma = J v1 + b`` (scaled by G's diagonal) and the scale of the velocities."""
    m = b.shape[0]
    nis = ptr.shape[0] - 1
    vs = 0.0
    sig = np.empty(m)
    for r in range(m):
        acc = 0.0
        for t in range(nnz[r]):
            acc += Jv[r, t] * v1[nz[r, t]]
        sig[r] = acc + b[r]
        a_ = max(abs(acc), abs(b[r]))
        if a_ > vs:
            vs = a_
    diag = np.zeros(m)
    for s in range(nis):
        ms = ptr[s + 1] - ptr[s]
        for ia in range(ms):
            diag[rows[ptr[s] + ia]] = Gb[gptr[s] + ia * ms + ia]
    dmax = 0.0
    for i in range(m):
        if diag[i] > dmax:
            dmax = diag[i]
    floor = 1e-12 * (dmax if dmax > 1.0 else 1.0)
    dG = np.empty(m)
    for i in range(m):
        dG[i] = diag[i] if diag[i] >= floor else floor
    dc = np.empty(nc)
    for i in range(nc):
        dc[i] = (dG[3 * i] + dG[3 * i + 1] + dG[3 * i + 2]) / 3.0
    return natres(lam, sig, nc, mu, dc, dG), vs


@njit
def blocks_impulses(v_free, MJc, rt, tree_hi, lam):
    """``v_free + M^-1 J^T lam`` from per-island storage."""
    v1 = v_free.copy()
    for r in range(rt.shape[0]):
        lr = lam[r]
        if lr == 0.0:
            continue
        base = 0
        for a in range(2):
            lo = rt[r, a]
            if lo >= 0:
                for i in range(lo, tree_hi[lo]):
                    v1[i] += MJc[r, base + i - lo] * lr
                base += tree_hi[lo] - lo
    return v1


@njit
def constrained_step_blocks(pos, frames, geom1, geom2, geom_joint, dist, mu, pair, point, Jw,
                            support, sup_ptr, sup_idx, joint_tree, tree_lo, tree_hi, q, v, lim_q,
                            lim_v, lim_bound, lim_sign, limit_margin, dt, erp, skin, Mb, moff,
                            v_free, warm, pair_w, point_w, lam_w, modes_w, limits_w, lim_act_w,
                            tol, mode_tol, newton_iter, mode_rounds, budget, realizable=False,
                            cap=MAX_DEPENETRATION_SPEED, drift=None, gbuf=None):
    """``forward._constrained_step`` (without restitution) on per-island storage: the active
    limits, ``constraint.assemble_blocks``, the warm start, stage 1 per island, ``v1`` and the
    check of the solution at ``v1``. Returns (all_ok, lim_idx, lim_dist, lam, sigma, modes,
    lim_act, its, res, v1, verify residual, verify scale, nprox, the storage tuple of
    assemble_blocks, the record of the realizable projection: per row its island or -1, the
    raw offsets (``forward._solve_islands``))."""
    nc = pos.shape[0]
    nv = Jw.shape[1]
    j1 = np.empty(nc, dtype=np.int64)
    j2 = np.empty(nc, dtype=np.int64)
    for k in range(nc):
        j1[k] = geom_joint[geom1[k]]
        j2[k] = geom_joint[geom2[k]]
    if lim_q.shape[0]:
        lim_idx, lim_dist = _active_limits(q, v, lim_q, lim_v, lim_bound, lim_sign, limit_margin,
                                           dt)
    else:
        lim_idx, lim_dist = np.zeros(0, dtype=np.int64), np.zeros(0)
    st = assemble_blocks(pos, frames, j1, j2, dist, Jw, support, sup_ptr, sup_idx, tree_lo,
                         tree_hi, joint_tree, lim_idx, lim_dist, lim_v, lim_sign, dt, erp, skin,
                         Mb, moff, v_free, cap, gbuf)
    Jv, nz, nnz, b, g, rt, MJc, isl_c, isl_l, nis, ptr, rows, cptr, cs, lptr, ls, gptr, Gb = st
    if drift is not None and drift.shape[0] == nc:   # (support_drift: ellipsoid support points)
        _add_normal_offsets(b, g, drift, nc)
    m = b.shape[0]
    nl = m - 3 * nc
    found = False
    if warm:
        lam0, modes0, found = _match_warm_start(pair_w, point_w, lam_w, modes_w, limits_w,
                                                lim_act_w, pair, point, dist, lim_idx, lim_dist)
    if not found:
        lam0, modes0 = np.zeros(0), np.zeros(0, dtype=np.int64)
    lam = np.zeros(m)
    sigma = np.zeros(m)
    modes = np.zeros(nc, dtype=np.int64)
    lim_act = np.zeros(nl, dtype=np.bool_)
    all_ok = True
    island_ok = np.ones(nis, dtype=np.bool_)
    touch = _pairs_in_contact(pair, dist) if realizable else np.zeros(0, np.bool_)
    its = 0
    res = 0.0
    nprox = 0
    proj = np.full(m, -1, dtype=np.int64)
    braw = b.copy()
    for s in range(nis):
        r0, r1 = ptr[s], ptr[s + 1]
        ms = r1 - r0
        ncs = cptr[s + 1] - cptr[s]
        nls = lptr[s + 1] - lptr[s]
        # (a view: the solver never writes G; a copy doubled the step's largest array)
        Gs = Gb[gptr[s]:gptr[s + 1]].reshape(ms, ms)
        gs, mus, lam0s, modes0s = _island_gather(g, mu, lam0, modes0, found, nc, rows, r0, ms,
                                                 cs, cptr[s], ncs, ls, lptr[s], nls)
        if ms >= BODY_MIN_ROWS:
            Jb, Mbd, tlo, thi = island_body_blocks(Jv, nz, nnz, rows[r0:r1], Mb, moff, tree_lo,
                                                   tree_hi, nv)
        else:
            Jb, Mbd, tlo, thi = no_body()
        bs, keep = _island_bias(b, rows, r0, ms, nc, touch, dist, skin, _NO_REST, lim_dist,
                                realizable)
        ok, lam_s, sigma_s, modes_s, lact_s, its_s, res_s, prox = solve_stage1(
            Gs, gs, ncs, mus, lam0s, modes0s, found, tol, mode_tol, newton_iter, mode_rounds,
            budget, Jb, Mbd, tlo, thi, bs, keep)
        if realizable:   # (the realizable offsets where solve_stage1's retry took them)
            _island_keep(b, g, proj, bs, gs, keep, rows, r0, ms, s)
        its += its_s
        nprox += prox
        if not ok:
            all_ok = False
            island_ok[s] = False
            continue
        if res_s > res:
            res = res_s
        _island_scatter(lam, sigma, modes, lim_act, lam_s, sigma_s, modes_s, lact_s, rows, r0, ms,
                        cs, cptr[s], ncs, ls, lptr[s], nls)
    # v1 = v_free + M^-1 J^T lam, row by row over its trees (forward._add_impulses' order)
    v1 = blocks_impulses(v_free, MJc, rt, tree_hi, lam)
    r1v = 0.0
    vs = 0.0
    if all_ok and m:
        r1v, vs = verify_blocks(Jv, nz, nnz, b, ptr, rows, gptr, Gb, v1, lam, nc, mu)
    return (all_ok, island_ok, lim_idx, lim_dist, lam, sigma, modes, lim_act, its, res, v1, r1v,
            vs, nprox, st, proj, braw)


class _RowsJ:
    """Rows of J made dense on indexing (``J[rows]``: (len(rows), nv)) from per-island
    storage; ``shape`` as J's."""

    def __init__(self, storage, nv):
        self.storage, self.nv = storage, nv
        self.shape = (storage[0].shape[0], nv)

    def __getitem__(self, rows):
        Jv, nz, nnz = self.storage[:3]
        rows = np.atleast_1d(np.arange(self.shape[0])[rows])
        out = np.zeros((len(rows), self.nv))
        for a, r in enumerate(rows.tolist()):
            out[a, nz[r, :nnz[r]]] = Jv[r, :nnz[r]]
        return out


class _IslandG:
    """``G[np.ix_(rows, rows)]`` from per-island storage (G couples rows of one island only)."""

    def __init__(self, storage):
        self.storage = storage
        isl_c, isl_l, nis, ptr, rows = storage[7:12]
        m = storage[3].shape[0]
        self.island = np.empty(m, dtype=np.int64)
        self.local = np.empty(m, dtype=np.int64)
        for s in range(int(nis)):
            rr = rows[ptr[s]:ptr[s + 1]]
            self.island[rr] = s
            self.local[rr] = np.arange(len(rr))

    def __getitem__(self, key):
        ptr, gptr, Gb = self.storage[10], self.storage[16], self.storage[17]
        ra = np.asarray(key[0]).ravel()
        rb = np.asarray(key[1]).ravel()
        sa, sb = self.island[ra], self.island[rb]
        la, lb = self.local[ra], self.local[rb]
        ms = (ptr[sa + 1] - ptr[sa])
        same = sa[:, None] == sb[None, :]
        idx = gptr[sa][:, None] + la[:, None] * ms[:, None] + lb[None, :]
        return np.where(same, Gb[np.where(same, idx, 0)], 0.0)


class BlockConstraints(Constraints):
    """:class:`constraint.Constraints` whose rows are held per island (``assemble_blocks``);
    ``J`` (m, nv) is built on first access (the derivatives read it), ``m`` is not."""

    def __init__(self, storage, nv, b, nc, mu, frames, contacts, limits, limit_dist, dist):
        self.storage, self.nv = storage, int(nv)
        self._dense = None
        self.b, self.nc, self.mu, self.frames, self.contacts = b, nc, mu, frames, contacts
        self.limits, self.limit_dist, self.dist = limits, limit_dist, dist
        self.restitution = None
        self.projected = None

    def dense(self):
        """(J (m, nv), M^-1 J^T (nv, m), G (m, m)) as the dense path assembles them."""
        if self._dense is None:
            Jv, nz, nnz, b, g, rt, MJc, _, _, _, ptr, rows, _, _, _, _, gptr, Gb = self.storage
            self._dense = blocks_dense(Jv, nz, nnz, rt, MJc, ptr, rows, gptr, Gb,
                                       self.tree_hi, self.nv)
        return self._dense

    @property
    def J(self):
        return self.dense()[0]

    @J.setter
    def J(self, value):          # (a caller replacing the rows: they are dense from now on)
        self._dense = (value,) + (self._dense[1:] if self._dense is not None else (None, None))

    @property
    def m(self) -> int:
        return int(self.b.shape[0])


class BlockCache(dict):
    """``sim.cache`` of a step in per-island storage: ``"G"`` and ``"Minv"`` (dense, as the
    dense path leaves them) are made on first read."""

    def __init__(self, base: dict, cons: BlockConstraints, minverse):
        super().__init__(base)
        self.pop("G", None)
        self.pop("Minv", None)
        self._lazy = {"G": lambda: cons.dense()[2], "Minv": minverse}

    def __missing__(self, key):
        make = self._lazy.get(key)
        if make is None:
            raise KeyError(key)
        val = self[key] = make()
        return val

    def get(self, key, default=None):
        if key in self or key in self._lazy:
            return self[key]
        return default


def block_step(sim, trees, q, v, Jw, contacts, v_free):
    """The constrained part of ``sim``'s step in per-island storage (module docstring), or None
    where it does not apply (then the dense path runs): (cons, res, g, v1, verified, islands,
    Minv maker, verify residual, support_drift.fixed_point's ``how``)."""
    cb, solver = sim.constraints, sim.solver
    nc, nv = len(contacts), sim.nv
    if (not nc or len(cb.pair_restitution) or type(solver) is not NCPSolver
            or not solver.settings.compiled or not getattr(cb, "trees_contiguous", False)):
        return None
    m = 3 * nc
    if 8.0 * (m * m + 2.0 * m * nv) < BLOCK_MIN_BYTES:
        return None
    Mb, moff = trees.minverse_blocks(q, cb.tree_lo, cb.tree_hi)
    frames = contacts.frames
    if frames is None:
        from .frames import tangent_frames
        frames = tangent_frames(contacts.normal)
    w = sim._warm
    st = solver.settings
    from .forward import _NO_DRIFT, _NO_WARM
    from .support_drift import fixed_point

    def solve_pass(drift):
        return constrained_step_blocks(
            contacts.pos, frames, contacts.geom1, contacts.geom2, cb.geom_joint, contacts.dist,
            contacts.mu, contacts.pair, contacts.point, Jw, cb.support, cb.sup_ptr, cb.sup_idx,
            cb.joint_tree, cb.tree_lo, cb.tree_hi, q, v, cb.lim_q, cb.lim_v, cb.lim_bound,
            cb.lim_sign, cb.limit_margin, sim.dt, cb.erp, cb.skin, Mb, moff, v_free,
            w is not None, *(w if w is not None else _NO_WARM), st.tol, st.mode_tol,
            st.newton_iter, st.mode_rounds, st.newton_budget, bool(st.realizable_bias),
            depenetration_speed(solver), _NO_DRIFT if drift is None else drift,
            g_buffer(sim))
    # (an ellipsoid's support point: its offsets at the step's own v1, support_drift)
    out, drift_at = fixed_point(sim, contacts, Jw, v, solve_pass,
                                lambda o: o[10] if o[0] else None)
    (all_ok, island_ok, lim_idx, lim_dist, lam, sigma, modes, lim_act, its, resid, v1, r1, vs,
     nprox, storage, proj, braw) = out
    need = int(storage[16][-1])                     # (G's blocks: g_buffer's next size)
    if need > sim.__dict__.get("_g_need", 0):
        sim._g_need = need
    cons = BlockConstraints(storage, nv, storage[3], nc, contacts.mu, frames, contacts, lim_idx,
                            lim_dist, contacts.dist)
    if len(proj) and proj.max() >= 0:
        cons.projected = (proj, braw)
    cons.tree_hi = cb.tree_hi
    if all_ok:
        res = SolverResult(lam, sigma, modes, lim_act, its, resid, True,
                           "prox+newton" if nprox else "newton")
        verified = r1 <= max(100.0 * st.tol, 1e-9 * vs)
    else:
        # (rare) the later stages, in Python, on each island whose stage 1 failed
        # (Simulator._solve_failed_islands) with that island's rows and block of G only
        Jv, nz, nnz, b, g, rt, MJc, isl_c, isl_l, nis, ptr, rows, _, _, _, _, gptr, Gb = storage
        view = Constraints(_RowsJ(storage, nv), b, nc, contacts.mu, frames, contacts, lim_idx,
                           lim_dist, contacts.dist)
        res = sim._solve_failed_islands(solver, _IslandG(storage), g, view, island_ok, isl_c,
                                        isl_l, lam, sigma, modes, lim_act, its, resid, v)
        v1 = blocks_impulses(v_free, MJc, rt, cb.tree_hi, res.lam)
        r1, vs = verify_blocks(Jv, nz, nnz, b, ptr, rows, gptr, Gb, v1, res.lam, nc, contacts.mu)
        verified = r1 <= max(100.0 * st.tol, 1e-9 * vs)
    return (cons, res, storage[4], v1, verified, int(storage[9]), lambda: trees.minverse(q),
            float(r1), drift_at)
