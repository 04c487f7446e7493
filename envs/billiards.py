"""DiffBilliards-v0: push the cue ball so that two chosen balls reach two target spots.

## Description
Sixteen pool balls (radius 28.6 mm, 0.17 kg, each on a free joint: 96 degrees of freedom) lie
on a table with four box cushions, with Coulomb friction 0.2 on every contact (ball-ball,
ball-table, ball-cushion) and no rolling resistance: the cue ball at the left, the other 15 in
a triangle rack. At every step the agent applies a horizontal force to the cue ball; two of the
15 object balls, chosen at random, must end up on two random target spots. After the Billiards
benchmark of the long-range-gradients contact-model paper
(``shared/papers/contact-model-long-range-gradients.txt``: 16 balls, 96 DOF, 100 steps at
dt = 0.04 s, two random target balls and spots). Model: ``assets/billiards.xml`` (the paper has
no cushions; we add four), time step 0.04 s, one simulator step per environment step.

## Action space
``Box(-1, 1, (2,))``: the force on the cue ball's centre along world x and y,
``F = force_scale * a`` with ``force_scale`` = 2 N by default (it acts for the whole 0.04 s step;
1 N for one step changes a free ball's speed by 0.24 m/s). Actions outside [-1, 1] are clipped
(derivative 0 there).

## Observation space
``Box(-inf, inf, (108,), float64)``, with balls in the order cue, ball1, ..., ball15:

| index | content |
| --- | --- |
| 0-31 | x, y of every ball (m), interleaved ``[x_cue, y_cue, x_1, y_1, ...]`` |
| 32-63 | x, y velocity of every ball (m/s, world frame) |
| 64-95 | x, y components of every ball's angular velocity (rad/s, world frame; rolling or slipping) |
| 96-99 | the two target spots ``[sx_1, sy_1, sx_2, sy_2]`` |
| 100-103 | the positions of the two target balls |
| 104-107 | spot minus target-ball position, for both |

Heights (constant on the table) and spins about the vertical (which no contact here couples
to the planar motion at first order) are not observed.

## Rewards
``r = -(|p_i - s_1|^2 + |p_j - s_2|^2)`` (m^2) after the step, where ``p_i``, ``p_j`` are the
positions of the two target balls and ``s_1``, ``s_2`` their spots. ``info`` reports
``reward_ball_1`` and ``reward_ball_2`` (the two terms), ``distance_1``, ``distance_2`` and
``success`` (both balls within ``success_radius`` = 5 cm of their spots). Smooth in the state.

## Starting state
The rack of ``assets/billiards.xml`` at rest; the cue ball at rest at x ~ U(-0.7, -0.5),
y ~ U(-0.1, 0.1). Two distinct target balls drawn uniformly from 1..15 and two spots drawn
uniformly in [-1.0, 1.0] x [-0.55, 0.55] m (inside the cushions, whose inner faces are at
|x| = 1.3, |y| = 0.7); these are constants of the episode kept in the state's extras, unless
fixed with ``target_balls=`` / ``spots=``.

## Episode end
No termination. Truncated after ``episode_steps`` = 100 steps (4 s). A diverged simulation
terminates with ``info["diverged"] = True``.

## Arguments
``gym.make("DiffBilliards-v0", render_mode=None, episode_steps=100, force_scale=2.0,
target_balls=None, spots=None, success_radius=0.05)``; ``target_balls=(i, j)`` with
``1 <= i != j <= 15`` and ``spots=((x1, y1), (x2, y2))`` fix the task.

## State
``get_state()`` is ``[q (112), v (96), i, j, s1x, s1y, s2x, s2y]``: per ball the position and
quaternion (x y z w), then per ball the world-frame linear and body-frame angular velocity, then
the task constants (the ball numbers i, j stored as floats). ``n_x = 192``.
"""
from __future__ import annotations

import numpy as np

from .base import DiffEnv

N_BALLS = 16


def _quat_matrices(Q: np.ndarray) -> np.ndarray:
    """Rotation matrices (n, 3, 3) of unit quaternions (n, 4) stored x y z w."""
    x, y, z, w = Q.T
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
        np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
        np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1)], 1)


def _skews(W: np.ndarray) -> np.ndarray:
    """Skew matrices (n, 3, 3) of vectors (n, 3)."""
    S = np.zeros((len(W), 3, 3))
    S[:, 0, 1], S[:, 0, 2], S[:, 1, 2] = -W[:, 2], W[:, 1], -W[:, 0]
    S[:, 1, 0], S[:, 2, 0], S[:, 2, 1] = W[:, 2], -W[:, 1], W[:, 0]
    return S


