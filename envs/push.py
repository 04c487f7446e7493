"""DiffPush-v0: a rod moved in the table plane pushes a box to a target.

## Description
A horizontal stick (a capsule 0.2 m long between its cap centres, radius 2 cm, 1 kg) moves in
the plane of a table on two slide joints and a yaw hinge, its axis 3.5 cm above the table; it
touches only a 10 cm, 0.5 kg box (free joint) that lies on its face on the table. Coulomb
friction 0.3 on every contact, the rod's included. The task is to push the box onto a target
point. This is the scene of the Push benchmark of the long-range-gradients contact-model paper
(``shared/papers/contact-model-long-range-gradients.txt``: the position and orientation of a
PD-controlled rod pushing a box lying on a table, 200 frames at dt = 0.04 s); our rod has the
three planar degrees of freedom of that task (the paper's rod has six). Model:
``assets/push.xml``, time step 0.04 s, one simulator step per environment step. The
simulator's contact margin is raised to 15 cm for this environment so that a rod accelerated
by the PD layer within a step cannot enter the box unseen (``CONTACT_MARGIN``; see
``_make_sim``).

## Contact, uniqueness and what the Jacobian is
The box face on the table is four coplanar corner contacts (a statically indeterminate
support); with friction at the rod the rod can also carry part of the box's weight. The
impulses are then not unique, and what the step and its Jacobian are depends on whether the
velocity is:

- **Box at rest, sticking, or sliding without spinning** (and every rod-box contact): the
  impulses form a family but the next velocity is unique (a self-equilibrated change of the
  normal impulses moves no body; for a face translating without spin it also leaves the net
  friction force and torque alone). The step is a function of the state, and the Jacobian
  ``step_with_jacobian`` returns is its derivative: the implicit derivative of the contact
  problem in the modes found, whose linear system is solved for the minimum-norm change of the
  impulses (``diffgym.sim.derivatives``, step 3); the change of the velocity is the same for
  every member of the family. Checked against central differences at every sub-step of random
  rollouts (``tests/test_envs_manip.py``): no disagreement other than mode switches.
- **Box sliding while it spins on its face**: the slip directions differ from corner to
  corner, so moving normal impulse between corners changes the friction torque. Rigid
  Coulomb point contact then has a one-parameter family of solutions *of the velocity too*
  (17 independent conditions on 18 unknowns per face): the next state is not a function of the
  state. The solver returns the member its warm start leads to (the previous step's impulses,
  hidden state: ``snapshot()``/``restore()`` carry it). Measured on random pushing rollouts:
  about 20% of steps, with the box's spin after a step differing by up to 0.67 rad/s between a
  warm and a cold start, both converged (``tests/data/push_nonunique.npz``). There the Jacobian
  is the same formula (minimum-norm change of the impulses) at the member returned: the
  derivative of the one solution found, holding the free split of normal impulse to its
  minimum-norm change. It is a valid first-order model of that solution branch but not the
  derivative of a step map (there is none); central differences of the solver's output may
  disagree with it or jump. ``diffgym.gradcheck`` labels such disagreements *indeterminate*
  (``velocity_indeterminacy``: the mode system has a null direction of the impulses that moves
  the velocity), never *explained* or *agreeing*.

- **The rod flat against the box face while the box slides on the table** (a steady push):
  the rod's vertical friction could carry part of the box's weight, and what it carries sets
  the table's friction. In exact arithmetic that is a family of velocities; in the problem the
  step actually solves it usually is not: the table contacts' drift correction (Baumgarte,
  ``erp * depth / dt`` for corners about 1e-9 m deep) asks the box to rise by about 1e-8 m/s,
  which a rod *sticking* in the vertical direction cannot allow, so the sticking equations
  have no solution. The rigid problem's solution then has the rod contacts sliding that slowly,
  their friction on the cone opposite the slip (pressing the box down by up to ``0.3`` times
  the rod's normal impulse): the friction direction, and with it the table's friction, is set
  by a 1e-8 m/s drift correction. The solver's stage 1 finds that solution (a sticking contact
  whose Newton iteration stalls with a slip is switched to sliding, friction opposite the
  slip; ``tests/data/push_nonconverged.npz`` converges there in stage 1, where stages 1 and 1b
  failed and ADMM/PGS stopped at 1.5e-8 m/s before). The Jacobian is the implicit derivative of
  the mode equations in those sliding modes, with the free split of normal impulse between the
  table corners held to its minimum-norm change. At the recorded state its velocity-by-force
  block matched central differences (h = 1e-7) within 1e-5 in a fresh process, but only to 1.7e-5
  after other pushes had run in the same process (not yet explained; not a test). It is the
  derivative of that branch: the branch
  itself can switch (friction up or down) with the sign of a 1e-8 m/s drift correction.
  The drift correction of such redundant rows can itself be unrealizable (the rod's end
  pushed out of the face by a yaw whose tangential slip the sticking rod forbids). With
  ``env.unwrapped.sim.solver.settings.realizable_bias = True`` (off by default), where stage 1
  fails on the raw offsets the step solves again with the touching rows' offsets projected
  onto the range of their rows of J (``constraint.realizable_bias``, at most 5e-6 m/s from the
  raw ones here) and keeps that where stage 1 succeeds: along the ramped 200-step push every
  step then converges in stage 1 (196 ``newton``, 4 ``prox+newton`` by the last sub-step of
  each step; 6 sub-steps with the realizable
  offsets; ``tests/test_envs_manip.py``). By default (off) 28 of those 200 steps end in the
  later stages, 11 unconverged (``sim.last.converged`` False with a ``SolverWarning``). The
  Jacobian at the retried steps includes the projection's own derivative
  (``derivatives._realizable_terms``); most of those steps are the box sliding while it turns,
  where the velocity is not unique (above).

The old scene (box on three feet, frictionless rod) avoided these cases; this one is the
paper's. ``sim.last`` reports the solver's statistics per step (``converged``, ``method``,
``iterations``, ``residual``).

## Action space
``Box(-1, 1, (3,))`` for the rod's x, y and yaw, through a PD layer computed inside the step
(its derivatives with respect to the state and the action are exact). ``control=`` picks what
the action means:

- ``"pose"`` (default): a target pose in a workspace around the box's start,
  ``x* = 0.5 a0``, ``y* = 0.5 a1`` (m, world frame) and ``yaw* = pi a2``; the force is
  ``tau = Kp (target - pose) - Kd v``. ``a = 0`` sends the rod to the workspace centre.
- ``"velocity"``: target velocities ``0.5 a0``, ``0.5 a1`` m/s and ``2 a2`` rad/s with
  ``tau = K (v* - v)`` (the joint damping of the model is compensated so that ``v -> v*``).

Gains are set from the rod's inertia for a natural frequency of 10 rad/s and damping ratio 0.75
(about 4 steps to settle; stable for the explicit damping at dt = 0.04 s). Actions outside
[-1, 1] are clipped (derivative 0 there).

## Observation space
``Box(-inf, inf, (18,), float64)``:

| index | content |
| --- | --- |
| 0-1 | rod position x, y (world, m) |
| 2-3 | cos, sin of the rod yaw |
| 4-5 | box position x, y |
| 6-7 | box heading: the x, y components of the box's x axis (cos, sin of its yaw when flat) |
| 8-10 | rod velocity x, y (m/s) and yaw rate (rad/s) |
| 11-12 | box velocity x, y (world frame) |
| 13 | box yaw rate (world z component of its angular velocity) |
| 14-15 | target x, y |
| 16-17 | target minus box position |

## Rewards
``r = -|box_xy - target|^2`` (m^2) after the step (box_xy: the box centre), reported as
``info["reward_distance"]``;
``info["distance"]`` is ``|box_xy - target|`` and ``info["success"]`` is ``distance < 0.02``.
The reward is a smooth function of the state.

## Starting state
The box at rest at the origin plus U(-0.02, 0.02) m per axis with yaw U(-pi, pi); the rod at
rest 0.2 m from the box centre in a uniformly random direction with yaw U(-pi, pi); the target
0.15 to 0.35 m from the box in a uniformly random direction (a constant of the episode, held in
the state's extras), unless fixed with ``target=``.

## Episode end
No termination. Truncated after ``episode_steps`` = 200 steps (8 s). A diverged simulation
terminates with ``info["diverged"] = True``.

## Arguments
``gym.make("DiffPush-v0", render_mode=None, episode_steps=200, control="pose", target=None)``;
``target=(x, y)`` fixes the target (world frame, m) instead of sampling it at reset.

## State
``get_state()`` is ``[q (10), v (9), target (2)]``: q = rod x (offset from the body's x = -0.3 m
in the MJCF), rod y, rod yaw, box x y z, box quaternion (x y z w); v = rod velocities, box
world-frame linear velocity, box body-frame angular velocity. ``n_x = 18`` (tangent
coordinates; the target is a constant).
"""
from __future__ import annotations

