"""Per-tree dynamics: a scene's independent kinematic trees, each with its own small pinocchio
Model and Data, so that memory grows linearly with the number of bodies.

Why: ``pinocchio.Model.createData()`` (pin 4) allocates second-order derivative tensors of
size nv^3 (and a dozen nv x nv matrices), so one Data for a scene of 100 free bodies (nv = 600)
takes 13 GB. The bodies of a scene that are not joined to one another are independent trees
(the subtrees of the children of the world): the mass matrix, ABA, ``M^-1`` and the ABA
derivatives are block diagonal over them. :class:`TreeGroups` splits the model's joints into
*groups* of consecutive trees (a group holds whole trees, at most ``max_group_nv`` velocity
components unless a single tree is larger, e.g. a robot), builds a pinocchio Model per group
with the same joints, placements, inertias, armature and limits, and one Data each. The
simulator's global q / v / tau layout is unchanged: a group's joints, configuration and
velocity components are contiguous ranges of the global ones (pinocchio's depth-first order
of a scene whose trees were appended one after another); a model where they are not keeps one
group (the whole model).

A scene that fits in one group (every model of at most ``max_group_nv`` velocities, and every
scene made of a single tree, such as a robot on a floor) takes the single-model path unchanged
(``TreeGroups.single``). Otherwise the step reads the kinematics (joint placements, world-frame
joint Jacobians, geometry placements), ABA, ``M^-1`` (block diagonal in a dense nv x nv array
whose off-block entries stay zero) and, for the step Jacobian, the forward-kinematics and ABA
derivatives group by group into global arrays of the layouts pinocchio's Data has.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pinocchio as pin

from .pinviews import addr, gather_placements, placement_view, raw_rows

# velocity components per group at most (unless one tree is larger): a Data of nv = 12 (two
# free bodies) takes about 90 kB, of nv = 24 500 kB, of nv = 48 3.4 MB (the nv^3 tensors)
MAX_GROUP_NV = 12


class Group:
    """One group of consecutive trees: global joint range [j0, j1), configuration range
    [q0, q1), velocity range [v0, v1), its own pinocchio Model and Data."""

    __slots__ = ("j0", "j1", "q0", "q1", "v0", "v1", "model", "data", "oM", "_fext")

    def __init__(self, model: pin.Model, j0: int, j1: int):
        self.j0, self.j1 = j0, j1
        jm0, jm1 = model.joints[j0], model.joints[j1 - 1]
        self.q0, self.q1 = jm0.idx_q, jm1.idx_q + jm1.nq
        self.v0, self.v1 = jm0.idx_v, jm1.idx_v + jm1.nv
        self.model = sub_model(model, j0, j1)
        self.data = self.model.createData()
        self.oM = None          # view of data.oMi (made once, checked), or None: gather copies
        self._fext = None

    def aba_derivatives(self, q: np.ndarray, v: np.ndarray, tau: np.ndarray,
                        fext: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """computeABADerivatives of this group at its own ``q``, ``v``, ``tau`` with the
        model's external joint forces ``fext`` (njoints, 6, joint frames; this group's rows
        read): (ddq_dq, ddq_dv, Minv), each (n, n)."""
        fv = self._fext
        if fv is None:
            fv = self._fext = pin.StdVec_Force()
            for _ in range(self.j1 - self.j0 + 1):
                fv.append(pin.Force.Zero())
        for k in range(1, self.j1 - self.j0 + 1):
            fv[k] = pin.Force(fext[self.j0 + k - 1])
        n = self.v1 - self.v0
        out = pin.computeABADerivatives(self.model, self.data, q, v, tau, fv)
        return tuple(np.reshape(x, (n, n)) for x in out)


def sub_model(model: pin.Model, j0: int, j1: int) -> pin.Model:
    """A pinocchio Model of the joints [j0, j1) of ``model`` (whole trees: each joint's parent
    is the world or a joint of the range), with the same joint models, placements, names,
    inertias, armature, limits and gravity."""
    m = pin.Model()
    m.name = f"{model.name}[{j0}:{j1}]"
    m.gravity = model.gravity
    for j in range(j0, j1):
        p = model.parents[j]
        local_parent = 0 if p == 0 else p - j0 + 1
        jid = m.addJoint(local_parent, model.joints[j], model.jointPlacements[j], model.names[j])
        if jid != j - j0 + 1:
            raise AssertionError(f"sub_model: joint {model.names[j]!r} got id {jid}")
        m.appendBodyToJoint(jid, model.inertias[j], pin.SE3.Identity())
    jm0, jm1 = model.joints[j0], model.joints[j1 - 1]
    q0, q1 = jm0.idx_q, jm1.idx_q + jm1.nq
    v0, v1 = jm0.idx_v, jm1.idx_v + jm1.nv
    if m.nq != q1 - q0 or m.nv != v1 - v0:
        raise AssertionError("sub_model: configuration or velocity sizes differ")
    for name, rng in (("armature", (v0, v1)), ("rotorInertia", (v0, v1)),
                      ("rotorGearRatio", (v0, v1)), ("damping", (v0, v1)),
                      ("friction", (v0, v1)), ("effortLimit", (v0, v1)),
                      ("velocityLimit", (v0, v1)), ("lowerPositionLimit", (q0, q1)),
                      ("upperPositionLimit", (q0, q1))):
        if hasattr(model, name):
            setattr(m, name, np.array(getattr(model, name))[rng[0]:rng[1]].copy())
    return m


def tree_ranges(model: pin.Model) -> list[tuple[int, int]] | None:
    """The joint ranges [j0, j1) of the model's kinematic trees in order, or None where a
    tree's joints, configuration or velocity components are not contiguous."""
    nj = model.njoints
    if any("Mimic" in model.joints[j].shortname() for j in range(1, nj)):
        return None                           # (a mimic joint may couple trees)
    parents = [int(p) for p in model.parents]
    root = [0] * nj
    out: list[tuple[int, int]] = []
    for j in range(1, nj):
        root[j] = j if parents[j] == 0 else root[parents[j]]
        if parents[j] == 0:
            out.append((j, j + 1))
        elif not out or root[j] != out[-1][0]:
            return None                       # a joint of an earlier tree after another tree
        else:
            out[-1] = (out[-1][0], j + 1)
    iq = iv = 0
    for j in range(1, nj):                    # q and v follow the joint order without gaps
        jm = model.joints[j]
        if jm.idx_q != iq or jm.idx_v != iv:
            return None
        iq, iv = iq + jm.nq, iv + jm.nv
    if iq != model.nq or iv != model.nv:
        return None
    return out


