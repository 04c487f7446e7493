"""Derivatives: analytical step Jacobians by implicit differentiation of the NCP, by contact mode.

Follows ``shared/notes/gradients.md``. For theta in {q, v, tau} (q in pinocchio's tangent space):

1. fixed-impulse sensitivity of the new velocity, ``V_theta = d v1/d theta |lam``, from
   pinocchio's ABA derivatives evaluated with the contact impulses as external forces fixed in
   the joint frames (``fext = lam / dt``) and the active joint-limit impulses as joint torques
   (``tau + J_lim^T lam_lim / dt``, ``_joint_torques``), plus the correction for the contact
   force not being body-fixed: its point slides on the body and its frame follows the collision
   geometry (``geometry_derivatives``);
2. fixed-impulse sensitivity of the constraint velocities,
   ``D_theta = d sigma/d theta |lam = J V_theta + d(J(q) w)/dq |_{w=v1} + d b/dq`` (the last two
   for theta = q only: the motion of the contact frames and the Baumgarte offset; where the
   step took the realizable offsets ``b' = P b`` of redundant rows, ``SolverSettings.
   realizable_bias``, ``d b'/dq = P db/dq + (I - P) dJ v_c + (J^#)^T dJ^T r`` on those rows,
   ``_realizable_terms``);
3. the linearized mode equations of the solution found by the solver (breaking: ``d lam_i = 0``;
   sticking: ``d sigma_i = 0``; sliding: ``d sigma_N = 0`` and the slip-direction rotation, or
   ``d lam_T = 0`` for a frictionless contact, which the step always labels sliding;
   joint limit active: ``d sigma = 0``, inactive: ``d lam = 0``): ``A d lam = -B D_theta``,
   solved in the least-squares / minimum-norm sense because ``A`` is rank deficient when
   contacts are redundant (four coplanar points): ``d v1`` is unique although ``d lam`` is not;
4. ``d v1 = V_theta + M^-1 J^T d lam`` and the Lie-group chain rule through ``pinocchio.integrate``.

At a mode switch the result is the one-sided derivative of the mode the solver found (the
Jacobian of the smooth piece the current state lies on); no smoothing is applied.

Collision geometry (how contact points, normals and distances move with q) is closed form for
a static plane against every shape (``_plane_contacts``: sphere and capsule roll about their
centre or segment point, box and mesh witness points are body-fixed vertices, a tilted
cylinder's witness is the lowest point of its cap rim, an ellipsoid's its support point or a
body-fixed surface sample), for
sphere-sphere, for sphere-box (``_sphere_box``: face, edge, corner and centre-inside regions;
either body static or moving), for sphere-capsule (``_sphere_capsule``: the centre against the
axis segment), for every pair of boxes and convex meshes, a capsule with either, and
capsule-capsule (``collision_derivatives``: feature by feature, patches included; the polytope
pairs of a step in one compiled call, ``polytope_pairs``), and for a cylinder on a box face,
static or moving (``collision_derivatives.cylinder_box_pair``: the rows the driver found on the
face), for single-point contacts of cylinders and ellipsoids with every primitive and of a
sphere with a mesh (``collision_derivatives.convex_pair``: the driver's refined point, the
implicit derivative of the distance problem's optimality conditions, ``convex_support``) and for
shapes lying on a cylinder's cap or a cylinder on a mesh facet (``collision_derivatives.face_pair``).
Capsules lying along each other are a 2-point line patch (``collision_driver``'s
``_capsule_line``, ``collision_derivatives.capsule_end_rows``). Every other configuration (a
shape across several mesh facets with several points, anything on a moving plane, ...) falls back to a central difference of the collision output alone (``_collision_fd``, step
``collision_fd_eps``), never of the dynamics, counted in ``fallback_counts`` with a warning
once per pair of kinds; ``closed_form_pair`` says which. ``tests/test_gradients.py`` and
``tests/test_collision_derivatives.py`` check both routes against central differences of the
whole step.

Two implementations give the same numbers (to rounding): ``step_jacobian``'s default compiled
route (pinocchio for the kinematics, the ABA derivatives and dIntegrate; numba kernels in
``derivative_kernels.py`` for the rest: joint forces, Jacobian stacking, closed-form geometry on
static planes, frame derivatives, the mode system, its solve and the chain rule) and the numpy
reference (``step_jacobian(sim, compiled=False)``, or ``COMPILED = False``), which the compiled
route falls back to where it does not apply. ``tests/test_derivative_kernels.py`` compares them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pinocchio as pin

from . import derivative_blocks as _db
from . import derivative_kernels as K
from . import collision_derivatives as _cd
from . import support_drift as _support_drift
from .collision_derivatives import (POLYTOPE_KINDS, capsule_pair, convex_pair,  # noqa: F401
                                    cylinder_box_pair, face_pair, margin_vertex_rows,
                                    polytope_pair, polytope_pairs)
from .collision_driver import tighten_requests
from .constraint import baumgarte_gain, depenetration_speed
from .plane_contacts import cylinder_lowest, ellipsoid_directions
from .pinviews import addr as _addr, gather_placements, placement_view, raw_rows as _raw_rows
from .solver import BREAKING, STICKING

collision_fd_eps = 1e-7


class JacobianDiagnostics:
    """How the step Jacobian was obtained and how close the step is to a mode switch.

    One entry per contact point (in ``sim.last`` order) then per joint-limit row within reach:

    - ``kinds``: ``"contact"`` or ``"limit"``; ``labels``: ``"geom1/geom2[point]"`` or
      ``"joint (lower|upper)"``;
    - ``modes``: the mode the derivative used: contacts ``"breaking"``, ``"sticking"`` or
      ``"sliding"`` (a frictionless touching contact is always sliding), limits ``"active"`` or
      ``"inactive"``;
    - ``margins`` (m/s) and ``margin_kinds``: the distance to this entry's nearest mode switch,
      the smallest of the conditions that hold its mode, impulses converted to velocities by the
      Delassus diagonal (the solver's own scaling, ``G_ii * impulse``):
      ``"impulse"`` (normal impulse / limit impulse to zero: breaking next),
      ``"slip"`` (a sliding contact's slip to zero: sticking next; not for mu = 0, whose cone is
      a ray), ``"cone"`` (a sticking contact's friction to the cone boundary,
      ``mu lam_N - |lam_T|``: sliding next), ``"gap"`` (a breaking contact's or inactive limit's
      constraint velocity after the step, ``sigma_N >= 0``, to zero: contact next);
    - ``min_margin``, ``argmin`` (entry index or -1 when there is none), ``argmin_kind``,
      ``argmin_label``: the nearest switch over all entries;
    - the mode system ``A`` of the implicit differentiation (``m x m``, m = 3 per contact + 1 per
      limit row; a sliding contact's slip-direction rows divided by ``1 + mu lam_N / |slip|``,
      as the solve uses them): ``singular_values``, ``sigma_min``, ``condition`` (``inf`` when singular),
      ``rank`` (singular values above 1e-12 of the largest, the least-squares cut-off),
      ``rank_deficient`` (smallest <= 1e-8 largest: the impulses' derivative is not unique) and
      ``solve``: ``"lu"`` (unique) or ``"min-norm"`` (the minimum-norm least-squares choice of
      d lam; d v1 is unique where the redundant rows act on the velocities alike, e.g. four
      coplanar points of a box on its face).

    Computed when first read from the step's solution, in three groups: the margins (one
    compiled call), the entries' kinds, labels and modes (strings), the conditioning (one SVD
    of A); nothing is computed when unread.
    A step without constraint rows has no entries (``min_margin`` inf, ``solve`` ``"none"``).
    """

    _MARGINS = ("margins", "margin_kinds", "min_margin", "argmin", "argmin_kind")
    _ENTRIES = ("kinds", "labels", "modes", "argmin_label")
    _CONDITIONING = ("singular_values", "sigma_min", "condition", "rank", "rank_deficient", "solve")
    _FIELDS = _ENTRIES[:3] + _MARGINS[:2] + ("min_margin", "argmin", "argmin_kind",
                                             "argmin_label") + _CONDITIONING
    _GROUP = {**{k: "_margins" for k in _MARGINS}, **{k: "_entries" for k in _ENTRIES},
              **{k: "_conditioning" for k in _CONDITIONING}}
    _MARGIN_NAMES = ("impulse", "slip", "cone", "gap")

    def __init__(self, sim, cons, res, G):
        self._src = (sim.sm, cons, res, G)

    def __getattr__(self, name):
        group = JacobianDiagnostics._GROUP.get(name)
        d = self.__dict__
        if group is not None and "_src" in d:
            src = d["_src"]
            if callable(src[3]):           # (G made when first needed)
                src = d["_src"] = src[:3] + (src[3](),)
            getattr(self, group)(*src)
            return d[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self._FIELDS}

    def __getstate__(self):
        # (pickling and copying compute every field: the copy holds no simulator objects)
        return self.as_dict()

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self) -> str:
        d = self.as_dict()
        return (f"JacobianDiagnostics(entries={len(d['kinds'])}, solve={d['solve']!r}, "
                f"rank_deficient={d['rank_deficient']}, condition={d['condition']:.3g}, "
                f"min_margin={d['min_margin']:.3g} ({d['argmin_kind']} at {d['argmin_label']!r}))")

    @staticmethod
    def _arrays(cons, res):
        modes = res.modes if res.modes.dtype == np.int64 else res.modes.astype(np.int64)
        act = res.limit_active if res.limit_active.dtype == np.bool_ \
            else res.limit_active.astype(np.bool_)
        mu = cons.mu if cons.mu.dtype == np.float64 else cons.mu.astype(np.float64)
        return modes, act, mu

    def _margins(self, sm, cons, res, G) -> None:
        d = self.__dict__
        if cons is not None and cons.m:
            modes, act, mu = self._arrays(cons, res)
            margins, kcode, a = K.mode_margins(res.lam, res.sigma, modes, act, G, cons.nc, mu)
            xr = getattr(cons, "extra", None)
            if xr is not None and xr.m:
                # the rows of diffgym.sim.equality: bilateral rows never switch; a sticking
                # friction row switches when |lam| reaches its bound ("impulse"), a sliding one
                # when its velocity reaches zero ("slip")
                margins, kcode = margins.copy(), kcode.copy()
                s0 = cons.m - xr.m
                e0 = len(margins) - xr.m
                for i in range(xr.m):
                    r, kd, xm = s0 + i, int(xr.kind[i]), int(xr.xmode[i])
                    if kd == 0:
                        margins[e0 + i], kcode[e0 + i] = np.inf, 0
                    elif kd == 1 and xm == 0:
                        margins[e0 + i] = G[r, r] * (xr.bound[i] - abs(res.lam[r]))
                        kcode[e0 + i] = 0
                    elif kd == 1:
                        margins[e0 + i], kcode[e0 + i] = abs(res.sigma[r]), 1
                a = int(np.argmin(margins))
            names = self._MARGIN_NAMES
            d["margins"] = margins
            d["margin_kinds"] = [names[k] for k in kcode.tolist()]
            d["min_margin"], d["argmin"] = float(margins[a]), a
            d["argmin_kind"] = d["margin_kinds"][a]
        else:
            d["margins"], d["margin_kinds"] = np.zeros(0), []
            d["min_margin"], d["argmin"], d["argmin_kind"] = np.inf, -1, ""

    def _entries(self, sm, cons, res, G) -> None:
        from .solver import MODE_NAMES
        d = self.__dict__
        if cons is not None and cons.m:
            nc = cons.nc
            names = [g.name for g in sm.geoms]
            c = cons.contacts
            lims = [sm.limits[li] for li in cons.limits.tolist()]
            d["kinds"] = ["contact"] * nc + ["limit"] * len(lims)
            d["labels"] = [f"{names[a]}/{names[b]}[{p}]" for a, b, p in
                           zip(c.geom1.tolist(), c.geom2.tolist(), c.point.tolist())] + \
                [f"{lim.joint} ({'lower' if lim.sign > 0 else 'upper'})" for lim in lims]
            d["modes"] = [MODE_NAMES[m] for m in res.modes.tolist()] + \
                ["active" if a else "inactive" for a in res.limit_active.tolist()]
            xr = getattr(cons, "extra", None)
            if xr is not None and xr.m:
                nl = len(lims)
                kn = {0: "equality", 1: "frictionloss", 2: "limit"}
                d["kinds"] += [kn[int(k)] for k in xr.kind.tolist()]
                d["labels"] += list(xr.labels)
                mn = {0: "active", 1: "sliding", -1: "sliding", 2: "inactive"}
                d["modes"] = d["modes"][:nc + nl] + [
                    "equality" if k == 0 else "sticking" if (k == 1 and x == 0) else mn[x]
                    for k, x in zip(xr.kind.tolist(), xr.xmode.tolist())]
            a = self.argmin
            d["argmin_label"] = d["labels"][a]
        else:
            d["kinds"], d["labels"], d["modes"], d["argmin_label"] = [], [], [], ""

    def _conditioning(self, sm, cons, res, G) -> None:
        d = self.__dict__
        if cons is None or not cons.m:
            d["singular_values"] = np.zeros(0)
            d["sigma_min"], d["condition"], d["rank"] = np.inf, 1.0, 0
            d["rank_deficient"], d["solve"] = False, "none"
            return
        modes, act, mu = self._arrays(cons, res)
        A = K.mode_system(res.lam, res.sigma, modes, act, G, cons.nc, mu)[0]
        sv = None
        if _ul is not None:
            with np.errstate(all="ignore"):
                sv = _ul.svd(A, signature="d->d")
        if sv is None or not np.isfinite(sv).all():
            sv = np.linalg.svd(A, compute_uv=False)
        smax, smin = float(sv[0]), float(sv[-1])
        d["singular_values"] = sv
        d["sigma_min"] = smin
        d["condition"] = smax / smin if smin > 0.0 else np.inf
        d["rank"] = int(np.count_nonzero(sv > 1e-12 * smax))
        # the rule of the reference solve (_solve_min_norm): LU above it, least squares below
        d["rank_deficient"] = not smin > 1e-8 * smax
        d["solve"] = "min-norm" if d["rank_deficient"] else "lu"


@dataclass
class StepJacobian:
    """Derivatives of one step. Columns/rows for q are tangent (nv wide). The six blocks are
    numpy arrays, or ``scipy.sparse.csr_matrix`` with the simulator's ``jacobian_format``
    "sparse" (or "auto" on a large scene; ``diffgym.sim.derivative_blocks``). ``diagnostics``: a
    :class:`JacobianDiagnostics` of the step (mode per contact and limit, conditioning of the
    mode system, distance to the nearest mode switch), computed when first read."""

    dq_dq: np.ndarray
    dq_dv: np.ndarray
    dq_dtau: np.ndarray
    dv_dq: np.ndarray
    dv_dv: np.ndarray
    dv_dtau: np.ndarray
    diagnostics: JacobianDiagnostics | None = field(default=None, repr=False, compare=False)
    # models with mocap bodies: the derivatives with respect to the mocap parameters, computed
    # when first read (diffgym.sim.mocap.MocapColumns; the properties below)
    mocap_columns: object = field(default=None, repr=False, compare=False)

    @property
    def dq_dmocap(self) -> np.ndarray | None:
        """d q1 / d(the mocap bodies' pos, rot, vel, angvel) (nv, 12 per mocap body, file order;
        diffgym.sim.mocap.mocap_jacobian), computed when first read; None without mocap bodies
        or where not computed (``mocap_note`` says why)."""
        return None if self.mocap_columns is None else self.mocap_columns.value()[0]

    @property
    def dv_dmocap(self) -> np.ndarray | None:
        """d v1 / d(the mocap bodies' pos, rot, vel, angvel): as ``dq_dmocap``."""
        return None if self.mocap_columns is None else self.mocap_columns.value()[1]

    @property
    def mocap_note(self) -> str | None:
        """Why ``dq_dmocap`` / ``dv_dmocap`` are None on a model with mocap bodies, else None."""
        return None if self.mocap_columns is None else self.mocap_columns.value()[2]

    @property
    def state(self) -> np.ndarray:
        """d(q1, v1)/d(q, v): (2nv, 2nv) (a scipy.sparse CSR matrix when the blocks are)."""
        if not isinstance(self.dq_dq, np.ndarray):
            import scipy.sparse as sp
            return sp.bmat([[self.dq_dq, self.dq_dv], [self.dv_dq, self.dv_dv]], format="csr")
        return np.block([[self.dq_dq, self.dq_dv], [self.dv_dq, self.dv_dv]])

    @property
    def control(self) -> np.ndarray:
        """d(q1, v1)/d tau: (2nv, nv) (a scipy.sparse CSR matrix when the blocks are)."""
        if not isinstance(self.dq_dtau, np.ndarray):
            import scipy.sparse as sp
            return sp.vstack([self.dq_dtau, self.dv_dtau], format="csr")
        return np.vstack([self.dq_dtau, self.dv_dtau])


def _skew(x: np.ndarray) -> np.ndarray:
    return np.array([[0.0, -x[2], x[1]], [x[2], 0.0, -x[0]], [-x[1], x[0], 0.0]])


_I1 = np.array([1, 2, 0])
_I2 = np.array([2, 0, 1])


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cross products a x b: a (k, 3), b (k, 3, n) -> (k, 3, n)."""
    # component i: a[i+1] b[i+2] - a[i+2] b[i+1]
    return a[:, _I1, None] * b[:, _I2] - a[:, _I2, None] * b[:, _I1]


def _frame_derivatives(n: np.ndarray, dn: np.ndarray) -> np.ndarray:
    """d R / dq (k, 3, 3, nv) of the frames R = constraint.tangent_frames(n) (k, 3, 3) given
    dn (k, 3, nv): t1 = helper x n / |helper x n| (helper e_x where |n_x| < 0.9, else e_y),
    t2 = n x t1. Zero where dn is (a static plane's normal)."""
    k, nv = dn.shape[0], dn.shape[2]
    moving = np.flatnonzero(np.abs(dn).reshape(k, -1).max(axis=1, initial=0.0) > 0.0)
    out = np.zeros((k, 3, 3, nv))
    if len(moving):
        out[moving] = _frame_derivatives_rows(n[moving], dn[moving])
    return out


def _frame_derivatives_rows(n: np.ndarray, dn: np.ndarray) -> np.ndarray:
    use_x = (np.abs(n[:, 0]) < 0.9)[:, None]
    # c = helper x n: e_x x n = (0, -n2, n1), e_y x n = (n2, 0, -n0); the same for dn
    zero = np.zeros_like(n[:, 0])
    c = np.where(use_x, np.stack([zero, -n[:, 2], n[:, 1]], axis=1), np.stack([n[:, 2], zero, -n[:, 0]], axis=1))
    nc = np.sqrt(np.einsum("ki,ki->k", c, c))
    t1 = c / nc[:, None]
    zn = np.zeros_like(dn[:, 0])
    dc = np.where(use_x[:, :, None], np.stack([zn, -dn[:, 2], dn[:, 1]], axis=1),
                  np.stack([dn[:, 2], zn, -dn[:, 0]], axis=1))
    dt1 = (dc - t1[:, :, None] * np.einsum("ki,kin->kn", t1, dc)[:, None, :]) / nc[:, None, None]
    dt2 = _cross(n, dt1) - _cross(t1, dn)                  # n x dt1 + dn x t1
    return np.stack([dt1, dt2, dn], axis=2)


def relative_velocity(kin, j1s, j2s, p, v, dp):
    """The velocity of contact points p on body 2 relative to body 1 (joints ``j1s``, ``j2s``; 0
    the world) at joint velocity v, world axes, and its derivative with respect to q (tangent)
    with the points moving as ``dp`` (nc, 3, nv). Returns (vrel (nc, 3), dvrel (nc, 3, nv))."""
    nc, nv = p.shape[0], v.shape[0]
    vrel = np.zeros((nc, 3))
    dvrel = np.zeros((nc, 3, nv))
    for js, sgn in ((j1s, -1.0), (j2s, 1.0)):
        if not np.any(js):
            continue
        Jj, o, w, dV = kin.stacked(js)
        Jp = Jj[:, :3] - _cross(p - o, Jj[:, 3:])
        vrel += sgn * (Jp @ v)
        dvrel += sgn * (dV[:, :3] - _cross(p, dV[:, 3:]) + _cross(w, dp))
    return vrel, dvrel


class _Kin:
    """Per-joint kinematic quantities at (q, v1) for the contacts' joints."""

    def __init__(self, model, data, q, v1, joints, trees=None):
        self.nv = model.nv
        self._stacked = {}
        if trees is not None:             # tree by tree (diffgym.sim.trees): the same quantities
            from .trees import joint_kinematics
            k = joint_kinematics(trees, q, v1, joints)
            self.J, self.dV, self.omega, self.o, self.R = (k["J"], k["dV"], k["omega"], k["o"],
                                                           k["R"])
            return
        pin.computeForwardKinematicsDerivatives(model, data, q, v1, np.zeros(model.nv))
        pin.computeJointJacobians(model, data, q)
        self.J = {}
        self.dV = {}
        self.omega = {}
        self.o = {}
        self.R = {}
        for j in joints:
            j = int(j)
            if j == 0 or j in self.J:
                continue
            self.J[j] = pin.getJointJacobian(model, data, j, pin.LOCAL_WORLD_ALIGNED)
            self.dV[j] = pin.getJointVelocityDerivatives(model, data, j, pin.WORLD)[0]
            self.omega[j] = pin.getVelocity(model, data, j, pin.WORLD).angular.copy()
            self.o[j] = data.oMi[j].translation.copy()
            self.R[j] = data.oMi[j].rotation.copy()

    def point_jacobian(self, j: int, p: np.ndarray) -> np.ndarray:
        if j == 0:
            return np.zeros((3, self.nv))
        J = self.J[j]
        return J[:3] - _skew(p - self.o[j]) @ J[3:]

    def stacked(self, js: np.ndarray):
        """Per-row arrays for the joints js (k,): Jacobian (k, 6, nv), origin (k, 3), angular
        velocity (k, 3) and velocity derivative (k, 6, nv); zero rows where js == 0 (world)."""
        key = np.asarray(js).tobytes()
        hit = self._stacked.get(key)
        if hit is not None:
            return hit
        k, nv = len(js), self.nv
        J = np.zeros((k, 6, nv))
        dV = np.zeros((k, 6, nv))
        o = np.zeros((k, 3))
        w = np.zeros((k, 3))
        for i, j in enumerate(js):
            j = int(j)
            if j:
                J[i], dV[i], o[i], w[i] = self.J[j], self.dV[j], self.o[j], self.omega[j]
        self._stacked[key] = (J, o, w, dV)
        return J, o, w, dV

    def point_jacobians(self, js: np.ndarray, p: np.ndarray) -> np.ndarray:
        """(k, 3, nv) Jacobians of the world points p (k, 3) fixed on the bodies of joints js."""
        J, o, _, _ = self.stacked(js)
        return J[:, :3] - _cross(p - o, J[:, 3:])


class _FrameKin(_Kin):
    """A ``_Kin`` for the compiled route: the joints' Jacobians (LOCAL_WORLD_ALIGNED) and
    origins from the WORLD Jacobian columns ``JT`` (nv, 6) and placements ``oM`` (njoints, 12)
    the route already holds, as ``contact_terms`` forms them (linear part ``l - o x a`` on the
    joint's supporting dofs ``supp[j]``: the same bits as pinocchio's ``getJointJacobian``), so
    that the polytope pairs' geometry needs no pinocchio call; the velocity derivatives,
    angular velocities and rotations that other pairs read are made on first use
    (``_Kin``)."""

    def __init__(self, model, data, q, v1, joints, trees, JT, oM, supp):
        self.nv = model.nv
        self._stacked = {}
        self._full = (model, data, q, v1, joints, trees)
        js = np.unique(joints)
        js = js[js != 0]
        J, o = K.frame_jacobians(JT, oM, supp, js)                 # (one compiled call)
        self.J = dict(zip(js.tolist(), J))
        self.o = dict(zip(js.tolist(), o))

    def __getattr__(self, name):
        if name in ("dV", "omega", "R"):
            full = _Kin(*self.__dict__["_full"])
            self.dV, self.omega, self.R = full.dV, full.omega, full.R
            return self.__dict__[name]
        raise AttributeError(name)


def _plane_contacts(sim, kin: _Kin, cons, idx: np.ndarray, dp, dn, dd) -> None:
    """Closed form for the contacts idx of a shape X against a static plane (vectorized).

    The witness point x on X moves with X: for a sphere or capsule it is the centre (or the
    segment point) minus r n, so it moves with that body-fixed point; for a box, a mesh or a
    cylinder lying flat it is a body-fixed vertex; for a tilted cylinder it is the lowest point
    of a cap's rim, c - r u with u the unit projection of the plane normal on the cap plane; for
    an ellipsoid, point 0 is the support point c - E m / sqrt(m^T E m), E = R diag(radii^2) R^T,
    along m = n, and points 1.. are body-fixed surface samples (plane_contacts.ELLIPSOID_U),
    which move as a box's vertices. The plane's normal is constant, so dn = 0, d dist = n_X . dx
    and the contact point (the projection of x on the plane) moves by dx - n d dist.
    """
    c = cons.contacts
    geoms = sim.sm.geoms
    gjoint = sim.constraints.geom_joint
    table = getattr(sim, "_dgeoms", None)
    if table is None:
        # per geom: static plane?, rolling radius (sphere, capsule) and kinds needing more work
        table = sim._dgeoms = (
            np.array([g.kind == "plane" and gjoint[i] == 0 for i, g in enumerate(geoms)], dtype=bool),
            np.array([g.size[0] if g.kind in ("sphere", "capsule") else 0.0 for g in geoms]),
            np.array([g.kind in ("cylinder", "ellipsoid") for g in geoms], dtype=bool))
    static_plane, roll_radius, curved = table
    g1, g2 = c.geom1[idx], c.geom2[idx]
    first = static_plane[g1]
    sgn = np.where(first, 1.0, -1.0)                    # +1: the moving shape X is geom 2
    gx = np.where(first, g2, g1)
    jx = gjoint[gx]
    n = c.normal[idx]
    npl = sgn[:, None] * n                              # plane normal, out of the plane
    x = c.pos[idx] + c.dist[idx][:, None] * npl         # witness points on X
    anchor = x + roll_radius[gx][:, None] * npl         # centre / segment point / vertex
    dx = kin.point_jacobians(jx, anchor)
    Jang = None
    for r in np.flatnonzero(curved[gx] & (jx != 0)):
        kd = geoms[int(gx[r])].kind
        if Jang is None:
            Jang = kin.stacked(jx)[0][:, 3:]
        Rg = sim.geom_data.oMg[int(gx[r])].rotation
        w = Jang[r]                                     # (3, nv) angular velocity Jacobian
        m = npl[r]
        if kd == "cylinder":
            rad = geoms[int(gx[r])].size[0]
            a = Rg[:, 2]
            dvec = m - (m @ a) * a
            nd = np.linalg.norm(dvec)
            if not cylinder_lowest(int(c.point[idx[r]])):   # body-fixed rim points (a flat cap,
                continue                                    # or a tilted cap's rim samples)
            u = dvec / nd
            centre = x[r] + rad * u                     # centre of the touching cap (body-fixed)
            da = -_skew(a) @ w                          # d a = w x a
            dd_vec = -np.outer(a, m @ da) - (m @ a) * da
            du = (dd_vec - np.outer(u, u @ dd_vec)) / nd
            dx[r] = kin.point_jacobians(jx[r:r + 1], centre[None])[0] - rad * du
        else:                                           # ellipsoid: support point
            if int(c.point[idx[r]]) >= 1:               # (a body-fixed surface sample)
                continue
            E = Rg @ np.diag(np.asarray(geoms[int(gx[r])].size[:3], float) ** 2) @ Rg.T
            # (point 0: the support point along the plane's normal)
            m = ellipsoid_directions(m)[int(c.point[idx[r]])]
            y = E @ m
            s2 = float(m @ y)
            centre = x[r] + y / np.sqrt(s2)
            # d(E m) for a rotation w: w x (E m) - E (w x m)
            dy = -_skew(y) @ w + E @ _skew(m) @ w
            ds2 = m @ dy
            dg = dy / np.sqrt(s2) - np.outer(y, ds2) / (2.0 * s2 ** 1.5)
            dx[r] = kin.point_jacobians(jx[r:r + 1], centre[None])[0] - dg
    ddist = np.einsum("ki,kin->kn", npl, dx)
    dd[idx] = ddist
    dp[idx] = dx - npl[:, :, None] * ddist[:, None, :]
    dn[idx] = 0.0


# shapes whose contact against a static plane has closed-form geometry derivatives
PLANE_CLOSED_FORM = ("sphere", "capsule", "box", "cylinder", "ellipsoid", "mesh")


def closed_form_pair(kind1: str, static1: bool, kind2: str, static2: bool) -> bool:
    """Whether the contact geometry of this pair of geom kinds has closed-form derivatives
    (otherwise ``_collision_fd`` differentiates the collision output numerically)."""
    if kind1 == "plane" and static1 and kind2 in PLANE_CLOSED_FORM:
        return True
    if kind2 == "plane" and static2 and kind1 in PLANE_CLOSED_FORM:
        return True
    if kind1 in POLYTOPE_KINDS and kind2 in POLYTOPE_KINDS:
        return True                       # collision_derivatives.polytope_pair
    if {kind1, kind2} in ({"box", "capsule"}, {"mesh", "capsule"}):
        return True                       # ... with the capsule as a segment and a radius
    if kind1 == "capsule" and kind2 == "capsule":
        return True                       # collision_derivatives.capsule_pair (not parallel)
    if {kind1, kind2} == {"sphere", "capsule"}:
        return True                       # _sphere_capsule (a point against a segment)
    return (kind1 == "sphere" and kind2 == "sphere") or {kind1, kind2} == {"sphere", "box"}


def _swept(sim, g: int) -> float:
    shape = sim.geom_model.geometryObjects[g].geometry
    return shape.getSweptSphereRadius() if hasattr(shape, "getSweptSphereRadius") else 0.0


def _sphere_box(sim, kin: _Kin, k: int, gb: int, gs: int, jb: int, js: int, sgn: float,
                dp, dn, dd) -> None:
    """Closed form for contact k of box geom gb (joint jb) and sphere geom gs (joint js); sgn
    = +1 when the box is geom 1 (the normal points out of the box), else -1.

    In the box frame (R, t) the sphere centre is x = R^T (c - t) and the box point closest to
    it p = clamp(x, -h, h): on a face one coordinate is clamped, on an edge two, at a corner
    three. Its variation is dx = R^T (dc - dc_B), dc_B the velocity Jacobian of the point c
    carried by the box. Outside the box (e = x - p, L = |e|, m = e / L) the clamped
    coordinates Q of p stay put while the free ones P = I - Q follow x: dp = P dx,
    dm = (Q - m m^T) dx / L, d dist = m . dx. With the centre inside the box, m is the outward
    normal of the face of least penetration (body-fixed), p is x projected on that face
    (P = I - m m^T) and d dist = m . dx again. In the world n = R m turns with the box
    (dn = w x n + R dm), the box point moves with the box and slides by R dp, the sphere point
    is c - r n, and the contact point is their midpoint."""
    Mb, Ms = sim.geom_data.oMg[gb], sim.geom_data.oMg[gs]
    R, t, c = Mb.rotation, Mb.translation, Ms.translation
    half = np.asarray(sim.geom_model.geometryObjects[gb].geometry.halfSide, float)
    r = float(sim.geom_model.geometryObjects[gs].geometry.radius)
    x = R.T @ (c - t)
    p = np.clip(x, -half, half)
    clamped = np.abs(x) > half
    if clamped.any():
        e = x - p
        L = np.linalg.norm(e)
        m = e / L
        Q = np.diag(clamped.astype(float))
        P = np.eye(3) - Q
        Dm = (Q - np.outer(m, m)) / L
    else:
        ax = int(np.argmin(half - np.abs(x)))
        m = np.zeros(3)
        m[ax] = 1.0 if x[ax] >= 0.0 else -1.0
        p[ax] = m[ax] * half[ax]
        P = np.eye(3) - np.outer(m, m)
        Dm = np.zeros((3, 3))
    nw = R @ m
    pb = t + R @ p
    dc = kin.point_jacobian(js, c)
    w = kin.J[jb][3:] if jb else np.zeros((3, kin.nv))
    dx = R.T @ (dc - kin.point_jacobian(jb, c))
    dnw = -_skew(nw) @ w + R @ (Dm @ dx)
    dpb = kin.point_jacobian(jb, pb) + R @ (P @ dx)
    dd[k] = m @ dx
    dn[k] = sgn * dnw
    dp[k] = 0.5 * (dpb + dc - r * dnw)


def _sphere_capsule(sim, kin: _Kin, c, k: int, gc: int, gs: int, jc: int, js: int, sgn: float,
                    dp, dn, dd) -> bool:
    """Closed form for contact k of capsule geom gc (joint jc) and sphere geom gs (joint js);
    sgn = +1 when the capsule is geom 1 (the normal points out of the capsule), else -1.
    False (nothing written) where the configuration is degenerate or coal's point is not the
    one described here (the caller's fallback).

    With the capsule's axis a0 + s u (s in [0, 1]) and the sphere centre c, the axis point
    closest to c is p = a0 + s u, s the clamped projection. An interior s follows from the
    orthogonality condition (c - p) . u = 0, differentiated implicitly:
    ds = ((dc - dp_fixed) . u + e . du) / (u . u), e = c - p, dp_fixed the Jacobian of p moving
    with the capsule; a clamped s stays at its body-fixed end. With L = |e| and m = e / L (out
    of the capsule): d dist = m . de, dm = (I - m m^T) de / L, de = dc - dp, and the point is
    the midpoint of the capsule's surface point p + rc m and the sphere's c - rs m."""
    Mc, Ms = sim.geom_data.oMg[gc], sim.geom_data.oMg[gs]
    shape = sim.geom_model.geometryObjects[gc].geometry
    h, rc = float(shape.halfLength), float(shape.radius)
    rs = float(sim.geom_model.geometryObjects[gs].geometry.radius)
    ax = Mc.rotation[:, 2]
    a0, u = Mc.translation - h * ax, 2.0 * h * ax
    pc, nc_ = c.pos[k], np.asarray(c.normal[k], float)
    c = Ms.translation
    uu = float(u @ u)
    s_raw = float((c - a0) @ u) / uu if uu > 0.0 else 0.0
    s = min(max(s_raw, 0.0), 1.0)
    p = a0 + s * u
    e = c - p
    L = float(np.linalg.norm(e))
    if L < 1e-9 * max(1.0, rc + rs):
        return False
    m = e / L
    pos = 0.5 * (p + c) + 0.5 * (rc - rs) * m
    scale = max(L, rc + rs, 1e-3)
    if sgn * (m @ nc_) < 1.0 - 1e-6 or np.linalg.norm(pos - pc) > 1e-6 * scale:
        return False
    dpf = kin.point_jacobian(jc, p)
    dc = kin.point_jacobian(js, c)
    if 1e-12 < s_raw < 1.0 - 1e-12:
        w = kin.J[jc][3:] if jc else np.zeros((3, kin.nv))
        du = -_skew(u) @ w
        ds = (u @ (dc - dpf) + e @ du) / uu
        dpa = dpf + np.outer(u, ds)
    else:
        dpa = dpf
    de = dc - dpa
    Dm = (np.eye(3) - np.outer(m, m)) @ de / L
    dd[k] = m @ de
    dn[k] = sgn * Dm
    dp[k] = 0.5 * (dpa + dc) + 0.5 * (rc - rs) * Dm
    return True


def geometry_derivatives(sim, kin: _Kin, cons, skip=None) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]:
    """dp/dq (nc, 3, nv), dn/dq (nc, 3, nv), d dist/dq (nc, nv) of every contact point.
    ``skip`` (nc,) bool: rows left zero (the compiled route's ``contact_terms`` fills those it
    closes itself: shapes on a static plane, two spheres)."""
    nc = cons.nc
    nv = kin.nv            # (sim.nv, or a block's dofs: derivative_blocks, kin.cols)
    c = cons.contacts
    geoms = sim.sm.geoms
    gjoint = sim.constraints.geom_joint
    dp = np.zeros((nc, 3, nv))
    dn = np.zeros((nc, 3, nv))
    dd = np.zeros((nc, nv))
    plane, fallback = [], []
    polytope: dict = {}
    capsules: dict = {}
    cylbox: dict = {}
    convex: dict = {}
    convex_pairs = getattr(c, "convex_pairs", {})     # (set by the detect pass of these rows)
    face_pairs = getattr(c, "face_pairs", {})
    faces: dict = {}
    spheres: list = []
    skipped = skip.tolist() if skip is not None else None
    for k, (g1, g2) in enumerate(zip(c.geom1.tolist(), c.geom2.tolist())):
        if skipped is not None and skipped[k]:
            continue
        k1, k2 = geoms[g1].kind, geoms[g2].kind
        j1, j2 = int(gjoint[g1]), int(gjoint[g2])
        if int(c.pair[k]) in convex_pairs:
            convex.setdefault(int(c.pair[k]), (j1, j2, []))[2].append(k)
        elif int(c.pair[k]) in face_pairs:
            faces.setdefault(int(c.pair[k]), (j1, j2, []))[2].append(k)
        elif {k1, k2} == {"cylinder", "box"}:
            cylbox.setdefault(int(c.pair[k]), (j1, j2, []))[2].append(k)
        elif not closed_form_pair(k1, j1 == 0, k2, j2 == 0):
            fallback.append(k)
            _cd.fallback_reasons["no closed-form route (pair not refined by the driver)"] = \
                _cd.fallback_reasons.get("no closed-form route (pair not refined by the driver)", 0) + 1
        elif (k1 in POLYTOPE_KINDS or k1 == "capsule") and (k2 in POLYTOPE_KINDS or k2 == "capsule") \
                and not (k1 == "capsule" and k2 == "capsule"):
            polytope.setdefault(int(c.pair[k]), (j1, j2, []))[2].append(k)
        elif k1 == "capsule" and k2 == "capsule":
            capsules.setdefault(int(c.pair[k]), (j1, j2, []))[2].append(k)
        elif {k1, k2} == {"sphere", "box"}:
            if _swept(sim, g1) or _swept(sim, g2):       # (coal's rounded box: no closed form)
                fallback.append(k)
            elif k1 == "box":
                _sphere_box(sim, kin, k, g1, g2, j1, j2, 1.0, dp, dn, dd)
            else:
                _sphere_box(sim, kin, k, g2, g1, j2, j1, -1.0, dp, dn, dd)
        elif {k1, k2} == {"sphere", "capsule"}:
            if k1 == "capsule":
                ok = _sphere_capsule(sim, kin, c, k, g1, g2, j1, j2, 1.0, dp, dn, dd)
            else:
                ok = _sphere_capsule(sim, kin, c, k, g2, g1, j2, j1, -1.0, dp, dn, dd)
            if not ok:
                fallback.append(k)
        elif k1 == "sphere" and k2 == "sphere":
            spheres.append((k, g1, g2, j1, j2))           # (all at once below)
        else:
            plane.append(k)
    if spheres:
        # two spheres: with the centres c1, c2 moving with their bodies, r = c2 - c1, L = |r|,
        # n = r / L: dn = (I - n n^T) dr / L, dd = n . dr, and the point (the midpoint of the
        # surface points c1 + r1 n, c2 - r2 n) dp = (dc1 + dc2) / 2 + (r1 - r2) / 2 dn
        ks, g1s, g2s, j1s, j2s = (np.array(x, dtype=np.int64) for x in zip(*spheres))
        oMg = sim.geom_data.oMg
        c1 = np.array([oMg[int(g)].translation for g in g1s]).reshape(-1, 3)
        c2 = np.array([oMg[int(g)].translation for g in g2s]).reshape(-1, 3)
        r1 = np.array([geoms[int(g)].size[0] for g in g1s], dtype=float)
        r2 = np.array([geoms[int(g)].size[0] for g in g2s], dtype=float)
        dc1, dc2 = kin.point_jacobians(j1s, c1), kin.point_jacobians(j2s, c2)
        dr = dc2 - dc1
        nrm = c.normal[ks]
        L = np.sqrt(np.einsum("ki,ki->k", c2 - c1, c2 - c1))
        ddk = np.einsum("ki,kin->kn", nrm, dr)
        dnk = (dr - nrm[:, :, None] * ddk[:, None, :]) / L[:, None, None]
        dn[ks] = dnk
        dd[ks] = ddk
        dp[ks] = 0.5 * (dc1 + dc2) + (0.5 * (r1 - r2))[:, None, None] * dnk
    deferred: list = []       # margin rows whose pair's contact row takes the fallback
    if polytope:
        # every polytope pair of the step in one compiled call (collision_derivatives)
        try:
            fallback += polytope_pairs(sim, kin, c, list(polytope.values()), dp, dn, dd,
                                       deferred)
        except (np.linalg.LinAlgError, FloatingPointError, ValueError, ZeroDivisionError):
            fallback += [k for _, _, rows in polytope.values() for k in rows]   # (degenerate)
    for route, groups in ((capsule_pair, capsules), (cylinder_box_pair, cylbox),
                          (convex_pair, convex), (face_pair, faces)):
        for j1, j2, rows in groups.values():
            try:
                with np.errstate(divide="raise", invalid="raise", over="raise"):
                    left = route(sim, kin, c, rows, j1, j2, dp, dn, dd)
            except (np.linalg.LinAlgError, FloatingPointError, ValueError, ZeroDivisionError):
                left = list(rows)             # a degenerate configuration: the fallback
            done = [k for k in rows if k not in left]
            if done and not (np.isfinite(dp[done]).all() and np.isfinite(dn[done]).all()
                             and np.isfinite(dd[done]).all()):
                left = list(rows)
            fallback += left
    if plane:
        _plane_contacts(sim, kin, cons, np.array(plane), dp, dn, dd)
    if fallback:
        _note_fallback(sim, c, fallback)
        cols = getattr(kin, "cols", None)
        if cols is None:
            _collision_fd(sim, cons, fallback, dp, dn, dd)
        else:                      # (a block's dofs only: derivative_blocks)
            _collision_fd(sim, cons, fallback, dp, dn, dd, cols)
    for job in deferred:           # (on the contact row's derivatives the fallback gave)
        left = margin_vertex_rows(sim, kin, c, *job, dp, dn, dd)
        if left:
            _note_fallback(sim, c, left)
            _collision_fd(sim, cons, left, dp, dn, dd, getattr(kin, "cols", None))
    return dp, dn, dd


# contact rows whose geometry derivatives took the finite-difference fallback, per pair of geom
# kinds, since the process started (``fallback_counts``); the first of each kind pair warns
fallback_counts: dict = {}


def _note_fallback(sim, c, rows) -> None:
    import warnings
    geoms = sim.sm.geoms
    for k in rows:
        key = tuple(sorted((geoms[int(c.geom1[k])].kind, geoms[int(c.geom2[k])].kind)))
        if key not in fallback_counts:
            fallback_counts[key] = 0
            warnings.warn(f"contact geometry derivatives of a {key[0]}-{key[1]} pair "
                          f"({geoms[int(c.geom1[k])].name}, {geoms[int(c.geom2[k])].name}) "
                          "use a finite difference of the collision output (no closed form for "
                          "this pair or configuration)", RuntimeWarning, stacklevel=3)
        fallback_counts[key] += 1


def _collision_fd_context(sim, q):
    """(GeometryData at q, the narrow phase's per-pair coal objects) of the collision output's
    central differences (``_collision_fd``, ``mocap._collision_fd_mocap``): this function's own,
    the simulator's kinematics arrays stay as the step left them."""
    model = sim.model
    trees = sim.__dict__.get("_trees")
    gdata = pin.GeometryData(sim.geom_model)
    if trees is not None:
        fd_trees = sim.__dict__.get("_fd_trees")
        if fd_trees is None:
            from .trees import TreeGroups
            fd_trees = sim.__dict__["_fd_trees"] = TreeGroups(model)
        fd_trees.kinematics(q, np.zeros(sim.nv), jacobians=False)
        fd_trees.geometry_placements(sim.geom_model, gdata)
    else:
        data = model.createData()
        pin.framesForwardKinematics(model, data, q)
        pin.updateGeometryPlacements(model, data, sim.geom_model, gdata)
    nph = sim.__dict__.get("_fd_narrow")
    if nph is None:
        from .collision_driver import GJK_TOLERANCE
        from .pair_tables import NarrowPhase
        nph = sim.__dict__["_fd_narrow"] = NarrowPhase(sim.geom_model, sim.sm.pairs,
                                                       GJK_TOLERANCE)
    return gdata, nph


def _pair_output(nph, gdata, c, k):
    """(point, normal, distance) of contact k's pair by coal at the placements of ``gdata``: the
    patch point nearest the step's point ``c.pos[k]``."""
    pair = int(c.pair[k])
    req, cres, pres = nph.slot(pair)
    # no GJK guess carried from the last evaluation: the difference is a function of the state
    # alone, not of which queries came before (the first Jacobian after a step otherwise
    # differed from the later ones)
    req.enable_cached_gjk_guess = False
    req.security_margin = 1.0
    req.enable_contact = True
    nph.collide(pair, gdata)
    nph.patch(pair, gdata)
    if pres.numContactPatches():
        patch = pres.getContactPatch(0)
        m = patch.size()
        P1 = np.array([patch.getPointShape1(t) for t in range(m)])
        P2 = np.array([patch.getPointShape2(t) for t in range(m)])
        nrm = np.asarray(patch.getNormal()).copy()
    else:
        ct = cres.getContact(0)
        P1, P2 = ct.getNearestPoint1()[None], ct.getNearestPoint2()[None]
        nrm = np.asarray(ct.normal).copy()
    mid = 0.5 * (P1 + P2)
    t = int(np.argmin(np.linalg.norm(mid - c.pos[k], axis=1)))
    return mid[t], nrm, float(nrm @ (P2[t] - P1[t]))


def _collision_fd(sim, cons, idx, dp, dn, dd, cols=None) -> None:
    """Central difference of the collision output alone for pairs without a closed form
    (``cols``: the dofs of dp's columns, None: all)."""
    model, q = sim.model, sim.cache["q"]
    trees = sim.__dict__.get("_trees")
    gdata, nph = _collision_fd_context(sim, q)
    fd_trees = sim.__dict__.get("_fd_trees") if trees is not None else None
    data = None if trees is not None else model.createData()
    c = cons.contacts
    for a, i in enumerate(range(sim.nv) if cols is None else cols.tolist()):
        outs = []
        for sgn in (1.0, -1.0):
            e = np.zeros(sim.nv)
            e[i] = sgn * collision_fd_eps
            qe = pin.integrate(model, q, e)
            if data is None:
                fd_trees.kinematics(qe, np.zeros(sim.nv), jacobians=False)
                fd_trees.geometry_placements(sim.geom_model, gdata)
            else:
                pin.framesForwardKinematics(model, data, qe)
                pin.updateGeometryPlacements(model, data, sim.geom_model, gdata)
            nph.new_placements()
            outs.append({k: _pair_output(nph, gdata, c, k) for k in idx})
        for k in idx:
            (pa, na, da), (pb, nb, db) = outs[0][k], outs[1][k]
            dp[k][:, a] = (pa - pb) / (2 * collision_fd_eps)
            dn[k][:, a] = (na - nb) / (2 * collision_fd_eps)
            dd[k][a] = (da - db) / (2 * collision_fd_eps)


def _mode_system(res, G, nc, mu):
    """A = dF/dlam and the weights W of d sigma in dF (F linear in d sigma: dF = A dlam + W dsig)."""
    m = G.shape[0]
    A = np.zeros((m, m))
    W = np.zeros((m, m))
    lam, sigma = res.lam, res.sigma
    for i in range(nc):
        r = slice(3 * i, 3 * i + 3)
        mode = res.modes[i]
        if mode == BREAKING:
            A[r, r] = np.eye(3)
        elif mode == STICKING:
            A[r] = G[r]
            W[r, r] = np.eye(3)
        else:
            A[3 * i + 2] = G[3 * i + 2]
            W[3 * i + 2, 3 * i + 2] = 1.0
            st = sigma[3 * i:3 * i + 2]
            nst = np.linalg.norm(st)
            if mu[i] == 0.0 or nst < 1e-14:
                A[3 * i:3 * i + 2, 3 * i:3 * i + 2] = np.eye(2)
                continue
            u = st / nst
            # the slip-direction rows divided by 1 + f, f = mu lam_N / ||sigma_T|| (an equivalent
            # system): at a slip of 1e-8 f is ~1e6 and, unscaled, these rows dwarf the others,
            # so the least-squares rank cut-off of a rank-deficient A (relative to its largest
            # singular value) discarded genuine directions: a box settling on three feet with
            # one foot creeping got d v1 entries of 6e-6 where the step's are 1e-10
            f = mu[i] * lam[3 * i + 2] / nst
            e = 1.0 / (1.0 + f)
            P = (e * f) * (np.eye(2) - np.outer(u, u))
            A[3 * i:3 * i + 2, 3 * i:3 * i + 2] = e * np.eye(2)
            A[3 * i:3 * i + 2, 3 * i + 2] = e * mu[i] * u
            A[3 * i:3 * i + 2] += P @ G[3 * i:3 * i + 2]
            W[3 * i:3 * i + 2, 3 * i:3 * i + 2] = P
    for jl in range(m - 3 * nc):
        k = 3 * nc + jl
        if res.limit_active[jl]:
            A[k] = G[k]
            W[k, k] = 1.0
        else:
            A[k, k] = 1.0
    return A, W


try:      # numpy's LAPACK gufuncs without np.linalg's Python wrappers (the same numbers)
    from numpy.linalg import _umath_linalg as _ul
    _ul.svd, _ul.solve, _ul.lstsq   # noqa: B018
except (ImportError, AttributeError):   # pragma: no cover - another numpy
    _ul = None


def _finish_rank_in_doubt(A, WD, JM, Vq, Vv, Vt, dI_dq, dI_dv, dt):
    """The six step blocks where ``dynamics_terms`` left the rank in doubt (status 2; it then
    returns the mode system ``A``, its right-hand side ``WD``, ``JM`` and the free parts ``Vq``,
    ``Vv``, ``Vt`` in the six output slots): the impulse derivatives by the reference's
    minimum-norm solve, then dv and dq (``dI_dq``, ``dI_dv``: dIntegrate)."""
    n = Vq.shape[1]
    MJt_dlam = JM.T @ _solve_min_norm(A, -WD)
    dv_dq = Vq + MJt_dlam[:, :n]
    dv_dv = Vv + MJt_dlam[:, n:2 * n]
    dv_dtau = Vt + MJt_dlam[:, 2 * n:]
    return (dI_dq + dt * dI_dv @ dv_dq, dt * dI_dv @ dv_dv, dt * dI_dv @ dv_dtau,
            dv_dq, dv_dv, dv_dtau)


def _solve_min_norm(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """A X = B by LU where A is well conditioned, else the minimum-norm least-squares solution
    (redundant contacts make A rank deficient; d v1 is unique even where d lam is not)."""
    if _ul is not None and A.size and A.ndim == 2 and B.ndim == 2 and B.shape[1] \
            and A.dtype == np.float64 and B.dtype == np.float64:
        with np.errstate(all="ignore"):
            sv = _ul.svd(A, signature="d->d")
            if np.isfinite(sv).all():
                if sv[-1] > 1e-8 * sv[0]:
                    X = _ul.solve(A, B, signature="dd->d")
                else:
                    X = _ul.lstsq(A, B, 1e-12, signature="ddd->ddid")[0]
                if np.isfinite(X).all():
                    return X
    if A.size:
        sv = np.linalg.svd(A, compute_uv=False)
        if sv[-1] > 1e-8 * sv[0]:
            return np.linalg.solve(A, B)
    return np.linalg.lstsq(A, B, rcond=1e-12)[0]


def _restitution(cons):
    """The contacts' coefficients of the impact-law rows of the step (nc,), or None if none."""
    rest = getattr(cons, "restitution", None)
    if rest is None or not cons.nc or not np.any(rest):
        return None
    return rest


def _closing(cons):
    """(nc,) bool: the impact-law contacts closing short of contact this step (their normal
    row's offset is ``d / dt``, constraint.restitution_bias), or None if none."""
    t = getattr(cons, "restitution_time", None)
    if t is None or not cons.nc or not np.any(t < 0.0):
        return None
    return t < 0.0


def _closing_time(sim, cons, C):
    """(nc,) the time left in the step for each contact, ``rem``: the offset of a row closing
    short of contact is ``d / rem`` (constraint.restitution_bias); ``dt``, or on a later pass of
    impact_time.impact_substep ``dt - spent`` (the time drifted by the dofs of its tree)."""
    rem = np.full(cons.nc, float(sim.dt))
    pre = C.get("impact_pre") if C is not None else None
    if pre is not None and cons.nc:
        from .impact_time import consumed_time
        spent = consumed_time(pre[1])
        cb, c = sim.constraints, cons.contacts
        tr = cb.joint_tree[cb.geom_joint[c.geom1]]
        tr = np.where(tr >= 0, tr, cb.joint_tree[cb.geom_joint[c.geom2]])
        rem = np.where(tr >= 0, sim.dt - spent[np.maximum(tr, 0)], rem)
    return rem


def _closing_spent(sim, C, system):
    """A later pass's rows closing short of contact (``b = d / (dt - S)``, ``S`` the time
    drifted, a function of the step's state): ``(P, ks, d / rem^2)`` with ``P = M^-1 J^T d lam /
    d b`` the response of ``v1`` to their offsets, for impact_time.correct_jacobian to chain
    ``d b = (d / rem^2) d S``; None without such a row (zero where the row is inactive, as the
    free motion leaves it)."""
    if C.get("impact_pre") is None:
        return None
    cons, res = C["cons"], C["res"]
    closing = _closing(cons) if cons is not None else None
    if closing is None:
        return None
    ks = np.flatnonzero(closing)
    rem = _closing_time(sim, cons, C)[ks]
    d = np.asarray(cons.dist, dtype=float)[ks]
    m = cons.m
    A, W = _mode_system(res, C["G"], cons.nc, cons.mu) if system is None else system
    E = np.zeros((m, len(ks)))
    E[3 * ks + 2, np.arange(len(ks))] = 1.0
    dlam = _solve_min_norm(A, -(W @ E))
    Minv = C["Minv"]
    if Minv is None:
        return None
    Minv = np.triu(Minv) + np.triu(Minv, 1).T
    return Minv @ (cons.J.T @ dlam), ks, d / rem ** 2


def realizable_islands(sim, cons):
    """The islands whose drift correction the step replaced by its realizable projection
    (``SolverSettings.realizable_bias``, ``solver_kernels.solve_stage1``'s retry): a list of
    (rows S (global indices, increasing), their raw offsets ``b_S``), read from the step's own
    record ``cons.projected`` (per row the island whose offsets were projected, and the offsets
    before the projection), which the step writes where it projects."""
    rec = getattr(cons, "projected", None) if cons is not None else None
    if rec is None:
        return []
    proj, braw = rec
    out = []
    for s in np.unique(proj[proj >= 0]).tolist():
        S = np.flatnonzero(proj == s).astype(np.int64)
        out.append((S, np.array(braw[S], dtype=float)))
    return out


def _realizable_terms(sim, cons, geometry, JT=None):
    """The change of ``Dq_extra`` (m, nv) where the step solved with the realizable drift
    correction (``realizable_islands``), or None. On an island's projected rows S the offsets
    are ``b' = P b`` with ``P = J_S J_S^#`` the orthogonal projector onto the range of J_S
    (``J_S^# = M^-1 J_S^T G_SS^+``, so ``P = G_SS G_SS^+``: the forward step's own projector)
    and b the raw offsets, so at a constant rank

        d b' = P db + dP b,   dP b = (I - P) dJ_S v_c + (J_S^#)^T dJ_S^T r,

    ``v_c = J_S^# b`` (the velocity realizing b'), ``r = (I - P) b = b - b'`` (what was taken
    off). (From ``P J = J``: ``dP J = (I - P) dJ``, so ``dP P = (I - P) dJ J^#``, and ``dP = dP P
    + P dP`` with ``P dP = (dP P)^T``; any J^# with ``J J^# = P`` gives the same dP.) ``Dq_extra``
    holds ``db`` (the Baumgarte gain times d dist/dq) on those rows: this adds ``(P - I) db``
    and the two dP terms, with ``dJ_S`` from ``derivative_kernels.projection_terms`` (contact
    rows; limit rows are constant). ``geometry``: (dp, dn, dd) of every contact or a function
    returning them (called only where an island was projected); ``JT``: the WORLD joint
    Jacobian columns at q (nv, 6), else computed here."""
    isl = realizable_islands(sim, cons)
    if not isl:
        return None
    dp, dn, dd = geometry() if callable(geometry) else geometry
    model, nv, nc = sim.model, sim.nv, cons.nc
    cb = sim.constraints
    G = sim.cache["G"]
    Minv = np.asarray(sim.cache["Minv"], dtype=float)
    Minv = np.triu(Minv) + np.triu(Minv, 1).T       # (only the upper triangle may be filled)
    q, v1 = sim.cache["q"], sim.cache["v1"]
    if JT is None:
        trees = sim.__dict__.get("_trees")
        if trees is None:
            data = getattr(sim, "_dproj", None)
            if data is None:
                data = sim._dproj = model.createData()
            pin.computeJointJacobians(model, data, q)
            JT = np.ascontiguousarray(data.J.T)
        else:
            JT = np.ascontiguousarray(trees.kinematics_derivatives(q, v1, np.zeros(nv)).J.T)
    JT = np.ascontiguousarray(JT, dtype=float).reshape(nv, 6)
    tabs = getattr(sim, "_dproj_tables", None)
    if tabs is None or tabs[0].shape[0] != nv:
        dof_joint = np.zeros(nv, dtype=np.int64)
        for j in range(1, model.njoints):
            jm = model.joints[j]
            dof_joint[jm.idx_v:jm.idx_v + jm.nv] = j
        tabs = sim._dproj_tables = (dof_joint, np.array([int(p) for p in model.parents],
                                                        dtype=np.int64))
    dof_joint, parents = tabs
    c = cons.contacts
    gj = cb.geom_joint
    dt, erp, skin = sim.dt, cb.erp, cb.skin
    cap = depenetration_speed(sim.solver)
    J = cons.J
    out = np.zeros((cons.m, nv))
    for S, braw in isl:
        Gs = np.asarray(G[np.ix_(S, S)], dtype=float)
        Gs = 0.5 * (Gs + Gs.T)
        U, sv, Vt = np.linalg.svd(Gs)
        rank = int(np.sum(sv > 1e-11 * sv[0])) if len(sv) and sv[0] > 0.0 else 0
        Ur = U[:, :rank]
        Gp = (Vt[:rank].T / sv[:rank]) @ Ur.T             # G_SS^+
        P = Ur @ Ur.T
        JS = np.asarray(J[S], dtype=float)
        vc = Minv @ (JS.T @ (Gp @ braw))
        resid = braw - cons.b[S]                           # (I - P) b, as the step took it off
        ks = np.unique(S[S < 3 * nc] // 3)
        kpos = {int(k): i for i, k in enumerate(ks.tolist())}
        rk = np.zeros((len(ks), 3))
        for a, r in enumerate(S.tolist()):
            if r < 3 * nc:
                rk[kpos[r // 3], r % 3] = resid[a]
        dnk = dn[ks]
        moving = np.abs(dnk).reshape(len(ks), -1).max(axis=1, initial=0.0) > 0.0
        dR = _frame_derivatives(c.normal[ks], dnk)
        T1, X = K.projection_terms(
            JT, cb.support, dof_joint, parents,
            np.ascontiguousarray(gj[c.geom1[ks]], dtype=np.int64),
            np.ascontiguousarray(gj[c.geom2[ks]], dtype=np.int64),
            np.ascontiguousarray(c.pos[ks], dtype=float),
            np.ascontiguousarray(cons.frames[ks], dtype=float),
            np.ascontiguousarray(dp[ks], dtype=float), np.ascontiguousarray(dR),
            moving, np.ascontiguousarray(vc), rk)
        ns = len(S)
        T1s = np.zeros((ns, nv))
        db = np.zeros((ns, nv))
        for a, r in enumerate(S.tolist()):
            if r < 3 * nc:
                T1s[a] = T1[kpos[r // 3], r % 3]
                if r % 3 == 2:          # (the gain of the offset: 0 where the cap acts)
                    k = r // 3
                    db[a] = baumgarte_gain(cons.dist[k:k + 1], dt, erp, skin, cap)[0] * dd[k]
            else:
                lim = sim.sm.limits[int(cons.limits[r - 3 * nc])]
                db[a, lim.idx_v] = (erp / dt) * lim.sign
        IP = np.eye(ns) - P
        out[S] += -(IP @ db) + IP @ T1s + Gp @ (JS @ (Minv @ X))
    return out


def _joint_torques(sim, cons, res) -> np.ndarray:
    """The generalized forces at which the ABA derivatives are evaluated: the applied and passive
    forces plus the active joint-limit impulses as joint torques (``J_lim^T lam_lim / dt``).
    The contact impulses enter as external forces (``fext``); the limit impulses act on the
    joints themselves, and ``d(M^-1 tau)/dq`` needs them in ``tau``: without them a limit row
    under load makes ``dv/dq`` wrong wherever M depends on q (a cart at its stop)."""
    tau = sim.cache["tau_total"]
    if cons is None or cons.m == 3 * cons.nc:
        return tau
    k = 3 * cons.nc
    limits = sim.sm.limits
    out = tau.copy()
    inv_dt = 1.0 / sim.dt
    for li, lam in zip(cons.limits.tolist(), res.lam[k:].tolist()):
        lim = limits[li]
        out[lim.idx_v] += lim.sign * lam * inv_dt
    xr = getattr(cons, "extra", None)
    if xr is not None and xr.m:
        # the rows of diffgym.sim.equality acting on joints (coupling, friction, ball and tendon
        # limits) as joint torques; connect and weld impulses are external forces (fext)
        s0 = k + len(cons.limits)
        lam_x = np.where(sim._extra.spatial_rows(xr), 0.0, res.lam[s0:])
        out += (xr.J.T @ lam_x) * inv_dt
    return out


def _with_long_range(sim, ddq_dq: np.ndarray, Minv: np.ndarray) -> np.ndarray:
    """``ddq_dq`` plus ``M^-1 d(tau_lr)/dq`` in the long_range mode: the potential's force is
    part of the applied forces (``tau_total``) at which the ABA derivatives were taken at fixed
    tau; its own dependence on q is added here (like a joint spring's)."""
    mode = getattr(sim, "gradient", None)
    if mode is None or mode.name != "long_range":
        return ddq_dq
    K = sim.long_range.force_derivative()
    if not K.any():
        return ddq_dq
    Minv = np.triu(Minv) + np.triu(Minv, 1).T          # (only the upper triangle may be filled)
    return ddq_dq + Minv @ K


def relaxed_derivative(mode) -> bool:
    """Whether ``mode``'s Jacobian is taken through the relaxed contact problem
    (``diffgym.sim.smoothing``): the smooth mode, and the long_range mode with ``rho`` set."""
    return mode.name == "smooth" or (mode.name == "long_range" and mode.rho is not None)


def step_jacobian(sim, compiled: bool | None = None) -> StepJacobian:
    """Jacobian of the step that ``sim`` just took (uses ``sim.cache``).

    ``compiled``: the numba route (``derivative_kernels``; the default, see ``COMPILED``) or the
    numpy reference below (False). Both give the same numbers to rounding; the compiled route
    falls back to the reference where it does not apply (mimic joints, non-finite data).
    Gives the derivative of ``sim.gradient`` (diffgym.sim.gradient_modes): smooth and long_range
    with ``rho`` take the contact part through ``smoothing.relaxed_view``; long_range adds its
    force's derivative (``_with_long_range``) on either route."""
    mode = getattr(sim, "gradient", None)
    C, system = sim.cache, None
    if mode is not None and relaxed_derivative(mode):
        if sim.__dict__.get("_extra") is not None:
            raise NotImplementedError(
                f"gradient mode {mode!r} (the relaxed contact derivative) does not cover the rows "
                "of diffgym.sim.equality (equality constraints, joint frictionloss, ball-joint and "
                "tendon limits) yet; use 'exact' (or 'long_range' without rho)")
        # the relaxed problem's solution replaces the exact one in every stage, and its
        # linearized conditions replace the mode system (diffgym.sim.smoothing)
        from .smoothing import relaxed_view
        C, system = relaxed_view(sim, mode.rho)
    elif mode is not None and mode.name not in ("exact", "long_range"):
        raise NotImplementedError(f"gradient mode {mode.name!r} is not implemented")
    out = None
    if sim.__dict__.get("_extra") is not None or sim.__dict__.get("_mocap") is not None:
        # the rows of diffgym.sim.equality, mocap bodies (moving world geoms): the numpy route
        compiled = False
    sparse = _db.wants_sparse(sim)
    if (COMPILED if compiled is None else compiled) and (sparse or sim.nv >= _db.BLOCK_MIN_NV) \
            and _db.applies(sim, C, system):
        # block by block, memory linear in the bodies (diffgym.sim.derivative_blocks)
        out = _db.step_jacobian_blocks(sim, C, sparse)
    if out is None and (COMPILED if compiled is None else compiled):
        out = _step_jacobian_compiled(sim, C, system)
    if out is None:
        out = _step_jacobian_reference(sim, C, system)
    # the gravity term of Newton's impact law (constraint.restitution_bias), on either route
    bias = _impact_gravity(sim, C, system, out)
    # an ellipsoid's support point on a plane: the second-order offset (support_drift; never
    # with restitution, so never with the impact terms below), on either route
    _support_drift.correct_jacobian(sim, C, system, out)
    C = sim.cache
    if C.get("impact_times") is not None or C.get("impact_pre") is not None:
        # impacts at their time inside the step (diffgym.sim.impact_time)
        from .impact_time import correct_jacobian
        cl = _closing_spent(sim, C, system)
        if cl is not None and C.get("impact_pre") is not None:
            bias = cl if bias is None else (np.hstack([bias[0], cl[0]]),
                                            np.concatenate([bias[1], cl[1]]),
                                            np.concatenate([bias[2], cl[2]]), bias[3])
        correct_jacobian(sim, out, C, bias if C.get("impact_pre") is not None else None)
    elif bias is not None:
        # (the q1 rows of the plain step, q1 = q (+) dt v1, from the corrected v1 rows)
        dI_dv = pin.dIntegrate(sim.model, C["q"], C["v1"] * sim.dt, pin.ArgumentPosition.ARG1)
        dq_v = sim.dt * dI_dv
        out.dq_dq = out.dq_dq + dq_v @ bias[3][0]
        out.dq_dv = out.dq_dv + dq_v @ bias[3][1]
        out.dq_dtau = out.dq_dtau + dq_v @ bias[3][2]
    if sparse and isinstance(out.dq_dq, np.ndarray):     # (a route without blocks)
        import scipy.sparse as sp
        for name in ("dq_dq", "dq_dv", "dq_dtau", "dv_dq", "dv_dv", "dv_dtau"):
            setattr(out, name, sp.csr_matrix(getattr(out, name)))
    if sim.__dict__.get("_mocap") is not None:
        # d(q1, v1) / d(mocap pos, rot, vel, angvel), when first read (diffgym.sim.mocap)
        from .mocap import MocapColumns
        out.mocap_columns = MocapColumns(sim, C, None if system is None else (
            f"gradient mode {mode.name!r}: the relaxed contact derivative does not cover the "
            "mocap parameters"))
    # (G made dense only if the diagnostics' margins or conditioning are read: a step kept in
    # per-island storage, island_step.BlockCache, holds it per island)
    G = C["G"] if "G" in dict.keys(C) else (lambda: C["G"])
    out.diagnostics = JacobianDiagnostics(sim, C["cons"], C["res"], G)
    return out


def _free_acceleration_derivatives(sim, q, v, tau_total):
    """d a_free / d(q, v, tau) (nv, nv) each: the acceleration of the free motion (applied and
    passive forces, no constraint impulse), as the step's fixed-impulse terms are taken."""
    model, nv = sim.model, sim.nv
    trees = sim.__dict__.get("_trees")
    if trees is not None:
        ddq_dq, ddq_dv, Minv = trees.aba_derivatives(q, v, tau_total,
                                                     np.zeros((model.njoints, 6)))
    else:
        data = getattr(sim, "_dfree", None)
        if data is None:
            data = sim._dfree = model.createData()
        ddq_dq, ddq_dv, Minv = pin.computeABADerivatives(model, data, q, v, tau_total)
    Minv = np.triu(Minv) + np.triu(Minv, 1).T          # (only the upper triangle may be filled)
    Fq = _with_long_range(sim, np.array(ddq_dq), Minv)
    Fv = np.array(ddq_dv)
    if len(sim._stiff_idx):
        Fq[:, sim._stiff_idx] -= Minv[:, sim._stiff_idx] * sim._stiff_k
    if np.any(sim.sm.damping):
        Fv -= Minv * sim.sm.damping[None, :]
    ex = sim.__dict__.get("_extra")
    if ex is not None and ex.passive:      # fixed tendons' springs and dampers
        Kq, tendon_dv = ex.passive_jacobians(q)
        Fq += Minv @ Kq
        Fv += Minv @ tendon_dv
    return Fq, Fv, Minv


def _impact_gravity(sim, C, system, jac):
    """The gravity term of Newton's impact law, ``b_N = e u + c a_n + ...`` with ``c = (1 + e) T
    + (e - 1) dt / 2`` and ``a_n = J_N a_free`` (constraint.restitution_bias): the routes
    differentiate ``e u`` (and the Baumgarte part); here ``c d a_n`` is added to ``jac``'s
    velocity rows (in place) through ``P = M^-1 J^T d lam / d b_N``, the response of the step's
    velocity to the offsets of the impact-law rows (the same mode system). Returns None without
    an impact-law row, else ``(P, ks, (1 + e) a_n, (dv_dq, dv_dv, dv_dtau) added)``: ``T``'s own
    dependence on the state (a later pass of impact_substep) is chained by
    ``impact_time.correct_jacobian``."""
    cons, res = C["cons"], C["res"]
    rest = _restitution(cons) if cons is not None else None
    if rest is None:
        return None
    from .impact_time import normal_rate_derivatives
    dt = sim.dt
    ks = np.flatnonzero(rest > 0.0)
    e = rest[ks]
    T = getattr(cons, "restitution_time", None)
    T = np.zeros(len(ks)) if T is None else np.asarray(T, dtype=float)[ks]
    c = (1.0 + e) * T + 0.5 * (e - 1.0) * dt
    S = sim.cache              # (C: the step's cache or the smooth mode's view of it)
    q, v = S["q"], S["v"]
    a_free = (S["v_free"] - v) / dt
    rows = 3 * ks + 2
    JN = cons.J[rows]
    Fq, Fv, Minv = _free_acceleration_derivatives(sim, q, v, S["tau_total"])
    du = normal_rate_derivatives(sim, cons, q, a_free)[1][ks]     # d(J_N w)/dq at w = a_free
    Bq = c[:, None] * (du + JN @ Fq)
    Bv = c[:, None] * (JN @ Fv)
    Bt = c[:, None] * (JN @ Minv)
    # d lam / d b: the step's linearized conditions (A d lam = -W d g) for d g = d b_N
    m = cons.m
    A, W = _mode_system(res, C["G"], cons.nc, cons.mu) if system is None else system
    E = np.zeros((m, len(ks)))
    E[rows, np.arange(len(ks))] = 1.0
    dlam = _solve_min_norm(A, -(W @ E))
    P = Minv @ (cons.J.T @ dlam)
    add = (P @ Bq, P @ Bv, P @ Bt)
    jac.dv_dq = jac.dv_dq + add[0]
    jac.dv_dv = jac.dv_dv + add[1]
    jac.dv_dtau = jac.dv_dtau + add[2]
    return P, ks, (1.0 + e) * (JN @ a_free), add


def _step_jacobian_reference(sim, C=None, system=None) -> StepJacobian:
    """The numpy reference of ``step_jacobian`` (``C``: the step's cache, or the smooth mode's
    relaxed view of it; ``system``: ``(A, W)`` replacing the mode system)."""
    C = sim.cache if C is None else C
    model = sim.model
    nv, dt = sim.nv, sim.dt
    q, v, v1, q1 = C["q"], C["v"], C["v1"], C["q1"]
    cons, res = C["cons"], C["res"]
    data = getattr(sim, "_ddata", None)
    if data is None:
        data = sim._ddata = model.createData()
    damping = sim.sm.damping
    const = getattr(sim, "_dconst", None)
    if const is None or const[0].shape != (nv, nv):
        # per-model constants: identity, upper-triangle mask, passive-force derivatives
        dpassive_dq = np.zeros((nv, nv))
        if len(sim._stiff_idx):
            dpassive_dq[sim._stiff_idx, sim._stiff_idx] = -sim._stiff_k
        const = sim._dconst = (np.eye(nv), np.triu(np.ones((nv, nv), dtype=bool)),
                               dpassive_dq if len(sim._stiff_idx) else None, bool(np.any(damping)))
    eye, upper, dpassive_dq, damped = const
    ex = sim.__dict__.get("_extra")
    tendon_dv = None
    if ex is not None and ex.passive:      # fixed tendons' springs and dampers
        Kq, tendon_dv = ex.passive_jacobians(q)
        dpassive_dq = Kq if dpassive_dq is None else dpassive_dq + Kq

    fext = [pin.Force.Zero() for _ in range(model.njoints)]
    if cons is not None:
        nc = cons.nc
        c = cons.contacts
        gj = sim.constraints.geom_joint
        j1s, j2s = gj[c.geom1], gj[c.geom2]
        kin = _Kin(model, data, q, v1, np.concatenate([j1s, j2s]))
        lam_c = res.lam[:3 * nc].reshape(nc, 3)
        f_world = np.einsum("kij,kj->ki", cons.frames, lam_c) if nc else np.zeros((0, 3))
        # contact impulses as external forces, summed per joint (world axes, about its origin)
        for js, sgn in ((j1s, -1.0), (j2s, 1.0)):
            if not js.any():
                continue
            _, o, _, _ = kin.stacked(js)
            f = (sgn / dt) * f_world
            tq = _cross(c.pos - o, f[:, :, None])[:, :, 0]
            for j in sorted(set(js.tolist()) - {0}):     # (as np.unique of the nonzero ones)
                sel = js == j
                Rj = kin.R[int(j)]
                fext[j] = fext[j] + pin.Force(Rj.T @ f[sel].sum(axis=0), Rj.T @ tq[sel].sum(axis=0))
    xterms = None
    xr = getattr(cons, "extra", None) if cons is not None else None
    if xr is not None and xr.m:
        # the rows of diffgym.sim.equality: kinematic terms, connect/weld impulses into fext
        s0 = 3 * cons.nc + len(cons.limits)
        xterms = (s0,) + ex.kinematic_derivatives(q, v1, res.lam[s0:], xr, dt, fext)
    ddq_dq, ddq_dv, Minv = pin.computeABADerivatives(model, data, q, v,
                                                     _joint_torques(sim, cons, res), fext)
    Minv = np.where(upper, Minv, Minv.T)               # pinocchio fills the upper triangle
    ddq_dq = _with_long_range(sim, ddq_dq, Minv)
    Vq = dt * (ddq_dq + Minv @ dpassive_dq) if dpassive_dq is not None else dt * ddq_dq
    Vv = eye + dt * (ddq_dv - Minv * damping[None, :]) if damped else eye + dt * ddq_dv
    if tendon_dv is not None:
        Vv = Vv + dt * (Minv @ tendon_dv)
    Vt = dt * Minv
    if cons is not None and cons.m:
        J, G = cons.J, C["G"]
        m = cons.m
        rest = _restitution(cons)
        corr = np.zeros((nv, nv))           # d(J^T lam)/dq minus its body-fixed part
        Dq_extra = np.zeros((m, nv))        # d(J(q) w)/dq at w = v1, plus Baumgarte
        erp, skin = sim.constraints.erp, sim.constraints.skin
        if nc:
            dp, dn, dd = geometry_derivatives(sim, kin, cons)
            R = cons.frames                                   # (nc, 3, 3)
            if dn.any():
                dR = _frame_derivatives(c.normal, dn)         # (nc, 3, 3, nv)
                df = np.einsum("kijn,kj->kin", dR, lam_c)     # d f_world at fixed lam
            else:                                             # static planes: constant frames
                dR = df = None
            p = c.pos
            vrel = np.zeros((nc, 3))
            dvrel = np.zeros((nc, 3, nv))
            for js, sgn in ((j1s, -1.0), (j2s, 1.0)):
                if not np.any(js):
                    continue
                Jj, o, w, dV = kin.stacked(js)
                Jw = Jj[:, 3:]
                Jp = Jj[:, :3] - _cross(p - o, Jw)            # zero rows for the world
                fs = sgn * f_world
                X = _cross(fs, Jw) if df is None else sgn * df + _cross(fs, Jw)
                Y = _cross(fs, dp - Jp)
                corr += Jp.reshape(-1, nv).T @ X.reshape(-1, nv) - Jw.reshape(-1, nv).T @ Y.reshape(-1, nv)
                vrel += sgn * (Jp @ v1)
                dvrel += sgn * (dV[:, :3] - _cross(p, dV[:, 3:]) + _cross(w, dp))     # 0 for the world
            mz = sim.__dict__.get("_mocap")
            if mz is not None and mz.moving():
                # a moving mocap geom's velocity at the point, in the rows' offsets
                # (diffgym.sim.mocap): d(R^T w(p))/dq = dR^T w + R^T (angvel x dp)
                for gs, sgn in ((c.geom1, -1.0), (c.geom2, 1.0)):
                    wm, om = mz.point_velocity(gs, p)
                    vrel += sgn * wm
                    dvrel += sgn * _cross(om, dp)
            RdV = np.einsum("kai,kan->kin", R, dvrel)
            if dR is not None:
                RdV = np.einsum("kain,ka->kin", dR, vrel) + RdV
            Dq_extra[:3 * nc] = RdV.reshape(3 * nc, nv)
            cap = depenetration_speed(sim.solver)
            gain = baumgarte_gain(cons.dist, dt, erp, skin, cap)
            if rest is not None:
                # Newton's impact law rows: b = e u(q, v) + erp min(d, 0) / dt, u = n . vrel at
                # the pre-step v (constraint.restitution_bias): the gain of d, and e du/dq
                gain = np.where(rest > 0.0, np.where(cons.dist < 0.0, baumgarte_gain(
                    cons.dist, dt, erp, 0.0, cap), 0.0), gain)
                trees = sim.__dict__.get("_trees")
                if trees is not None:      # per-tree groups: no whole-model Data (cubic in nv)
                    kin0 = _Kin(model, None, q, v, np.concatenate([j1s, j2s]), trees)
                else:
                    data0 = getattr(sim, "_ddata0", None)
                    if data0 is None:
                        data0 = sim._ddata0 = model.createData()
                    kin0 = _Kin(model, data0, q, v, np.concatenate([j1s, j2s]))
                vrel0, dvrel0 = relative_velocity(kin0, j1s, j2s, p, v, dp)
                du = np.einsum("ka,kan->kn", R[:, :, 2], dvrel0)
                if dR is not None:
                    du += np.einsum("kan,ka->kn", dR[:, :, 2], vrel0)
                Dq_extra[2:3 * nc:3] += rest[:, None] * du
            closing = _closing(cons)
            if closing is not None:                            # b = d / rem
                gain = np.where(closing, 1.0 / _closing_time(sim, cons, C), gain)
            Dq_extra[2:3 * nc:3] += gain[:, None] * dd
        for jl, (li, ld) in enumerate(zip(cons.limits.tolist(), cons.limit_dist.tolist())):
            lim = sim.sm.limits[li]
            gain = 1.0 / dt if ld > skin else erp / dt        # baumgarte_gain on a float
            Dq_extra[3 * nc + jl, lim.idx_v] += gain * lim.sign
        if nc:                              # the realizable drift correction's derivative
            rz = _realizable_terms(sim, cons, (dp, dn, dd))
            if rz is not None:
                Dq_extra += rz
        if xterms is not None:              # the rows of diffgym.sim.equality (kinematic terms)
            s0, Dx, cx = xterms
            Dq_extra[s0:] = Dx
            corr += cx
        Vq = Vq + Minv @ corr
        JVv = J @ Vv
        if rest is not None:                 # d b / d v of the impact-law rows: e J_N
            JVv[2:3 * nc:3] += rest[:, None] * J[2:3 * nc:3]
        D = np.hstack([J @ Vq + Dq_extra, JVv, J @ Vt])
        A, W = _mode_system(res, G, nc, cons.mu) if system is None else system
        dlam = _solve_min_norm(A, -(W @ D))
        MJt_dlam = (Minv @ J.T) @ dlam
        dv_dq = Vq + MJt_dlam[:, :nv]
        dv_dv = Vv + MJt_dlam[:, nv:2 * nv]
        dv_dtau = Vt + MJt_dlam[:, 2 * nv:]
    else:
        dv_dq, dv_dv, dv_dtau = Vq, Vv, Vt
    dI_dq = pin.dIntegrate(model, q, v1 * dt, pin.ArgumentPosition.ARG0)
    dI_dv = pin.dIntegrate(model, q, v1 * dt, pin.ArgumentPosition.ARG1)
    del q1
    return StepJacobian(dq_dq=dI_dq + dt * dI_dv @ dv_dq, dq_dv=dt * dI_dv @ dv_dv,
                        dq_dtau=dt * dI_dv @ dv_dtau, dv_dq=dv_dq, dv_dv=dv_dv, dv_dtau=dv_dtau)


# -- compiled route ---------------------------------------------------------------------------
# step_jacobian's default route: pinocchio for the kinematics, ABA derivatives and dIntegrate,
# numba kernels (derivative_kernels.py) for everything else on the common path. Contacts whose
# geometry has no closed form in the kernels (anything but a sphere, capsule, box or mesh on a
# static plane, or two spheres) take geometry_derivatives above, in Python, and the kernels take
# its output (and write the rows they close into it).
COMPILED = True

_ARG0, _ARG1 = pin.ArgumentPosition.ARG0, pin.ArgumentPosition.ARG1
_KERNEL_KINDS = ("sphere", "capsule", "box", "mesh")
_VECTOR_JOINTS = frozenset(f"JointModel{n}" for n in (
    "RX", "RY", "RZ", "RevoluteUnaligned", "PX", "PY", "PZ", "PrismaticUnaligned", "Translation"))


class _CompiledState:
    """Per-simulator constants and buffers of the compiled route: its own pinocchio Data, views
    of its placements (oMi), velocities (ov) and of a std::vector of external forces, support
    masks, geometry tables."""

    def __init__(self, sim):
        model = self.model = sim.model
        nv, nj = model.nv, model.njoints
        self.ok = getattr(model, "nvExtended", nv) == nv       # no mimic joints
        # a scene of many trees: per-group pinocchio Data (diffgym.sim.trees) instead of one
        self.trees = trees = sim.__dict__.get("_trees")
        data = self.data = model.createData() if trees is None else None
        self.zero = np.zeros(nv)
        # every joint a revolute or prismatic one (not unbounded) or a translation: the
        # configuration space is a vector space and dIntegrate is the identity
        self.eye = np.eye(nv) if all(model.joints[j].shortname() in _VECTOR_JOINTS
                                     for j in range(1, nj)) else None
        dof_joint = np.zeros(nv, dtype=np.int64)
        for j in range(1, nj):
            jm = model.joints[j]
            dof_joint[jm.idx_v:jm.idx_v + jm.nv] = j
        # per joint, the velocity components that move it (the constraint builder's table)
        self.dof_joint, self.supp = dof_joint, sim.constraints.support
        self.parents = np.array([int(p) for p in model.parents], dtype=np.int64)
        # external forces: one std::vector for every call, updated in place
        fv = self.fext_vec = pin.StdVec_Force()
        for _ in range(nj):
            fv.append(pin.Force.Zero())
        self._init_views(trees)
        self._init_tables(sim)

    def _init_views(self, trees) -> None:
        model, data = self.model, self.data
        nv, nj = model.nv, model.njoints
        fv = self.fext_vec
        if trees is not None:    # the groups' arrays, gathered by TreeGroups: no views
            self.gather, self.scatter, self.dirty = False, False, True
            self.oM, self.ov = trees.kin.oM, trees.kin.ov
            self.fext = np.zeros((nj, 6))
            return
        # views of data.oMi (rotation column-major, translation), data.ov and the forces, checked
        # against pinocchio's accessors; where the layout differs, copies gathered per joint
        rng = np.random.default_rng(0)

        def random_kinematics():
            qr = pin.integrate(model, pin.neutral(model), rng.uniform(-1.0, 1.0, nv))
            pin.computeForwardKinematicsDerivatives(model, data, qr, rng.normal(size=nv), self.zero)

        def same_ov(ov):
            return all(np.array_equal(ov[j], data.ov[j].vector) for j in range(nj))

        random_kinematics()
        oM = placement_view(model, data)
        ov = _raw_rows([_addr(data.ov[j].vector) for j in range(nj)], 6)
        for _ in range(2):                 # twice: the views follow pinocchio's own memory
            if oM is not None and not np.array_equal(oM, gather_placements(data, np.empty((nj, 12)))):
                oM = None
            if ov is not None and not same_ov(ov):
                ov = None
            random_kinematics()
        fx = _raw_rows([_addr(fv[j].vector) for j in range(nj)], 6)
        if fx is not None:
            fx[:] = np.arange(6.0 * nj).reshape(nj, 6)
            if not all(np.array_equal(fx[j], fv[j].vector) for j in range(nj)):
                fx = None
            else:
                fx[:] = 0.0
        self.gather = oM is None or ov is None
        self.oM = oM if oM is not None else np.zeros((nj, 12))
        self.ov = ov if ov is not None else np.zeros((nj, 6))
        self.scatter = fx is None
        self.fext = fx if fx is not None else np.zeros((nj, 6))
        self.dirty = True

    def _init_tables(self, sim) -> None:
        nv = self.model.nv
        # geometry: static planes, rolling radii, pairs the kernel's closed form covers
        geoms = sim.sm.geoms
        gj = self.gjoint = np.ascontiguousarray(sim.constraints.geom_joint, dtype=np.int64)
        self.static_plane = np.array([g.kind == "plane" and gj[i] == 0
                                      for i, g in enumerate(geoms)], dtype=np.bool_)
        self.roll_radius = np.array([float(g.size[0]) if g.kind in ("sphere", "capsule") else 0.0
                                     for g in geoms])
        kern = np.array([g.kind in _KERNEL_KINDS for g in geoms], dtype=np.bool_)
        sp = self.static_plane
        sph = np.array([g.kind == "sphere" for g in geoms], dtype=np.bool_)
        # (the kernel's closed forms: a shape on a static plane, two spheres)
        self.python_geometry = ~((sp[:, None] & kern[None, :]) | (kern[:, None] & sp[None, :])
                                 | (sph[:, None] & sph[None, :]))
        cb = sim.constraints
        self.lim_v = np.ascontiguousarray(cb.lim_v, dtype=np.int64)
        self.lim_sign = np.ascontiguousarray(cb.lim_sign, dtype=float)
        # passive forces
        self.kstiff = np.zeros(nv)
        if len(sim._stiff_idx):
            self.kstiff[sim._stiff_idx] = -sim._stiff_k
        self.has_stiff = bool(len(sim._stiff_idx))
        self.damped = bool(np.any(sim.sm.damping))
        # stand-ins where there are no constraints
        self.no_J = np.zeros((0, nv))
        self.no_G = np.zeros((0, 0))
        self._no_corr = None            # (nv, nv) zeros, made when first needed (no_corr)
        self.no_f = np.zeros(0)
        self.no_modes = np.zeros(0, dtype=np.int64)
        self.no_act = np.zeros(0, dtype=np.bool_)
        self.no_geo = (np.zeros((0, 3, nv)), np.zeros((0, 3, nv)), np.zeros((0, nv)))

    @property
    def no_corr(self) -> np.ndarray:
        """(nv, nv) zeros: corr of a step without constraints on the whole-model route (made on
        first use: the block route of a large scene never needs it)."""
        if self._no_corr is None:
            self._no_corr = np.zeros((self.model.nv, self.model.nv))
        return self._no_corr

    # a copied or unpickled simulator builds its own (the views alias this one's pinocchio Data)
    def __copy__(self):
        return None

    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return (type(None), ())

    def gather_kinematics(self) -> None:
        data = self.data
        gather_placements(data, self.oM)
        for j in range(self.model.njoints):
            self.ov[j] = data.ov[j].vector

    def scatter_forces(self) -> None:
        for j in range(self.model.njoints):
            self.fext_vec[j] = pin.Force(self.fext[j])


def _geom_placements(sim) -> np.ndarray:
    """The geoms' world placements (ngeom, 12: rotation column-major, translation) the step
    left in ``sim.geom_data``: the collision driver's view where it has one, else a copy."""
    oMg = getattr(sim.collision, "_oMg", None)
    if oMg is not None:
        return oMg(sim.geom_data)
    out = np.empty((len(sim.sm.geoms), 12))
    for g, M in enumerate(sim.geom_data.oMg):
        out[g, :9] = M.rotation.ravel(order="F")
        out[g, 9:] = M.translation
    return out


def _reference_data(sim):
    """The numpy route's own pinocchio Data (created on first use)."""
    data = getattr(sim, "_ddata", None)
    if data is None:
        data = sim._ddata = sim.model.createData()
    return data


def _compiled_state(sim) -> _CompiledState:
    st = sim.__dict__.get("_djit")
    if st is None or st.model is not sim.model:
        st = sim._djit = _CompiledState(sim)
    return st


def _step_jacobian_compiled(sim, C=None, system=None) -> StepJacobian | None:
    st = _compiled_state(sim)
    if not st.ok:
        return None
    C = sim.cache if C is None else C
    model, data, dt = st.model, st.data, sim.dt
    q, v, v1 = C["q"], C["v"], C["v1"]
    cons, res = C["cons"], C["res"]
    trees = st.trees
    if cons is not None:
        if trees is None:
            pin.computeForwardKinematicsDerivatives(model, data, q, v1, st.zero)
            JT = data.J.T                  # (nv, 6), C-ordered (data.J is column-major)
        else:
            JT = trees.kinematics_derivatives(q, v1, st.zero).J.T
        if JT.ndim == 1:                   # nv = 1: eigenpy gives the 6 x 1 matrix as a vector
            JT = JT.reshape(1, 6)
        c = cons.contacts
        nc = cons.nc
        if st.gather:
            st.gather_kinematics()
        ccons = sim.constraints
        args = (JT, st.oM, st.ov, st.fext, st.supp, st.dof_joint, st.parents, st.gjoint,
                st.static_plane, st.roll_radius, st.python_geometry,
                _geom_placements(sim), c.geom1, c.geom2, c.pos, c.normal, c.dist,
                cons.dist, cons.frames, res.lam, v1, dt, ccons.erp, ccons.skin)
        rest = _restitution(cons)
        rest = np.zeros(nc) if rest is None else np.ascontiguousarray(rest, dtype=float)
        bias_n = rest
        closing = _closing(cons)
        if closing is not None:            # (< 0: closing short of contact, b = d / rem, the
            # kernel's gain 1 / rem from -rem / dt: -1 on a step's first pass)
            rest = np.where(closing, -_closing_time(sim, cons, C) / sim.dt, rest)
        lims = (cons.limits, cons.limit_dist, st.lim_v, st.lim_sign, v, rest,
                depenetration_speed(sim.solver))
        # pairs without a closed form in the kernel: geometry in Python (the kernel would
        # return at once, undone, without the geometry: not called for nothing)
        python_rows = st.python_geometry[c.geom1, c.geom2]
        done = False
        if not python_rows.any():
            corr, Dq, done = K.contact_terms(*args, False, *st.no_geo, *lims)
        geo = None
        if not done:
            gj = st.gjoint
            kin = _FrameKin(model, data, q, v1, np.concatenate([gj[c.geom1], gj[c.geom2]]),
                            trees, JT, st.oM, st.supp)
            # (the rows the kernel closes are left to it: it writes them into geo)
            geo = geometry_derivatives(sim, kin, cons, skip=~python_rows)
            corr, Dq, done = K.contact_terms(*args, True, *geo, *lims)
        if nc:                # the realizable drift correction's derivative (where it acted)
            def geometry():
                if geo is not None:
                    return geo
                gj = st.gjoint
                kin = _Kin(model, _reference_data(sim), q, v1,
                           np.concatenate([gj[c.geom1], gj[c.geom2]]), trees)
                return geometry_derivatives(sim, kin, cons)
            rz = _realizable_terms(sim, cons, geometry, JT if trees is None else None)
            if rz is not None:
                Dq = Dq + rz
        st.dirty = True
        if st.scatter:
            st.scatter_forces()
        Jc, G, lam, sigma, modes, act, mu = cons.J, C["G"], res.lam, res.sigma, res.modes, \
            res.limit_active, cons.mu
        bias_v = np.zeros(cons.m)            # d b / d v = bias_v[:, None] * J (impact law)
        bias_v[2:3 * nc:3] = bias_n
    else:
        nc = 0
        if st.dirty:
            st.fext[:] = 0.0
            if st.scatter:
                st.scatter_forces()
            st.dirty = False
        corr, Dq = st.no_corr, st.no_J
        Jc, G, lam, sigma, modes, act, mu = st.no_J, st.no_G, st.no_f, st.no_f, st.no_modes, \
            st.no_act, st.no_f
        bias_v = st.no_f
    if trees is None:
        ddq_dq, ddq_dv, Minv = pin.computeABADerivatives(model, data, q, v,
                                                         _joint_torques(sim, cons, res),
                                                         st.fext_vec)
    else:
        # (Trees builds them column-major, pinocchio's layout in memory, while pinocchio's own
        # call hands row-major arrays to Python: the kernels take one layout, else numba would
        # compile dynamics_terms and all it calls a second time. They read the matrices entry
        # by entry: the copies change no result.)
        ddq_dq, ddq_dv, Minv = (np.ascontiguousarray(x) for x in trees.aba_derivatives(
            q, v, _joint_torques(sim, cons, res), st.fext))
    ddq_dq = _with_long_range(sim, ddq_dq, Minv)
    v1dt = v1 * dt
    if st.eye is not None:                 # vector-space joints: integrate is q + dq
        dI_dq = dI_dv = st.eye
    else:
        dI_dq = pin.dIntegrate(model, q, v1dt, _ARG0)
        dI_dv = pin.dIntegrate(model, q, v1dt, _ARG1)
    if system is None:
        status, dq_dq, dq_dv, dq_dtau, dv_dq, dv_dv, dv_dtau = K.dynamics_terms(
            ddq_dq, ddq_dv, Minv, st.kstiff, st.has_stiff, sim.sm.damping, st.damped, dt,
            Jc, G, corr, Dq, lam, sigma, modes, act, mu, nc, dI_dq, dI_dv, bias_v)
    else:
        status, dq_dq, dq_dv, dq_dtau, dv_dq, dv_dv, dv_dtau = K.dynamics_terms_system(
            ddq_dq, ddq_dv, Minv, st.kstiff, st.has_stiff, sim.sm.damping, st.damped, dt,
            Jc, G, corr, Dq, system[0], system[1], dI_dq, dI_dv, bias_v)
    if status == 1:                        # non-finite data
        return None
    if status == 2:                        # rank in doubt: the reference's solve, then finish
        dq_dq, dq_dv, dq_dtau, dv_dq, dv_dv, dv_dtau = _finish_rank_in_doubt(
            dq_dq, dq_dv, dq_dtau, dv_dq, dv_dv, dv_dtau, dI_dq, dI_dv, dt)
    return StepJacobian(dq_dq=dq_dq, dq_dv=dq_dv, dq_dtau=dq_dtau, dv_dq=dv_dq, dv_dv=dv_dv,
                        dv_dtau=dv_dtau)