import numpy as np
import pinocchio as pin

from .base import DiffEnv


def _skew(w: np.ndarray) -> np.ndarray:
    return np.array([[0.0, -w[2], w[1]], [w[2], 0.0, -w[0]], [-w[1], w[0], 0.0]])


def _quat_matrix(quat_xyzw: np.ndarray) -> np.ndarray:
    x, y, z, w = quat_xyzw
    return pin.Quaternion(w, x, y, z).toRotationMatrix()


class DiffPushEnv(DiffEnv):
    asset = "push.xml"
    episode_steps = 200
    obs_dim = 18
    n_const = 2
    camera = dict(lookat=(0.0, 0.0, 0.0), distance=1.6, azimuth=90.0, elevation=-60.0, fovy=45.0)

    WORKSPACE = 0.5           # m, half extent of the pose targets around the origin
    MAX_SPEED = (0.5, 0.5, 2.0)
    OMEGA, ZETA = 10.0, 0.75  # PD natural frequency (rad/s) and damping ratio
    SUCCESS_RADIUS = 0.02
    ROD_START_DISTANCE = 0.2
    TARGET_DISTANCE = (0.15, 0.35)
    CONTACT_MARGIN = 0.15     # m, see _make_sim

    def __init__(self, render_mode=None, episode_steps=None, control: str = "pose", target=None,
                 **kwargs):
        if control not in ("pose", "velocity"):
            raise ValueError(f"control must be 'pose' or 'velocity', got {control!r}")
        if target is not None:
            t = np.asarray(target, dtype=float)
            if t.shape != (2,) or not np.all(np.isfinite(t)):
                raise ValueError(f"target must be two finite numbers (x, y) in metres, got {target!r}")
            target = t
        self.control = control
        self.fixed_target = target
        super().__init__(render_mode=render_mode, episode_steps=episode_steps, **kwargs)
        m = self.sim.model
        self._rod = [m.joints[self.sim.joint_id(n)].idx_v for n in ("rod_x", "rod_y", "rod_yaw")]
        if self._rod != [0, 1, 2]:
            raise RuntimeError(f"push.xml: expected the rod joints first, got dofs {self._rod}")
        self._box_q = m.joints[self.sim.joint_id("box")].idx_q           # translation x y z
        self._box_rq = m.joints[self.sim.joint_id("box_rot")].idx_q      # quaternion x y z w
        self._box_v = m.joints[self.sim.joint_id("box")].idx_v
        self._box_w = m.joints[self.sim.joint_id("box_rot")].idx_v
        # world position of the rod at zero joint offsets (the body's pos in the MJCF)
        data = m.createData()
        pin.forwardKinematics(m, data, self.sim.q0)
        self._rod_offset = np.array(data.oMi[self.sim.joint_id("rod_yaw")].translation[:2])
        self._rod_offset -= self.sim.q0[:2]
        # PD gains from the rod's joint-space inertia (diagonal: the three rod dofs decouple)
        M = pin.crba(m, data, self.sim.q0)
        inertia = np.array([M[i, i] for i in range(3)])
        damping = self.sim.sm.damping[:3]
        self._kp = self.OMEGA ** 2 * inertia
        kd_total = 2.0 * self.ZETA * self.OMEGA * inertia
        if np.any(kd_total < damping):
            raise RuntimeError("push.xml: joint damping exceeds the PD layer's total damping")
        self._kd = kd_total - damping               # the joints' own damping supplies the rest
        self._kv = kd_total                         # velocity mode: (Kv) (v* - v) overall

    def _make_sim(self, **options):
        # The simulator's speculative contact margin is dt times the bodies' speed at the start
        # of a step; the PD layer can change the rod's speed by metres per second within one
        # step, so the rod could pass into the box before its contact is seen. A fixed 15 cm
        # margin covers the rod's reach in one step; contacts found early stay inactive
        # ("breaking", zero impulse) unless the gap closes within the step, so the physics and
        # the derivatives are unchanged, only the rod-box pair is tested more often.
        options.setdefault("margin", self.CONTACT_MARGIN)
        return super()._make_sim(**options)

    def _action_dim(self) -> int:
        return 3

    # -- state ----------------------------------------------------------------------------------
    def _rod_pose(self, x):
        return np.array([x[0] + self._rod_offset[0], x[1] + self._rod_offset[1], x[2]])

    def _reset_state(self, rng):
        x = np.zeros(self.state_size)
        nq, nv = self.nq, self.nv
        box_xy = rng.uniform(-0.02, 0.02, 2)
        box_yaw = rng.uniform(-np.pi, np.pi)
        ang = rng.uniform(-np.pi, np.pi)
        rod_xy = box_xy + self.ROD_START_DISTANCE * np.array([np.cos(ang), np.sin(ang)])
        x[0:2] = rod_xy - self._rod_offset
        x[2] = rng.uniform(-np.pi, np.pi)
        b, r = self._box_q, self._box_rq
        x[b:b + 3] = [box_xy[0], box_xy[1], self.sim.q0[b + 2]]
        x[r:r + 4] = [0.0, 0.0, np.sin(0.5 * box_yaw), np.cos(0.5 * box_yaw)]
        if self.fixed_target is not None:
            target = self.fixed_target
        else:
            tang = rng.uniform(-np.pi, np.pi)
            target = box_xy + rng.uniform(*self.TARGET_DISTANCE) * np.array([np.cos(tang), np.sin(tang)])
        x[nq + nv:nq + nv + 2] = target
        return x

    # -- PD layer -------------------------------------------------------------------------------
    def _forces(self, x, a):
        nq, nv = self.nq, self.nv
        tau = np.zeros(nv)
        dtau_dx = np.zeros((nv, self.n_x))
        dtau_da = np.zeros((nv, 3))
        v = x[nq:nq + 3]
        if self.control == "pose":
            target = np.array([self.WORKSPACE * a[0], self.WORKSPACE * a[1], np.pi * a[2]])
            err = target - self._rod_pose(x)
            tau[:3] = self._kp * err - self._kd * v
            dtau_dx[[0, 1, 2], [0, 1, 2]] = -self._kp                   # q tangent = q here
            dtau_dx[[0, 1, 2], [nv, nv + 1, nv + 2]] = -self._kd
            dtau_da[[0, 1, 2], [0, 1, 2]] = self._kp * np.array([self.WORKSPACE, self.WORKSPACE, np.pi])
        else:
            vmax = np.asarray(self.MAX_SPEED)
            damping = self.sim.sm.damping[:3]
            # tau - damping v = Kv (v* - v): the joints' own damping is compensated
            tau[:3] = self._kv * vmax * a - (self._kv - damping) * v
            dtau_dx[[0, 1, 2], [nv, nv + 1, nv + 2]] = -(self._kv - damping)
            dtau_da[[0, 1, 2], [0, 1, 2]] = self._kv * vmax
        return tau, dtau_dx, dtau_da

    # -- observation and reward ------------------------------------------------------------------
    def _observe(self, x):
        nq, nv = self.nq, self.nv
        b, r, bv, bw = self._box_q, self._box_rq, self._box_v, self._box_w
        rod = self._rod_pose(x)
        R = _quat_matrix(x[r:r + 4])
        w_body = x[nq + bw:nq + bw + 3]
        w_world = R @ w_body
        target = x[nq + nv:nq + nv + 2]
        box_xy = x[b:b + 2]
        c, s = np.cos(rod[2]), np.sin(rod[2])
        obs = np.concatenate([rod[:2], [c, s], box_xy, R[:2, 0], x[nq:nq + 3],
                              x[nq + bv:nq + bv + 2], [w_world[2]], target, target - box_xy])
        d = np.zeros((self.obs_dim, self.n_x))
        d[0, 0] = d[1, 1] = 1.0
        d[2, 2], d[3, 2] = -s, c
        d[4, bv], d[5, bv + 1] = 1.0, 1.0                 # translation joint: q tangent = q
        # R (+) w = R exp(w): d(R e_x) = -R [e_x]x w, d(R w_b) = -R [w_b]x w + R dw_b
        d[6:8, bw:bw + 3] = (-R @ _skew(np.array([1.0, 0.0, 0.0])))[:2]
        d[8, nv], d[9, nv + 1], d[10, nv + 2] = 1.0, 1.0, 1.0
        d[11, nv + bv], d[12, nv + bv + 1] = 1.0, 1.0
        d[13, bw:bw + 3] = (-R @ _skew(w_body))[2]
        d[13, nv + bw:nv + bw + 3] = R[2]
        d[16, bv], d[17, bv + 1] = -1.0, -1.0
        return obs, d

    def _reward(self, x, a):
        nq, nv = self.nq, self.nv
        b = self._box_q
        diff = x[b:b + 2] - x[nq + nv:nq + nv + 2]
        d2 = float(diff @ diff)
        dist = float(np.sqrt(d2))
        terms = {"reward_distance": -d2, "distance": dist, "success": dist < self.SUCCESS_RADIUS}
        dr = np.zeros(self.n_x)
        dr[self._box_v:self._box_v + 2] = -2.0 * diff
        return -d2, terms, dr, np.zeros(3)