def group_ranges(model: pin.Model, max_group_nv: int | None = None) -> list[tuple[int, int]]:
    """Consecutive trees packed into groups of at most ``max_group_nv`` velocity components
    (a larger tree is a group of its own); one group (the whole model) when the trees are not
    contiguous or the model has no joint."""
    if max_group_nv is None:
        max_group_nv = MAX_GROUP_NV
    trees = tree_ranges(model) if model.njoints > 1 else None
    if not trees:
        return [(1, model.njoints)] if model.njoints > 1 else []
    nv_of = [model.joints[j1 - 1].idx_v + model.joints[j1 - 1].nv - model.joints[j0].idx_v
             for j0, j1 in trees]
    groups: list[tuple[int, int]] = []
    cur = None
    cur_nv = 0
    for (j0, j1), n in zip(trees, nv_of):
        if cur is not None and cur_nv + n <= max_group_nv:
            cur = (cur[0], j1)
            cur_nv += n
        else:
            if cur is not None:
                groups.append(cur)
            cur, cur_nv = (j0, j1), n
    if cur is not None:
        groups.append(cur)
    return groups


def block_mass_matrices(model: pin.Model, q: np.ndarray, max_group_nv: int | None = None):
    """Yield ``(v0, M_block)`` for each group: the dense symmetric joint-space mass matrix of
    the group's trees at q (the whole model's M is block diagonal over them). Memory linear in
    the number of trees."""
    ranges = group_ranges(model, max_group_nv)
    for j0, j1 in ranges:
        if len(ranges) == 1:
            m, qg, v0 = model, q, 0
        else:
            m = sub_model(model, j0, j1)
            jm0 = model.joints[j0]
            qg, v0 = q[jm0.idx_q:jm0.idx_q + m.nq], jm0.idx_v
        M = np.reshape(pin.crba(m, m.createData(), qg), (m.nv, m.nv))
        yield v0, np.triu(M) + np.triu(M, 1).T


class TreeData:
    """Global kinematic arrays filled group by group, with the layouts of a pinocchio Data of
    the whole model that the step's consumers read: ``J`` (6, nv) world-frame joint Jacobians
    (column-major, as data.J), ``oM`` (njoints, 12) joint placements (rotation column-major,
    translation; pinviews' layout) and ``ov`` (njoints, 6) world-frame spatial velocities."""

    def __init__(self, nj: int, nv: int):
        self.J = np.zeros((6, nv), order="F")
        self.oM = np.zeros((nj, 12))
        self.oM[0, [0, 4, 8]] = 1.0                  # the world: identity
        self.ov = np.zeros((nj, 6))


_MALLOC_TUNED = False


