"""DiffGo1-v0: the Unitree Go1 quadruped walking forward at a commanded speed.

## Description
The Unitree Go1 of ``example-robot-data`` (``asset_path("go1.urdf")``: 13.1 kg, 12 actuated
revolute joints with their URDF limits as hard limits, primitive collision geoms: spheres for
the feet, boxes and cylinders for the links) on a floating base (pinocchio FreeFlyer) above a
ground plane, Coulomb friction 1.0. The task is to walk forward (+x of the base) at a
commanded speed that is fixed for an episode. Time step 0.005 s, four simulator steps per
environment step (``frame_skip=4``, environment dt 0.02 s, 50 Hz control, as legged_gym).
The URDF's 0.2 N m of joint dry friction is left out by default (it costs 1.8x the step time
for a 1.4 cm difference in 3 s, measured); ``sim_options={"ignore_unsupported": ()}`` simulates it.

The action sets joint targets through a PD layer evaluated at every simulator step::

    tau = clip(Kp (q_stand + 0.25 a - q) - Kd qdot, -tau_max, tau_max)

with Kp = 40 N m/rad, Kd = 1 N m s/rad, q_stand the SRDF ``standing`` pose and tau_max the
URDF effort limits (23.7 N m hip and thigh, 35.55 N m knee). Its derivatives with respect to
the state and the action are exact (0 where a torque saturates). With a = 0 the robot stands at
a base height of about 0.233 m.

Time step (measured, 2 s with a = 0 and with uniform random actions): dt = 0.005 s is stable
for these gains (dt sqrt(Kp/I) = 0.42 and dt Kd/I = 0.88 for the knee, I = 0.0057 kg m^2);
dt = 0.02 s in one step makes the contact solver fail.

## Action space
``Box(-1, 1, (12,))``: joint target offsets from the standing pose, 0.25 rad at ``|a| = 1``,
in the order FL, FR, RL, RR legs x (hip, thigh, calf). Clipped outside [-1, 1] (derivative 0).

## Observation space
``Box(-inf, inf, (47,), float64)``, every entry a smooth function of the state:

| index | content |
| --- | --- |
| 0 | base height z (m, world) |
| 1-3 | gravity direction in the base frame, ``R^T (0, 0, -1)`` (``(0, 0, -1)`` upright) |
| 4-6 | base linear velocity in the base frame (m/s) |
| 7-9 | base angular velocity in the base frame (rad/s) |
| 10-21 | joint positions minus the standing pose (rad) |
| 22-33 | joint velocities (rad/s) |
| 34-45 | the previous action (the action of this step, after clipping) |
| 46 | the commanded forward speed (m/s) |

## Rewards
Evaluated at the state after the step, with ``v`` the base-frame linear velocity, ``w`` the
base-frame angular velocity, ``g`` the base-frame gravity direction, ``c`` the commanded speed::

    tracking     = exp(-((v_x - c)^2 + v_y^2) / 0.25)
    yaw          = 0.5 exp(-w_z^2 / 0.25)
    upright      = 0.5 (-g_z)                      (cos of the tilt; 0.5 upright)
    height       = -20 (z - 0.25)^2
    torque       = -1e-4 |tau|^2                   (tau: the PD torque at the new state)
    joint_vel    = -5e-4 |qdot|^2

``r`` is their sum; ``info`` reports each (``reward_tracking``, ``reward_yaw``,
``reward_upright``, ``reward_height``, ``reward_torque``, ``reward_joint_velocity``) plus
``forward_velocity`` (``v_x``), ``command`` and ``x_position``. The torque term uses the PD
torque the same action gives at the new state (the torques applied inside the step are not
part of the state); it is smooth except where a torque saturates.

## Starting state
The standing pose with the base lifted so that the lowest foot sphere is 1 mm above the
ground, plus U(-0.05, 0.05) rad on each joint, U(-0.02, 0.02) rad of roll, pitch and yaw,
U(-0.05, 0.05) on every velocity; previous action 0; the command drawn from
U(``command_range``) unless ``command`` is given.

## Episode end
Terminated when the base height is below 0.15 m, when the base is tilted by more than 60
degrees (``-g_z < 0.5``, which includes flipping over), or when the simulation diverged
(``info["diverged"] = True``). Truncated after ``episode_steps`` = 1000 steps (20 s).

## Arguments
``gym.make("DiffGo1-v0", render_mode=None, episode_steps=1000, frame_skip=4, command=None,
command_range=(0.2, 1.0), sim_options=None, width=320, height=240)``: ``command`` fixes the
forward speed (m/s); ``sim_options`` are keyword settings of :class:`diffgym.Simulator`
(``dt``, ``friction``...). ``render_mode="rgb_array"`` draws a three-quarter view that follows
the base over the ground.

## State
``get_state()`` is ``[q (19), v (18), previous action (12), command (1)]``: q = base position
(world), base quaternion (x, y, z, w), 12 joint angles; v = base linear and angular velocity
in the base frame, 12 joint velocities (pinocchio's FreeFlyer convention). ``n_x = 48``:
derivatives use the tangent perturbation ``q (+) dq`` (pinocchio.integrate; base rotation
``R exp(dw)``), the previous action is differentiable and the command is a constant.
"""
from __future__ import annotations

