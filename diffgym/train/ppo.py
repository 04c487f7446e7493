"""PPO (stable-baselines3) on diffgym environments, logged and checkpointed through a Run.

The N environment copies are one :class:`diffgym.vector.DiffVectorEnv` (``diffgym.make_vec``)
behind :class:`SB3VecEnv`, a small adapter to SB3's own ``VecEnv`` API: the vector env's
same-step autoreset maps to SB3's convention (``info["final_obs"]`` of a finished row becomes
``infos[i]["terminal_observation"]``, a time-limit end sets ``"TimeLimit.truncated"`` so PPO
bootstraps it from the value function), and the adapter keeps Monitor-style episode statistics
(``infos[i]["episode"] = {"r", "l", "t"}``). SB3's ``VecNormalize`` normalizes observations
(``ppo.normalize_obs``) and rewards (``ppo.normalize_reward``), its usual continuous-control
setting.

``ppo.n_steps`` is the horizon per environment, so an iteration is ``n_steps * env.num_envs``
environment steps, cut into minibatches of ``ppo.batch_size`` for ``ppo.n_epochs`` epochs.

Checkpoints (every ``checkpoint_every`` iterations, at an iteration boundary) hold, as plain
data (see :mod:`diffgym.train.run`; nothing in them is unpickled on resume): the policy's and
its optimizer's state dicts and SB3's update counter, the VecNormalize statistics (mean, var,
count) and its running discounted returns, the rollout state SB3 keeps between iterations (the
current normalized observations and episode-start flags), every environment's simulator state,
episode clock, reset RNG and running episode return, and the global torch / numpy / random RNG
states. ``--resume`` builds the PPO model from the config and loads all of that into it, so the
resumed run continues exactly as if it had never stopped (the same losses and returns; tested).
Saving a checkpoint also clears the contact solver's warm start, in both the saved and the
resumed run, because a warm start is not part of the state.

At the end the run directory also gets ``ppo_model.zip`` and ``vecnormalize.pkl``, loadable with
``PPO.load`` / ``VecNormalize.load`` for use outside diffgym. Those formats unpickle Python
objects when loaded (SB3 stores parts of the model with cloudpickle), so load them only from
runs you trust; ``diffgym train --resume`` never reads them.
"""
from __future__ import annotations

import os
import random
import time
from typing import Any

import numpy as np

from .config import TrainConfig
from .run import Run