class DiffBilliardsEnv(DiffEnv):
    asset = "billiards.xml"
    episode_steps = 100
    obs_dim = 108
    n_const = 6
    camera = dict(lookat=(0.0, 0.0, 0.0), distance=2.6, azimuth=90.0, elevation=-70.0, fovy=45.0)

    SPOT_RANGE = ((-1.0, 1.0), (-0.55, 0.55))
    CUE_RANGE = ((-0.7, -0.5), (-0.1, 0.1))

    def __init__(self, render_mode=None, episode_steps=None, force_scale: float = 2.0,
                 target_balls=None, spots=None, success_radius: float = 0.05, **kwargs):
        if not (np.isfinite(force_scale) and force_scale > 0):
            raise ValueError(f"force_scale must be a positive number of newtons, got {force_scale!r}")
        if not (np.isfinite(success_radius) and success_radius > 0):
            raise ValueError(f"success_radius must be positive (m), got {success_radius!r}")
        if target_balls is not None:
            tb = np.asarray(target_balls)
            if (tb.shape != (2,) or not np.all(np.mod(tb, 1) == 0) or tb[0] == tb[1]
                    or tb.min() < 1 or tb.max() > N_BALLS - 1):
                raise ValueError(f"target_balls must be two distinct ball numbers in 1..15, got {target_balls!r}")
            target_balls = tb.astype(float)
        if spots is not None:
            sp = np.asarray(spots, dtype=float)
            if sp.shape != (2, 2) or not np.all(np.isfinite(sp)):
                raise ValueError(f"spots must be ((x1, y1), (x2, y2)) in metres, got {spots!r}")
            spots = sp
        self.force_scale = float(force_scale)
        self.success_radius = float(success_radius)
        self.fixed_balls, self.fixed_spots = target_balls, spots
        super().__init__(render_mode=render_mode, episode_steps=episode_steps, **kwargs)
        if self.nq != 7 * N_BALLS or self.nv != 6 * N_BALLS:
            raise RuntimeError(f"billiards.xml: expected 16 free balls, got nq={self.nq}, nv={self.nv}")
        # ball b: q[7b:7b+3] position, q[7b+3:7b+7] quaternion; v[6b:6b+3] linear, v[6b+3:6b+6] angular
        self._iq = 7 * np.arange(N_BALLS)
        self._iv = 6 * np.arange(N_BALLS)

    # -- actions -----------------------------------------------------------------------------------
    def _action_dim(self) -> int:
        return 2

    def _actuator_matrix(self) -> np.ndarray:
        B = np.zeros((self.nv, 2))
        B[0, 0] = B[1, 1] = self.force_scale        # the cue ball's world-frame x, y dofs
        return B

    # -- state -------------------------------------------------------------------------------------
    def _task(self, x):
        e = x[self.nq + self.nv:]
        return e[:2].astype(int), e[2:6].reshape(2, 2)

    def _reset_state(self, rng):
        x = np.zeros(self.state_size)
        x[:self.nq] = self.sim.q0
        x[0] = rng.uniform(*self.CUE_RANGE[0])
        x[1] = rng.uniform(*self.CUE_RANGE[1])
        balls = (self.fixed_balls if self.fixed_balls is not None
                 else rng.choice(np.arange(1, N_BALLS), size=2, replace=False).astype(float))
        if self.fixed_spots is not None:
            spots = self.fixed_spots
        else:
            spots = np.stack([rng.uniform(*self.SPOT_RANGE[0], size=2),
                              rng.uniform(*self.SPOT_RANGE[1], size=2)], axis=1)
        n0 = self.nq + self.nv
        x[n0:n0 + 2] = balls
        x[n0 + 2:n0 + 6] = spots.reshape(-1)
        return x

    def set_state(self, x) -> None:
        x = np.asarray(x, dtype=float)
        if x.shape == (self.state_size,) and np.all(np.isfinite(x)):
            balls = x[self.nq + self.nv:self.nq + self.nv + 2]
            if (not np.all(np.mod(balls, 1) == 0) or balls[0] == balls[1] or balls.min() < 1
                    or balls.max() > N_BALLS - 1):
                raise ValueError(f"DiffBilliardsEnv.set_state: state[{self.nq + self.nv}:"
                                 f"{self.nq + self.nv + 2}] must hold two distinct ball numbers in "
                                 f"1..15, got {balls.tolist()}")
        super().set_state(x)

    # -- observation and reward --------------------------------------------------------------------
    def _observe(self, x):
        nq, nv, n_x = self.nq, self.nv, self.n_x
        Q = x[:nq].reshape(N_BALLS, 7)
        V = x[nq:nq + nv].reshape(N_BALLS, 6)
        R = _quat_matrices(Q[:, 3:7])
        w_body = V[:, 3:6]
        w_world = np.einsum("bij,bj->bi", R, w_body)
        balls, spots = self._task(x)
        pos = Q[:, :2]
        tb = pos[balls]
        obs = np.concatenate([pos.reshape(-1), V[:, :2].reshape(-1), w_world[:, :2].reshape(-1),
                              spots.reshape(-1), tb.reshape(-1), (spots - tb).reshape(-1)])
        d = np.zeros((self.obs_dim, n_x))
        iv = self._iv
        for c in range(2):
            d[2 * np.arange(N_BALLS) + c, iv + c] = 1.0                   # positions
            d[32 + 2 * np.arange(N_BALLS) + c, nv + iv + c] = 1.0         # linear velocities
        # w_world = R w_b with R (+) dth = R exp(dth): d w_world = -R [w_b]x dth + R dw_b
        dth = -np.einsum("bij,bjk->bik", R, _skews(w_body))              # (16, 3, 3)
        for b in range(N_BALLS):
            rows = slice(64 + 2 * b, 66 + 2 * b)
            d[rows, iv[b] + 3:iv[b] + 6] = dth[b, :2]
            d[rows, nv + iv[b] + 3:nv + iv[b] + 6] = R[b, :2]
        for k, ball in enumerate(balls):
            for c in range(2):
                d[100 + 2 * k + c, iv[ball] + c] = 1.0
                d[104 + 2 * k + c, iv[ball] + c] = -1.0
        return obs, d

    def _reward(self, x, a):
        balls, spots = self._task(x)
        diff = x[self._iq[balls][:, None] + np.arange(2)] - spots          # (2, 2)
        d2 = np.sum(diff * diff, axis=1)
        dist = np.sqrt(d2)
        terms = {"reward_ball_1": -float(d2[0]), "reward_ball_2": -float(d2[1]),
                 "distance_1": float(dist[0]), "distance_2": float(dist[1]),
                 "success": bool(np.all(dist < self.success_radius))}
        dr = np.zeros(self.n_x)
        for k, ball in enumerate(balls):
            dr[self._iv[ball]:self._iv[ball] + 2] = -2.0 * diff[k]
        return -float(d2.sum()), terms, dr, np.zeros(2)