import warnings

import numpy as np
import pinocchio as pin

from diffgym.sim.forward import Simulator
from diffgym.resources import asset_path
from diffgym.sim.unsupported import UnsupportedIgnoredWarning

from .base import DiffEnv


def _skew(w: np.ndarray) -> np.ndarray:
    return np.array([[0.0, -w[2], w[1]], [w[2], 0.0, -w[0]], [-w[1], w[0], 0.0]])


def _quat_to_matrix(quat: np.ndarray) -> np.ndarray:
    """Rotation matrix of a unit quaternion stored (x, y, z, w)."""
    x, y, z, w = quat / np.linalg.norm(quat)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


class DiffGo1Env(DiffEnv):
    asset = "go1.urdf"
    frame_skip = 4
    episode_steps = 1000
    n_diff = 12               # the previous action
    n_const = 1               # the commanded forward speed
    obs_dim = 47
    # a three-quarter view from the front right; _render_kwargs follows the base in x and y
    camera = dict(lookat=(0.0, 0.0, 0.15), distance=1.2, azimuth=135.0, elevation=-20.0)

    DT = 0.005
    FRICTION = 1.0
    KP, KD, ACTION_SCALE = 40.0, 1.0, 0.25
    FOOT_CLEARANCE = 1e-3     # m, lowest foot above the ground at reset
    W_TRACK, SIGMA_TRACK = 1.0, 0.25
    W_YAW, SIGMA_YAW = 0.5, 0.25
    W_UPRIGHT = 0.5
    W_HEIGHT, TARGET_HEIGHT = 20.0, 0.25
    W_TORQUE = 1e-4
    W_JOINT_VEL = 5e-4
    MIN_HEIGHT = 0.15
    MIN_UPRIGHT = 0.5         # cos of the largest tilt (60 degrees)
    JOINT_NOISE, ORIENT_NOISE, VEL_NOISE = 0.05, 0.02, 0.05

    def __init__(self, render_mode=None, episode_steps=None, frame_skip=None, command=None,
                 command_range=(0.2, 1.0), **kwargs):
        try:
            lo_hi = np.asarray(command_range, dtype=float)
        except (TypeError, ValueError):
            lo_hi = np.full(1, np.nan)
        if lo_hi.shape != (2,) or not np.all(np.isfinite(lo_hi)) or lo_hi[0] > lo_hi[1]:
            raise ValueError(f"command_range must be (low, high) with low <= high (m/s), "
                             f"got {command_range!r}")
        if command is not None:
            try:
                c = float(command)
            except (TypeError, ValueError):
                c = float("nan")
            if not np.isfinite(c):
                raise ValueError(f"command must be a finite forward speed (m/s), got {command!r}")
            command = c
        self.command_range = (float(lo_hi[0]), float(lo_hi[1]))
        self.fixed_command = command
        super().__init__(render_mode=render_mode, episode_steps=episode_steps,
                         frame_skip=frame_skip, **kwargs)
        m = self.sim.model
        if (self.nq, self.nv) != (19, 18) or m.joints[1].shortname() != "JointModelFreeFlyer":
            raise RuntimeError(f"{self.asset}: expected a FreeFlyer base and 12 joints, got "
                               f"nq={self.nq}, nv={self.nv}")
        acts = sorted(self.sim.actuators, key=lambda act: act.idx_v)
        if [act.idx_v for act in acts] != list(range(6, 18)):
            raise RuntimeError(f"{self.asset}: expected one motor per joint dof 6..17")
        self.q_stand = self.sim.q0[7:].copy()
        self.tau_max = np.array([max(abs(act.ctrlrange[0]), abs(act.ctrlrange[1]))
                                 if act.ctrlrange is not None else np.inf for act in acts])
        self._data = m.createData()
        self._gdata = pin.GeometryData(self.sim.geom_model)
        self._feet = [i for i, g in enumerate(self.sim.sm.geoms) if g.kind == "sphere"
                      and g.name.endswith("foot_0")]
        if len(self._feet) != 4:
            raise RuntimeError(f"{self.asset}: expected 4 foot spheres, found {len(self._feet)}")
        self._foot_radius = np.array([self.sim.sm.geoms[i].size[0] for i in self._feet])

    def _make_sim(self, **options) -> Simulator:
        options.setdefault("dt", self.DT)
        options.setdefault("friction", self.FRICTION)
        # the URDF gives each joint 0.2 N m of dry friction (<dynamics friction>). diffgym
        # simulates it (12 box-constrained rows, diffgym.sim.equality; their mixed solve compiled,
        # their assembly in Python): measured 1.8x the time of an env step (10.0 vs 5.5 ms on a
        # loaded machine; 3.7x before that solve was compiled, and 4.0x with the Jacobian then),
        # for a difference of 1.4 cm in the base position after 3 s of random
        # actions (0.012 rad in the joints, of PD torques up to 23.7 N m). So this environment
        # leaves it out by default (said here and in the docs, not warned at each reset);
        # sim_options={"ignore_unsupported": ()} simulates it.
        options.setdefault("ignore_unsupported", ("joint.frictionloss",))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnsupportedIgnoredWarning)
            return Simulator.from_file(asset_path(self.asset), **options)

    # -- starting state -------------------------------------------------------------------------
    def _lowest_foot(self, q: np.ndarray) -> float:
        """Height of the lowest point of the foot spheres at configuration q."""
        m, d = self.sim.model, self._data
        pin.forwardKinematics(m, d, q)
        pin.updateGeometryPlacements(m, d, self.sim.geom_model, self._gdata)
        z = [self._gdata.oMg[i].translation[2] for i in self._feet]
        return float(np.min(np.array(z) - self._foot_radius))

    def _reset_state(self, rng):
        nq, nv = self.nq, self.nv
        x = np.zeros(self.state_size)
        q = self.sim.q0.copy()
        q[7:] += rng.uniform(-self.JOINT_NOISE, self.JOINT_NOISE, 12)
        rpy = rng.uniform(-self.ORIENT_NOISE, self.ORIENT_NOISE, 3)
        quat = pin.Quaternion(pin.rpy.rpyToMatrix(rpy))
        q[3:7] = [quat.x, quat.y, quat.z, quat.w]
        q[2] += self.FOOT_CLEARANCE - self._lowest_foot(q)
        x[:nq] = q
        x[nq:nq + nv] = rng.uniform(-self.VEL_NOISE, self.VEL_NOISE, nv)
        if self.fixed_command is not None:
            c = self.fixed_command
        else:
            c = rng.uniform(*self.command_range)
        x[nq + nv + self.n_diff] = c
        return x

    # -- PD layer -------------------------------------------------------------------------------
    def _pd(self, x, a):
        """(tau_joints (12,), unsaturated mask (12,)) of the PD layer at state x, action a."""
        qj, vj = x[7:19], x[self.nq + 6:self.nq + 18]
        raw = self.KP * (self.q_stand + self.ACTION_SCALE * a - qj) - self.KD * vj
        tau = np.minimum(np.maximum(raw, -self.tau_max), self.tau_max)   # (np.clip, without its wrapper)
        free = (np.abs(raw) < self.tau_max).astype(float)
        return tau, free

    def _forces(self, x, a):
        nv = self.nv
        tau_j, free = self._pd(x, a)
        tau = np.zeros(nv)
        tau[6:] = tau_j
        if not self._derivs:
            return tau, None, None
        dtau_dx = np.zeros((nv, self.n_x))
        idx = np.arange(6, 18)
        dtau_dx[idx, idx] = -self.KP * free
        dtau_dx[idx, nv + idx] = -self.KD * free
        dtau_da = np.zeros((nv, 12))
        dtau_da[idx, np.arange(12)] = self.KP * self.ACTION_SCALE * free
        return tau, dtau_dx, dtau_da

    def _extra_next(self, x, a):
        return a.copy(), None, (np.eye(12) if self._derivs else None)

    # -- observation and reward -------------------------------------------------------------------
    def _base(self, x):
        R = _quat_to_matrix(x[3:7])
        g = -R[2].copy()                    # R^T (0, 0, -1)
        return R, g

    def _observe(self, x):
        nq, nv = self.nq, self.nv
        R, g = self._base(x)
        v = x[nq:nq + nv]
        n0 = nq + nv
        obs = np.concatenate([[x[2]], g, v[0:6], x[7:19] - self.q_stand, v[6:18],
                              x[n0:n0 + 12], [x[n0 + 12]]])
        if not self._derivs:
            return obs, None
        d = np.zeros((self.obs_dim, self.n_x))
        d[0, 0:3] = R[2]                                     # z moves by R dp
        d[1:4, 3:6] = _skew(g)                               # (R exp(w))^T e = g + g x w
        d[4:10, nv:nv + 6] = np.eye(6)
        d[10:22, 6:18] = np.eye(12)
        d[22:34, nv + 6:nv + 18] = np.eye(12)
        d[34:46, 2 * nv:2 * nv + 12] = np.eye(12)
        return obs, d

    def _reward(self, x, a):
        nq, nv = self.nq, self.nv
        R, g = self._base(x)
        v = x[nq:nq + nv]
        c = x[nq + nv + self.n_diff]
        vx, vy, wz = v[0], v[1], v[5]
        qd = v[6:18]
        z = x[2]
        tau, free = self._pd(x, a)

        e_track = ((vx - c) ** 2 + vy ** 2) / self.SIGMA_TRACK
        tracking = self.W_TRACK * np.exp(-e_track)
        yaw = self.W_YAW * np.exp(-wz ** 2 / self.SIGMA_YAW)
        upright = self.W_UPRIGHT * (-g[2])
        height = -self.W_HEIGHT * (z - self.TARGET_HEIGHT) ** 2
        torque = -self.W_TORQUE * float(tau @ tau)
        joint_vel = -self.W_JOINT_VEL * float(qd @ qd)
        terms = {"reward_tracking": float(tracking), "reward_yaw": float(yaw),
                 "reward_upright": float(upright), "reward_height": float(height),
                 "reward_torque": torque, "reward_joint_velocity": joint_vel}
        r = tracking + yaw + upright + height + torque + joint_vel
        if not self._derivs:
            terms.update(forward_velocity=float(vx), command=float(c), x_position=float(x[0]))
            return float(r), terms, None, None

        dr = np.zeros(self.n_x)
        dr[nv + 0] = -tracking * 2.0 * (vx - c) / self.SIGMA_TRACK
        dr[nv + 1] = -tracking * 2.0 * vy / self.SIGMA_TRACK
        dr[nv + 5] = -yaw * 2.0 * wz / self.SIGMA_YAW
        dr[3:6] += -self.W_UPRIGHT * _skew(g)[2]
        dr[0:3] += -2.0 * self.W_HEIGHT * (z - self.TARGET_HEIGHT) * R[2]
        # torque: d tau / d q_j = -Kp, d tau / d qdot_j = -Kd, d tau / d a = Kp s (unsaturated)
        gt = -2.0 * self.W_TORQUE * tau * free
        dr[6:18] += -self.KP * gt
        dr[nv + 6:nv + 18] += -self.KD * gt - 2.0 * self.W_JOINT_VEL * qd
        dr_da = self.KP * self.ACTION_SCALE * gt
        terms.update(forward_velocity=float(vx), command=float(c), x_position=float(x[0]))
        return float(r), terms, dr, dr_da

    def _terminated(self, x):
        _, g = self._base(x)
        return bool(x[2] < self.MIN_HEIGHT or -g[2] < self.MIN_UPRIGHT)

    def _render_kwargs(self) -> dict:
        from diffgym.render import Camera
        lookat = np.array(self.camera["lookat"], dtype=float)
        lookat[:2] += self._x[:2]                   # follow the base over the ground
        return {"camera": Camera(**dict(self.camera, lookat=lookat))}
