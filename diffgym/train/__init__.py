"""Training: ``diffgym train CONFIG.yaml`` (SHAC or PPO) and ``diffgym sweep SWEEP.yaml``."""
from __future__ import annotations

import os
import time

from .config import ConfigError, TrainConfig, load_config


def default_run_dir(cfg: TrainConfig) -> str:
    name = f"{cfg.env.id.split('-')[0].lower()}_{cfg.algo}_s{cfg.seed}_{time.strftime('%Y%m%d-%H%M%S')}"
    return os.path.join("runs", name)


def train(cfg: TrainConfig, run_dir: str | None = None, resume: bool = False) -> dict:
    """Run one training job into ``run_dir`` (created), resuming from its checkpoint if asked.

    The environment is checked (``env.id``, ``env.kwargs``) and built once before the run
    directory is created: a config error leaves nothing behind."""
    from .config import check_env
    from .run import Run, prepare_env
    check_env(cfg)                        # before anything is created
    prepare_env(cfg, jacobian=cfg.algo == "shac")
    run_dir = run_dir or cfg.run_dir or default_run_dir(cfg)
    run = Run(cfg, run_dir, resume=resume)
    if cfg.algo == "ppo":
        from .ppo import train_ppo
        out = train_ppo(cfg, run)
    else:
        from .shac import train_shac
        out = train_shac(cfg, run)
    out["run_dir"] = run_dir
    return out


__all__ = ["train", "load_config", "TrainConfig", "ConfigError", "default_run_dir"]
