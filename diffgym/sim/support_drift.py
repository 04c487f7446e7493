"""The drift of a curved support point over a step: ellipsoids, cylinder rims and capsule ends
on a static plane.

A contact row is first order in the step: ``sigma_N = J_N v1 + b`` moves the contact point as a
material point of the body, ``d(q1) = d + dt J_N v1 + O(dt^2)``. For a body-fixed point (a box
corner) the second-order term is the centripetal one, which lifts the lowest points off the
plane. An ellipsoid's contact is its support point, which slides over the surface as the body
turns: its distance to the plane is ``d = n . c - h - s``, ``s = sqrt(n^T E n)``, ``E = R
diag(r^2) R^T``, and for a rotation at a constant body-frame rate (a free body's step ``R1 = R
exp(dt w)``, a revolute joint's) the step misses ``-dt^2 s'' / 2`` of it, where, in the geom's
frame (``a = R^T n``, ``w = R^T omega``, ``D = diag(r^2)``),

    u1 = a x w (= a'),  u2 = w x (w x a) (= a''),
    s'' = (u1^T D u1 + a^T D u2) / s - (a^T D u1)^2 / s^3.

At 30 Hz an ellipsoid with radii 0.07 and 0.19 m rocking at 8 rad/s misses about 1.6 mm a
step; the Baumgarte correction catches up one fifth of a penetration per step, so the body
rolled about 1-2 mm deep into the floor (the drop benchmark's ellipsoid failures).

The same holds for a cylinder cap's lowest rim point (``plane_contacts`` ids 8, 9: ``s = -z a_z
+ r sqrt(a_x^2 + a_y^2)``, z = -h, +h the cap, the quadratic part with ``D = (r^2, r^2, 0)``;
bench_drops #197) and, where ``CAPSULE_ENDS``, for a capsule end on a free body (``s = -z a_z + r``: a material point,
but an upper end swinging down over its arc falls below its linearized path: bench_drops #211,
a capsule at 10 Hz, 12 mm into the floor). At 10 Hz a body turns by a radian in a step, where
the second-order term is not enough (#5, a capsule end at 11 rad/s: still 12 mm): the row gets
the exact rest, ``b = -(s(E^T a) - s(a) - dt g(a).(a x w)) / dt`` (``offset``: ``E = exp(dt
w)``, ``g = grad s``; its leading term is ``-dt s''/2``), which makes it the distance after the
step's own rotation, up to a turn of ``MAX_TURN`` a step (the offset is periodic in the
turn). Capsules would be taken on free bodies only (a ``<freejoint>``: translation and
ball joints, where the turn is exactly ``exp(dt w)`` and the centre moves on a line), so robot
links keep their first-order rows; ellipsoids and cylinders on any joint.

The normal row of each such contact gets that ``b`` at the step's own angular velocity
``omega1`` (``fixed_point``: the constrained part is solved again with the offsets at the last
solution's velocity until they agree to rounding or to ``AGREE`` times the solver's tolerance,
Anderson-accelerated, a few passes). The term at the pre-step velocity alone is wrong where the
contact changes the spin: a flat ellipsoid landing at 15 rad/s got a 53 mm push-out it did not
need and kept rocking. The problem's rows and its Delassus operator are unchanged (only
offsets). Where the passes do not agree (MAX_PASSES) or a pass needs the later solver stages,
the step is taken without the term (the first-order rows). Models with restitution keep the
first-order rows (the impact law's rows carry their own offsets; ``prepare`` returns None
there). The geom's centre is taken to move on a straight line and its body-frame rate to be
constant over the step: exact for a free body (translation and ball joint), the leading term
on a chain of joints.

Its derivative (``correct_jacobian``): ``b = b(q, v1)``; ``d b / d q`` at fixed ``v1`` through
the geom's rotation (``d a = R^T (n x J_w)``, ``d w = R^T (d omega / dq + omega x J_w)``) and
``d b / d v1 = d b/d w R^T J_w`` (``offset``'s closed-form gradients), with ``J_w`` the geom's
angular velocity Jacobian; they enter the step's velocity through the response ``P = M^-1 J^T d
lam / d b`` of the step's mode system, the same for both Jacobian routes (as the impact law's
gravity term, ``derivatives._impact_gravity``): ``d v1 = (I - P B_v)^-1 (X + P B_q d q)``.
"""
from __future__ import annotations

