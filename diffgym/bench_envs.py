"""Environment throughput: steps per second of each environment, with and without Jacobians,
single and vectorized (``diffgym bench --envs``; ``python -m diffgym.bench_envs --help``).

Every configuration runs in this one process, one after the other, on the same random actions,
so the figures compare side by side. A vectorized step of N copies counts N environment steps.
"""
from __future__ import annotations

import argparse
import csv
import time

import numpy as np

ENVS = ["DiffCartPole-v0", "DiffHopper-v0", "DiffGo1-v0", "DiffPush-v0", "DiffBilliards-v0"]


def measure(env_id: str, num_envs: int, jacobian: bool, steps: int, seed: int = 0) -> float:
    """Environment steps per second over ``steps`` vector steps (after 3 untimed ones)."""
    import diffgym
    venv = diffgym.make_vec(env_id, num_envs=num_envs, seed=seed)
    venv.reset()
    rng = np.random.default_rng(seed)
    step = venv.step_with_jacobian if jacobian else venv.step
    acts = rng.uniform(-1, 1, (steps + 3, num_envs, venv.n_a))
    for k in range(3):
        step(acts[k])
    t0 = time.perf_counter()
    for k in range(steps):
        step(acts[3 + k])
    dt = time.perf_counter() - t0
    venv.close()
    return steps * num_envs / dt


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--envs", nargs="*", default=None, help=f"subset of {ENVS}")
    p.add_argument("--num-envs", nargs="*", type=int, default=[1, 16, 64],
                   help="vector sizes N (default 1 16 64)")
    p.add_argument("--env-steps", type=int, default=2000,
                   help="environment steps timed per configuration (split over the N copies)")
    p.add_argument("--csv", default=None, help="also write the table to this CSV file")
    return p


def main(args) -> int:
    names = args.envs or ENVS
    bad = [n for n in names if n not in ENVS]
    if bad:
        raise SystemExit(f"unknown environment(s) {bad}; choose from {ENVS}")
    if any(n < 1 for n in args.num_envs) or args.env_steps < 1:
        raise SystemExit("--num-envs and --env-steps must be positive")
    rows = []
    header = ["env", "N", "steps/s", "steps/s +jac", "jac cost"]
    print(f"{header[0]:<18}{header[1]:>4}{header[2]:>12}{header[3]:>15}{header[4]:>10}", flush=True)
    for name in names:
        for n in args.num_envs:
            vsteps = max(2, args.env_steps // n)
            fwd = measure(name, n, False, vsteps)
            jac = measure(name, n, True, vsteps)
            rows.append([name, n, fwd, jac, fwd / jac])
            print(f"{name:<18}{n:>4}{fwd:>12.0f}{jac:>15.0f}{fwd / jac:>9.2f}x", flush=True)
    print("\nsteps/s counts environment steps (a vector step of N copies is N steps); jac cost = "
          "time with Jacobians / time without. Copies are stepped in one process, so N changes "
          "throughput only through per-call overhead.")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(add_arguments(argparse.ArgumentParser(prog="python -m diffgym.bench_envs")).parse_args()))
