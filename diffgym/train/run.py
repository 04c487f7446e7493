"""The run directory shared by the training algorithms.

    runs/<name>/
        config.yaml          the resolved configuration (after overrides)
        metrics.csv          one row per logged iteration (env_steps, wall_time, iteration, ...)
        tb/                  the same scalars for TensorBoard
        checkpoint_last.pt   written atomically every ``checkpoint_every`` iterations
        checkpoint_prev.pt   the checkpoint before it (the fallback if the last one is damaged)
        checkpoint_best.pt   a copy of the checkpoint with the best training return so far
        checkpoint_best.json (its iteration, env_steps and episode_return)
        learning_curve.png   episode return against environment steps and wall-clock
        eval.json            the final deterministic evaluation
        policy.gif           a rollout of the trained policy

``Run(cfg, run_dir, resume=True)`` reopens a directory: ``load_checkpoint()`` returns the last
checkpoint and the CSV (and TensorBoard, through ``purge_step``) is cut back to it, so a run
killed half-way loses only the unfinished iteration and its curve stays continuous. A damaged
last checkpoint (empty, truncated, overwritten) is reported by name and the run resumes from
``checkpoint_prev.pt`` instead, cut back the same way. Without ``resume`` an existing
directory's metrics, checkpoints and TensorBoard events are replaced.

Loading a checkpoint never runs code: checkpoints hold plain data only (tensors, numbers,
strings, lists, tuples and dicts; numpy arrays are stored as tensors with their dtype, see
:func:`to_plain`) and are read with ``torch.load(weights_only=True)``, which refuses anything
else. A file that references Python objects (a crafted checkpoint, or one written by diffgym
before checkpoint format 2) is refused with an error naming the file and what it references.
"""
from __future__ import annotations

import csv
import json
import math
import os
import shutil
import sys
import time
from collections import OrderedDict
from typing import Callable

import numpy as np
import yaml

from .config import TrainConfig, config_to_dict


CHECKPOINT_FORMAT = 2        # 2: plain data read with weights_only=True (1: pickled numpy/SB3 objects)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be resumed from; the message names the file and why."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """A readable checkpoint that does not fit the run resuming it (another algorithm, another
    number of environments or network size, missing entries)."""


class _Damaged(CheckpointError):
    """The file is not a whole checkpoint (empty, truncated, overwritten): fall back."""


_ND = "__ndarray__"


def to_plain(obj, key: str = "checkpoint"):
    """``obj`` as data ``torch.load(weights_only=True)`` reads back: tensors, None, bool, int,
    float, str, and lists, tuples and dicts (str or int keys) of them. A numpy array becomes
    ``{"__ndarray__": tensor, "dtype": "<f8"}`` (unsigned integers stored bit for bit in the signed
    type of the same size); numpy scalars become Python numbers. Anything else raises TypeError
    naming the key, so no Python object ever gets into a checkpoint."""
    import torch
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise TypeError(f"{key}: a numpy array of dtype {obj.dtype} cannot go into a checkpoint")
        a = np.ascontiguousarray(obj)
        stored = a.view(f"i{a.dtype.itemsize}") if a.dtype.kind == "u" and a.dtype.itemsize > 1 else a
        return {_ND: torch.from_numpy(stored.copy()), "dtype": a.dtype.str}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        bad = [k for k in obj if not isinstance(k, (str, int)) or isinstance(k, bool)]
        if bad:
            raise TypeError(f"{key}: key {bad[0]!r} is not a string or an integer")
        out = type(obj)() if type(obj) in (dict, OrderedDict) else {}
        for k, v in obj.items():
            out[k] = to_plain(v, f"{key}.{k}")
        meta = getattr(obj, "_metadata", None)           # a module state_dict's version numbers
        if isinstance(out, OrderedDict) and meta is not None:
            out._metadata = to_plain(dict(meta), f"{key}._metadata")
        return out
    if type(obj) in (list, tuple):
        return type(obj)(to_plain(v, f"{key}[{i}]") for i, v in enumerate(obj))
    raise TypeError(f"{key}: {type(obj).__name__} is not plain data (tensors, numbers, strings, lists, "
                    "dicts, numpy arrays) and cannot go into a checkpoint")


def from_plain(obj):
    """The inverse of :func:`to_plain` (numpy arrays back from their tensors)."""
    if isinstance(obj, dict):
        if _ND in obj and set(obj) == {_ND, "dtype"}:
            dtype = np.dtype(obj["dtype"])
            a = obj[_ND].numpy()
            return (a.view(dtype) if dtype.kind == "u" and dtype.itemsize > 1 else a.astype(dtype)).copy()
        out = type(obj)()
        for k, v in obj.items():
            out[k] = from_plain(v)
        if isinstance(obj, OrderedDict) and hasattr(obj, "_metadata"):
            out._metadata = obj._metadata
        return out
    if type(obj) in (list, tuple):
        return type(obj)(from_plain(v) for v in obj)
    return obj


def _referenced_globals(path: str) -> list[str]:
    """The Python callables a checkpoint's pickle references (read without unpickling)."""
    try:
        from torch.serialization import get_unsafe_globals_in_checkpoint
        return sorted(get_unsafe_globals_in_checkpoint(path))
    except Exception:          # noqa: BLE001  (only for the message)
        return []