import numpy as np

from .jit import njit


def _cross(a, b):
    return np.cross(a, b)


def second_derivative(a: np.ndarray, w: np.ndarray, D: np.ndarray, grad: bool = False):
    """``s''`` of the support distance ``s = sqrt(a^T D a)`` along ``a' = a x w`` (geom frame,
    ``D`` the diagonal (3,) of radii squared), and with ``grad`` its gradients with respect to
    ``a`` and ``w`` (closed form)."""
    Da = D * a
    s2 = float(a @ Da)
    s = np.sqrt(s2)
    u1 = _cross(a, w)
    u2 = _cross(w, _cross(w, a))
    Du1, Du2 = D * u1, D * u2
    P = float(u1 @ Du1 + a @ Du2)
    Qq = float(a @ Du1)
    f = P / s - Qq * Qq / (s2 * s)
    if not grad:
        return f
    ww = float(w @ w)
    Daw = float(Da @ w)
    aw = float(a @ w)
    gP_a = 2.0 * _cross(w, Du1) + Du2 + Daw * w - ww * Da
    gP_w = 2.0 * _cross(Du1, a) + aw * Da + Daw * a - 2.0 * s2 * w
    gQ_a = Du1 + _cross(w, Da)
    gQ_w = _cross(Da, a)
    gs_a = Da / s
    c_s = -P / s2 + 3.0 * Qq * Qq / (s2 * s2)
    c_Q = -2.0 * Qq / (s2 * s)
    ga = gP_a / s + c_s * gs_a + c_Q * gQ_a
    gw = gP_w / s + c_Q * gQ_w
    return f, ga, gw


def _free_rotation(model, j) -> bool:
    """Whether joint ``j`` is a free body's rotation: a spherical joint on a translation joint
    on the world (how a ``<freejoint>`` loads: the centre moves on a straight line over a step
    and the rotation at a constant body-frame rate, so the second-order term is exact)."""
    if j <= 0 or model.joints[j].shortname() != "JointModelSpherical":
        return False
    p = model.parents[j]
    return p > 0 and model.joints[p].shortname() == "JointModelTranslation" and model.parents[p] == 0


class _Table:
    """Per-simulator constants: which geoms carry the term (ellipsoids, cylinders, and capsules
    of free bodies) with the diagonal ``D`` of their support's quadratic part (ellipsoid: radii
    squared; cylinder: ``(r^2, r^2, 0)``, a cap's rim; capsule: 0) and the body-frame heights
    ``z`` of their points along the geom's axis (``points``: contact point id -> z), and which
    geoms are static planes."""

    def __init__(self, sim):
        from .plane_contacts import CYLINDER_LOWEST_ID
        geoms = sim.sm.geoms
        gj = sim.constraints.geom_joint
        model = sim.model
        n = len(geoms)
        self.D = np.zeros((n, 3))
        self.carrier = np.zeros(n, dtype=bool)
        # per geom: (point id 0, point id 1) the ids that carry the term (-1: none) and the
        # points' heights along the geom's z axis
        self.ids = np.full((n, 2), -1, dtype=np.int64)
        self.z = np.zeros((n, 2))
        for i, g in enumerate(geoms):
            if gj[i] == 0:
                continue
            if g.kind == "ellipsoid":
                self.D[i] = np.asarray(g.size[:3], float) ** 2
                self.ids[i, 0] = 0
            elif g.kind == "cylinder":
                r, h = float(g.size[0]), float(g.size[1])
                self.D[i] = (r * r, r * r, 0.0)
                # a cap's lowest rim point, cap 0 at -h, cap 1 at +h (plane_contacts)
                self.ids[i] = (CYLINDER_LOWEST_ID, CYLINDER_LOWEST_ID + 1)
                self.z[i] = (-h, h)
            elif g.kind == "capsule" and CAPSULE_ENDS and _free_rotation(model, int(gj[i])):
                h = float(g.size[1])
                self.ids[i] = (0, 1)             # its two ends (plane_contacts.shape_points)
                self.z[i] = (-h, h)
            else:
                continue
            self.carrier[i] = True
        self.plane = np.array([g.kind == "plane" and gj[i] == 0 for i, g in enumerate(geoms)],
                              dtype=bool)
        self.active = bool(self.carrier.any() and self.plane.any()
                           and not len(sim.constraints.pair_restitution))


