"""The ``diffgym`` command line: ``diffgym demo``, ``diffgym bench``, ... (each with --help)."""
from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    return run_demo(seconds=args.seconds)


def _bench(args: argparse.Namespace) -> int:
    if getattr(args, "drops", False):
        from .bench_drops import main as drops_main
        return drops_main(args)
    if getattr(args, "zoo", False):
        from .bench_zoo import main as zoo_main
        return zoo_main(args)
    from .bench import main as bench_main
    return bench_main(args)


def _record(args: argparse.Namespace) -> int:
    from gymnasium.error import Error as GymError

    from .record import check_arguments, main as record_main
    # a bad argument (or an unknown environment id) is a usage error, rc 2; a ValueError raised
    # while the rollout runs is a failure of the run and keeps its traceback
    try:
        check_arguments(args.out, steps=args.steps, actions=args.actions, width=args.width,
                        height=args.height, max_fps=args.max_fps)
    except ValueError as exc:
        print(f"diffgym record: {exc}", file=sys.stderr)
        return 2
    try:
        return record_main(args)
    except GymError as exc:
        print(f"diffgym record: {exc}", file=sys.stderr)
        return 2


def _train(args: argparse.Namespace) -> int:
    import os
    from .train import train
    from .train.config import ConfigError, load_config
    try:
        if args.resume:
            cfg_path = os.path.join(args.resume, "config.yaml")
            if not os.path.isfile(cfg_path):
                raise ConfigError(f"--resume {args.resume}: not a run directory (no config.yaml)")
            if args.run_dir and os.path.abspath(args.run_dir) != os.path.abspath(args.resume):
                raise ConfigError("--resume RUN_DIR continues in RUN_DIR; drop --run-dir")
            cfg = load_config(cfg_path, args.overrides)
            run_dir = args.resume
        else:
            if not args.config:
                from .resources import configs_dir
                names = sorted(f for f in os.listdir(configs_dir()) if f.endswith(".yaml"))
                raise ConfigError("give a CONFIG.yaml (or --resume RUN_DIR); shipped configs: " + ", ".join(names))
            cfg = load_config(args.config, args.overrides)
            run_dir = args.run_dir
    except ConfigError as exc:
        print(f"diffgym train: {exc}", file=sys.stderr)
        return 2
    from .train import default_run_dir
    run_dir = run_dir or cfg.run_dir or default_run_dir(cfg)
    print(f"{'resuming' if args.resume else 'training'} {cfg.algo} on {cfg.env.id} in {run_dir}", file=sys.stderr)
    from .train.run import CheckpointError
    try:
        out = train(cfg, run_dir, resume=bool(args.resume))
    except KeyboardInterrupt:
        print("\ninterrupted; continue with: diffgym train --resume <run dir>", file=sys.stderr)
        return 130
    except (ConfigError, CheckpointError) as exc:     # nothing was trained; the message says why
        print(f"diffgym train: {exc}", file=sys.stderr)
        return 2
    ev = out.get("eval") or {}
    print(f"run directory: {out['run_dir']}")
    if ev:
        msg = f"evaluation over {ev['episodes']} episodes: return {ev['return_mean']:.2f} +- {ev['return_std']:.2f}"
        if "success_rate" in ev:
            msg += f", success rate {ev['success_rate']:.2f}"
        print(msg)
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from .train.config import ConfigError
    from .train.sweep import run_sweep
    try:
        recs = run_sweep(args.sweep, workers=args.workers, use_ray=args.ray is not None,
                         ray_address=args.ray or None, out=args.out, restart=args.restart)
    except ConfigError as exc:
        print(f"diffgym sweep: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0 if all(r.get("status") == "ok" for r in recs) else 1


def _compile(args: argparse.Namespace) -> int:
    import time

    import gymnasium as gym
    import numpy as np

    from .sim import jit
    if not jit.ENABLED:
        print("diffgym compile: DIFFGYM_JIT=0, nothing to compile", file=sys.stderr)
        return 0
    where = jit.CACHE_DIR or "memory only (no writable cache: nothing will be kept)"
    print(f"kernel cache: {where}")
    from .envs import ENV_IDS
    for env_id in args.ids or list(ENV_IDS):
        t = time.perf_counter()
        env = gym.make(env_id)
        env.reset(seed=0)
        a = np.zeros(env.action_space.shape)
        env.step(a)
        env.unwrapped.step_with_jacobian(a)
        env.close()
        print(f"{env_id}: ready in {time.perf_counter() - t:.1f} s", flush=True)
    return 0


def _trajopt(args: argparse.Namespace) -> int:
    from .trajopt import check_args, run as trajopt_run
    # a bad argument is a usage error, rc 2; a ValueError raised while the optimizations run
    # (a failure of the run, not of the command line) keeps its traceback
    try:
        check_args(args)
    except ValueError as exc:
        print(f"diffgym trajopt: {exc}", file=sys.stderr)
        return 2
    return trajopt_run(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="diffgym", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="simulate the shipped scenes and print what happened")
    p.add_argument("--seconds", type=float, default=2.0, help="simulated time per scene")
    p.set_defaults(func=_demo)
    p = sub.add_parser("bench", help="print the step-time benchmark table (MuJoCo side by side)")
    from .bench import add_arguments
    add_arguments(p)
    p.add_argument("--drops", action="store_true",
                   help="instead, the random drop benchmark (diffgym.bench_drops): failure "
                        "categories per shape and rate")
    p.add_argument("--n", type=int, default=300, help="--drops: number of drops (paper: 3600)")
    p.add_argument("--seed", type=int, default=0, help="--drops: seed of the random scenes")
    p.add_argument("--zoo", action="store_true",
                   help="instead, the model zoo (diffgym.bench_zoo): every Gymnasium MuJoCo "
                        "asset, dm_control suite domain and example-robot-data robot loaded, "
                        "refused by name or simulated next to MuJoCo")
    p.add_argument("--zoo-seconds", type=float, default=3.0, help="--zoo: simulated time per model")
    p.add_argument("--only", default="", help="--zoo: comma-separated substrings of model names")
    p.add_argument("--budget", type=float, default=120.0,
                   help="--zoo: wall-clock seconds per model (the row says where a run stopped)")
    p.set_defaults(func=_bench)
    from .record import add_arguments as record_arguments
    p = record_arguments(sub.add_parser("record", help="render a rollout of an environment to a GIF or MP4"))
    p.set_defaults(func=_record)
    p = sub.add_parser("compile", help="compile and cache the simulation kernels now (for example "
                       "while building a container image), by stepping each environment once")
    p.add_argument("ids", nargs="*", help="environment ids (default: all)")
    p.set_defaults(func=_compile)
    p = sub.add_parser("train", help="train SHAC or PPO from a YAML config")
    p.add_argument("config", nargs="?", help="CONFIG.yaml (a path, or a name in diffgym's configs/)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. shac.actor_lr=1e-3 seed=2")
    p.add_argument("--run-dir", default=None, metavar="DIR",
                   help="where to write the run (default runs/<env>_<algo>_s<seed>_<time>)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue a run from its last checkpoint (overrides such as total_env_steps=... apply)")
    p.set_defaults(func=_train)
    p = sub.add_parser("sweep", help="run a sweep of training trials (local process pool or Ray)")
    p.add_argument("sweep", nargs="?", help="SWEEP.yaml (a path, or a name in diffgym's configs/sweeps/)")
    p.add_argument("--workers", type=int, default=None,
                   help="trials at a time: local worker processes, or the CPUs of a local Ray instance "
                        "(default: the number of CPUs)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the trials as Ray Tune trials (on ADDRESS, or a local Ray instance)")
    p.add_argument("--out", default=None, help="sweep output directory (default runs/sweeps/<name>)")
    p.add_argument("--restart", action="store_true",
                   help="run every trial from scratch (default: keep finished trials, resume interrupted ones)")
    p.set_defaults(func=_sweep)
    p = sub.add_parser("trajopt", help="the trajectory-optimization benchmark (Billiards, Push) per "
                       "gradient mode against CMA-ES")
    from .trajopt import add_arguments as trajopt_arguments
    trajopt_arguments(p)
    p.set_defaults(func=_trajopt)
    args = parser.parse_args(argv)
    if args.command == "sweep" and args.sweep is None:
        if args.ray and args.ray.endswith((".yaml", ".yml")):     # `sweep --ray SWEEP.yaml`
            args.sweep, args.ray = args.ray, ""
        else:
            parser.error("sweep: give a SWEEP.yaml")
    if args.command == "train" and args.config and "=" in args.config:
        args.overrides.insert(0, args.config)
        args.config = None
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
