"""Sweeps: a base config, a grid or random search over dotted keys, and seeds.

    # configs/sweeps/example.yaml
    name: cartpole_lr
    trials:                       # one entry per compared setting (a list of configs), or:
      - {base: cartpole_shac.yaml}
      - {base: cartpole_ppo.yaml}
    grid: {shac.actor_lr: [1.0e-2, 3.0e-3]}         # every combination ...
    random: {shac.critic_lr: {low: 1.0e-4, high: 1.0e-2, log: true}}   # ... or sampled
    num_samples: 4                # random draws (with ``random``)
    seeds: [0, 1, 2]
    overrides: [total_env_steps=200000]

By default trials run in a local process pool (``--workers``); ``--ray [ADDRESS]`` runs the same
trials as Ray Tune trials on a Ray cluster (or a local Ray instance when no address is given).
A trial that raises is recorded with its error (``error.txt`` in its directory, ``status`` in
the summary) and the others go on. The sweep writes ``summary.csv`` and ``comparison.png``
(mean and min-max spread over seeds against environment steps and wall-clock).
"""
from __future__ import annotations

import csv
import itertools
import json
import os
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np
import yaml

from .config import ConfigError, load_config

_KEYS = {"name", "base", "trials", "grid", "random", "num_samples", "seeds", "overrides", "out"}


@dataclass
class Trial:
    name: str
    config_path: str
    overrides: list
    group: str          # the setting, seeds pooled
    seed: int
    run_dir: str


def _resolve(path: str, sweep_path: str) -> str:
    for cand in (path, os.path.join(os.path.dirname(sweep_path), path),
                 os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(sweep_path))), path)):
        if os.path.isfile(cand):
            return os.path.abspath(cand)
    from diffgym.resources import configs_dir
    cand = os.path.join(str(configs_dir()), path)
    if os.path.isfile(cand):
        return cand
    raise ConfigError(f"{sweep_path}: base config not found: {path}")


def expand(sweep_path: str, out: str | None = None) -> tuple[str, list[Trial]]:
    """The trials of a sweep file (validated; configs are loaded once to catch errors early)."""
    if not os.path.isfile(sweep_path):
        raise ConfigError(f"sweep file not found: {sweep_path}")
    with open(sweep_path) as f:
        spec = yaml.safe_load(f) or {}
    if not isinstance(spec, dict):
        raise ConfigError(f"{sweep_path}: the top level must be a mapping")
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise ConfigError(f"{sweep_path}: unknown key {unknown[0]}; valid keys: {sorted(_KEYS)}")
    name = str(spec.get("name") or os.path.splitext(os.path.basename(sweep_path))[0])
    out = out or spec.get("out") or os.path.join("runs", "sweeps", name)
    bases = spec.get("trials") or [{"base": spec.get("base")}]
    if not isinstance(bases, list) or not all(isinstance(b, dict) and b.get("base") for b in bases):
        raise ConfigError(f"{sweep_path}: trials must be a list of {{base: CONFIG, overrides: [...]}} "
                          "(or give one top-level base)")
    seeds = spec.get("seeds", [0])
    if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds):
        raise ConfigError(f"{sweep_path}: seeds must be a list of integers, got {seeds!r}")
    common = list(spec.get("overrides") or [])
    settings: list[list[str]] = [[]]
    if spec.get("grid"):
        grid = spec["grid"]
        if not isinstance(grid, dict) or not all(isinstance(v, list) for v in grid.values()):
            raise ConfigError(f"{sweep_path}: grid must map dotted keys to lists of values")
        settings = [[f"{k}={json.dumps(v)}" for k, v in zip(grid, combo)]
                    for combo in itertools.product(*grid.values())]
    elif spec.get("random"):
        rng = np.random.default_rng(0)
        n = int(spec.get("num_samples", 4))
        settings = []
        for _ in range(n):
            s = []
            for k, d in spec["random"].items():
                if isinstance(d, list):
                    v = d[int(rng.integers(len(d)))]
                elif isinstance(d, dict) and {"low", "high"} <= set(d):
                    lo, hi = float(d["low"]), float(d["high"])
                    v = float(np.exp(rng.uniform(np.log(lo), np.log(hi)))) if d.get("log") else float(rng.uniform(lo, hi))
                else:
                    raise ConfigError(f"{sweep_path}: random.{k} must be a list of choices or {{low, high, log}}")
                s.append(f"{k}={json.dumps(v)}")
            settings.append(s)
    trials = []
    for b in bases:
        unknown = sorted(set(b) - {"base", "overrides", "label"})
        if unknown:
            raise ConfigError(f"{sweep_path}: unknown key trials.{unknown[0]}")
        path = _resolve(b["base"], sweep_path)
        for setting in settings:
            ov = common + list(b.get("overrides") or []) + setting
            cfg = load_config(path, ov)            # validates now, not in a worker
            group = b.get("label") or f"{cfg.algo}:{cfg.env.id}" + ("" if not setting else " " + " ".join(setting))
            for seed in seeds:
                tname = f"t{len(trials):03d}_{cfg.algo}_{cfg.env.id.split('-')[0]}_s{seed}"
                trials.append(Trial(tname, path, ov + [f"seed={seed}", "gif=false"], group, seed,
                                    os.path.join(out, tname)))
    return out, trials


