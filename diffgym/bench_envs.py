"""Environment throughput: steps per second of each environment, with and without Jacobians,
for N copies in one process and spread over every core, next to Gymnasium's MuJoCo
environments (``python -m diffgym.bench_envs --help``).

For each environment and N, every configuration is built first (``diffgym.make_vec`` with one
worker process and with all of them, Gymnasium's ``Hopper-v5`` for DiffHopper-v0 and
``Ant-v5`` for DiffGo1-v0 in a ``SyncVectorEnv`` when ``gymnasium[mujoco]`` is installed), then
the configurations take turns block by block (``--blocks`` rounds, each configuration running
the same number of environment steps per round on uniform random actions in [-1, 1], episodes
resetting themselves), so a load change on a shared machine hits all of them alike. A vector
step of N copies counts N environment steps. Reported: total steps / total time of each
configuration, and ratios taken as the median over the rounds of the per-round ratio; also the
CPU time per environment step summed over this process and the vector env's worker processes
(from /proc): on a machine whose cores are busy with other work the wall-clock speed-up of
workers cannot show, but equal CPU per step with k processes and with one says the split adds
no work.

The MuJoCo tasks are the nearest Gymnasium has, not the same problem: Hopper-v5 is the same
hopper with MuJoCo's soft contact (our DiffHopper-v0 steps the unrelaxed NCP to 1e-9 m/s and
uses SHAC's reward); Ant-v5 is a quadruped with 8 motors against our Go1 with 12.

Third-party vectorization (``--third-party``, on by default for N <= ``--third-party-max-n``):
the same diffgym environment through Gymnasium's ``AsyncVectorEnv`` and stable-baselines3's
``SubprocVecEnv`` over ``gym.make`` (one process per copy, observations pickled through a
pipe, no Jacobians), in the same alternating rounds, so their steps/s and their speed-up over
one process can be read next to ``diffgym.make_vec``'s.
"""
from __future__ import annotations

import argparse
import csv
import os
import time

import numpy as np