def _table(sim) -> _Table:
    t = sim.__dict__.get("_support_drift")
    if t is None:
        t = sim.__dict__["_support_drift"] = _Table(sim)
    return t


def _rows(t: _Table, contacts):
    """(contact indices, carrier geoms, the points' heights z along the geom axis, the sign
    turning each contact's normal into the plane's outward normal) of the contacts that carry
    the term: a carrier's support point (ellipsoid id 0, cylinder ids 8, 9) or end (capsule
    ids 0, 1) on a static plane."""
    g1, g2 = contacts.geom1, contacts.geom2
    first = t.plane[g1] & t.carrier[g2]
    on = first | (t.plane[g2] & t.carrier[g1])
    ge = np.where(first, g2, g1)
    pt = np.asarray(contacts.point)
    ids = t.ids[ge]
    hit0, hit1 = on & (pt == ids[:, 0]), on & (pt == ids[:, 1])
    ks = np.flatnonzero(hit0 | hit1)
    ge = ge[ks]
    z = np.where(hit0[ks], t.z[ge, 0], t.z[ge, 1])
    sign = np.where(first[ks], 1.0, -1.0)        # (normals point from geom 1 to geom 2)
    return ks, ge, z, sign


def _support(a, D, z, grad: int = 0):
    """``s(a) = -z a_z + sqrt(a^T D a)`` (the support distance of a point at height z on the
    geom's axis, plus a quadratic support where D is not 0), with ``grad`` >= 1 its gradient and
    >= 2 its Hessian."""
    Da = D * a
    quad = bool(D.any())
    q = float(np.sqrt(a @ Da)) if quad else 0.0
    s = -z * a[2] + q
    if not grad:
        return s
    g = Da / q if quad else np.zeros(3)
    g[2] -= z
    if grad < 2:
        return s, g
    H = (np.diag(D) / q - np.outer(Da, Da) / q ** 3) if quad else np.zeros((3, 3))
    return s, g, H


# the turn over a step that the offset follows at most (rad): the exact offset is periodic in
# the turn, so past it a faster spin could make a row's offset whatever the solve needs (a
# capsule at 10 Hz, bench_drops #3185, spun itself up from 27 to 550 rad/s in 6 steps); beyond
# it the offset is that of this turn about the same axis (continuous, flat in the rate)
MAX_TURN = 1.0


@njit
def _offsets(a, w, D, z, dt):
    """``offset``'s value for k rows at once: ``a``, ``w``, ``D`` (k, 3), ``z`` (k,) (the turn
    ``E^T a = exp(-dt w) a`` by Rodrigues' formula, its coefficients by their series where the
    angle is small). Compiled: on a capsule's drops the numpy form cost 4x the solves."""
    k = a.shape[0]
    out = np.empty(k)
    for i in range(k):
        a0, a1_, a2 = a[i, 0], a[i, 1], a[i, 2]
        w0, w1, w2 = w[i, 0], w[i, 1], w[i, 2]
        tw = dt * np.sqrt(w0 * w0 + w1 * w1 + w2 * w2)
        if tw > MAX_TURN:                 # (the turn saturates: see MAX_TURN)
            f = MAX_TURN / tw
            w0, w1, w2 = w0 * f, w1 * f, w2 * f
        d0, d1, d2 = D[i, 0], D[i, 1], D[i, 2]
        zi = z[i]
        p0, p1, p2 = -dt * w0, -dt * w1, -dt * w2
        th2 = p0 * p0 + p1 * p1 + p2 * p2
        if th2 < 1e-8:
            c1 = 1.0 - th2 / 6.0
            c2 = 0.5 - th2 / 24.0
        else:
            th = np.sqrt(th2)
            c1 = np.sin(th) / th
            c2 = (1.0 - np.cos(th)) / th2
        # phi x a, phi x (phi x a)
        x0 = p1 * a2 - p2 * a1_
        x1 = p2 * a0 - p0 * a2
        x2 = p0 * a1_ - p1 * a0
        y0 = p1 * x2 - p2 * x1
        y1 = p2 * x0 - p0 * x2
        y2 = p0 * x1 - p1 * x0
        b0 = a0 + c1 * x0 + c2 * y0
        b1 = a1_ + c1 * x1 + c2 * y1
        b2 = a2 + c1 * x2 + c2 * y2
        s1 = -zi * b2 + np.sqrt(b0 * b0 * d0 + b1 * b1 * d1 + b2 * b2 * d2)
        q0 = np.sqrt(a0 * a0 * d0 + a1_ * a1_ * d1 + a2 * a2 * d2)
        s0 = -zi * a2 + q0
        inv = 1.0 / q0 if q0 > 0.0 else 1.0
        g0, g1, g2 = d0 * a0 * inv, d1 * a1_ * inv, d2 * a2 * inv - zi
        # g . (a x w)
        u = g0 * (a1_ * w2 - a2 * w1) + g1 * (a2 * w0 - a0 * w2) + g2 * (a0 * w1 - a1_ * w0)
        out[i] = -(s1 - s0 - dt * u) / dt
    return out


