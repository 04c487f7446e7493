"""``diffgym record``: render a rollout of one of the environments to a GIF or an MP4.

    diffgym record DiffHopper-v0 hopper.gif                 # random actions (seeded), one episode
    diffgym record DiffGo1-v0 go1.mp4 --actions zero --steps 200 --width 480 --height 360

A trained policy's rollout is written by training itself (``policy.gif`` in the run directory).
"""
from __future__ import annotations

import argparse
import math
import os

import numpy as np


def check_arguments(path: str, *, steps: int | None = None, actions: str = "random",
                    width: int = 320, height: int = 240, max_fps: float = 30.0) -> str:
    """Refuses bad arguments of :func:`record` before anything runs (ValueError naming the
    argument and its value). Returns the output file's extension."""
    if actions not in ("random", "zero"):
        raise ValueError(f"actions must be 'random' or 'zero', got {actions!r}")
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    for name, val in (("width", width), ("height", height)):
        if val < 1:
            raise ValueError(f"{name} must be >= 1 pixel, got {val}")
    if not max_fps > 0:
        raise ValueError(f"max_fps must be > 0, got {max_fps}")
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".gif", ".mp4", ".webm", ".mkv", ".avi", ".mov"):
        raise ValueError(f"{path}: write a .gif or a video (.mp4, .webm, .mkv, .avi, .mov)")
    return ext


def record(env_id: str, path: str, *, steps: int | None = None, seed: int = 0, actions: str = "random",
           width: int = 320, height: int = 240, max_fps: float = 30.0, **env_kwargs) -> dict:
    """Roll out ``env_id`` from ``reset(seed)`` with random (seeded) or zero actions for one episode
    (or ``steps`` steps), render it and write ``path`` (``.gif``, or a video such as ``.mp4``).
    Frames are kept at no more than ``max_fps`` of simulated time. Returns a summary dict."""
    import gymnasium as gym

    import diffgym  # noqa: F401  (registers the ids)
    from diffgym.render import write_gif, write_video

    ext = check_arguments(path, steps=steps, actions=actions, width=width, height=height,
                          max_fps=max_fps)
    env = gym.make(env_id, render_mode="rgb_array", width=width, height=height, **env_kwargs)
    try:
        env.action_space.seed(seed)
        env.reset(seed=seed)
        fps = float(env.metadata["render_fps"])
        every = max(1, math.ceil(fps / max_fps))
        frames, total, n, done = [env.render()], 0.0, 0, False
        limit = steps if steps is not None else math.inf
        zero = np.zeros(env.action_space.shape, env.action_space.dtype)
        while n < limit and not done:
            a = env.action_space.sample() if actions == "random" else zero
            _, r, terminated, truncated, info = env.step(a)
            total += float(r)
            n += 1
            done = terminated or truncated
            if n % every == 0 or done or n == limit:
                frames.append(env.render())
    finally:
        env.close()
    out_fps = fps / every
    (write_gif if ext == ".gif" else write_video)(frames, path, fps=out_fps)
    return {"env": env_id, "path": path, "steps": n, "return": total, "frames": len(frames),
            "fps": out_fps, "terminated": bool(terminated), "diverged": bool(info.get("diverged", False))}


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("env_id", help="a registered id, e.g. DiffHopper-v0")
    p.add_argument("out", help="output file: .gif, or a video such as .mp4 (needs diffgym[render])")
    p.add_argument("--steps", type=int, default=None, help="steps to record (default: one episode)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--actions", choices=["random", "zero"], default="random")
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--height", type=int, default=240)
    p.add_argument("--max-fps", type=float, default=30.0, help="frames per second of simulated time, at most")
    return p


def main(args: argparse.Namespace) -> int:
    out = record(args.env_id, args.out, steps=args.steps, seed=args.seed, actions=args.actions,
                 width=args.width, height=args.height, max_fps=args.max_fps)
    print(f"{out['path']}: {out['frames']} frames at {out['fps']:.3g} fps, {out['steps']} steps, "
          f"return {out['return']:.2f}" + (", terminated" if out["terminated"] else "")
          + (", diverged" if out["diverged"] else ""))
    return 0
