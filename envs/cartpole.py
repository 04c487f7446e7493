"""DiffCartPole-v0: cart-pole swing-up on a rail with hard limits.

## Description
A cart slides on a rail between hard stops at x = +-2.4 m (unilateral joint-limit constraints
solved with the contacts, not springs) and carries an unactuated pole (1 m, 0.2 kg). The pole
starts hanging down; the task is to swing it up and balance it. Model: ``assets/cartpole.xml``,
time step 1/60 s, one simulator step per environment step.

## Action space
``Box(-1, 1, (1,))``: the horizontal force on the cart, scaled by the actuator's ctrlrange
(100 N at |a| = 1). Actions outside [-1, 1] are clipped (derivative 0 there).

## Observation space
``Box(-inf, inf, (5,), float64)``: ``[x, x_dot, sin(theta), cos(theta), theta_dot]`` where theta
is the pole angle from upright (theta = 0 up, +-pi hanging down).

## Rewards
``r = -(theta^2 + 0.1 theta_dot^2 + 0.05 x^2 + 0.1 x_dot^2)`` with theta wrapped to (-pi, pi],
evaluated at the state after the step. ``info`` reports each term (``reward_angle``,
``reward_angular_velocity``, ``reward_position``, ``reward_velocity``). The reward is smooth
except at theta = +-pi (hanging straight down), where theta^2 has a kink.

## Starting state
theta = pi + U(-0.2, 0.2) (hanging down, perturbed), x ~ U(-0.2, 0.2), x_dot and theta_dot
~ U(-0.1, 0.1).

## Episode end
No termination (the rail stops the cart). Truncated after ``episode_steps`` = 240 steps (4 s).
A diverged simulation (never expected here) terminates with ``info["diverged"] = True``.

## Arguments
``gym.make("DiffCartPole-v0", render_mode=None, episode_steps=240, frame_skip=1)``.
"""
from __future__ import annotations

import numpy as np

from .base import DiffEnv, wrap_angle


class DiffCartPoleEnv(DiffEnv):
    asset = "cartpole.xml"
    episode_steps = 240
    obs_dim = 5
    camera = dict(lookat=(0.0, 0.0, -0.2), distance=5.5, azimuth=90.0, elevation=-5.0)

    W_ANGLE, W_ANGVEL, W_POS, W_VEL = 1.0, 0.1, 0.05, 0.1

    def _reset_state(self, rng):
        x = np.zeros(self.state_size)
        x[0] = rng.uniform(-0.2, 0.2)
        x[1] = rng.uniform(-0.2, 0.2)          # hinge angle: 0 hangs down
        x[2:4] = rng.uniform(-0.1, 0.1, size=2)
        return x

    def _observe(self, x):
        pos, hinge, vel, omega = x
        th = wrap_angle(hinge - np.pi)
        s, c = np.sin(th), np.cos(th)
        obs = np.array([pos, vel, s, c, omega])
        d = np.zeros((5, 4))
        d[0, 0], d[1, 2], d[2, 1], d[3, 1], d[4, 3] = 1.0, 1.0, c, -s, 1.0
        return obs, d

    def _reward(self, x, a):
        pos, hinge, vel, omega = x
        th = wrap_angle(hinge - np.pi)
        terms = {"reward_angle": -self.W_ANGLE * th * th,
                 "reward_angular_velocity": -self.W_ANGVEL * omega * omega,
                 "reward_position": -self.W_POS * pos * pos,
                 "reward_velocity": -self.W_VEL * vel * vel}
        r = sum(terms.values())
        dr = -2.0 * np.array([self.W_POS * pos, self.W_ANGLE * th, self.W_VEL * vel, self.W_ANGVEL * omega])
        return r, terms, dr, np.zeros(1)
