"""Derivatives: analytical step Jacobians by implicit differentiation of the NCP, by contact mode.

Follows ``shared/notes/gradients.md``. For theta in {q, v, tau} (q in pinocchio's tangent space):

1. fixed-impulse sensitivity of the new velocity, ``V_theta = d v1/d theta |lam``, from
   pinocchio's ABA derivatives evaluated with the contact impulses as external forces fixed in
   the joint frames (``fext = lam / dt``), plus the correction for the contact force not being
   body-fixed: its point slides on the body and its frame follows the collision geometry
   (``geometry_derivatives``);
2. fixed-impulse sensitivity of the constraint velocities,
   ``D_theta = d sigma/d theta |lam = J V_theta + d(J(q) w)/dq |_{w=v1} + d b/dq`` (the last two
   for theta = q only: the motion of the contact frames and the Baumgarte offset);
3. the linearized mode equations of the solution found by the solver (breaking: ``d lam_i = 0``;
   sticking: ``d sigma_i = 0``; sliding: ``d sigma_N = 0`` and the slip-direction rotation;
   joint limit active: ``d sigma = 0``, inactive: ``d lam = 0``): ``A d lam = -B D_theta``,
   solved in the least-squares / minimum-norm sense because ``A`` is rank deficient when
   contacts are redundant (four coplanar points): ``d v1`` is unique although ``d lam`` is not;
4. ``d v1 = V_theta + M^-1 J^T d lam`` and the Lie-group chain rule through ``pinocchio.integrate``.

At a mode switch the result is the one-sided derivative of the mode the solver found (the
Jacobian of the smooth piece the current state lies on); no smoothing is applied.

Collision geometry (how contact points, normals and distances move with q) is closed form for
a static plane against sphere, capsule, box, cylinder, ellipsoid and convex meshes (witness
points of flat shapes are body-fixed vertices; spheres and capsules roll about their centre or
segment point) and for sphere-sphere. Any other pair (e.g. box-box) falls back to a central
difference of the collision output alone (``collision_fd_eps``), never of the dynamics.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pinocchio as pin

from .constraint import baumgarte_gain
from .solver import BREAKING, STICKING

collision_fd_eps = 1e-7


@dataclass
class StepJacobian:
    """Derivatives of one step. Columns/rows for q are tangent (nv wide)."""

    dq_dq: np.ndarray
    dq_dv: np.ndarray
    dq_dtau: np.ndarray
    dv_dq: np.ndarray
    dv_dv: np.ndarray
    dv_dtau: np.ndarray

    @property
    def state(self) -> np.ndarray:
        """d(q1, v1)/d(q, v): (2nv, 2nv)."""
        return np.block([[self.dq_dq, self.dq_dv], [self.dv_dq, self.dv_dv]])

    @property
    def control(self) -> np.ndarray:
        """d(q1, v1)/d tau: (2nv, nv)."""
        return np.vstack([self.dq_dtau, self.dv_dtau])


def _skew(x: np.ndarray) -> np.ndarray:
    return np.array([[0.0, -x[2], x[1]], [x[2], 0.0, -x[0]], [-x[1], x[0], 0.0]])


def _frame_derivative(n: np.ndarray, dn: np.ndarray) -> np.ndarray:
    """d R / dq (3, 3, nv) of R = tangent_frames(n) given dn (3, nv)."""
    helper = np.array([1.0, 0, 0]) if abs(n[0]) < 0.9 else np.array([0, 1.0, 0])
    c = np.cross(helper, n)
    nc = np.linalg.norm(c)
    t1 = c / nc
    dc = np.cross(helper[:, None], dn, axis=0)
    dt1 = (np.eye(3) - np.outer(t1, t1)) @ dc / nc
    dt2 = np.cross(dn, t1[:, None], axis=0) + np.cross(n[:, None], dt1, axis=0)
    return np.stack([dt1, dt2, dn], axis=1)


class _Kin:
    """Per-joint kinematic quantities at (q, v1) for the contacts' joints."""

    def __init__(self, model, data, q, v1, joints):
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
        self.nv = model.nv

    def point_jacobian(self, j: int, p: np.ndarray) -> np.ndarray:
        if j == 0:
            return np.zeros((3, self.nv))
        J = self.J[j]
        return J[:3] - _skew(p - self.o[j]) @ J[3:]


