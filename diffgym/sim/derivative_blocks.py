"""The step Jacobian block by block: memory linear in the number of bodies.

The compiled route of ``derivatives.step_jacobian`` works on whole-model dense arrays: the
ABA derivatives and ``M^-1`` (nv x nv each), ``corr`` (nv x nv), the rows ``J`` (m x nv), the
Delassus matrix ``G`` (m x m), the geometry derivatives ``dp/dq``, ``dn/dq`` (nc, 3, nv), the
mode system (m x m) and the right-hand sides ``D`` (m x 3 nv). On a scene of 1,000 free bodies
(nv = 6,000, m about 9,000) that is several GB, and the six (nv, nv) outputs alone are 1.7 GB.

Yet the step's derivative is block diagonal. The bodies of a scene made of independent
kinematic trees (``diffgym.sim.trees``) interact only through the contacts of the step, and a
*breaking* contact (zero impulse, separating: its mode equation is ``d lam = 0``) transmits
nothing: its impulse's derivative is zero, its force terms (``corr``, the external forces) are
zero, and its row of ``W D`` is zero. So the dofs fall into *blocks*: connected components of
the trees (the pinocchio groups of ``TreeGroups``) through the contacts that are not breaking
(joint limits lie within a tree). The derivative of a block's state after the step depends only
on the block's own state and torques, and every term of the route can be formed over the
block's dofs, rows and contacts alone:

* the contacts of a block: those between its bodies or with the world (breaking ones between
  two blocks are left out, as they contribute nothing); its rows: theirs and its limits';
* the geometry derivatives of its contacts (the closed forms of ``derivatives``, on the
  block's contacts only) and ``derivative_kernels.contact_terms`` on its dofs;
* the ABA derivatives, ``M^-1`` and ``dIntegrate`` of its pinocchio groups (block diagonal);
* its rows of J and its block of G (read in place from the forward step's per-island storage
  when the step kept one, ``island_step``), and ``derivative_kernels.dynamics_terms``.

Consecutive small blocks are merged into one call of up to ``CHUNK_NV`` dofs (the kernels
keep independent rows apart: ``_island_min_norm`` solves each component of the mode system on
its own), so a rack of 1,000 balls takes about 130 calls, not 1,000. The numbers are those of
the whole-model route to rounding (``tests/test_deriv_blocks.py`` compares them, and the
result with central differences).

The output, ``StepJacobian`` with its six (nv, nv) blocks, is then either dense numpy (as
always) or ``scipy.sparse.csr_matrix`` holding only the blocks' entries
(``Simulator(..., jacobian_format=...)``: ``"dense"``, ``"sparse"`` or ``"auto"``, which
returns sparse matrices only when the six dense ones would take more than
``SPARSE_AUTO_BYTES``, i.e. from nv = 2,366: about 400 free bodies). This route runs for
sparse output, and for dense output from ``BLOCK_MIN_NV`` dofs; below, dense output keeps the
whole-model route.

Where this route does not apply it returns None and the whole-model route runs: a model of one
group (a single robot; its Jacobian is dense anyway), the rows of ``diffgym.sim.equality``,
Newton's impact law (restitution) and impacts at their time inside the step, the smooth and
long_range gradient modes (whose derivatives couple bodies that do not touch), mimic joints.
"""
from __future__ import annotations

import copy

import numpy as np
import pinocchio as pin

from . import derivative_kernels as K
from .constraint import depenetration_speed
from .solver import BREAKING

# dofs per kernel call at most (consecutive blocks merged up to it; a larger block is one call)
CHUNK_NV = 48
# the block route also for dense output from this many dofs (below it, and for dense output,
# the whole-model route as before: its intermediates are small there)
BLOCK_MIN_NV = 256
# "auto": sparse output when the six dense (nv, nv) blocks would take more bytes than this
SPARSE_AUTO_BYTES = 256 * 2 ** 20

JACOBIAN_FORMATS = ("auto", "dense", "sparse")

_ARG0, _ARG1 = pin.ArgumentPosition.ARG0, pin.ArgumentPosition.ARG1


def wants_sparse(sim) -> bool:
    """Whether ``sim``'s step Jacobian is returned as scipy.sparse matrices (its
    ``jacobian_format``; ``"auto"``: when the dense output would exceed SPARSE_AUTO_BYTES)."""
    fmt = getattr(sim, "jacobian_format", "auto")
    if fmt == "sparse":
        return True
    if fmt == "dense":
        return False
    return 6.0 * 8.0 * sim.nv * sim.nv > SPARSE_AUTO_BYTES