ENVS = ["DiffCartPole-v0", "DiffHopper-v0", "DiffGo1-v0", "DiffPush-v0", "DiffBilliards-v0"]
MUJOCO_PAIRS = {"DiffHopper-v0": "Hopper-v5", "DiffGo1-v0": "Ant-v5"}


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, from /proc (NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return float("nan")


def _worker_pids(venv) -> list[int]:
    """Process ids of the processes stepping ``venv`` besides this one (make_vec's workers,
    AsyncVectorEnv's and SubprocVecEnv's processes)."""
    pool = getattr(venv, "_pool", None)
    procs = pool.procs if pool is not None else getattr(venv, "processes", [])
    return [p.pid for p in procs]


class _Config:
    """One configuration: a vector env and how to step it. Wall time and CPU time (this
    process plus the vector env's worker processes) are summed over the rounds."""

    def __init__(self, label, venv, step, n_a, workers, num_envs):
        self.label, self.venv, self.step, self.n_a = label, venv, step, n_a
        self.workers, self.num_envs = workers, num_envs
        self.steps, self.time, self.cpu, self.block_rates = 0, 0.0, 0.0, []
        self.pids = _worker_pids(venv)

    def _cpu_now(self) -> float:
        return time.process_time() + sum(_proc_cpu(p) for p in self.pids)

    def run(self, acts) -> None:
        step = self.step
        c0 = self._cpu_now()
        t0 = time.perf_counter()
        for a in acts:
            step(a)
        dt = time.perf_counter() - t0
        self.cpu += self._cpu_now() - c0
        self.steps += len(acts) * self.num_envs
        self.time += dt
        self.block_rates.append(len(acts) * self.num_envs / dt)

    @property
    def rate(self) -> float:
        return self.steps / self.time if self.time > 0 else float("nan")

    @property
    def cpu_us(self) -> float:
        """CPU microseconds per environment step, over all the processes stepping it."""
        return self.cpu / self.steps * 1e6 if self.steps else float("nan")


def _mujoco_venv(name: str, n: int):
    """Gymnasium's MuJoCo task ``name`` as a SyncVectorEnv of n copies, or None if unavailable."""
    try:
        import gymnasium as gym
        venv = gym.make_vec(name, n, vectorization_mode="sync")
    except Exception:                   # gymnasium[mujoco] missing, or too old for the id
        return None
    return venv


def _third_party_venv(kind: str, env_id: str, n: int):
    """``n`` copies of ``env_id`` (via ``gym.make``) in Gymnasium's AsyncVectorEnv ("async") or
    SB3's SubprocVecEnv ("subproc"), both with one process per copy; None if unavailable."""
    import functools

    import gymnasium as gym
    make = functools.partial(gym.make, f"diffgym:{env_id}")
    if kind == "async":
        return gym.vector.AsyncVectorEnv([make] * n)
    try:
        from stable_baselines3.common.vec_env import SubprocVecEnv
    except ImportError:
        return None
    return SubprocVecEnv([make] * n)


def measure(env_id: str, num_envs: int, jacobian: bool, steps: int, seed: int = 0,
            num_workers: int | None = 1) -> float:
    """Environment steps per second of one configuration over ``steps`` vector steps (after 3
    untimed ones); a stand-alone helper (the table below alternates configurations instead)."""
    import diffgym
    venv = diffgym.make_vec(env_id, num_envs=num_envs, seed=seed, num_workers=num_workers)
    try:
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
    finally:
        venv.close()
    return steps * num_envs / dt


THIRD_PARTY = {"async": "gym Async", "subproc": "SB3 Subproc"}


def run_env(env_id: str, n: int, worker_counts: list[int], vsteps: int, blocks: int,
            mujoco: bool, seed: int = 0, third_party: bool = False) -> list[_Config]:
    import diffgym
    configs: list[_Config] = []
    try:
        for w in worker_counts:
            venv = diffgym.make_vec(env_id, num_envs=n, seed=seed, num_workers=w)
            venv.reset()
            configs.append(_Config("fwd", venv, venv.step, venv.n_a, w, n))
            configs.append(_Config("jac", venv, venv.step_with_jacobian, venv.n_a, w, n))
        if mujoco and env_id in MUJOCO_PAIRS:
            mj = _mujoco_venv(MUJOCO_PAIRS[env_id], n)
            if mj is not None:
                mj.reset(seed=seed)
                configs.append(_Config(MUJOCO_PAIRS[env_id], mj, mj.step,
                                       mj.single_action_space.shape[0], 1, n))
        if third_party:
            for kind, label in THIRD_PARTY.items():
                tp = _third_party_venv(kind, env_id, n)
                if tp is None:
                    continue
                if kind == "async":
                    tp.reset(seed=seed)
                else:
                    tp.seed(seed)
                    tp.reset()
                configs.append(_Config(label, tp, tp.step, configs[0].n_a, n, n))
        rng = np.random.default_rng(seed)
        for c in configs:                                # warm-up (not timed)
            for a in rng.uniform(-1, 1, (3, n, c.n_a)):
                c.step(a)
        for _ in range(blocks):
            for c in configs:
                c.run(rng.uniform(-1, 1, (vsteps, n, c.n_a)))
    finally:
        for c in configs:
            c.venv.close()
    return configs


def _median_ratio(a: _Config, b: _Config) -> float:
    return float(np.median(np.array(a.block_rates) / np.array(b.block_rates)))


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--envs", nargs="*", default=None, help=f"subset of {ENVS}")
    p.add_argument("--num-envs", nargs="*", type=int, default=[1, 16, 64],
                   help="vector sizes N (default 1 16 64)")
    p.add_argument("--workers", nargs="*", type=int, default=None,
                   help="worker-process counts to time (default: 1 and all available cores)")
    p.add_argument("--env-steps", type=int, default=1000,
                   help="environment steps per configuration and round (split over the N copies)")
    p.add_argument("--blocks", type=int, default=3, help="rounds of alternating configurations")
    p.add_argument("--no-mujoco", action="store_true", help="skip Gymnasium's MuJoCo tasks")
    p.add_argument("--third-party", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the same environment in Gymnasium's AsyncVectorEnv and SB3's "
                        "SubprocVecEnv over gym.make (one process per copy; default: on)")
    p.add_argument("--third-party-max-n", type=int, default=16,
                   help="largest N timed with --third-party (one process per copy; default 16)")
    p.add_argument("--csv", default=None, help="also write the table to this CSV file")
    return p


def main(args) -> int:
    from diffgym.vector import available_cores
    names = args.envs or ENVS
    bad = [n for n in names if n not in ENVS]
    if bad:
        raise SystemExit(f"unknown environment(s) {bad}; choose from {ENVS}")
    if any(n < 1 for n in args.num_envs) or args.env_steps < 1 or args.blocks < 1:
        raise SystemExit("--num-envs, --env-steps and --blocks must be positive")
    cores = available_cores()
    worker_counts = sorted(set(args.workers or [1, cores]))
    if any(w < 1 for w in worker_counts):
        raise SystemExit("--workers must be positive")
    header = ["env", "N", "workers", "steps/s", "steps/s +jac", "jac cost", "vs 1 worker",
              "cpu us/step", "mujoco", "mujoco steps/s", "ours / mujoco", "ours+jac / mujoco"]
    print(f"{'env':<18}{'N':>4}{'wk':>4}{'steps/s':>10}{'+jac':>10}{'jac cost':>9}"
          f"{'vs 1 wk':>9}{'CPU us':>8}   {'MuJoCo (1 core)':<16}{'steps/s':>9}{'ours/MJ':>9}"
          f"{'+jac/MJ':>9}", flush=True)
    rows = []
    for name in names:
        for n in args.num_envs:
            ws = sorted({min(w, n) for w in worker_counts})
            vsteps = max(2, args.env_steps // n)
            tp = bool(getattr(args, "third_party", False)) and n <= getattr(args, "third_party_max_n", 16)
            configs = run_env(name, n, ws, vsteps, args.blocks, not args.no_mujoco, third_party=tp)
            mj = next((c for c in configs if c.label in MUJOCO_PAIRS.values()), None)
            base = {c.label: c for c in configs if c.workers == ws[0] and c.label in ("fwd", "jac")}
            for w in ws:
                fwd = next(c for c in configs if c.label == "fwd" and c.workers == w)
                jac = next(c for c in configs if c.label == "jac" and c.workers == w)
                speed = _median_ratio(fwd, base["fwd"]) if w != ws[0] else 1.0
                r_mj = _median_ratio(fwd, mj) if mj else float("nan")
                rj_mj = _median_ratio(jac, mj) if mj else float("nan")
                mj_name = mj.label if mj else "-"
                mj_rate = mj.rate if mj else float("nan")
                rows.append([name, n, w, fwd.rate, jac.rate, fwd.rate / jac.rate, speed, fwd.cpu_us,
                             mj_name, mj_rate, r_mj, rj_mj])
                mjcols = (f"   {mj_name:<16}{mj_rate:>9.0f}{r_mj:>9.2f}{rj_mj:>9.2f}" if mj else "")
                print(f"{name:<18}{n:>4}{w:>4}{fwd.rate:>10.0f}{jac.rate:>10.0f}"
                      f"{fwd.rate / jac.rate:>8.2f}x{speed:>8.2f}x{fwd.cpu_us:>8.0f}{mjcols}", flush=True)
            for c in configs:
                if c.label not in THIRD_PARTY.values():
                    continue
                # the speed-up is over make_vec with one process: the same copies, one core
                speed = _median_ratio(c, base["fwd"])
                r_mj = _median_ratio(c, mj) if mj else float("nan")
                rows.append([f"{name} ({c.label})", n, c.workers, c.rate, float("nan"), float("nan"),
                             speed, c.cpu_us, mj.label if mj else "-", mj.rate if mj else float("nan"),
                             r_mj, float("nan")])
                mjcols = (f"   {mj.label:<16}{mj.rate:>9.0f}{r_mj:>9.2f}{'-':>9}" if mj else "")
                print(f"  {c.label:<16}{n:>4}{c.workers:>4}{c.rate:>10.0f}{'-':>10}{'-':>9}"
                      f"{speed:>8.2f}x{c.cpu_us:>8.0f}{mjcols}", flush=True)
    print(f"\nsteps/s counts environment steps (a vector step of N copies is N steps); wk = worker "
          f"processes (1: all copies in this process); jac cost = time with Jacobians / time "
          f"without; vs 1 wk = speed-up over one worker; CPU us = CPU time per environment step "
          f"(without Jacobians) summed over this process and the worker processes: equal CPU us "
          f"with k workers and with 1 means the split costs nothing, so on k idle cores the "
          f"speed-up could approach k (blocks being equal; on busy cores the wall-clock speed-up cannot show it); "
          f"ours/MJ and +jac/MJ = our steps/s "
          f"(without, with Jacobians) / Gymnasium's MuJoCo task on one core (SyncVectorEnv of "
          f"the same N). Indented rows: the same environment in Gymnasium's AsyncVectorEnv / SB3's "
          f"SubprocVecEnv over gym.make (wk = one process per copy; vs 1 wk = over make_vec with "
          f"one process). Ratios: median over {args.blocks} rounds alternating the "
          f"configurations. {cores} cores available, {os.cpu_count()} in the machine, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}.")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(add_arguments(argparse.ArgumentParser(prog="python -m diffgym.bench_envs")).parse_args()))