def _sb3_vec_env_class():
    from stable_baselines3.common.vec_env import VecEnv

    class SB3VecEnv(VecEnv):
        """SB3 ``VecEnv`` over a :class:`diffgym.vector.DiffVectorEnv` (same-step autoreset)."""

        def __init__(self, venv):
            self.venv = venv
            n = venv.num_envs
            self.ep_ret = np.zeros(n)
            self.ep_len = np.zeros(n, dtype=np.int64)
            self._t0 = time.perf_counter()
            self._actions: np.ndarray | None = None
            super().__init__(n, venv.single_observation_space, venv.single_action_space)

        # -- the VecEnv API -------------------------------------------------------------------
        def reset(self):
            seeds = self._seeds if any(s is not None for s in self._seeds) else None
            opts = self._options[0] if self._options and self._options[0] else None
            obs, _ = self.venv.reset(seed=seeds, options=opts)
            self._reset_seeds()
            self._reset_options()
            self.ep_ret[:] = 0.0
            self.ep_len[:] = 0
            return obs

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = np.asarray(actions, dtype=np.float64).reshape(self.num_envs, -1)

        def step_wait(self):
            obs, rew, term, trunc, info = self.venv.step(self._actions)
            self.ep_ret += rew
            self.ep_len += 1
            done = term | trunc
            diverged = info.get("diverged")
            infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
            for i in np.flatnonzero(done):
                d = infos[i]
                d["terminal_observation"] = info["final_obs"][i]
                d["TimeLimit.truncated"] = bool(trunc[i] and not term[i])
                d["episode"] = {"r": float(self.ep_ret[i]), "l": int(self.ep_len[i]),
                                "t": round(time.perf_counter() - self._t0, 6)}
                if diverged is not None and bool(diverged[i]):
                    d["diverged"] = True
                self.ep_ret[i] = 0.0
                self.ep_len[i] = 0
            return obs, rew.astype(np.float32), done, infos

        def close(self) -> None:
            self.venv.close()

        # the copies may live in worker processes: go through the vector env's get_attr/call
        def get_attr(self, attr_name: str, indices=None) -> list:
            vals = self.venv.get_attr(attr_name)
            return [vals[i] for i in self._get_indices(indices)]

        def set_attr(self, attr_name: str, value, indices=None) -> None:
            idx = set(self._get_indices(indices))
            old = self.venv.get_attr(attr_name) if len(idx) < self.num_envs else [None] * self.num_envs
            self.venv.set_attr(attr_name, [value if i in idx else old[i] for i in range(self.num_envs)])

        def env_method(self, method_name: str, *args, indices=None, **kwargs) -> list:
            if self.venv.num_workers == 1:
                return [getattr(self.venv.envs[i], method_name)(*args, **kwargs)
                        for i in self._get_indices(indices)]
            out = self.venv.call(method_name, *args, **kwargs)
            return [out[i] for i in self._get_indices(indices)]

        def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
            return [False for _ in self._get_indices(indices)]      # the bare environments

        def get_images(self):
            return list(self.venv.call("render"))

        # -- the rollout state, for checkpoints -----------------------------------------------
        def snapshot(self) -> dict:
            return {"envs": self.venv.snapshot(), "ep_ret": self.ep_ret.copy(),
                    "ep_len": self.ep_len.copy()}

        def restore(self, snap: dict) -> None:
            envs = snap.get("envs")
            if envs is None:       # (checkpoints written before per-copy snapshots)
                envs = [{"state": x, "elapsed": el, "np_random": rng} for x, el, rng in
                        zip(snap["state"], snap["elapsed"], snap["np_random"])]
            if len(envs) != self.num_envs:
                raise ValueError(f"the checkpoint holds {len(envs)} environments, the "
                                 f"config asks for env.num_envs={self.num_envs}")
            self.venv.restore(envs)
            self.ep_ret[:] = snap["ep_ret"]
            self.ep_len[:] = snap["ep_len"]

    return SB3VecEnv


def make_sb3_vec_env(cfg: TrainConfig):
    """``cfg.env.num_envs`` copies of ``cfg.env.id`` as an SB3 VecEnv (see the module doc)."""
    import diffgym
    kwargs = dict(cfg.env.kwargs or {})
    if cfg.env.episode_steps is not None:
        kwargs["episode_steps"] = cfg.env.episode_steps
    return _sb3_vec_env_class()(diffgym.make_vec(cfg.env.id, num_envs=cfg.env.num_envs, seed=cfg.seed,
                                                 num_workers=cfg.env.num_workers, **kwargs))


def _lr(pc):
    if pc.lr_schedule == "linear":
        return lambda progress_remaining: pc.learning_rate * progress_remaining
    return pc.learning_rate


def _rms_state(rms) -> dict | None:
    """SB3's ``RunningMeanStd`` as plain data."""
    if rms is None:
        return None
    return {"mean": np.array(rms.mean, dtype=np.float64), "var": np.array(rms.var, dtype=np.float64),
            "count": float(rms.count)}


def _set_rms(rms, state: dict, what: str) -> None:
    mean, var = np.asarray(state["mean"], dtype=np.float64), np.asarray(state["var"], dtype=np.float64)
    if mean.size != rms.mean.size or var.size != rms.var.size:      # (SB3 may widen () to (1,))
        from .run import CheckpointMismatchError
        raise CheckpointMismatchError(f"{what}: the checkpoint's statistics have shape {mean.shape}, the environment's "
                         f"{rms.mean.shape}")
    rms.mean, rms.var, rms.count = mean.copy(), var.copy(), float(state["count"])


def _model_desc(model) -> str:
    return f"{model.env.num_envs} environments, networks {model.policy.net_arch}"


