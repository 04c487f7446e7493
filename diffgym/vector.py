"""Vectorized environments: N copies stepped in-process, with batched step Jacobians.

``diffgym.make_vec("DiffHopper-v0", num_envs=16, seed=0)`` (or Gymnasium's
``gym.make_vec(id, 16, vectorization_mode="vector_entry_point")``) returns a
:class:`DiffVectorEnv`, a ``gymnasium.vector.VectorEnv`` with

- batched Box spaces, float64 observations, actions in [-1, 1];
- same-step autoreset: the observation row of an environment whose episode ended this step is
  already its reset observation; ``info["final_obs"]`` (N, n_obs) holds the last observation of
  every row (the terminal one where ``info["_final_obs"]`` is set) and ``info["final_state"]``
  (N, state_size) the matching states;
- ``step_with_jacobian(actions)``: the same step plus a :class:`BatchedJacobian` whose arrays
  have a leading N axis; a done row's Jacobian is that of the step that ended its episode;
- ``get_state()`` / ``set_state(X)`` over all copies, ``tangent_maps()``.

Copies are stepped one after the other in this process: a simulator step is a few hundred
microseconds of C++ and numpy, so threads would not help and processes would cost more in
transfer than they save at these sizes. Run several processes (a sweep) to use more cores.
"""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np


@dataclass
class BatchedJacobian:
    state_state: np.ndarray    # (N, n_x, n_x)
    state_action: np.ndarray   # (N, n_x, n_a)
    reward_state: np.ndarray   # (N, n_x)
    reward_action: np.ndarray  # (N, n_a)
    obs_state: np.ndarray      # (N, n_obs, n_x)


class DiffVectorEnv(gym.vector.VectorEnv):
    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "render_modes": ["rgb_array"]}

    def __init__(self, env_id: str, num_envs: int, seed: int | None = None, **env_kwargs):
        if not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self.envs = [gym.make(env_id, **env_kwargs).unwrapped for _ in range(self.num_envs)]
        e0 = self.envs[0]
        self.single_observation_space = e0.observation_space
        self.single_action_space = e0.action_space
        self.observation_space = gym.vector.utils.batch_space(e0.observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(e0.action_space, self.num_envs)
        self.metadata = dict(self.metadata, render_fps=e0.metadata["render_fps"])
        self.render_mode = env_kwargs.get("render_mode")
        self.spec = e0.spec
        self.n_x, self.n_a, self.state_size, self.obs_dim = e0.n_x, e0.n_a, e0.state_size, e0.obs_dim
        self._seed = seed
        self._needs_reset = True

    # -- gymnasium API --------------------------------------------------------------------------
    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        if seed is None:
            seed = self._seed
            self._seed = None            # only the first reset uses the constructor's seed
        seeds = (list(seed) if isinstance(seed, (list, tuple, np.ndarray))
                 else [None if seed is None else int(seed) + i for i in range(self.num_envs)])
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset: {len(seeds)} seeds given for {self.num_envs} environments")
        obs = np.stack([env.reset(seed=s, options=options)[0] for env, s in zip(self.envs, seeds)])
        self._needs_reset = False
        return obs, {}

    def step(self, actions):
        out = self._step(actions, jacobian=False)
        return out[:5]

    def step_with_jacobian(self, actions):
        return self._step(actions, jacobian=True)

    def _step(self, actions, jacobian: bool):
        if self._needs_reset:
            raise RuntimeError("DiffVectorEnv: call reset() before step()")
        a = np.asarray(actions, dtype=float)
        if a.shape != (self.num_envs, self.n_a):
            raise ValueError(f"{self.env_id} vector step: actions must have shape "
                             f"({self.num_envs}, {self.n_a}), got {a.shape}")
        N = self.num_envs
        obs = np.empty((N, self.obs_dim))
        final_obs = np.empty((N, self.obs_dim))
        final_state = np.empty((N, self.state_size))
        rew = np.empty(N)
        term = np.zeros(N, dtype=bool)
        trunc = np.zeros(N, dtype=bool)
        infos: list[dict] = []
        jacs = []
        for i, env in enumerate(self.envs):
            o, r, te, tr, inf, jac = env._step(a[i], jacobian)
            final_obs[i], final_state[i] = o, env._x
            rew[i], term[i], trunc[i] = r, te, tr
            if te or tr:
                o, _ = env.reset()
            obs[i] = o
            infos.append(inf)
            jacs.append(jac)
        info = {k: np.array([d.get(k, np.nan) for d in infos]) for k in infos[0]}
        info["final_obs"], info["final_state"] = final_obs, final_state
        info["_final_obs"] = term | trunc
        if not jacobian:
            return obs, rew, term, trunc, info, None
        bj = BatchedJacobian(*(np.stack([getattr(j, f) for j in jacs]) for f in
                               ("state_state", "state_action", "reward_state", "reward_action", "obs_state")))
        return obs, rew, term, trunc, info, bj

    # -- state ------------------------------------------------------------------------------------
    def get_state(self) -> np.ndarray:
        return np.stack([env.get_state() for env in self.envs])

    def set_state(self, X) -> None:
        X = np.asarray(X, dtype=float)
        if X.shape != (self.num_envs, self.state_size):
            raise ValueError(f"set_state: states must have shape ({self.num_envs}, "
                             f"{self.state_size}), got {X.shape}")
        for env, x in zip(self.envs, X):
            env.set_state(x)
        self._needs_reset = False

    def snapshot(self) -> list[dict]:
        """Each copy's ``snapshot()`` (state, episode step count, reset RNG, warm start)."""
        return [e.snapshot() for e in self.envs]

    def restore(self, snaps: list[dict]) -> None:
        if len(snaps) != self.num_envs:
            raise ValueError(f"the snapshot holds {len(snaps)} environments, this vector env has "
                             f"{self.num_envs}")
        for e, snap in zip(self.envs, snaps):
            e.restore(snap)
        self._needs_reset = False

    def tangent_maps(self, X=None) -> np.ndarray:
        X = self.get_state() if X is None else np.asarray(X, dtype=float)
        return np.stack([env.tangent_map(x) for env, x in zip(self.envs, X)])

    def observe(self, X=None) -> np.ndarray:
        X = self.get_state() if X is None else X
        return np.stack([env._observe(x)[0] for env, x in zip(self.envs, X)])

    def render(self):
        return self.envs[0].render()

    def close(self, **kwargs):
        for env in self.envs:
            env.close()


def make_vec(env_id: str, num_envs: int = 1, seed: int | None = None, **env_kwargs) -> DiffVectorEnv:
    """N copies of a diffgym environment in one :class:`DiffVectorEnv`."""
    import diffgym.envs  # noqa: F401  (registers the ids)
    if env_id not in gym.registry:
        raise gym.error.NameNotFound(f"unknown environment id {env_id!r}")
    return DiffVectorEnv(env_id, num_envs, seed=seed, **env_kwargs)


def vector_entry_point(env_id: str, num_envs: int = 1, **env_kwargs) -> DiffVectorEnv:
    """Gymnasium's ``vector_entry_point`` for the diffgym ids (registered with functools.partial)."""
    return DiffVectorEnv(env_id, num_envs, **env_kwargs)