def offset(a, w, D, z, dt: float, grad: bool = False):
    """The normal row's offset (m/s) that makes it the exact distance after the step: a plane's
    outward normal ``a`` and the rate ``w`` in the geom's frame, the geom turning by ``E =
    exp(dt w)`` over the step (its centre on a straight line: a free body), so its normal in
    the geom's frame ends at ``E^T a``; the row predicts the support distance's change to first
    order, ``dt g(a).(a x w)`` (``g = grad s``, the velocity of the support point), and misses

        b = -(s(E^T a) - s(a) - dt g(a).(a x w)) / dt,

    of which the leading term is ``-dt s''/2`` (``second_derivative``). With ``grad`` also
    ``d b / d a`` and ``d b / d w`` (closed form: ``d(E^T a) = dt E^T [a]x Jr(-dt w) dw``, Jr
    pinocchio's Jexp3)."""
    import pinocchio as pin
    b = float(_offsets(np.asarray(a, float).reshape(1, 3), np.asarray(w, float).reshape(1, 3),
                       np.asarray(D, float).reshape(1, 3), np.array([float(z)]), float(dt))[0])
    if not grad:
        return b
    w = np.asarray(w, float)
    tw = dt * float(np.sqrt(w @ w))
    Sat = None
    if tw > MAX_TURN:                    # (saturated turn: d w_eff / d w = f (I - u u^T))
        f = MAX_TURN / tw
        u = w / np.sqrt(w @ w)
        Sat = f * (np.eye(3) - np.outer(u, u))
        w = w * f
    E = pin.exp3(dt * w)
    a1 = E.T @ a
    u1 = np.cross(a, w)
    s0, g0, H0 = _support(a, D, z, 2)
    s1, g1 = _support(a1, D, z, 1)
    Eg1 = E @ g1
    ga = -(Eg1 - g0 - dt * (H0 @ u1 + np.cross(w, g0))) / dt
    gw = -(Eg1 @ _skew(a) @ pin.Jexp3(-dt * w)) + np.cross(g0, a)
    if Sat is not None:
        gw = gw @ Sat
    return b, ga, gw


def _skew(x):
    return np.array([[0.0, -x[2], x[1]], [x[2], 0.0, -x[0]], [-x[1], x[0], 0.0]])


class _Drift:
    """The step's rows that carry the term, prepared once (the fixed point evaluates the
    offsets at many velocities): contact indices, geom-frame normals, the (k, 3, nv) maps from
    v to the geoms' rates in their frames, D and z."""

    def __init__(self, sim, t, contacts, Jw, ks, ge, z, sign):
        self.nc, self.ks, self.z, self.dt = len(contacts), ks, z, sim.dt
        gj = sim.constraints.geom_joint
        sup = sim.constraints.support
        oMg = sim.geom_data.oMg
        R = np.array([oMg[g].rotation for g in ge.tolist()])               # (k, 3, 3)
        self.a = np.einsum("kji,kj->ki", R, sign[:, None] * contacts.normal[ks])
        self.W = np.einsum("kji,jn->kin", R, Jw[3:]) * sup[gj[ge]][:, None, :]
        self.D = t.D[ge]

    def __call__(self, v):
        out = np.zeros(self.nc)
        out[self.ks] = _offsets(self.a, self.W @ v, self.D, self.z, self.dt)
        return out


