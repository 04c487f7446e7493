"""The run directory shared by the training algorithms.

    runs/<name>/
        config.yaml          the resolved configuration (after overrides)
        metrics.csv          one row per logged iteration (env_steps, wall_time, iteration, ...)
        tb/                  the same scalars for TensorBoard
        checkpoint_last.pt   written atomically every ``checkpoint_every`` iterations
        checkpoint_best.pt   a copy of the checkpoint with the best training return so far
        checkpoint_best.json (its iteration, env_steps and episode_return)
        learning_curve.png   episode return against environment steps and wall-clock
        eval.json            the final deterministic evaluation
        policy.gif           a rollout of the trained policy

``Run(cfg, run_dir, resume=True)`` reopens a directory: ``load_checkpoint()`` returns the last
checkpoint and the CSV (and TensorBoard, through ``purge_step``) is cut back to it, so a run
killed half-way loses only the unfinished iteration and its curve stays continuous. Without
``resume`` an existing directory's metrics, checkpoints and TensorBoard events are replaced.
"""
from __future__ import annotations

import csv
import json
import math
import os
import shutil
import sys
import time
from typing import Callable

import numpy as np
import yaml

from .config import TrainConfig, config_to_dict


class Run:
    def __init__(self, cfg: TrainConfig, run_dir: str, resume: bool = False, tensorboard: bool = True):
        self.cfg, self.dir, self.resume = cfg, os.fspath(run_dir), bool(resume)
        if resume and not os.path.isfile(os.path.join(self.dir, "config.yaml")):
            raise FileNotFoundError(f"--resume {self.dir}: not a run directory (no config.yaml)")
        os.makedirs(self.dir, exist_ok=True)
        self.csv_path = os.path.join(self.dir, "metrics.csv")
        self.ckpt_path = os.path.join(self.dir, "checkpoint_last.pt")
        self.best_path = os.path.join(self.dir, "checkpoint_best.pt")
        self.best_json = os.path.join(self.dir, "checkpoint_best.json")
        if not resume:
            for name in ("metrics.csv", "checkpoint_last.pt", "checkpoint_best.pt", "checkpoint_best.json",
                         "eval.json", "learning_curve.png", "policy.gif", "ppo_model.zip", "vecnormalize.pkl"):
                p = os.path.join(self.dir, name)
                if os.path.exists(p):
                    os.remove(p)
            shutil.rmtree(os.path.join(self.dir, "tb"), ignore_errors=True)
        with open(os.path.join(self.dir, "config.yaml"), "w") as f:
            yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
        self._rows = self._read_csv()
        self._wall0 = time.perf_counter() - (float(self._rows[-1]["wall_time"]) if self._rows else 0.0)
        self._best = None
        if resume and os.path.isfile(self.best_json):
            with open(self.best_json) as f:
                self._best = json.load(f)
        self._ckpt_steps = 0                 # env_steps of the last checkpoint (for "best")
        self._use_tb, self._tb, self._purge_step = tensorboard, None, None

    def _writer(self):
        """The TensorBoard writer, opened at the first row (after a resume has cut the CSV)."""
        if self._tb is None and self._use_tb:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except Exception:        # tensorboard missing: the CSV is the record
                self._use_tb = False
                return None
            self._tb = SummaryWriter(os.path.join(self.dir, "tb"), purge_step=self._purge_step)
        return self._tb

    # -- metrics ---------------------------------------------------------------------------------
    def _read_csv(self) -> list[dict]:
        if not os.path.isfile(self.csv_path):
            return []
        with open(self.csv_path, newline="") as f:
            return list(csv.DictReader(f))

    def _write_csv(self) -> None:
        keys: list[str] = []
        for r in self._rows:
            keys += [k for k in r if k not in keys]
        tmp = self.csv_path + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(self._rows)
        os.replace(tmp, self.csv_path)

    def log(self, env_steps: int, **metrics) -> None:
        row = {"env_steps": int(env_steps), "wall_time": round(time.perf_counter() - self._wall0, 3)}
        row.update({k: (float(v) if isinstance(v, (np.floating, np.integer)) else v) for k, v in metrics.items()})
        self._rows.append(row)
        new_keys = len(self._rows) == 1 or any(k not in self._rows[0] for k in row)
        if new_keys:
            self._write_csv()
        else:
            with open(self.csv_path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=list(self._rows[0])).writerow(row)
        tb = self._writer()
        if tb is not None:
            for k, v in row.items():
                if k != "env_steps" and isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
                    tb.add_scalar(k, v, int(env_steps))
            tb.flush()

    def progress(self, total_env_steps: int):
        from tqdm.auto import tqdm
        done = self._ckpt_steps if self.resume else 0
        tty = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        return tqdm(total=int(total_env_steps), initial=done, unit="step", unit_scale=True, dynamic_ncols=True,
                    desc=f"{self.cfg.algo} {self.cfg.env.id}", mininterval=1.0 if tty else 30.0,
                    smoothing=0.1)

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, payload: dict, iteration: int) -> None:
        """Write checkpoint_last.pt atomically; copy it to checkpoint_best.pt when the mean training
        return logged since the previous checkpoint is the best so far."""
        import torch
        payload = dict(payload, iteration=int(iteration))
        tmp = self.ckpt_path + ".tmp"
        torch.save(payload, tmp)
        os.replace(tmp, self.ckpt_path)        # atomic: a kill leaves the previous checkpoint
        steps = int(payload.get("env_steps", self._rows[-1]["env_steps"] if self._rows else 0))
        recent = [float(r["episode_return"]) for r in self._rows
                  if self._ckpt_steps < int(float(r["env_steps"])) <= steps
                  and r.get("episode_return") not in (None, "") and not math.isnan(float(r["episode_return"]))]
        self._ckpt_steps = steps
        if recent:
            ret = float(np.mean(recent))
            if self._best is None or ret > self._best["episode_return"]:
                shutil.copyfile(self.ckpt_path, self.best_path + ".tmp")
                os.replace(self.best_path + ".tmp", self.best_path)
                self._best = {"iteration": int(iteration), "env_steps": steps, "episode_return": ret}
                with open(self.best_json + ".tmp", "w") as f:
                    json.dump(self._best, f, indent=2)
                os.replace(self.best_json + ".tmp", self.best_json)

    def load_checkpoint(self) -> dict | None:
        """The last checkpoint (resume only); metrics logged after it are dropped (CSV and TensorBoard).

        Resuming a directory without a checkpoint starts the run over (its metrics are dropped)."""
        if not self.resume:
            return None
        ckpt, steps = None, 0
        if os.path.isfile(self.ckpt_path):
            import torch
            ckpt = torch.load(self.ckpt_path, weights_only=False)
            steps = int(ckpt.get("env_steps", 0))
        else:
            print(f"--resume {self.dir}: no checkpoint yet; starting the run over", file=sys.stderr)
        kept = [r for r in self._rows if int(float(r["env_steps"])) <= steps]
        if len(kept) != len(self._rows):
            self._rows = kept
            if kept:
                self._write_csv()
            elif os.path.exists(self.csv_path):
                os.remove(self.csv_path)
        self._wall0 = time.perf_counter() - (float(self._rows[-1]["wall_time"]) if self._rows else 0.0)
        self._ckpt_steps = steps
        self._purge_step = steps + 1
        return ckpt

    # -- the end of a run ------------------------------------------------------------------------
    def finish(self, policy_fn: Callable[[np.ndarray], np.ndarray]) -> dict:
        result = evaluate(self.cfg, policy_fn, self.cfg.eval_episodes) if self.cfg.eval_episodes > 0 else {}
        with open(os.path.join(self.dir, "eval.json"), "w") as f:
            json.dump(result, f, indent=2)
        plot_learning_curve(self.csv_path, os.path.join(self.dir, "learning_curve.png"),
                            title=f"{self.cfg.algo.upper()} on {self.cfg.env.id}", eval_result=result)
        if self.cfg.gif:
            write_policy_gif(self.cfg, policy_fn, os.path.join(self.dir, "policy.gif"))
        self.close()
        return result

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _make_env(cfg: TrainConfig, **extra):
    import gymnasium as gym
    import diffgym  # noqa: F401  (registers the ids)
    kwargs = dict(cfg.env.kwargs or {})
    if cfg.env.episode_steps is not None:
        kwargs["episode_steps"] = cfg.env.episode_steps
    kwargs.update(extra)
    return gym.make(cfg.env.id, **kwargs)


