"""PPO (stable-baselines3) on diffgym environments, logged and checkpointed through a Run.

The environments are the unchanged Gymnasium ones (``gym.make(id)``) in SB3's DummyVecEnv with
a Monitor per copy and VecNormalize (observations optionally, rewards always: SB3's usual
setting for continuous control). ``cfg.ppo.n_steps`` is the horizon per environment, so an
iteration is ``n_steps * num_envs`` environment steps; ``batch_size`` is the minibatch.

Checkpoints hold the SB3 model (policy, optimizer, step counter) and the VecNormalize
statistics. ``--resume`` reloads them and continues the step count; the episodes that were in
progress when the run stopped start over (the policy, optimizer and normalization lose nothing).
"""
from __future__ import annotations

import io
import os
import pickle
import tempfile
import time

import numpy as np

from .config import TrainConfig
from .run import Run


def _make_vec(cfg: TrainConfig, seed: int):
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_vec_env
    import diffgym  # noqa: F401
    kwargs = dict(cfg.env.kwargs or {})
    if cfg.env.episode_steps is not None:
        kwargs["episode_steps"] = cfg.env.episode_steps
    return make_vec_env(lambda: gym.make(cfg.env.id, **kwargs), n_envs=cfg.env.num_envs, seed=seed)


def train_ppo(cfg: TrainConfig, run: Run) -> dict:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    pc = cfg.ppo
    N = cfg.env.num_envs
    steps_per_iter = pc.n_steps * N
    if pc.batch_size > steps_per_iter:
        raise ValueError(f"ppo.batch_size={pc.batch_size} exceeds the {steps_per_iter} samples of an "
                         f"iteration (ppo.n_steps * env.num_envs)")
    torch.set_num_threads(1)
    venv = VecNormalize(_make_vec(cfg, cfg.seed), norm_obs=pc.normalize_obs, norm_reward=True,
                        gamma=pc.gamma)
    ckpt = run.load_checkpoint()
    if ckpt is not None:
        if ckpt.get("algo") != "ppo":
            raise ValueError(f"{run.dir}: the checkpoint is from algo {ckpt.get('algo')!r}, not ppo")
        stats = pickle.loads(ckpt["vecnormalize"])
        venv.obs_rms, venv.ret_rms = stats["obs_rms"], stats["ret_rms"]
        model = PPO.load(io.BytesIO(ckpt["model"]), env=venv, device="cpu")
    else:
        model = PPO("MlpPolicy", venv, n_steps=pc.n_steps, batch_size=pc.batch_size, n_epochs=pc.n_epochs,
                    learning_rate=pc.learning_rate, gamma=pc.gamma, gae_lambda=pc.gae_lambda,
                    clip_range=pc.clip_range, ent_coef=pc.ent_coef, vf_coef=pc.vf_coef,
                    max_grad_norm=pc.max_grad_norm, seed=cfg.seed, device="cpu", verbose=0,
                    policy_kwargs=dict(net_arch=list(pc.net_arch), log_std_init=pc.log_std_init))

    class Logger(BaseCallback):
        def __init__(self):
            super().__init__()
            self.returns, self.lengths = [], []
            self.iteration = int(ckpt["iteration"]) if ckpt else 0
            self.t_last, self.steps_last = time.perf_counter(), None

        def _on_training_start(self):
            self.bar = run.progress(cfg.total_env_steps)
            self.steps_last = self.model.num_timesteps

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                ep = info.get("episode")
                if ep is not None:
                    self.returns.append(ep["r"])
                    self.lengths.append(ep["l"])
            return True

        def _on_rollout_end(self):
            pass

        def _on_rollout_start(self):
            if self.model.num_timesteps == self.steps_last:
                return
            self.iteration += 1
            now = time.perf_counter()
            n = self.model.num_timesteps
            metrics = dict(iteration=self.iteration, episodes=len(self.returns),
                           episode_return=float(np.mean(self.returns)) if self.returns else float("nan"),
                           episode_length=float(np.mean(self.lengths)) if self.lengths else float("nan"),
                           steps_per_s=(n - self.steps_last) / max(now - self.t_last, 1e-9))
            for key in ("train/value_loss", "train/policy_gradient_loss", "train/approx_kl", "train/std"):
                val = self.model.logger.name_to_value.get(key)
                if val is not None:
                    metrics[key.split("/")[1]] = float(val)
            if self.iteration % max(1, cfg.log_every) == 0:
                run.log(n, **metrics)
            self.bar.update(n - self.steps_last)
            if self.returns:
                self.bar.set_postfix(ret=f"{metrics['episode_return']:.1f}", sps=f"{metrics['steps_per_s']:.0f}")
            self.returns, self.lengths = [], []
            self.t_last, self.steps_last = now, n
            if cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0:
                save(self.iteration)

        def _on_training_end(self):
            self._on_rollout_start()
            self.bar.close()

    def save(iteration: int) -> None:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "model.zip")
            model.save(path)
            with open(path, "rb") as f:
                blob = f.read()
        run.save_checkpoint({"algo": "ppo", "env_steps": int(model.num_timesteps), "model": blob,
                             "vecnormalize": pickle.dumps({"obs_rms": venv.obs_rms, "ret_rms": venv.ret_rms})},
                            iteration)

    logger = Logger()
    remaining = cfg.total_env_steps - model.num_timesteps
    if remaining > 0:
        model.learn(total_timesteps=remaining, callback=logger, reset_num_timesteps=ckpt is None,
                    progress_bar=False)
    save(logger.iteration)
    venv.training = False

    def policy_fn(obs: np.ndarray) -> np.ndarray:
        o = venv.normalize_obs(np.asarray(obs, dtype=np.float64)[None])
        act, _ = model.predict(o, deterministic=True)
        return np.asarray(act[0], dtype=np.float64)

    result = run.finish(policy_fn)
    venv.close()
    return {"iterations": logger.iteration, "env_steps": int(model.num_timesteps), "eval": result}
