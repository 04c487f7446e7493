"""DiffHopper-v0: Gymnasium's one-legged hopper with the smooth reward of SHAC.

## Description
The planar hopper of Gymnasium's ``Hopper-v5`` (same bodies, capsule geoms, masses, joint
armature and damping, motors with gear 200, joint ranges as hard limits) on diffgym's
unrelaxed frictional contact, friction 0.9 on every geom. The task is to hop forward (+x) as
fast as possible without falling. Model: ``assets/hopper.xml``. Time step 0.002 s and four
simulator steps per environment step (``frame_skip=4``, environment dt 0.008 s), as Gymnasium.

Time step (measured on this model, 1 s of a sinusoidal gait and of uniform random actions): all
of dt = 0.002, 0.004, 0.008 and 1/60 s run without divergence or solver failures; against a
reference at dt = 0.0005 s the joint angles after 1 s differ by 0.006 rad at 0.002 s, 0.02 rad
at 0.004 s and 0.03 rad at 0.008 s, and resting penetration is 0.08 mm, 0.2 mm and 0.25 mm.
0.002 s keeps Gymnasium's dynamics; ``frame_skip=2, sim_options={"dt": 0.004}`` keeps the
environment dt and halves the cost.

## Action space
``Box(-1, 1, (3,))``: torques on the thigh, leg and foot hinges, 200 N m at ``|a| = 1``
(gear 200, control range [-1, 1]). Actions outside [-1, 1] are clipped (derivative 0 there).

## Observation space
``Box(-inf, inf, (11,), float64)``, as Gymnasium's Hopper (``qpos[1:]`` and ``qvel``) but with
no clipping of the velocities, so the observation is a smooth (linear) function of the state:

| index | content |
| --- | --- |
| 0 | torso height z (m, world; 1.25 at the nominal start) |
| 1 | torso angle (rad, rotation about y; 0 upright) |
| 2-4 | thigh, leg, foot joint angles (rad) |
| 5-6 | torso x and z velocity (m/s) |
| 7 | torso angular velocity (rad/s) |
| 8-10 | thigh, leg, foot joint velocities (rad/s) |

## Rewards
The smooth reward of the SHAC paper (Xu et al., ICLR 2022), evaluated at the state after the
step, with ``a`` the clipped action::

    r = vx + height + angle - 0.1 |a|^2
    height = h if h >= 0 else -200 h^2,   h = clip(z - z_start + 0.3, -1, 0.3)
    angle  = 1 - (theta / (pi/6))^2

where ``vx`` is the torso's forward velocity, ``z_start = 1.25`` m the nominal starting torso
height and ``theta`` the torso angle. ``info`` reports ``reward_forward``, ``reward_height``,
``reward_angle`` and ``reward_ctrl`` (their sum is the reward), plus ``x_position``,
``x_velocity`` and ``height``. Every term is differentiated exactly: the clip has derivative 0
outside [-1, 0.3] and the height term is C1 at h = 0.

## Starting state
Gymnasium's: the nominal pose (upright, torso at 1.25 m, all joints 0, the foot 4 cm above the
floor) plus U(-0.005, 0.005) on every position and every velocity.

## Episode end
Terminated when the torso is more than 0.45 m below its nominal start height (``z < 0.8``
m), or when the simulation diverged (``info["diverged"] = True``). Truncated after
``episode_steps`` = 1000 steps (8 s).

## Arguments
``gym.make("DiffHopper-v0", render_mode=None, episode_steps=1000, frame_skip=4,
sim_options=None, reset_noise_scale=0.005, width=320, height=240)``; ``sim_options`` are
keyword settings of :class:`diffgym.Simulator` (``dt``, ``erp``, ``tol``...).
``render_mode="rgb_array"`` draws a side view that follows the torso along x.

## State
``get_state()`` is ``[q (6), v (6)]`` = ``[x, z, theta, thigh, leg, foot, vx, vz, omega,
thigh_dot, leg_dot, foot_dot]``; ``n_x = 12`` (every coordinate is its own tangent).
"""
from __future__ import annotations

import numpy as np