def applies(sim, C, system) -> bool:
    """Whether the block route covers this step (module docstring)."""
    from .derivatives import _closing, _restitution, _compiled_state
    mode = getattr(sim, "gradient", None)
    if system is not None or (mode is not None and mode.name != "exact"):
        return False
    if sim.__dict__.get("_extra") is not None:
        return False
    trees = sim.__dict__.get("_trees")
    if trees is None or trees.single or not len(trees.groups):
        return False
    if C.get("impact_times") is not None or C.get("impact_pre") is not None:
        return False
    cons = C["cons"]
    if cons is not None and (_restitution(cons) is not None or _closing(cons) is not None):
        return False
    if cons is not None and getattr(cons, "projected", None) is not None:
        return False          # (the realizable projection's terms: derivatives._realizable_terms)
    return bool(_compiled_state(sim).ok)


class _Rows:
    """Rows of J and entries of G of the step, read from the forward step's per-island storage
    (``island_step.BlockConstraints``) without making them dense, else from its dense arrays."""

    def __init__(self, C, cons):
        from .island_step import BlockConstraints, _IslandG
        self.cons = cons
        self.block = isinstance(cons, BlockConstraints) and cons._dense is None \
            and "G" not in dict.keys(C)
        if self.block:
            self.storage = cons.storage
            self.G = _IslandG(cons.storage)
        else:
            self.J = cons.J
            self.G = C["G"]

    def J_rows(self, R, loc, Db):
        """J[R][:, Db] as a dense (len(R), len(Db)) array (``loc``: local index of each dof)."""
        if not self.block:
            return np.ascontiguousarray(self.J[np.ix_(R, Db)])
        Jv, nz, nnz = self.storage[:3]
        out = np.zeros((len(R), len(Db)))
        for a, r in enumerate(R.tolist()):
            k = int(nnz[r])
            out[a, loc[nz[r, :k]]] = Jv[r, :k]
        return out

    def G_block(self, R):
        if self.block:
            return np.ascontiguousarray(self.G[R, R])
        return np.ascontiguousarray(self.G[np.ix_(R, R)])


def _blocks(sim, trees, cons, res):
    """Chunks of the groups: a list of (group indices, contact indices, limit indices), each
    chunk one or more whole blocks (module docstring), in the groups' order."""
    groups = trees.groups
    ng = len(groups)
    nj = sim.model.njoints
    gof = np.full(nj, -1, dtype=np.int64)           # joint -> group
    for i, g in enumerate(groups):
        gof[g.j0:g.j1] = i
    parent = np.arange(ng)

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    nc = cons.nc if cons is not None else 0
    if nc:
        gj = sim.constraints.geom_joint
        c = cons.contacts
        a1, a2 = gof[gj[c.geom1]], gof[gj[c.geom2]]
        live = np.asarray(res.modes) != BREAKING
        for k in np.flatnonzero(live & (a1 >= 0) & (a2 >= 0) & (a1 != a2)).tolist():
            x, y = find(int(a1[k])), find(int(a2[k]))
            if x != y:
                parent[max(x, y)] = min(x, y)
    root = np.array([find(i) for i in range(ng)], dtype=np.int64)
    # blocks in the order of their first group; merged into chunks of up to CHUNK_NV dofs
    members: dict = {}
    for i in range(ng):
        members.setdefault(int(root[i]), []).append(i)
    chunk_of_root = {}
    chunks: list = []
    cur, cur_nv = [], 0
    for r, gs in members.items():
        n = sum(groups[i].v1 - groups[i].v0 for i in gs)
        if cur and cur_nv + n > CHUNK_NV:
            chunks.append(cur)
            cur, cur_nv = [], 0
        cur = cur + gs
        cur_nv += n
        chunk_of_root[r] = len(chunks)
    if cur:
        chunks.append(cur)
    chunk_of_group = np.empty(ng, dtype=np.int64)
    for i in range(ng):
        chunk_of_group[i] = chunk_of_root[int(root[i])]
    ck = [[] for _ in chunks]
    if nc:
        # a contact goes to the chunk of its moving bodies; a breaking contact between two
        # chunks (it transmits nothing) is left out
        ch1 = np.where(a1 >= 0, chunk_of_group[np.maximum(a1, 0)], -1)
        ch2 = np.where(a2 >= 0, chunk_of_group[np.maximum(a2, 0)], -1)
        for k in range(nc):
            x, y = int(ch1[k]), int(ch2[k])
            if x < 0 or y < 0 or x == y:
                ck[max(x, y)].append(k)
            elif live[k]:                       # (cannot happen: live contacts are merged)
                raise AssertionError("a live contact between two derivative blocks")
    cl = [[] for _ in chunks]
    if cons is not None and len(cons.limits):
        dof_group = np.empty(sim.nv, dtype=np.int64)
        for i, g in enumerate(groups):
            dof_group[g.v0:g.v1] = i
        limits = sim.sm.limits
        for jl, li in enumerate(cons.limits.tolist()):
            cl[int(chunk_of_group[dof_group[limits[li].idx_v]])].append(jl)
    return [(gs, np.array(k, dtype=np.int64), np.array(l, dtype=np.int64))
            for gs, k, l in zip(chunks, ck, cl)]