def run_trial(trial: Trial) -> dict:
    """Run one trial; never raises (a failure is returned and written to error.txt)."""
    from . import train
    os.makedirs(trial.run_dir, exist_ok=True)
    rec = {"trial": trial.name, "group": trial.group, "seed": trial.seed, "run_dir": trial.run_dir}
    try:
        cfg = load_config(trial.config_path, trial.overrides)
        out = train(cfg, trial.run_dir)
        ev = out.get("eval") or {}
        rec.update(status="ok", env_steps=out.get("env_steps"), eval_return=ev.get("return_mean"),
                   success_rate=ev.get("success_rate"))
    except BaseException as exc:                 # noqa: BLE001 — a trial must not end the sweep
        with open(os.path.join(trial.run_dir, "error.txt"), "w") as f:
            f.write(traceback.format_exc())
        rec.update(status="failed", error=f"{type(exc).__name__}: {exc}")
    return rec


def run_sweep(sweep_path: str, workers: int = 2, ray_address: str | None = None, use_ray: bool = False,
              out: str | None = None) -> list[dict]:
    out, trials = expand(sweep_path, out)
    os.makedirs(out, exist_ok=True)
    records: list[dict] = []
    if use_ray:
        records = _run_ray(trials, ray_address)
    else:
        from tqdm.auto import tqdm
        with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
            futures = [pool.submit(run_trial, t) for t in trials]
            for fut in tqdm(as_completed(futures), total=len(futures), desc="trials"):
                records.append(fut.result())
    records.sort(key=lambda r: r["trial"])
    _summarize(out, records)
    return records


def _run_ray(trials: list[Trial], address: str | None) -> list[dict]:
    import ray
    from ray import tune
    started = False
    if not ray.is_initialized():
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
        started = True
    by_name = {t.name: t for t in trials}

    def trainable(config):
        rec = run_trial(by_name_ref[config["trial"]])
        return {k: v for k, v in rec.items() if v is not None}

    by_name_ref = {k: Trial(**{**v.__dict__, "run_dir": os.path.abspath(v.run_dir)}) for k, v in by_name.items()}
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}),
                       param_space={"trial": tune.grid_search(list(by_name))},
                       tune_config=tune.TuneConfig(max_concurrent_trials=None),
                       run_config=tune.RunConfig(storage_path=os.path.abspath(os.path.join(
                           os.path.dirname(trials[0].run_dir) if trials else ".", "ray")), verbose=0))
    results = tuner.fit()
    records = []
    for res in results:
        if res.error is not None:
            name = res.config["trial"] if res.config else "?"
            records.append({"trial": name, "status": "failed", "error": str(res.error)})
        else:
            records.append(dict(res.metrics))
    records = [{k: v for k, v in r.items() if k in ("trial", "group", "seed", "run_dir", "status", "error",
                                                       "env_steps", "eval_return", "success_rate")}
               for r in records]
    if started:
        ray.shutdown()
    return records


def _summarize(out: str, records: list[dict]) -> None:
    keys = ["trial", "group", "seed", "status", "env_steps", "eval_return", "success_rate", "error", "run_dir"]
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(records)
    plot_comparison(out, records)
    ok = sum(r.get("status") == "ok" for r in records)
    print(f"{ok}/{len(records)} trials finished; summary: {os.path.join(out, 'summary.csv')}")
    for r in records:
        tail = (f"eval return {r.get('eval_return'):.2f}" if r.get("eval_return") is not None
                else r.get("error", ""))
        print(f"  {r['trial']:<40} {r.get('status'):<7} {tail}")


def _curve(run_dir: str):
    path = os.path.join(run_dir, "metrics.csv")
    if not os.path.isfile(path):
        return None
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("episode_return") not in (None, "", "nan")]
    if not rows:
        return None
    return tuple(np.array([float(r[k]) for r in rows]) for k in ("env_steps", "wall_time", "episode_return"))


def plot_comparison(out: str, records: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups: dict[str, list] = {}
    for r in records:
        if r.get("status") == "ok" and r.get("run_dir"):
            c = _curve(r["run_dir"])
            if c is not None:
                groups.setdefault(r.get("group", r["trial"]), []).append(c)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for g, curves in groups.items():
        for ax, xi in ((axes[0], 0), (axes[1], 1)):
            hi = min(c[xi][-1] for c in curves)
            lo = max(c[xi][0] for c in curves)
            if hi <= lo:
                x = curves[0][xi]
                ax.plot(x, curves[0][2], label=g)
                continue
            x = np.linspace(lo, hi, 100)
            ys = np.array([np.interp(x, c[xi], c[2]) for c in curves])
            ax.plot(x, ys.mean(0), label=f"{g} (n={len(curves)})")
            ax.fill_between(x, ys.min(0), ys.max(0), alpha=0.2)
    axes[0].set_xlabel("environment steps")
    axes[1].set_xlabel("wall-clock (s)")
    for ax in axes:
        ax.set_ylabel("episode return")
        ax.grid(alpha=0.3)
    if groups:
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "comparison.png"), dpi=100)
    plt.close(fig)