def geometry_derivatives(sim, kin: _Kin, cons) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dp/dq (nc, 3, nv), dn/dq (nc, 3, nv), d dist/dq (nc, nv) of every contact point."""
    nc = cons.nc
    nv = sim.nv
    c = cons.contacts
    geoms = sim.sm.geoms
    gjoint = sim.constraints.geom_joint
    dp = np.zeros((nc, 3, nv))
    dn = np.zeros((nc, 3, nv))
    dd = np.zeros((nc, nv))
    fallback = []
    for k in range(nc):
        g1, g2 = int(c.geom1[k]), int(c.geom2[k])
        k1, k2 = geoms[g1].kind, geoms[g2].kind
        j1, j2 = int(gjoint[g1]), int(gjoint[g2])
        n = c.normal[k]
        p = c.pos[k]
        dist = c.dist[k]
        if (k1 == "plane" and j1 == 0) or (k2 == "plane" and j2 == 0):
            s = 1.0 if k1 == "plane" else -1.0        # +1: the moving shape X is geom 2
            gx = g2 if s > 0 else g1
            jx = j2 if s > 0 else j1
            x = p + s * 0.5 * dist * n                 # witness point on X
            kind = geoms[gx].kind
            r = geoms[gx].size[0] if kind in ("sphere", "capsule") else 0.0
            anchor = x + s * r * n                     # body-fixed point: centre or vertex
            dx = kin.point_jacobian(jx, anchor)
            dd[k] = s * n @ dx
            dp[k] = dx - s * 0.5 * np.outer(n, dd[k])
        elif k1 == "sphere" and k2 == "sphere":
            c1 = sim.geom_data.oMg[g1].translation
            c2 = sim.geom_data.oMg[g2].translation
            r1, r2 = geoms[g1].size[0], geoms[g2].size[0]
            L = np.linalg.norm(c2 - c1)
            dc1, dc2 = kin.point_jacobian(j1, c1), kin.point_jacobian(j2, c2)
            dn[k] = (np.eye(3) - np.outer(n, n)) @ (dc2 - dc1) / L
            dd[k] = n @ (dc2 - dc1)
            dp[k] = 0.5 * (dc1 + dc2) + 0.5 * (r1 - r2) * dn[k]
        else:
            fallback.append(k)
    if fallback:
        _collision_fd(sim, cons, fallback, dp, dn, dd)
    return dp, dn, dd


def _collision_fd(sim, cons, idx, dp, dn, dd) -> None:
    """Central difference of the collision output alone for pairs without a closed form."""
    model, q = sim.model, sim.cache["q"]
    data = model.createData()
    gdata = pin.GeometryData(sim.geom_model)
    c = cons.contacts
    for i in range(sim.nv):
        outs = []
        for sgn in (1.0, -1.0):
            e = np.zeros(sim.nv)
            e[i] = sgn * collision_fd_eps
            pin.framesForwardKinematics(model, data, pin.integrate(model, q, e))
            pin.updateGeometryPlacements(model, data, sim.geom_model, gdata)
            out = {}
            for k in idx:
                pair = int(c.pair[k])
                req = gdata.collisionRequests[pair]
                req.security_margin = 1.0
                req.enable_contact = True
                pin.computeCollision(sim.geom_model, gdata, pair)
                pin.computeContactPatch(sim.geom_model, gdata, pair)
                pres = gdata.contactPatchResults[pair]
                if pres.numContactPatches():
                    patch = pres.getContactPatch(0)
                    m = patch.size()
                    P1 = np.array([patch.getPointShape1(t) for t in range(m)])
                    P2 = np.array([patch.getPointShape2(t) for t in range(m)])
                    nrm = np.asarray(patch.getNormal()).copy()
                else:
                    ct = gdata.collisionResults[pair].getContact(0)
                    P1, P2 = ct.getNearestPoint1()[None], ct.getNearestPoint2()[None]
                    nrm = np.asarray(ct.normal).copy()
                mid = 0.5 * (P1 + P2)
                t = int(np.argmin(np.linalg.norm(mid - c.pos[k], axis=1)))
                out[k] = (mid[t], nrm, float(nrm @ (P2[t] - P1[t])))
            outs.append(out)
        for k in idx:
            (pa, na, da), (pb, nb, db) = outs[0][k], outs[1][k]
            dp[k][:, i] = (pa - pb) / (2 * collision_fd_eps)
            dn[k][:, i] = (na - nb) / (2 * collision_fd_eps)
            dd[k][i] = (da - db) / (2 * collision_fd_eps)


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
            P = (mu[i] * lam[3 * i + 2] / nst) * (np.eye(2) - np.outer(u, u))
            A[3 * i:3 * i + 2, 3 * i:3 * i + 2] = np.eye(2)
            A[3 * i:3 * i + 2, 3 * i + 2] = mu[i] * u
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


def step_jacobian(sim) -> StepJacobian:
    """Jacobian of the step that ``sim`` just took (uses ``sim.cache``)."""
    C = sim.cache
    model = sim.model
    nv, dt = sim.nv, sim.dt
    q, v, v1, q1 = C["q"], C["v"], C["v1"], C["q1"]
    cons, res = C["cons"], C["res"]
    data = getattr(sim, "_ddata", None)
    if data is None:
        data = sim._ddata = model.createData()
    damping = sim.sm.damping
    dpassive_dq = np.zeros((nv, nv))
    if len(sim._stiff_idx):
        dpassive_dq[sim._stiff_idx, sim._stiff_idx] = -sim._stiff_k

    fext = [pin.Force.Zero() for _ in range(model.njoints)]
    if cons is not None:
        nc = cons.nc
        c = cons.contacts
        gj = sim.constraints.geom_joint
        j1s, j2s = gj[c.geom1], gj[c.geom2]
        kin = _Kin(model, data, q, v1, np.concatenate([j1s, j2s]))
        lam_c = res.lam[:3 * nc].reshape(nc, 3)
        f_world = np.einsum("kij,kj->ki", cons.frames, lam_c) if nc else np.zeros((0, 3))
        for k in range(nc):
            for j, sgn in ((int(j1s[k]), -1.0), (int(j2s[k]), 1.0)):
                if j == 0:
                    continue
                f = sgn * f_world[k] / dt
                Rj = kin.R[j]
                r = c.pos[k] - kin.o[j]
                fext[j] = fext[j] + pin.Force(Rj.T @ f, Rj.T @ np.cross(r, f))
    ddq_dq, ddq_dv, Minv = pin.computeABADerivatives(model, data, q, v, C["tau_total"], fext)
    Minv = np.triu(Minv) + np.triu(Minv, 1).T
    Vq = dt * (ddq_dq + Minv @ dpassive_dq)
    Vv = np.eye(nv) + dt * (ddq_dv - Minv * damping[None, :])
    Vt = dt * Minv
    if cons is not None and cons.m:
        J, G = cons.J, C["G"]
        m = cons.m
        dp, dn, dd = geometry_derivatives(sim, kin, cons) if nc else (None, None, None)
        corr = np.zeros((nv, nv))           # d(J^T lam)/dq minus its body-fixed part
        Dq_extra = np.zeros((m, nv))        # d(J(q) w)/dq at w = v1, plus Baumgarte
        erp, skin = sim.constraints.erp, sim.constraints.skin
        for k in range(nc):
            R = cons.frames[k]
            dR = _frame_derivative(c.normal[k], dn[k])
            f = f_world[k]
            df = np.einsum("ijn,j->in", dR, lam_c[k])
            p = c.pos[k]
            vrel = np.zeros(3)
            dvrel = np.zeros((3, nv))
            for j, sgn in ((int(j1s[k]), -1.0), (int(j2s[k]), 1.0)):
                if j == 0:
                    continue
                Jj = kin.J[j]
                Jp = kin.point_jacobian(j, p)
                Jw = Jj[3:]
                fs = sgn * f
                corr += Jp.T @ (sgn * df + _skew(fs) @ Jw) - Jw.T @ _skew(fs) @ (dp[k] - Jp)
                w = kin.omega[j]
                Vw = sim_point_velocity(kin, j, p, v1)
                vrel += sgn * Vw
                dV = kin.dV[j]
                dvrel += sgn * (dV[:3] - _skew(p) @ dV[3:] + _skew(w) @ dp[k])
            rows = slice(3 * k, 3 * k + 3)
            Dq_extra[rows] = np.einsum("ain,a->in", dR, vrel) + R.T @ dvrel
            Dq_extra[3 * k + 2] += baumgarte_gain(cons.dist[k], dt, erp, skin) * dd[k]
        for jl, li in enumerate(cons.limits):
            lim = sim.sm.limits[li]
            Dq_extra[3 * nc + jl, lim.idx_v] += baumgarte_gain(cons.limit_dist[jl], dt, erp, skin) * lim.sign
        Vq = Vq + Minv @ corr
        D = np.hstack([J @ Vq + Dq_extra, J @ Vv, J @ Vt])
        A, W = _mode_system(res, G, nc, cons.mu)
        dlam = np.linalg.lstsq(A, -(W @ D), rcond=1e-12)[0]
        MJt = Minv @ J.T
        dv1 = np.hstack([Vq, Vv, Vt]) + MJt @ dlam
    else:
        dv1 = np.hstack([Vq, Vv, Vt])
    dv_dq, dv_dv, dv_dtau = dv1[:, :nv], dv1[:, nv:2 * nv], dv1[:, 2 * nv:]
    dI_dq = pin.dIntegrate(model, q, v1 * dt, pin.ArgumentPosition.ARG0)
    dI_dv = pin.dIntegrate(model, q, v1 * dt, pin.ArgumentPosition.ARG1)
    del q1
    return StepJacobian(dq_dq=dI_dq + dt * dI_dv @ dv_dq, dq_dv=dt * dI_dv @ dv_dv,
                        dq_dtau=dt * dI_dv @ dv_dtau, dv_dq=dv_dq, dv_dv=dv_dv, dv_dtau=dv_dtau)


def sim_point_velocity(kin: _Kin, j: int, p: np.ndarray, v1: np.ndarray) -> np.ndarray:
    """World velocity at world point p of the body of joint j, for generalized velocity v1."""
    return kin.point_jacobian(j, p) @ v1