def prepare(sim, contacts, Jw: np.ndarray):
    """``F(v)``: the (nc,) offsets to add to the contacts' normal rows at velocity ``v``
    (module docstring), or None where the step has no row carrying the term. ``Jw``: the world
    joint Jacobians (6, nv) at the step's q."""
    t = _table(sim)
    if not t.active or not len(contacts):
        return None
    ks, ge, z, sign = _rows(t, contacts)
    if not len(ks):
        return None
    return _Drift(sim, t, contacts, Jw, ks, ge, z, sign)


def drift(sim, contacts, Jw: np.ndarray, v: np.ndarray):
    """(nc,) offsets to add to the contacts' normal rows at velocity ``v``, or None (``prepare``)."""
    f = prepare(sim, contacts, Jw)
    return None if f is None else f(v)


# a free capsule's ends carry the term too. Without MAX_TURN a tumbling capsule's offsets at
# its own v1 fed its spin at 10 Hz (#3185: 27 -> 550 rad/s in 6 steps); with it, of the 805
# runs of bench_drops --n 3600 (seed 0) with a capsule, 21 fail against 50 without the term
# (all too deep; #3185 and #545, at 10 Hz, 30 and 10 mm, pass without it)
CAPSULE_ENDS = True

# passes of the step's constrained part at most, for the offsets at the step's own v1
MAX_PASSES = 40
# the offsets agree with those at the step's v1 once they differ by less than this fraction of
# the solver's tolerance (m/s) or by rounding. 0: by rounding only. At 1e-2 (4.07 solves a
# step on ellipsoid drops instead of 4.59) the step map carried the early stop's ~1e-11 m/s as
# noise, which central differences at h = 1e-7 read as 1.8e-6 relative errors in dq_dq of a
# free capsule on the ground (test_capsule_on_capsule[spinning-free]; 1e-8 at 0): the step
# must be a smooth function of the state for the audits users run
AGREE = 0.0


def fixed_point(sim, contacts, Jw, v, solve, velocity):
    """The step's constrained part with the offsets at its own angular velocity: ``solve(drift)``
    runs it with the offsets ``drift`` (None: without them) and ``velocity(out)`` reads the new
    velocity from its output (None where the pass is not usable: a later solver stage to run).
    Starts from the offsets at the pre-step ``v`` and solves ``drift = F(drift)``, F the offsets
    at the resulting ``v1``, to rounding, by Anderson-accelerated iteration (memory 3): the plain
    iteration contracts (an offset moves the angular velocity by about its size over the lever
    arm, and the offset changes by ``dt ds''/dw`` times that) but slowly for a fast-spinning flat
    body at 30 Hz (a ratio of 0.75). Returns ``(out, how)``: ``how`` "v1" (converged: the
    offsets are those at the step's v1), None (no term, or no convergence within MAX_PASSES:
    the step without the offsets)."""
    F = prepare(sim, contacts, Jw)
    if F is None:
        return solve(None), None
    settings = getattr(sim.solver, "settings", None)
    agree = AGREE * float(getattr(settings, "tol", 0.0))
    x = F(v)
    out = solve(x)
    X, R = [], []                   # (the last iterates' F(x) and residuals F(x) - x)
    for _ in range(MAX_PASSES):
        v1 = velocity(out)
        if v1 is None or not np.all(np.isfinite(v1)):
            break
        fx = F(v1)
        r = fx - x
        if np.max(np.abs(r)) <= max(1e-14 * (1.0 + np.max(np.abs(fx))), agree):
            return out, "v1"
        X.append(fx)
        R.append(r)
        if len(R) > 4:
            del X[0], R[0]
        if len(R) > 1:
            dR = np.array([R[i + 1] - R[i] for i in range(len(R) - 1)]).T
            dX = np.array([X[i + 1] - X[i] for i in range(len(X) - 1)]).T
            gamma = np.linalg.lstsq(dR, r, rcond=None)[0]
            x = fx - dX @ gamma
        else:
            x = fx
        out = solve(x)
    return solve(None), None