def tune_malloc() -> None:
    """Keep a large island's step temporaries on the heap (once per process, on the first
    model of several trees; glibc only; off with ``DIFFGYM_MALLOPT=0``). That step allocates and
    frees arrays of a few MB (J, M^-1 J^T and G: 1.6-2.2 MB each at a rack of 64 balls), and
    glibc's dynamic thresholds served them by mmap or trimmed the heap under them depending on
    the process's history: such a process took ~690 page faults a step, 1.0-1.6 ms of system
    time on a 2-3 ms step (3 of 6 fresh processes of the 64-ball rack). Fixed thresholds (mmap
    from 32 MB, the dynamic threshold's own ceiling; trim above 64 MB free at the heap's top)
    give every process 0 faults a step. Memory: up to 64 MB of freed heap stays with the
    process, for the next step. (Here, not in forward.py: a change there recompiles the step.)"""
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    if os.environ.get("DIFFGYM_MALLOPT", "1") == "0" or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):      # (glibc's mallopt parameters)
            return
        libc.mallopt(-3, 32 * 1024 * 1024)      # M_MMAP_THRESHOLD
        libc.mallopt(-1, 64 * 1024 * 1024)      # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        return


class TreeGroups:
    """The groups of a model's trees (module docstring) and the per-step calls on them."""

    def __init__(self, model: pin.Model, max_group_nv: int | None = None):
        self.model = model
        self.nv, self.nq, self.nj = model.nv, model.nq, model.njoints
        ranges = group_ranges(model, max_group_nv)
        self.single = len(ranges) <= 1
        self.groups: list[Group] = [] if self.single else [Group(model, a, b) for a, b in ranges]
        if not self.single:
            tune_malloc()       # (several trees: islands of many bodies, see there)
        self.kin = TreeData(self.nj, self.nv)
        self._views_ready = False
        self._gview = None           # (geometry data, its oMg view or None)

    def __len__(self) -> int:
        return len(self.groups)

    # -- kinematics ------------------------------------------------------------------------
    def _make_views(self) -> None:
        for g in self.groups:
            g.oM = placement_view(g.model, g.data)
        self._views_ready = True

    def _gather_placements(self) -> None:
        """The joint placements of every group (after its forward kinematics) into
        ``self.kin.oM`` (through a view of each group's data where possible)."""
        if not self._views_ready:
            self._make_views()
        oM = self.kin.oM
        for g in self.groups:
            if g.oM is not None:
                oM[g.j0:g.j1] = g.oM[1:]
            else:
                oM[g.j0:g.j1] = gather_placements(g.data, np.empty((g.j1 - g.j0 + 1, 12)))[1:]

    def kinematics(self, q: np.ndarray, v: np.ndarray, jacobians: bool = True) -> TreeData:
        """forwardKinematics (and computeJointJacobians) of every group: the placements and
        the world-frame joint Jacobians gathered into ``self.kin``."""
        kin = self.kin
        J = kin.J
        fk, cjj = pin.forwardKinematics, pin.computeJointJacobians
        for g in self.groups:
            fk(g.model, g.data, q[g.q0:g.q1], v[g.v0:g.v1])
            if jacobians:
                cjj(g.model, g.data)
                J[:, g.v0:g.v1] = g.data.J.reshape(6, -1)   # ((6,) when nv = 1)
        self._gather_placements()
        return kin

    def kinematics_derivatives(self, q: np.ndarray, v: np.ndarray, a: np.ndarray) -> TreeData:
        """computeForwardKinematicsDerivatives of every group: placements, world-frame
        spatial velocities (data.ov) and joint Jacobians gathered into ``self.kin``."""
        kin = self.kin
        J, ov = kin.J, kin.ov
        for g in self.groups:
            d = g.data
            pin.computeForwardKinematicsDerivatives(g.model, d, q[g.q0:g.q1], v[g.v0:g.v1],
                                                    a[g.v0:g.v1])
            J[:, g.v0:g.v1] = d.J.reshape(6, -1)
            for k in range(1, g.j1 - g.j0 + 1):
                ov[g.j0 + k - 1] = d.ov[k].vector
        self._gather_placements()
        return kin

    def geometry_placements(self, geom_model: pin.GeometryModel, gdata: pin.GeometryData,
                            W0: np.ndarray | None = None) -> None:
        """updateGeometryPlacements from ``self.kin.oM``: each geom's world placement
        ``oMi[parent] * placement``, written into gdata.oMg (through a checked view of its
        memory where possible)."""
        gv = self._gview
        if gv is None or gv[0] is not gdata:
            objs = geom_model.geometryObjects
            parent = np.array([o.parentJoint for o in objs], dtype=np.int64)
            local = np.array([o.placement.homogeneous for o in objs]).reshape(-1, 4, 4)
            view = _oMg_view(gdata)
            gv = self._gview = (gdata, view, parent, local[:, :3, :3].copy(),
                                local[:, :3, 3].copy())
        _, view, parent, R0, t0 = gv
        if not len(parent):
            return
        P = self.kin.oM[parent]
        Rj = P[:, :9].reshape(-1, 3, 3).transpose(0, 2, 1)      # column-major rows -> R
        R = Rj @ R0
        t = np.einsum("gij,gj->gi", Rj, t0) + P[:, 9:]
        if view is not None:
            view[:, :9] = R.transpose(0, 2, 1).reshape(-1, 9)
            view[:, 9:] = t
        else:
            oMg = gdata.oMg
            for i in range(len(parent)):
                oMg[i] = pin.SE3(R[i], t[i])

    # -- dynamics --------------------------------------------------------------------------
    def aba(self, q: np.ndarray, v: np.ndarray, tau: np.ndarray) -> np.ndarray:
        a = np.empty(self.nv)
        aba = pin.aba
        for g in self.groups:
            a[g.v0:g.v1] = aba(g.model, g.data, q[g.q0:g.q1], v[g.v0:g.v1], tau[g.v0:g.v1])
        return a

    def minverse(self, q: np.ndarray) -> np.ndarray:
        """M^-1 (nv, nv), block diagonal over the groups (upper triangle of each block filled,
        as pinocchio's computeMinverse; entries outside the blocks are zero). A fresh array:
        its untouched zero pages cost no memory. Row-major: the layout the compiled step takes
        (Simulator.step would otherwise copy it, ~0.5 ms at 64 balls); the values are the same
        in either layout."""
        Minv = np.zeros((self.nv, self.nv))
        cm = pin.computeMinverse
        for g in self.groups:
            n = g.v1 - g.v0
            Minv[g.v0:g.v1, g.v0:g.v1] = np.reshape(cm(g.model, g.data, q[g.q0:g.q1]), (n, n))
        return Minv

    def minverse_blocks(self, q: np.ndarray, tree_lo: np.ndarray, tree_hi: np.ndarray):
        """M^-1 per kinematic tree, without the (nv, nv) matrix: ``(Mb, moff)`` with tree t's
        block (both triangles, mirrored from the upper triangle pinocchio's computeMinverse
        fills) row-major at ``Mb[moff[lo]:moff[lo] + w * w]`` (``lo = tree_lo[d]`` the tree's
        first dof, ``w = tree_hi[d] - lo``; ``moff`` indexed by dof, set at each tree's first
        dof). Memory: the sum of the squared tree sizes, linear in the number of bodies."""
        nv = self.nv
        moff = np.full(nv, -1, dtype=np.int64)
        n = 0
        d = 0
        while d < nv:
            w = int(tree_hi[d] - tree_lo[d])
            moff[d] = n
            n += w * w
            d = int(tree_hi[d])
        Mb = np.empty(n)
        cm = pin.computeMinverse
        tril = self.__dict__.setdefault("_tril", {})
        groups = self.groups or [None]
        for g in groups:
            if g is None:                                # (one group: the whole model)
                raise ValueError("minverse_blocks needs a split model (len(groups) > 1)")
            k = g.v1 - g.v0
            B = np.array(np.reshape(cm(g.model, g.data, q[g.q0:g.q1]), (k, k)))
            il = tril.get(k)
            if il is None:
                il = tril[k] = np.tril_indices(k, -1)
            B[il] = B.T[il]                              # (the lower triangle from the upper)
            d = g.v0
            while d < g.v1:
                lo, hi = int(tree_lo[d]), int(tree_hi[d])
                if lo < g.v0 or hi > g.v1:
                    raise ValueError("a kinematic tree crosses a group boundary")
                Mb[moff[lo]:moff[lo] + (hi - lo) ** 2] = \
                    B[lo - g.v0:hi - g.v0, lo - g.v0:hi - g.v0].ravel()
                d = hi
        return Mb, moff

    def kinetic_and_gravity(self, q: np.ndarray, v: np.ndarray, v1: np.ndarray):
        """(0.5 v.M v, 0.5 v1.M v1, g(q)) with M and g per group."""
        ke0 = ke1 = 0.0
        grav = np.empty(self.nv)
        for g in self.groups:
            qg = q[g.q0:g.q1]
            n = g.v1 - g.v0
            M = np.reshape(pin.crba(g.model, g.data, qg), (n, n))
            M = np.triu(M) + np.triu(M, 1).T
            a, b = v[g.v0:g.v1], v1[g.v0:g.v1]
            ke0 += 0.5 * float(a @ M @ a)
            ke1 += 0.5 * float(b @ M @ b)
            grav[g.v0:g.v1] = pin.computeGeneralizedGravity(g.model, g.data, qg)
        return ke0, ke1, grav

    def aba_derivatives(self, q: np.ndarray, v: np.ndarray, tau: np.ndarray, fext: np.ndarray):
        """computeABADerivatives per group with the external joint forces ``fext`` (njoints, 6,
        in the joint frames): (ddq_dq, ddq_dv, Minv), dense (nv, nv), block diagonal."""
        nv = self.nv
        ddq_dq, ddq_dv, Minv = (np.zeros((nv, nv), order="F") for _ in range(3))
        for g in self.groups:
            s = slice(g.v0, g.v1)
            ddq_dq[s, s], ddq_dv[s, s], Minv[s, s] = g.aba_derivatives(q[g.q0:g.q1], v[s],
                                                                        tau[s], fext)
        return ddq_dq, ddq_dv, Minv