def _restore(run: Run, ckpt: dict, model, env, venv) -> None:
    """Put a checkpoint's state into a PPO model built from the config (module doc)."""
    import torch

    from .run import CheckpointMismatchError
    where = f"--resume {run.dir}"
    try:
        env.restore(ckpt["env"])
        model.policy.load_state_dict(ckpt["policy"])
        model.policy.optimizer.load_state_dict(ckpt["optimizer"])
        vn = ckpt["vecnormalize"]
        if vn["obs_rms"] is not None and getattr(venv, "obs_rms", None) is not None:
            _set_rms(venv.obs_rms, vn["obs_rms"], f"{where}: vecnormalize.obs_rms")
        _set_rms(venv.ret_rms, vn["ret_rms"], f"{where}: vecnormalize.ret_rms")
        returns = np.asarray(vn["returns"], dtype=np.float64)
        if returns.shape != venv.returns.shape:
            raise CheckpointMismatchError(f"{where}: the checkpoint holds {returns.shape[0]} running returns, "
                                          f"env.num_envs is {venv.returns.shape[0]}")
        venv.returns = returns.copy()
        model.num_timesteps = int(ckpt["env_steps"])
        model._n_updates = int(ckpt.get("n_updates", 0))
        model._last_obs = np.array(ckpt["last_obs"], copy=True)       # (the dtype it was saved with)
        if model._last_obs.shape != (env.num_envs, *venv.observation_space.shape):
            raise CheckpointMismatchError(f"{where}: the checkpoint's observations have shape "
                                          f"{model._last_obs.shape}, the run's "
                                          f"{(env.num_envs, *venv.observation_space.shape)}")
        model._last_episode_starts = np.array(ckpt["last_episode_starts"], copy=True)
        # the PPO constructor seeded the global RNGs: put the run's streams back
        torch.set_rng_state(ckpt["rng"]["torch"])
        np.random.set_state(ckpt["rng"]["numpy"])
        random.setstate(ckpt["rng"]["python"])
    except KeyError as exc:
        raise CheckpointMismatchError(f"{where}: the checkpoint lacks {exc}; it was not written by this "
                                      "diffgym version's PPO trainer") from None
    except (RuntimeError, TypeError, ValueError, IndexError, AttributeError) as exc:
        if isinstance(exc, CheckpointMismatchError):
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise CheckpointMismatchError(f"{where}: the checkpoint does not fit this run (config {_model_desc(model)}): "
                                      f"{type(exc).__name__}: {first}") from None