from .base import DiffEnv


class DiffHopperEnv(DiffEnv):
    asset = "hopper.xml"
    frame_skip = 4
    episode_steps = 1000
    obs_dim = 11
    # a side view of the x-z plane the hopper moves in; _render_kwargs follows the torso's x
    camera = dict(lookat=(0.0, 0.0, 0.75), distance=3.2, azimuth=90.0, elevation=-10.0)

    START_HEIGHT = 1.25           # nominal torso height at reset (m)
    TERMINATION_DROP = 0.45       # terminate when the torso is this far below the start (m)
    HEIGHT_OFFSET = 0.3           # h = clip(z - z_start + 0.3, -1, 0.3)
    HEIGHT_CLIP = (-1.0, 0.3)
    HEIGHT_PENALTY = 200.0
    ANGLE_LIMIT = np.pi / 6.0
    CTRL_COST = 0.1

    def __init__(self, render_mode=None, episode_steps=None, frame_skip=None,
                 reset_noise_scale: float = 5e-3, **kwargs):
        noise = float(reset_noise_scale)
        if not np.isfinite(noise) or noise < 0.0:
            raise ValueError(f"reset_noise_scale must be a finite number >= 0, got {reset_noise_scale!r}")
        self.reset_noise_scale = noise
        super().__init__(render_mode=render_mode, episode_steps=episode_steps,
                         frame_skip=frame_skip, **kwargs)
        if (self.nq, self.nv, self.n_a) != (6, 6, 3):
            raise RuntimeError(f"{self.asset}: expected a planar hopper with nq = nv = 6 and 3 "
                               f"motors, got nq={self.nq}, nv={self.nv}, {self.n_a} motors")

    # -- hooks ----------------------------------------------------------------------------------
    def _reset_state(self, rng):
        x = np.zeros(self.state_size)
        s = self.reset_noise_scale
        x[:6] = self.sim.q0 + rng.uniform(-s, s, 6)
        x[6:12] = rng.uniform(-s, s, 6)
        return x

    def _observe(self, x):
        obs = x[1:12].copy()
        if not self._derivs:
            return obs, None
        d = np.zeros((11, 12))
        d[np.arange(11), np.arange(1, 12)] = 1.0
        return obs, d

    def _height_term(self, z):
        """(value, d value / dz) of the clipped height reward."""
        lo, hi = self.HEIGHT_CLIP
        h_raw = z - self.START_HEIGHT + self.HEIGHT_OFFSET
        h = min(max(h_raw, lo), hi)
        dh = 1.0 if lo < h_raw < hi else 0.0
        if h >= 0.0:
            return h, dh
        return -self.HEIGHT_PENALTY * h * h, -2.0 * self.HEIGHT_PENALTY * h * dh

    def _reward(self, x, a):
        z, theta, vx = x[1], x[2], x[6]
        height, dheight = self._height_term(z)
        angle = 1.0 - (theta / self.ANGLE_LIMIT) ** 2
        ctrl = -self.CTRL_COST * float(a @ a)
        terms = {"reward_forward": float(vx), "reward_height": float(height),
                 "reward_angle": float(angle), "reward_ctrl": ctrl}
        r = vx + height + angle + ctrl
        terms.update(x_position=float(x[0]), x_velocity=float(vx), height=float(z))
        if not self._derivs:
            return r, terms, None, None
        dr_dx = np.zeros(self.n_x)
        dr_dx[1] = dheight
        dr_dx[2] = -2.0 * theta / self.ANGLE_LIMIT ** 2
        dr_dx[6] = 1.0
        dr_da = -2.0 * self.CTRL_COST * a
        return r, terms, dr_dx, dr_da

    def _terminated(self, x):
        return bool(x[1] < self.START_HEIGHT - self.TERMINATION_DROP)

    def _render_kwargs(self) -> dict:
        from diffgym.render import Camera
        lookat = np.array(self.camera["lookat"], dtype=float)
        lookat[0] += self._x[0]                     # follow the torso along x
        return {"camera": Camera(**dict(self.camera, lookat=lookat))}