def _oMg_view(gdata: pin.GeometryData) -> np.ndarray | None:
    """A checked (ngeom, 12) view of gdata.oMg (rotation column-major, translation), or None."""
    oMg = gdata.oMg
    n = len(oMg)
    if n == 0:
        return None
    for i in range(n):
        R, t = oMg[i].rotation, oMg[i].translation
        if (R.strides != (8, 24) or t.strides != (8,) or addr(t) != addr(R) + 72
                or R.dtype != np.float64 or t.dtype != np.float64):
            return None
    view = raw_rows([addr(oMg[i].rotation) for i in range(n)], 12)
    if view is None:
        return None
    for i in range(n):
        if not (np.array_equal(view[i, :9], oMg[i].rotation.ravel(order="F"))
                and np.array_equal(view[i, 9:], oMg[i].translation)):
            return None
    return view


def joint_placements(model: pin.Model, q: np.ndarray) -> list:
    """The world placements of every joint (``data.oMi`` after forwardKinematics) at q,
    computed tree group by tree group (no whole-model Data for a scene of many trees)."""
    tg = TreeGroups(model)
    if tg.single:
        data = model.createData()
        pin.forwardKinematics(model, data, q)
        return [pin.SE3(M) for M in data.oMi]
    out = [pin.SE3.Identity()]
    for g in tg.groups:
        pin.forwardKinematics(g.model, g.data, q[g.q0:g.q1])
        out.extend(pin.SE3(g.data.oMi[k]) for k in range(1, g.j1 - g.j0 + 1))
    return out