def _sub_contacts(c, ks):
    """The contacts ks of ``c`` (a collision_driver.Contacts) as a Contacts of their own, with
    the detect pass's per-pair tables (``convex_pairs``, ``face_pairs``) shared."""
    sub = copy.copy(c)
    for name in ("pair", "geom1", "geom2", "point", "pos", "normal", "dist", "mu"):
        setattr(sub, name, np.ascontiguousarray(getattr(c, name)[ks]))
    if c.frames is not None:
        sub.frames = np.ascontiguousarray(c.frames[ks])
    return sub


class _SubCons:
    """The contact part of a Constraints restricted to some contacts (what
    ``derivatives.geometry_derivatives`` reads)."""

    def __init__(self, cons, ks):
        self.contacts = _sub_contacts(cons.contacts, ks)
        self.nc = len(ks)
        self.mu = cons.mu[ks]
        self.frames = cons.frames[ks]
        self.dist = cons.dist[ks]
        self.limits = cons.limits[:0]
        self.restitution = None
        self.restitution_time = None


def step_jacobian_blocks(sim, C, sparse: bool):
    """The compiled route's Jacobian (``derivatives._step_jacobian_compiled``) block by block
    (module docstring): a StepJacobian of dense arrays or, with ``sparse``, of
    ``scipy.sparse.csr_matrix``; None where a block's data are not finite (the caller takes
    the whole-model route)."""
    from .derivatives import (StepJacobian, _Kin, _compiled_state, _geom_placements,
                              _joint_torques, _finish_rank_in_doubt, geometry_derivatives)
    st = _compiled_state(sim)
    trees = st.trees
    model, dt, nv = st.model, sim.dt, sim.nv
    q, v, v1 = C["q"], C["v"], C["v1"]
    cons, res = C["cons"], C["res"]
    nc = cons.nc if cons is not None else 0
    groups = trees.groups
    tau = _joint_torques(sim, cons, res)
    if cons is not None:
        kin = trees.kinematics_derivatives(q, v1, st.zero)
        JT = kin.J.T                                    # (nv, 6)
        if JT.ndim == 1:
            JT = JT.reshape(1, 6)
        rows = _Rows(C, cons) if cons.m else None
        c = cons.contacts
        ccons = sim.constraints
        lam, sigma, modes, act = res.lam, res.sigma, res.modes, res.limit_active
    fext = np.zeros((model.njoints, 6))
    loc = np.full(nv, -1, dtype=np.int64)
    v1dt = v1 * dt
    damping = sim.sm.damping
    out_blocks = []
    for gs, ks, ls in _blocks(sim, trees, cons, res):
        Db = np.concatenate([np.arange(groups[i].v0, groups[i].v1) for i in gs])
        nb = len(Db)
        loc[Db] = np.arange(nb)
        ncb, nlb = len(ks), len(ls)
        mb = 3 * ncb + nlb
        R = np.concatenate([(3 * ks[:, None] + np.arange(3)[None, :]).ravel(),
                            3 * nc + ls]).astype(np.int64)
        if cons is not None:
            JTb = np.ascontiguousarray(JT[Db])
            supp = np.ascontiguousarray(st.supp[:, Db])
            g1, g2 = c.geom1[ks], c.geom2[ks]
            cargs = (JTb, st.oM, st.ov, fext, supp, st.dof_joint[Db], st.parents, st.gjoint,
                     st.static_plane, st.roll_radius, st.python_geometry,
                     _geom_placements(sim), g1, g2,
                     np.ascontiguousarray(c.pos[ks]), np.ascontiguousarray(c.normal[ks]),
                     c.dist[ks], cons.dist[ks], np.ascontiguousarray(cons.frames[ks]),
                     lam[R], v1[Db], dt, ccons.erp, ccons.skin)
            lims = (cons.limits[ls], cons.limit_dist[ls], loc[st.lim_v], st.lim_sign, v[Db],
                    np.zeros(ncb), depenetration_speed(sim.solver))
            no_geo = (np.zeros((0, 3, nb)), np.zeros((0, 3, nb)), np.zeros((0, nb)))
            corr, Dq, done = K.contact_terms(*cargs, False, *no_geo, *lims)
            if not done:          # pairs without a closed form in the kernel: in Python
                gj = st.gjoint
                sub = _SubCons(cons, ks)
                bkin = _Kin(model, None, q, v1, np.concatenate([gj[g1], gj[g2]]), trees)
                # (the joints' Jacobians on the chunk's dofs only: geometry nb wide, not nv)
                for d in (bkin.J, bkin.dV):
                    for j in d:
                        d[j] = np.ascontiguousarray(d[j][:, Db])
                bkin.nv, bkin.cols = nb, Db
                geo = geometry_derivatives(sim, bkin, sub, skip=~st.python_geometry[g1, g2])
                corr, Dq, done = K.contact_terms(*cargs, True, *geo, *lims)
            Jc = rows.J_rows(R, loc, Db) if rows is not None else np.zeros((0, nb))
            G = rows.G_block(R) if rows is not None else np.zeros((0, 0))
            lamb, sigb, modb = lam[R], sigma[R], modes[ks]
            actb, mub = act[ls], cons.mu[ks]
        else:
            corr, Dq = np.zeros((nb, nb)), np.zeros((0, nb))
            Jc, G = np.zeros((0, nb)), np.zeros((0, 0))
            lamb = sigb = mub = np.zeros(0)
            modb = np.zeros(0, dtype=np.int64)
            actb = np.zeros(0, dtype=np.bool_)
        # the ABA derivatives, M^-1 and dIntegrate of the chunk's groups (block diagonal)
        ddq_dq, ddq_dv, Minv, dI_dq, dI_dv = (np.zeros((nb, nb)) for _ in range(5))
        o = 0
        for i in gs:
            g = groups[i]
            n = g.v1 - g.v0
            s = slice(g.v0, g.v1)
            qg = q[g.q0:g.q1]
            t = slice(o, o + n)
            ddq_dq[t, t], ddq_dv[t, t], Minv[t, t] = g.aba_derivatives(qg, v[s], tau[s], fext)
            dI_dq[t, t] = np.reshape(pin.dIntegrate(g.model, qg, v1dt[s], _ARG0), (n, n))
            dI_dv[t, t] = np.reshape(pin.dIntegrate(g.model, qg, v1dt[s], _ARG1), (n, n))
            o += n
        status, dq_dq, dq_dv, dq_dtau, dv_dq, dv_dv, dv_dtau = K.dynamics_terms(
            ddq_dq, ddq_dv, Minv, st.kstiff[Db], st.has_stiff, damping[Db], st.damped, dt,
            Jc, G, corr, Dq, lamb, sigb, modb, actb, mub, ncb, dI_dq, dI_dv, np.zeros(mb))
        if status == 1:
            return None
        if status == 2:           # rank in doubt: the reference's solve (as the compiled route)
            dq_dq, dq_dv, dq_dtau, dv_dq, dv_dv, dv_dtau = _finish_rank_in_doubt(
                dq_dq, dq_dv, dq_dtau, dv_dq, dv_dv, dv_dtau, dI_dq, dI_dv, dt)
        out_blocks.append((Db, (dq_dq, dq_dv, dq_dtau, dv_dq, dv_dv, dv_dtau)))
        loc[Db] = -1
    return StepJacobian(*_assemble(out_blocks, nv, sparse))


def _assemble(out_blocks, nv, sparse):
    """The six (nv, nv) matrices from the chunks' blocks: dense arrays, or CSR matrices of the
    blocks' nonzero entries."""
    if not sparse:
        mats = [np.zeros((nv, nv)) for _ in range(6)]
        for Db, blocks in out_blocks:
            ix = np.ix_(Db, Db)
            for M, B in zip(mats, blocks):
                M[ix] = B
        return mats
    import scipy.sparse as sp
    mats = []
    for w in range(6):
        ri, ci, vals = [], [], []
        for Db, blocks in out_blocks:
            B = blocks[w]
            a, b = np.nonzero(B)
            ri.append(Db[a])
            ci.append(Db[b])
            vals.append(B[a, b])
        if ri:
            r, cc, x = np.concatenate(ri), np.concatenate(ci), np.concatenate(vals)
        else:
            r = cc = np.zeros(0, dtype=np.int64)
            x = np.zeros(0)
        mats.append(sp.csr_matrix((x, (r, cc)), shape=(nv, nv)))
    return mats