def evaluate(cfg: TrainConfig, policy_fn, episodes: int, seed: int = 10_000) -> dict:
    """Deterministic episodes: return, length and, where the env reports it, success."""
    env = _make_env(cfg)
    rets, lens, succ, upright = [], [], [], []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        total, n, done, info, cos_hist = 0.0, 0, False, {}, []
        while not done:
            obs, r, term, trunc, info = env.step(np.clip(policy_fn(obs), -1, 1))
            total += r
            n += 1
            done = term or trunc
            if cfg.env.id.startswith("DiffCartPole"):
                cos_hist.append(obs[3])
        rets.append(total)
        lens.append(n)
        if "success" in info:
            succ.append(bool(info["success"]))
        if cos_hist:      # swung up and balanced: |theta| < 0.2 rad over the last 100 steps
            upright.append(bool(np.all(np.array(cos_hist[-100:]) > np.cos(0.2))))
    out = {"episodes": episodes, "return_mean": float(np.mean(rets)), "return_std": float(np.std(rets)),
           "length_mean": float(np.mean(lens)), "returns": [float(r) for r in rets]}
    if succ:
        out["success_rate"] = float(np.mean(succ))
    if upright:
        out["success_rate"] = float(np.mean(upright))
        out["success"] = "|theta| < 0.2 rad over the last 100 steps"
    return out