def jacobian_terms(sim, cons, q, v):
    """``(ks, Bq, Bv)``: the contacts carrying the term and ``d b / d q`` (tangent, at fixed v),
    ``d b / d v`` (len(ks), nv) of their offsets evaluated at the velocity ``v`` (the step's v1),
    or None."""
    t = _table(sim)
    if cons is None or not t.active or not cons.nc:
        return None
    c = cons.contacts
    ks, ge, z, sign = _rows(t, c)
    if not len(ks):
        return None
    from .derivatives import _Kin
    model, nv = sim.model, sim.nv
    gj = sim.constraints.geom_joint
    js = gj[ge]
    trees = sim.__dict__.get("_trees")
    if trees is not None:
        kin = _Kin(model, None, q, v, js, trees)
    else:
        data = sim.__dict__.get("_ddrift")
        if data is None:
            data = sim.__dict__["_ddrift"] = model.createData()
        kin = _Kin(model, data, q, v, js)
        # (the geoms' placements at q: the step's own, sim.geom_data)
    J, _, omega, dV = kin.stacked(js)
    dt = sim.dt
    Bq = np.zeros((len(ks), nv))
    Bv = np.zeros((len(ks), nv))
    for i, (k, g) in enumerate(zip(ks.tolist(), ge.tolist())):
        R = sim.geom_data.oMg[g].rotation
        n = sign[i] * c.normal[k]
        Jang = J[i, 3:]
        a, w = R.T @ n, R.T @ omega[i]
        _, ga, gw = offset(a, w, t.D[g], z[i], dt, grad=True)
        da = R.T @ np.cross(n[:, None], Jang, axis=0)
        dw = R.T @ (dV[i, 3:] + np.cross(omega[i][:, None], Jang, axis=0))
        Bq[i] = ga @ da + gw @ dw
        Bv[i] = gw @ (R.T @ Jang)
    return ks, Bq, Bv


def correct_jacobian(sim, C, system, jac) -> bool:
    """Adds the offsets' derivative to the step Jacobian ``jac`` (either route's, in place).
    The routes take the offsets ``b`` as constants; with ``P = M^-1 J^T d lam / d b`` from the
    step's linearized conditions (``A d lam = -W d g``; ``system``: the smooth mode's) the
    step's velocity moves by ``P d b``, and ``b = b(q, v1)`` at the step's own velocity
    (``fixed_point``), so ``d v1 = X + P (B_q d q + B_v d v1)``: ``d v1 = (I - P B_v)^-1 (X +
    P B_q d q)`` (``X``: the routes' result; the inverse by Woodbury's identity, a k x k
    solve), and the q rows through ``pinocchio.integrate``. Returns whether there was a
    term."""
    import pinocchio as pin

    from .derivatives import _mode_system, _solve_min_norm
    S = sim.cache
    if S.get("support_drift") != "v1":
        return False
    cons, res = C["cons"], C["res"]
    if cons is None or res is None:
        return False
    q, v1 = S["q"], S["v1"]
    terms = jacobian_terms(sim, cons, q, v1)
    if terms is None:
        return False
    ks, Bq, Bv = terms
    m, k = cons.m, len(ks)
    A, W = _mode_system(res, C["G"], cons.nc, cons.mu) if system is None else system
    E = np.zeros((m, k))
    E[3 * ks + 2, np.arange(k)] = 1.0
    dlam = _solve_min_norm(A, -(W @ E))
    Minv = np.asarray(S["Minv"])
    Minv = np.triu(Minv) + np.triu(Minv, 1).T          # (pinocchio fills the upper triangle)
    P = Minv @ (np.asarray(cons.J).T @ dlam)           # (nv, k)
    K = np.linalg.solve(np.eye(k) - Bv @ P, np.eye(k))   # (I - B_v P)^-1

    def solve(X):                                      # (I - P B_v)^-1 X
        return X + P @ (K @ (Bv @ X))
    dt = sim.dt
    dI_dv = pin.dIntegrate(sim.model, q, v1 * dt, pin.ArgumentPosition.ARG1)
    for name, extra in (("dv_dq", P @ Bq), ("dv_dv", None), ("dv_dtau", None)):
        old = getattr(jac, name)
        new = solve(old if extra is None else old + extra)
        setattr(jac, name, new)
        qname = "dq_" + name[3:]
        setattr(jac, qname, getattr(jac, qname) + dt * (dI_dv @ (new - old)))
    return True
