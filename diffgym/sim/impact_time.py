"""Impacts at their time of impact inside the step (restitution, issue 15).

Newton's impact law (:func:`diffgym.sim.constraint.restitution_bias`) gives the velocity after an
impact, ``v1``; the semi-implicit step ``q1 = q (+) dt v1`` then moves the bodies with ``v1`` over
the whole step, as if the impact had happened at its start: a ball shot at 4 m/s with dt = 0.01
lands up to 4 cm away from where the continuous-time impact puts it, and the final position is
a staircase in the initial velocity (the step in which the contact closes).

Here the impact of contact ``k`` happens at ``t_k = d_k / (-u_k)`` into the step (``d_k`` its
distance, ``u_k`` its normal velocity before the step, clipped to ``[0, dt]``): until then the
bodies move with the pre-step velocity ``v``, after it with ``v1``::

    q1 = q (+) (dt v1 - tau * (v1 - v)),   tau_i = t_k for the dofs of contact k's island

The island: the kinematic trees linked by the step's contacts (an impulse passed through a
resting contact, as in Newton's cradle, moves the far body from the same instant); with several
impacts in one island the earliest one. Dofs of islands without an impact keep ``tau = 0``, the
plain semi-implicit step. Between impacts the free motion is exact for constant velocities, so
two balls colliding on a frictionless table end where the event-driven solution puts them.

**Derivatives.** ``t_k`` is a smooth function of the state where it is inside ``(0, dt)``:
``dt_k = -dd_k / u_k + d_k du_k / u_k^2`` with ``dd_k / dq`` the contact distance's derivative
(:func:`diffgym.sim.derivatives.geometry_derivatives`) and ``du_k = n . dvrel + dn . vrel`` at the
pre-step velocity (``du_k / dv`` the normal row of ``J``); ``correct_jacobian`` rebuilds the rows
of ``q1`` from the step's ``dv1`` rows, on either route of :func:`diffgym.sim.derivatives.step_jacobian`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pinocchio as pin


MAX_PASSES = 4            # drifts to the impact per step (Newton on the distance)
MIN_FRACTION = 1e-9       # a drift shorter than this fraction of dt ends the iteration


@dataclass
class ImpactTimes:
    tau: np.ndarray       # (nv,) time of impact of each dof's island (0: none)
    contact: np.ndarray   # (nv,) the impacting contact that sets it (-1: none)
    t: np.ndarray         # (nc,) time of impact of each contact (nan: not an impact)
    u: np.ndarray         # (nc,) pre-step normal velocity
    interior: np.ndarray  # (nc,) bool: 0 < t < dt (t differentiable in the state)


def impact_times(sim, cons, v: np.ndarray, consumed: np.ndarray | None = None) -> ImpactTimes | None:
    """The times of impact of the step's impact-law contacts, per dof (None without one);
    ``consumed``: the time of the step already drifted (later passes of impact_substep)."""
    rest = getattr(cons, "restitution", None) if cons is not None else None
    if rest is None or not cons.nc or not np.any(rest):
        return None
    nc, nv = cons.nc, sim.nv
    dt = sim.dt - (float(consumed.max()) if consumed is not None else 0.0)
    u = cons.J[2:3 * nc:3] @ v
    d = np.asarray(cons.dist, dtype=float)
    t = np.full(nc, np.nan)
    imp = (rest > 0) & (u < 0)
    t[imp] = np.clip(d[imp] / -u[imp], 0.0, dt)
    interior = imp & (t > MIN_FRACTION * sim.dt) & (t < dt)
    # islands of kinematic trees linked by the contacts (union-find on the trees' first dofs)
    cb = sim.constraints
    c = cons.contacts
    tr1 = cb.joint_tree[cb.geom_joint[c.geom1]]
    tr2 = cb.joint_tree[cb.geom_joint[c.geom2]]
    parent = {}

    def find(a):
        while parent.setdefault(a, a) != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in zip(tr1.tolist(), tr2.tolist()):
        if a >= 0 and b >= 0:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    first: dict[int, int] = {}          # island root -> earliest impacting contact
    for k in np.flatnonzero(imp).tolist():
        for tr in (int(tr1[k]), int(tr2[k])):
            if tr >= 0:
                r = find(tr)
                if r not in first or t[k] < t[first[r]]:
                    first[r] = k
    tau = np.zeros(nv)
    contact = np.full(nv, -1, dtype=np.int64)
    if not first:
        return None
    dof_island = np.array([find(int(cb.tree_lo[i])) for i in range(nv)])
    for r, k in first.items():
        sel = dof_island == r
        tau[sel] = t[k]
        contact[sel] = k
    if not np.any(tau > 0):
        return None
    return ImpactTimes(tau, contact, t, u, interior)


def displacement(it: ImpactTimes | None, dt: float, v: np.ndarray, v1: np.ndarray,
                 consumed: np.ndarray | None = None) -> np.ndarray:
    """The tangent displacement of the step: ``dt v1`` without impact, ``dt v1 - tau (v1 - v)``
    with impact times at the step's ends (0 or dt), ``(dt - consumed) v1`` for the last pass of
    :func:`impact_substep` (from the configuration at the time of impact)."""
    if consumed is not None:
        return (dt - consumed) * v1
    if it is None:
        return v1 * dt
    return v1 * dt - it.tau * (v1 - v)


def impact_substep(sim, q, v, tau, jacobian, it: ImpactTimes, cons):
    """The step with an impact inside it: drift each impacting island to its time of impact,
    ``q_c = q (+) tau v``, and take the step from ``(q_c, v)`` (contacts, normals and the impact
    law at the configuration of impact, velocity update over the whole ``dt``), moving
    ``(dt - tau) v1`` after it. The time ``d / (-u)`` is a first-order estimate (a sphere pair's
    distance is convex along the drift: the estimate falls short): the step from ``q_c`` looks
    again and drifts on (Newton's iteration on the distance, at most ``MAX_PASSES`` drifts).
    ``sim.cache["impact_pre"]`` keeps the passes for the derivatives."""
    passes = sim.__dict__.get("_toi_pass")
    outer = passes is None
    if outer:
        passes = []
    passes.append((q, it, cons))
    q_c = pin.integrate(sim.model, q, it.tau * v)
    sim._toi_pass = passes
    try:
        q1, v1 = sim._step(q_c, v, tau, False)
    finally:
        if outer:
            sim._toi_pass = None
    if not outer:
        return q1, v1
    sim.cache["impact_pre"] = (v, passes)
    if jacobian:
        from .derivatives import step_jacobian
        jac = step_jacobian(sim)
        sim.last.__dict__["jacobian_diagnostics"] = jac.diagnostics
        return q1, v1, jac
    return q1, v1


def consumed_time(passes) -> np.ndarray:
    return np.sum([it.tau for _, it, _ in passes], axis=0)


def _time_derivatives(sim, cons, it: ImpactTimes, q, v):
    """(dt_k/dq, dt_k/dv) (nc, nv) of the interior impact times (zero rows elsewhere)."""
    nc, nv = cons.nc, sim.nv
    Tq, Tv = np.zeros((nc, nv)), np.zeros((nc, nv))
    ks = np.flatnonzero(it.interior)
    if not len(ks):
        return Tq, Tv
    dd, du = normal_rate_derivatives(sim, cons, q, v)
    d, u = np.asarray(cons.dist, dtype=float), it.u
    for k in ks.tolist():
        Tq[k] = -dd[k] / u[k] + d[k] * du[k] / u[k] ** 2
        Tv[k] = d[k] * cons.J[3 * k + 2] / u[k] ** 2
    return Tq, Tv


def normal_rate_derivatives(sim, cons, q, w):
    """(d dist/dq, d(n . vrel(w))/dq) (nc, nv) of the step's contacts at configuration ``q``:
    the distances' derivatives and those of the normal component of the relative velocity of
    the contact points for the generalized velocity ``w`` at fixed ``w`` (linear in ``w``: the
    pre-step ``v`` for the times of impact, the free acceleration for the impact law's gravity
    term, constraint.restitution_bias)."""
    from .derivatives import _Kin, geometry_derivatives, relative_velocity
    model = sim.model
    c = cons.contacts
    gj = sim.constraints.geom_joint
    j1s, j2s = gj[c.geom1], gj[c.geom2]
    joints = np.concatenate([j1s, j2s])
    # the simulator's own kinematics, brought to this pass's (q, w) and back to the step's after:
    # its per-tree groups (diffgym.sim.trees) or, for a single group, its Data (no Data of the
    # whole model of its own: that is cubic in nv)
    trees = sim.__dict__.get("_trees")
    if trees is not None:
        kin = _Kin(model, None, q, w, joints, trees)
        trees.kinematics(q, w)
        trees.geometry_placements(sim.geom_model, sim.geom_data)
    else:
        data = sim.data
        kin = _Kin(model, data, q, w, joints)
        pin.updateGeometryPlacements(model, data, sim.geom_model, sim.geom_data)
    # the geometry derivatives read the placements in sim.geom_data: those of the first pass's
    # configuration q here (after impact_substep they are at the second pass's), restored after
    try:
        dp, dn, dd = geometry_derivatives(sim, kin, cons)
    finally:
        q_now, v_now = sim.cache.get("q"), sim.cache.get("v")
        if q_now is not None:
            if trees is not None:
                trees.kinematics(q_now, v_now)
                trees.geometry_placements(sim.geom_model, sim.geom_data)
            else:
                pin.forwardKinematics(model, data, q_now, v_now)
                pin.computeJointJacobians(model, data)
                pin.updateGeometryPlacements(model, data, sim.geom_model, sim.geom_data)
    p = c.pos
    n = cons.frames[:, :, 2]
    vrel, dvrel = relative_velocity(kin, j1s, j2s, p, w, dp)
    du = np.einsum("ka,kan->kn", n, dvrel) + np.einsum("kan,ka->kn", dn, vrel)
    return dd, du


def _tau_derivatives(sim, cons, it: ImpactTimes, q, v):
    """(d tau/dq, d tau/dv) (nv, nv): each dof's time of impact, that of its island's contact."""
    Tq, Tv = _time_derivatives(sim, cons, it, q, v)
    nv = sim.nv
    dq, dv = np.zeros((nv, nv)), np.zeros((nv, nv))
    has = it.contact >= 0
    dq[has] = Tq[it.contact[has]]
    dv[has] = Tv[it.contact[has]]
    return dq, dv


def correct_jacobian(sim, jac, C, bias=None) -> None:
    """Rebuild the ``q1`` rows of ``jac`` (a StepJacobian, in place) for a step whose impacts
    were placed at their time of impact: ``C["impact_pre"]`` (the passes of
    :func:`impact_substep`: chain through ``q_c,k = q_c,k-1 (+) tau_k(q_c,k-1, v) v``; ``jac``'s
    velocity rows are those of the last pass, from ``q_c,K``) or ``C["impact_times"]`` (times at
    the step's ends, constant). ``bias``: ``(P, ks, s, ..)`` of the last pass's impact-law rows
    (``derivatives._impact_gravity``): ``v1`` moves by ``P[:, i]`` per unit of the offset of
    contact ``ks[i]``'s normal row, whose time of impact ``T`` (the time drifted, a function of
    the step's ``(q, v)``) enters it as ``s[i] T``."""
    model, dt, nv = sim.model, sim.dt, sim.nv
    pre = C.get("impact_pre")
    if pre is not None:
        v, passes = pre
        q_c, v1 = C["q"], C["v1"]
        Qq, Qv = np.eye(nv), np.zeros((nv, nv))          # d q_c,k / d(q, v)
        Sq, Sv = np.zeros((nv, nv)), np.zeros((nv, nv))  # d(sum tau_k) / d(q, v)
        for qk, it, cons in passes:
            tq, tv = _tau_derivatives(sim, cons, it, qk, v)
            dtq, dtv = tq @ Qq, tq @ Qv + tv
            s = it.tau * v
            A0 = pin.dIntegrate(model, qk, s, pin.ArgumentPosition.ARG0)
            A1 = pin.dIntegrate(model, qk, s, pin.ArgumentPosition.ARG1)
            Qq = A0 @ Qq + A1 @ (v[:, None] * dtq)
            Qv = A0 @ Qv + A1 @ (np.diag(it.tau) + v[:, None] * dtv)
            Sq, Sv = Sq + dtq, Sv + dtv
        dv_dq = jac.dv_dq @ Qq
        dv_dv = jac.dv_dv + jac.dv_dq @ Qv
        if bias is not None:
            # the impact law's T (constraint.restitution_bias: the time drifted by the dofs of
            # the contact's tree) is sum_k tau_k: d T = (Sq, Sv) rows of that tree's dof
            P, ks, sc = bias[:3]
            cb, c = sim.constraints, C["cons"].contacts
            tr = cb.joint_tree[cb.geom_joint[c.geom1[ks]]]
            tr = np.where(tr >= 0, tr, cb.joint_tree[cb.geom_joint[c.geom2[ks]]])
            dv_dq = dv_dq + P @ (sc[:, None] * Sq[tr])
            dv_dv = dv_dv + P @ (sc[:, None] * Sv[tr])
        dv_dtau = jac.dv_dtau
        consumed = consumed_time(passes)
        w = (dt - consumed)[:, None]
        delta = displacement(None, dt, v, v1, consumed)
        B0 = pin.dIntegrate(model, q_c, delta, pin.ArgumentPosition.ARG0)
        B1 = pin.dIntegrate(model, q_c, delta, pin.ArgumentPosition.ARG1)
        jac.dq_dq = B0 @ Qq + B1 @ (w * dv_dq - v1[:, None] * Sq)
        jac.dq_dv = B0 @ Qv + B1 @ (w * dv_dv - v1[:, None] * Sv)
        jac.dq_dtau = B1 @ (w * dv_dtau)
        jac.dv_dq, jac.dv_dv = dv_dq, dv_dv
        return
    it = C.get("impact_times")
    if it is None:
        return
    q, v, v1 = C["q"], C["v"], C["v1"]
    w = (dt - it.tau)[:, None]
    delta = displacement(it, dt, v, v1)
    dI_dq = pin.dIntegrate(model, q, delta, pin.ArgumentPosition.ARG0)
    dI_dv = pin.dIntegrate(model, q, delta, pin.ArgumentPosition.ARG1)
    jac.dq_dq = dI_dq + dI_dv @ (w * jac.dv_dq)
    jac.dq_dv = dI_dv @ (w * jac.dv_dv + np.diag(it.tau))
    jac.dq_dtau = dI_dv @ (w * jac.dv_dtau)