def plot_learning_curve(csv_path: str, png_path: str, title: str = "", eval_result: dict | None = None) -> None:
    """Training return (episodes finished in each logged iteration) against environment steps and
    wall-clock; the final deterministic evaluation as a marker at the end."""
    if not os.path.isfile(csv_path):
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(csv_path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("episode_return") not in (None, "", "nan")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    if rows:
        ret = np.array([float(r["episode_return"]) for r in rows])
        xs = (np.array([float(r["env_steps"]) for r in rows]), np.array([float(r["wall_time"]) for r in rows]))
        for ax, x in zip(axes, xs):
            ax.plot(x, ret, lw=1.2, label="training (with exploration)")
            if eval_result and "return_mean" in eval_result:
                ax.errorbar([x[-1]], [eval_result["return_mean"]], yerr=[eval_result.get("return_std", 0.0)],
                            fmt="o", color="C3", capsize=3,
                            label=f"final evaluation ({eval_result.get('episodes')} episodes)")
        axes[0].legend(fontsize=8, loc="lower right")
    axes[0].set_xlabel("environment steps")
    axes[1].set_xlabel("wall-clock (s)")
    for ax in axes:
        ax.set_ylabel("episode return")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def write_policy_gif(cfg: TrainConfig, policy_fn, path: str, max_frames: int = 150, seed: int = 20_000) -> None:
    from diffgym.render import write_gif
    env = _make_env(cfg, render_mode="rgb_array")
    obs, _ = env.reset(seed=seed)
    steps = env.unwrapped.episode_steps
    every = max(1, math.ceil(steps / max_frames), math.ceil(env.metadata["render_fps"] / 50))
    frames, done, k = [env.render()], False, 0
    while not done:
        obs, r, term, trunc, info = env.step(np.clip(policy_fn(obs), -1, 1))
        done = term or trunc
        k += 1
        if k % every == 0 or done:
            frames.append(env.render())
    write_gif(frames, path, fps=max(1, round(env.metadata["render_fps"] / every)))