def train_ppo(cfg: TrainConfig, run: Run) -> dict:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    pc = cfg.ppo
    torch.set_num_threads(1)
    env = make_sb3_vec_env(cfg)
    venv = VecNormalize(env, norm_obs=pc.normalize_obs, norm_reward=pc.normalize_reward, gamma=pc.gamma)
    ckpt = run.load_checkpoint()
    policy_kwargs = dict(net_arch=list(pc.net_arch), log_std_init=pc.log_std_init)
    if ckpt is not None and ckpt.get("algo") != "ppo":
        from .run import CheckpointMismatchError
        raise CheckpointMismatchError(f"--resume {run.dir}: the checkpoint is from algo {ckpt.get('algo')!r}, "
                                      "not ppo")
    model = PPO("MlpPolicy", venv, n_steps=pc.n_steps, batch_size=pc.batch_size, n_epochs=pc.n_epochs,
                learning_rate=_lr(pc), gamma=pc.gamma, gae_lambda=pc.gae_lambda,
                clip_range=pc.clip_range, ent_coef=pc.ent_coef, vf_coef=pc.vf_coef,
                max_grad_norm=pc.max_grad_norm, target_kl=pc.target_kl, seed=cfg.seed,
                device="cpu", verbose=0, policy_kwargs=policy_kwargs)
    if ckpt is not None:
        _restore(run, ckpt, model, env, venv)

    def save(iteration: int) -> None:
        env.venv.set_state(env.venv.get_state())     # a warm start is not state (module doc)
        run.save_checkpoint({
            "algo": "ppo", "env_steps": int(model.num_timesteps),
            "policy": model.policy.state_dict(), "optimizer": model.policy.optimizer.state_dict(),
            "n_updates": int(model._n_updates),
            "vecnormalize": {"obs_rms": _rms_state(getattr(venv, "obs_rms", None)),
                             "ret_rms": _rms_state(venv.ret_rms), "returns": venv.returns.copy()},
            "env": env.snapshot(), "last_obs": np.array(model._last_obs, copy=True),
            "last_episode_starts": np.array(model._last_episode_starts, copy=True),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                    "python": random.getstate()}}, iteration)

    class Logger(BaseCallback):
        """Logs one row per PPO iteration (at the start of the next rollout, after the update)."""

        def __init__(self):
            super().__init__()
            self.returns: list[float] = []
            self.lengths: list[int] = []
            self.diverged = 0
            self.iteration = int(ckpt["iteration"]) if ckpt else 0
            self.bar = None

        def _on_training_start(self):
            # SB3 runs whole iterations until num_timesteps >= total: the bar's total is what they add up to
            per_iter = pc.n_steps * cfg.env.num_envs
            n0 = self.model.num_timesteps
            self.bar = run.progress(n0 + -(-(cfg.total_env_steps - n0) // per_iter) * per_iter)
            self.t_last, self.steps_last = time.perf_counter(), self.model.num_timesteps

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                ep = info.get("episode")
                if ep is not None:
                    self.returns.append(ep["r"])
                    self.lengths.append(ep["l"])
                    self.diverged += bool(info.get("diverged"))
            return True

        def _on_rollout_start(self):
            n = self.model.num_timesteps
            if n == self.steps_last:            # the first rollout: nothing to report yet
                return
            self.iteration += 1
            now = time.perf_counter()
            sps = (n - self.steps_last) / max(now - self.t_last, 1e-9)
            metrics = dict(iteration=self.iteration, episodes=len(self.returns),
                           episode_return=float(np.mean(self.returns)) if self.returns else float("nan"),
                           episode_length=float(np.mean(self.lengths)) if self.lengths else float("nan"),
                           diverged=self.diverged, steps_per_s=sps)
            vals = self.model.logger.name_to_value
            for key in ("value_loss", "policy_gradient_loss", "entropy_loss", "approx_kl", "clip_fraction",
                        "explained_variance", "std", "learning_rate"):
                if f"train/{key}" in vals:
                    metrics[key] = float(vals[f"train/{key}"])
            if self.iteration % cfg.log_every == 0:
                run.log(n, **metrics)
            self.bar.update(n - self.steps_last)
            post = {"sps": f"{sps:.0f}"}
            if self.returns:
                post = {"return": f"{metrics['episode_return']:.1f}", **post}
            self.bar.set_postfix(post, refresh=False)
            self.returns, self.lengths, self.diverged = [], [], 0
            self.t_last, self.steps_last = now, n
            if cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0:
                save(self.iteration)

        def _on_training_end(self):
            self._on_rollout_start()            # the last iteration's row
            self.bar.close()

    # a logger that only keeps the values (SB3's default makes an empty /tmp/SB3-<time> per learn())
    from stable_baselines3.common.logger import Logger as SB3Logger
    model.set_logger(SB3Logger(folder=None, output_formats=[]))
    logger = Logger()
    remaining = cfg.total_env_steps - model.num_timesteps
    if remaining > 0:
        try:
            model.learn(total_timesteps=remaining, callback=logger, reset_num_timesteps=ckpt is None,
                        progress_bar=False)
        finally:
            if logger.bar is not None:
                logger.bar.close()
    if not (cfg.checkpoint_every and logger.iteration % cfg.checkpoint_every == 0) or remaining <= 0:
        save(logger.iteration)
    model.save(os.path.join(run.dir, "ppo_model.zip"))
    venv.save(os.path.join(run.dir, "vecnormalize.pkl"))
    venv.training = False

    def policy_fn(obs: np.ndarray) -> np.ndarray:
        o = venv.normalize_obs(np.asarray(obs, dtype=np.float64)[None])
        act, _ = model.predict(o, deterministic=True)
        return np.asarray(act[0], dtype=np.float64)

    result = run.finish(policy_fn)
    venv.close()
    return {"iterations": logger.iteration, "env_steps": int(model.num_timesteps), "eval": result}