def joint_kinematics(tg: "TreeGroups", q: np.ndarray, v: np.ndarray, joints) -> dict:
    """Per joint j of ``joints`` (global ids, 0 skipped) at (q, v), group by group: its joint
    Jacobian in LOCAL_WORLD_ALIGNED (6, nv, global columns), velocity derivative in WORLD
    (6, nv), angular velocity in WORLD, origin and rotation (what derivatives._Kin holds)."""
    want = sorted({int(j) for j in joints if int(j)})
    out: dict = {"J": {}, "dV": {}, "omega": {}, "o": {}, "R": {}}
    if not want:
        return out
    starts = np.array([g.j0 for g in tg.groups])
    by_group: dict = {}
    for j in want:
        gi = int(np.searchsorted(starts, j, side="right")) - 1
        by_group.setdefault(gi, []).append(j)
    nv = tg.nv
    for gi, js in by_group.items():
        g = tg.groups[gi]
        m, d = g.model, g.data
        qg, vg = q[g.q0:g.q1], v[g.v0:g.v1]
        pin.computeForwardKinematicsDerivatives(m, d, qg, vg, np.zeros(m.nv))
        pin.computeJointJacobians(m, d, qg)
        for j in js:
            jl = j - g.j0 + 1
            J = np.zeros((6, nv))
            J[:, g.v0:g.v1] = np.reshape(pin.getJointJacobian(m, d, jl, pin.LOCAL_WORLD_ALIGNED),
                                         (6, -1))
            dV = np.zeros((6, nv))
            dV[:, g.v0:g.v1] = np.reshape(pin.getJointVelocityDerivatives(m, d, jl, pin.WORLD)[0],
                                          (6, -1))
            out["J"][j], out["dV"][j] = J, dV
            out["omega"][j] = pin.getVelocity(m, d, jl, pin.WORLD).angular.copy()
            out["o"][j] = d.oMi[jl].translation.copy()
            out["R"][j] = d.oMi[jl].rotation.copy()
    return out