# what diffgym wrote before checkpoint format 2: numpy arrays and RNG states, SB3's pickled statistics
_OLD_FORMAT_GLOBALS = ("numpy.", "stable_baselines3.", "_codecs.encode", "builtins.bytearray")


def read_checkpoint(path: str) -> dict:
    """A checkpoint written by :meth:`Run.save_checkpoint`, read without running any code.

    Raises ``_Damaged`` (a :class:`CheckpointError`) for a file that is not a whole checkpoint and
    :class:`CheckpointError` for one that references Python objects or has another format."""
    import pickle
    import zipfile

    import torch
    size = os.path.getsize(path)
    if size == 0:
        raise _Damaged(f"{path}: empty (0 bytes)")
    if not zipfile.is_zipfile(path):
        raise _Damaged(f"{path}: damaged or truncated ({size} bytes that are not a torch checkpoint archive)")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        if bad is not None:
            raise _Damaged(f"{path}: damaged (member {bad} fails its checksum)")
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise _Damaged(f"{path}: damaged or truncated ({exc})") from None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        refs = _referenced_globals(path)
        if "weights only" not in str(exc).lower() and not refs:
            raise _Damaged(f"{path}: damaged ({str(exc).splitlines()[0]})") from None
        if refs and all(r.startswith(_OLD_FORMAT_GLOBALS) for r in refs):
            raise CheckpointError(
                f"{path}: written by an older diffgym version (checkpoint format 1, which stores pickled "
                f"Python objects: {', '.join(refs[:4])}). Loading it could run code, so diffgym no longer "
                "does; start the run over (diffgym train CONFIG --run-dir DIR), or resume it with the "
                "diffgym version that wrote it") from None
        what = ", ".join(refs[:6]) if refs else str(exc).splitlines()[0]
        raise CheckpointError(
            f"{path}: refused: the file references Python objects ({what}) that would run code when "
            "loaded; a diffgym checkpoint holds only tensors, numbers and strings. Do not resume from "
            "this directory unless you know where it came from") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _Damaged(f"{path}: damaged or truncated ({why})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        fmt = ckpt.get("format") if isinstance(ckpt, dict) else None
        raise CheckpointError(
            f"{path}: not a diffgym checkpoint of format {CHECKPOINT_FORMAT} (format {fmt!r}"
            f"{', written by an older diffgym version' if fmt is None else ''}); start the run over")
    return from_plain(ckpt)


class Run:
    def __init__(self, cfg: TrainConfig, run_dir: str, resume: bool = False, tensorboard: bool = True):
        self.cfg, self.dir, self.resume = cfg, os.fspath(run_dir), bool(resume)
        if resume and not os.path.isfile(os.path.join(self.dir, "config.yaml")):
            raise FileNotFoundError(f"--resume {self.dir}: not a run directory (no config.yaml)")
        os.makedirs(self.dir, exist_ok=True)
        self.csv_path = os.path.join(self.dir, "metrics.csv")
        self.ckpt_path = os.path.join(self.dir, "checkpoint_last.pt")
        self.prev_path = os.path.join(self.dir, "checkpoint_prev.pt")
        self.best_path = os.path.join(self.dir, "checkpoint_best.pt")
        self.best_json = os.path.join(self.dir, "checkpoint_best.json")
        if not resume:
            for name in ("metrics.csv", "checkpoint_last.pt", "checkpoint_prev.pt", "checkpoint_best.pt",
                         "checkpoint_last.pt.tmp", "checkpoint_best.json",
                         "eval.json", "learning_curve.png", "policy.gif", "ppo_model.zip", "vecnormalize.pkl"):
                p = os.path.join(self.dir, name)
                if os.path.exists(p):
                    os.remove(p)
            shutil.rmtree(os.path.join(self.dir, "tb"), ignore_errors=True)
        # a resumed run's config.yaml (overrides such as a longer budget) is written once it has
        # logged or saved something: a resume refused for its checkpoint leaves the directory's config
        self._config_written = False
        if not resume:
            self._write_config()
        self._rows = self._read_csv()
        self._wall0 = time.perf_counter() - (float(self._rows[-1]["wall_time"]) if self._rows else 0.0)
        self._best = None
        if resume and os.path.isfile(self.best_json):
            try:
                with open(self.best_json) as f:
                    best = json.load(f)
                self._best = {"iteration": int(best["iteration"]), "env_steps": int(best["env_steps"]),
                              "episode_return": float(best["episode_return"])}
            except (OSError, ValueError, TypeError, KeyError) as exc:
                print(f"{self.best_json}: unreadable ({exc}); the best checkpoint is tracked afresh",
                      file=sys.stderr)
        self._ckpt_steps = 0                 # env_steps of the last checkpoint (for "best")
        self._use_tb, self._tb, self._purge_step = tensorboard, None, None

    def _write_config(self) -> None:
        if not self._config_written:
            tmp = os.path.join(self.dir, "config.yaml.tmp")
            with open(tmp, "w") as f:
                yaml.safe_dump(config_to_dict(self.cfg), f, sort_keys=False)
            os.replace(tmp, os.path.join(self.dir, "config.yaml"))
            self._config_written = True

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
        self._write_config()
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

    def progress(self, total_env_steps: int) -> "Progress":
        """The progress bar of the environment steps, from the resumed count to
        ``total_env_steps`` (give the steps the run will actually take: whole iterations)."""
        done = self._ckpt_steps if self.resume else 0
        self.last_progress = Progress(int(total_env_steps), done, f"{self.cfg.algo} {self.cfg.env.id}")
        return self.last_progress

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, payload: dict, iteration: int) -> None:
        """Write checkpoint_last.pt atomically (the one it replaces becomes checkpoint_prev.pt);
        copy it to checkpoint_best.pt when the mean training return logged since the previous
        checkpoint is the best so far. ``payload`` must be plain data (see :func:`to_plain`)."""
        import torch
        self._write_config()
        payload = to_plain(dict(payload, iteration=int(iteration), format=CHECKPOINT_FORMAT))
        tmp = self.ckpt_path + ".tmp"
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        if os.path.isfile(self.ckpt_path):
            os.replace(self.ckpt_path, self.prev_path)
        os.replace(tmp, self.ckpt_path)        # atomic: a kill leaves a whole last or previous checkpoint
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

        A damaged last checkpoint is reported and the previous one is used instead. Resuming a
        directory without a checkpoint starts the run over (its metrics are dropped); a directory
        whose checkpoints are all damaged, or that holds a checkpoint referencing Python objects,
        raises :class:`CheckpointError`."""
        if not self.resume:
            return None
        ckpt, steps, damaged = None, 0, []
        for path in (self.ckpt_path, self.prev_path):
            if not os.path.isfile(path):
                continue
            try:
                ckpt = read_checkpoint(path)
            except _Damaged as exc:
                damaged.append(str(exc))
                continue
            steps = int(ckpt.get("env_steps", 0))
            if path != self.ckpt_path:
                if damaged:     # set aside, so the next checkpoint keeps this one as the previous
                    os.replace(self.ckpt_path, self.ckpt_path + ".damaged")
                    why = f"{damaged[0]}; moved it to {os.path.basename(self.ckpt_path)}.damaged and"
                else:
                    why = f"{self.ckpt_path} is missing;"
                print(f"--resume: {why} resuming from the previous checkpoint {path} (iteration "
                      f"{int(ckpt.get('iteration', 0))}, {steps} environment steps)", file=sys.stderr)
            break
        if ckpt is None and damaged:
            raise CheckpointError("--resume: no usable checkpoint: " + "; ".join(damaged))
        if ckpt is None:
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
        self._write_config()
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


class Progress:
    """A tqdm bar of environment steps whose rate and time estimate start after the first update.

    The first iteration of a run includes one-time work (kernel compilation on a first run,
    allocations) that would make the estimate predict hours; the bar shows only the count until
    that iteration is done, then restarts its clock there. ``n`` and ``total`` are the counts
    shown; the trainers set ``total`` to the steps their whole iterations take (a count past it
    would move the total along; ``total_at_start`` keeps the first one)."""

    def __init__(self, total: int, initial: int, desc: str):
        self.total, self.n, self.desc = int(total), int(initial), desc
        self.total_at_start = self.total
        self._tty = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        self._bar = self._open(timed=False)
        self._timed = False

    def _open(self, timed: bool):
        from tqdm.auto import tqdm
        fmt = None if timed else "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [first iteration{postfix}]"
        return tqdm(total=self.total, initial=self.n, unit="step", unit_scale=True, dynamic_ncols=True,
                    desc=self.desc, mininterval=1.0 if self._tty else 30.0, smoothing=0.1, bar_format=fmt,
                    leave=timed)

    def update(self, steps: int) -> None:
        steps = int(steps)
        self.n += steps
        if self.n > self.total:      # never shown past its end (the trainers give the exact total)
            self.total = self._bar.total = self.n
        if not self._timed:          # the first update: restart the clock after the one-time work
            self._bar.close()
            self._bar = self._open(timed=True)
            self._timed = True
        else:
            self._bar.update(steps)

    def set_postfix(self, *args, **kwargs) -> None:
        self._bar.set_postfix(*args, **kwargs)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


COMPILE_NOTICE_AFTER = 2.0         # seconds of environment preparation before saying what it is


def prepare_env(cfg: TrainConfig, jacobian: bool = False) -> None:
    """Build one environment and step it once (with its Jacobian for SHAC) before a run starts.

    A value in ``env.kwargs`` the environment rejects fails here, before the run directory is
    created, as a :class:`ConfigError`; and the simulator's compiled kernels are loaded (or, on
    a first run, compiled, announced after two seconds) here rather than inside the first timed
    iteration. The environment's RNG is its own: the run's random streams are not touched."""
    import threading

    from .config import ConfigError
    announced = threading.Event()

    def announce():
        announced.set()
        print(f"preparing the simulator's compiled kernels for {cfg.env.id} (compiled once on a first run, "
              "then loaded from the cache)...", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    timer = threading.Timer(COMPILE_NOTICE_AFTER, announce)
    timer.daemon = True
    timer.start()
    try:
        try:
            env = _make_env(cfg, disable_env_checker=True)
        except (TypeError, ValueError) as exc:
            given = dict(cfg.env.kwargs or {})
            if cfg.env.episode_steps is not None:
                given["episode_steps"] = cfg.env.episode_steps
            raise ConfigError(f"env.kwargs: {cfg.env.id} rejects {given}: {exc}") from None
        try:
            env.reset(seed=cfg.seed)
            a = np.zeros(env.action_space.shape)
            step = getattr(env.unwrapped, "step_with_jacobian", None) if jacobian else None
            (step or env.step)(a)
        finally:
            env.close()
    finally:
        timer.cancel()
    if announced.is_set():
        print(f"simulator kernels ready ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)


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
