"""Sweeps: base configs, a grid or random search over dotted keys, and seeds.

    # configs/sweeps/example.yaml
    name: cartpole_lr                 # output: runs/sweeps/<name>/ (or ``out:``, or --out)
    trials:                           # the compared settings (each a base config), or one ``base:``
      - {base: cartpole_shac.yaml}
      - {base: cartpole_ppo.yaml, overrides: [ppo.n_epochs=10], label: "PPO, 10 epochs"}
    grid: {shac.actor_lr: [1.0e-2, 3.0e-3]}                         # every combination ...
    random: {shac.critic_lr: {low: 1.0e-4, high: 1.0e-2, log: true},  # ... or sampled
             shac.horizon: [16, 32]}
    num_samples: 4                    # random draws (with ``random``); search_seed: 0 picks them
    seeds: [0, 1, 2]                  # or a count: 3
    overrides: [total_env_steps=200000]   # applied to every trial (before the trial's own)
    target_return: {DiffCartPole-v0: -400}  # optional: report steps / wall-clock to reach it
                                            # (a number for all trials, or per env id / group label)

Every (setting, seed) pair is a trial with its own run directory ``<out>/<trial>/`` (config,
metrics, checkpoints, eval.json, ``log.txt`` with its output). By default trials run in local
worker processes (``workers``, default: the number of CPUs); ``--ray [ADDRESS]`` runs the same
trials as Ray Tune trials, one CPU each, on the Ray cluster at ADDRESS (``auto``, ``ray://...``)
or on a local Ray instance when no address is given. A trial that raises (or whose process dies)
is recorded with its error (``error.txt`` with the traceback in its directory, ``status: failed``
in the summary) and the others go on.

Running the same sweep again continues it: finished trials (``result.json`` with the same
resolved config) are kept, interrupted ones resume from their last checkpoint; ``restart=True``
(``--restart``) runs everything from scratch.

Outputs: ``summary.csv`` (a row per trial: status, final training return, evaluation return,
success rate, environment steps, wall-clock, steps and time to ``target_return``, error),
``groups.csv`` (the same aggregated over seeds: mean, std, min, max) and ``comparison.png``
(per environment: mean training return with the min-max spread over seeds, against environment
steps and against wall-clock). Trials report their curves back with their results, so the
summary and the plot need no shared file system on a cluster.
"""
from __future__ import annotations

import contextlib
import csv
import itertools
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field

import numpy as np

from .config import ConfigError, config_to_dict, load_config, read_yaml_mapping

_KEYS = {"name", "base", "trials", "grid", "random", "num_samples", "search_seed", "seeds", "overrides", "out",
         "target_return"}
_SUMMARY_KEYS = ["trial", "group", "algo", "env", "seed", "status", "env_steps", "wall_time", "train_return",
                 "eval_return", "eval_std", "success_rate", "steps_to_target", "time_to_target", "target_return",
                 "resumed", "error", "run_dir"]


@dataclass
class Trial:
    name: str
    config_path: str
    overrides: list
    group: str          # the compared setting; its seeds are pooled
    seed: int
    run_dir: str
    algo: str = ""
    env_id: str = ""
    target_return: float | None = None
    config: dict = field(default_factory=dict)      # the resolved config (to recognise a finished trial)


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


def _settings(spec: dict, where: str) -> list[list[str]]:
    """The override lists of the searched settings ([[]] without a search)."""
    if spec.get("grid") and spec.get("random"):
        raise ConfigError(f"{where}give grid or random, not both")
    if spec.get("grid"):
        grid = spec["grid"]
        if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
            raise ConfigError(f"{where}grid must map dotted keys to non-empty lists of values, got {grid!r}")
        return [[f"{k}={json.dumps(v)}" for k, v in zip(grid, combo)] for combo in itertools.product(*grid.values())]
    if spec.get("random"):
        rnd = spec["random"]
        if not isinstance(rnd, dict):
            raise ConfigError(f"{where}random must map dotted keys to choices or {{low, high, log}}")
        n = spec.get("num_samples", 4)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"{where}num_samples must be a positive integer, got {n!r}")
        rng = np.random.default_rng(spec.get("search_seed", 0))
        out = []
        for _ in range(n):
            s = []
            for k, d in rnd.items():
                if isinstance(d, list) and d:
                    v = d[int(rng.integers(len(d)))]
                elif isinstance(d, dict) and {"low", "high"} <= set(d) and set(d) <= {"low", "high", "log", "int"}:
                    lo, hi = float(d["low"]), float(d["high"])
                    if not lo < hi or (d.get("log") and lo <= 0):
                        raise ConfigError(f"{where}random.{k}: need low < high (and low > 0 with log), got {d!r}")
                    v = float(np.exp(rng.uniform(np.log(lo), np.log(hi)))) if d.get("log") else float(rng.uniform(lo, hi))
                    if d.get("int"):
                        v = int(round(v))
                else:
                    raise ConfigError(f"{where}random.{k} must be a list of choices or {{low, high[, log, int]}}, "
                                      f"got {d!r}")
                s.append(f"{k}={json.dumps(v)}")
            out.append(s)
        return out
    return [[]]


def _target(spec_target, cfg, label) -> float | None:
    if spec_target is None:
        return None
    if isinstance(spec_target, (int, float)) and not isinstance(spec_target, bool):
        return float(spec_target)
    if isinstance(spec_target, dict):
        for key in (label, cfg.env.id):
            if key in spec_target:
                return float(spec_target[key])
        return None
    raise ConfigError(f"target_return must be a number or a mapping of env ids / labels to numbers, "
                      f"got {spec_target!r}")


def find_sweep(sweep_path) -> str:
    """The sweep file: a path, or a name in diffgym's configs/sweeps/."""
    sweep_path = os.fspath(sweep_path)
    if os.path.isfile(sweep_path):
        return sweep_path
    from diffgym.resources import configs_dir
    alt = os.path.join(str(configs_dir()), "sweeps", sweep_path)
    if os.path.isfile(alt):
        return alt
    raise ConfigError(f"sweep file not found: {sweep_path}")


def expand(sweep_path: str, out: str | None = None) -> tuple[str, list[Trial]]:
    """The trials of a sweep file; every trial's config is validated here, before anything runs."""
    sweep_path = find_sweep(sweep_path)
    where = f"{sweep_path}: "
    spec = read_yaml_mapping(sweep_path)
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}unknown key {unknown[0]}; valid keys: {sorted(_KEYS)}")
    name = str(spec.get("name") or os.path.splitext(os.path.basename(sweep_path))[0])
    out = os.path.abspath(out or spec.get("out") or os.path.join("runs", "sweeps", name))
    if spec.get("trials") and spec.get("base"):
        raise ConfigError(f"{where}give base or trials, not both")
    bases = spec.get("trials") or ([{"base": spec["base"]}] if spec.get("base") else None)
    if not isinstance(bases, list) or not all(isinstance(b, dict) and b.get("base") for b in bases):
        raise ConfigError(f"{where}trials must be a list of {{base: CONFIG[, overrides: [...], label: ...]}} "
                          "(or give one top-level base)")
    seeds = spec.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1:
        seeds = list(range(seeds))
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in seeds):
        raise ConfigError(f"{where}seeds must be a list of integers or a count, got {seeds!r}")
    common = spec.get("overrides") or []
    if not isinstance(common, list):
        raise ConfigError(f"{where}overrides must be a list of key=value strings, got {common!r}")
    settings = _settings(spec, where)
    trials: list[Trial] = []
    for i, b in enumerate(bases):
        unknown = sorted(set(b) - {"base", "overrides", "label"})
        if unknown:
            raise ConfigError(f"{where}unknown key trials[{i}].{unknown[0]}; valid: base, overrides, label")
        path = _resolve(b["base"], sweep_path)
        for setting in settings:
            ov = [str(x) for x in common] + [str(x) for x in (b.get("overrides") or [])] + setting
            try:
                cfg = load_config(path, ov)                # validates now, not in a worker
            except ConfigError as exc:
                raise ConfigError(f"{where}trials[{i}] ({b['base']}): {exc}") from None
            label = b.get("label") or f"{cfg.algo}:{cfg.env.id}"
            group = label + ("" if not setting else " " + " ".join(setting))
            for seed in seeds:
                tname = f"t{len(trials):03d}_{cfg.algo}_{cfg.env.id.split('-')[0]}_s{seed}"
                tov = ["gif=false"] + ov + [f"seed={seed}"]     # no GIF unless the sweep asks
                trials.append(Trial(tname, path, tov, group, seed, os.path.join(out, tname), cfg.algo, cfg.env.id,
                                    _target(spec.get("target_return"), cfg, b.get("label")),
                                    config_to_dict(load_config(path, tov))))
    names = [t.group for t in trials]
    if len(set(zip(names, [t.seed for t in trials]))) != len(trials):
        raise ConfigError(f"{where}two trials have the same setting and seed (give the trials labels)")
    return out, trials


# -- one trial ------------------------------------------------------------------------------------
def _read_curve(run_dir: str) -> dict | None:
    path = os.path.join(run_dir, "metrics.csv")
    if not os.path.isfile(path):
        return None
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("episode_return") not in (None, "", "nan")]
    return {k: [float(r[k]) for r in rows] for k in ("env_steps", "wall_time", "episode_return")}


def _same_config(run_dir: str, config: dict) -> bool:
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        return False
    try:
        saved = read_yaml_mapping(path)
    except ConfigError:
        return False
    strip = lambda d: {k: v for k, v in d.items() if k != "run_dir"}      # noqa: E731
    return json.loads(json.dumps(strip(saved))) == json.loads(json.dumps(strip(config)))


def run_trial(trial: Trial, restart: bool = False, quiet: bool = True) -> dict:
    """Run (or continue) one trial and return its record; never raises.

    The record is also written to ``<run_dir>/result.json``; a failure writes ``error.txt``."""
    rec = {"trial": trial.name, "group": trial.group, "algo": trial.algo, "env": trial.env_id,
           "seed": trial.seed, "run_dir": trial.run_dir, "target_return": trial.target_return}
    result_path = os.path.join(trial.run_dir, "result.json")
    if restart:
        shutil.rmtree(trial.run_dir, ignore_errors=True)
    elif os.path.isfile(result_path) and _same_config(trial.run_dir, trial.config):
        with open(result_path) as f:
            done = json.load(f)
        if done.get("status") == "ok":
            return done
    os.makedirs(trial.run_dir, exist_ok=True)
    if os.path.exists(os.path.join(trial.run_dir, "error.txt")):
        os.remove(os.path.join(trial.run_dir, "error.txt"))
    resume = (any(os.path.isfile(os.path.join(trial.run_dir, f"checkpoint_{k}.pt")) for k in ("last", "prev"))
              and _same_config(trial.run_dir, trial.config))
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if quiet:
            log = stack.enter_context(open(os.path.join(trial.run_dir, "log.txt"), "a"))
            stack.enter_context(contextlib.redirect_stdout(log))
            stack.enter_context(contextlib.redirect_stderr(log))
        try:
            from . import train
            cfg = load_config(trial.config_path, trial.overrides)
            out = train(cfg, trial.run_dir, resume=resume)
            ev = out.get("eval") or {}
            rec.update(status="ok", env_steps=out.get("env_steps"), eval_return=ev.get("return_mean"),
                       eval_std=ev.get("return_std"), success_rate=ev.get("success_rate"), resumed=resume)
        except BaseException as exc:                 # noqa: BLE001 — a trial must not end the sweep
            with open(os.path.join(trial.run_dir, "error.txt"), "w") as f:
                f.write(traceback.format_exc())
            rec.update(status="failed", error=f"{type(exc).__name__}: {exc}".strip(), resumed=resume)
            if isinstance(exc, KeyboardInterrupt):
                rec["status"] = "interrupted"
    rec["trial_seconds"] = round(time.perf_counter() - t0, 2)
    curve = _read_curve(trial.run_dir)
    if curve is not None:
        rec["curve"] = curve
        if curve["episode_return"]:
            rec["train_return"] = curve["episode_return"][-1]
            rec["wall_time"] = curve["wall_time"][-1]
        if trial.target_return is not None:
            hit = [i for i, r in enumerate(curve["episode_return"]) if r >= trial.target_return]
            rec["steps_to_target"] = curve["env_steps"][hit[0]] if hit else None
            rec["time_to_target"] = curve["wall_time"][hit[0]] if hit else None
    with open(result_path + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(result_path + ".tmp", result_path)
    return rec


def _trial_process(trial: Trial, restart: bool) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # trials already run one per core: a config leaving env.num_workers null keeps its copies
    # in the trial's process (an explicit env.num_workers still applies)
    os.environ.setdefault("DIFFGYM_NUM_WORKERS", "1")
    run_trial(trial, restart=restart)


# -- the sweep ------------------------------------------------------------------------------------
def run_sweep(sweep_path: str, workers: int | None = None, ray_address: str | None = None, use_ray: bool = False,
              out: str | None = None, restart: bool = False) -> list[dict]:
    """Run every trial of a sweep file and write the summary; returns the trial records."""
    out, trials = expand(sweep_path, out)
    os.makedirs(out, exist_ok=True)
    with contextlib.suppress(shutil.SameFileError):
        shutil.copyfile(find_sweep(sweep_path), os.path.join(out, "sweep.yaml"))
    workers = int(workers) if workers else (os.cpu_count() or 1)
    print(f"sweep {os.path.basename(out)}: {len(trials)} trials -> {out}"
          + (f" (Ray{' at ' + ray_address if ray_address else ', local'})" if use_ray else f" ({workers} workers)"))
    interrupted = False
    if use_ray:
        records = _run_ray(trials, ray_address, workers, restart)
    else:
        records, interrupted = _run_local(trials, workers, restart)
    records.sort(key=lambda r: r["trial"])
    summarize(out, records)
    if interrupted:
        print("interrupted: run the same command again to continue (finished trials are kept, "
              "interrupted ones resume from their last checkpoint)", file=sys.stderr)
        raise KeyboardInterrupt
    return records


def _run_local(trials: list[Trial], workers: int, restart: bool) -> tuple[list[dict], bool]:
    """Each trial in its own process (a crash or a leak stays there), ``workers`` at a time."""
    from multiprocessing.connection import wait
    from tqdm.auto import tqdm
    # fork is fast but unsafe once torch's thread pools exist in this process (as under pytest)
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") and "torch" not in sys.modules else "spawn")
    pending, running, records = list(trials), {}, []
    bar = tqdm(total=len(trials), desc="trials", unit="trial")
    try:
        while pending or running:
            while pending and len(running) < workers:
                t = pending.pop(0)
                p = ctx.Process(target=_trial_process, args=(t, restart), name=t.name, daemon=False)
                p.start()
                running[p.sentinel] = (p, t)
            for s in wait(list(running)):
                p, t = running.pop(s)
                p.join()
                records.append(_collect(t, p.exitcode))
                bar.update(1)
                bar.set_postfix(failed=sum(r["status"] != "ok" for r in records), refresh=False)
    except KeyboardInterrupt:
        for p, t in running.values():
            p.terminate()
        for p, t in running.values():
            p.join()
            records.append(dict(_base_record(t), status="interrupted", error="KeyboardInterrupt"))
        for t in pending:
            records.append(dict(_base_record(t), status="not run"))
        return records, True
    finally:
        bar.close()
    return records, False


def _base_record(t: Trial) -> dict:
    return {"trial": t.name, "group": t.group, "algo": t.algo, "env": t.env_id, "seed": t.seed,
            "run_dir": t.run_dir, "target_return": t.target_return}


def _collect(t: Trial, exitcode: int | None) -> dict:
    path = os.path.join(t.run_dir, "result.json")
    if exitcode == 0 and os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    msg = f"the trial's process died (exit code {exitcode})"
    with contextlib.suppress(OSError):           # (a run directory that cannot be written)
        os.makedirs(t.run_dir, exist_ok=True)
        with open(os.path.join(t.run_dir, "error.txt"), "a") as f:
            f.write(msg + "\n")
    return dict(_base_record(t), status="failed", error=msg)


def _ray_trainable(config: dict) -> dict:
    os.environ.setdefault("DIFFGYM_NUM_WORKERS", "1")     # a trial of one CPU (see _trial_process)
    rec = run_trial(Trial(**config["trial"]), restart=config["restart"])
    rec = {k: v for k, v in rec.items() if v is not None}
    if "curve" in rec:
        rec["curve"] = json.dumps(rec["curve"])       # one value, not flattened by Tune
    return rec


def _ray_run_config(**kw):
    from ray import tune
    if hasattr(tune, "RunConfig"):          # Ray >= 2.40
        return tune.RunConfig(**kw)
    from ray import train
    return train.RunConfig(**kw)


def _run_ray(trials: list[Trial], address: str | None, workers: int, restart: bool) -> list[dict]:
    """The same trials as Ray Tune trials (one CPU each) on the cluster at ``address``."""
    import ray
    from ray import tune
    started = False
    if not ray.is_initialized():
        kw = {} if address else {"num_cpus": workers}
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False, **kw)
        started = True
    try:
        by_name = {t.name: t for t in trials}
        out = os.path.dirname(trials[0].run_dir) if trials else "."
        tuner = tune.Tuner(
            tune.with_resources(_ray_trainable, {"cpu": 1}),
            param_space={"trial": tune.grid_search([asdict(t) for t in trials]), "restart": restart},
            run_config=_ray_run_config(name="ray", storage_path=os.path.abspath(out), verbose=1))
        results = tuner.fit()
        records = []
        for res in results:
            name = (res.config or {}).get("trial", {}).get("name", "?")
            t = by_name.get(name)
            if res.error is not None or not res.metrics or "status" not in res.metrics:
                base = _base_record(t) if t else {"trial": name}
                records.append(dict(base, status="failed", error=f"Ray: {res.error}"))
                continue
            rec = {k: v for k, v in res.metrics.items() if k in _SUMMARY_KEYS + ["curve", "trial_seconds"]}
            if isinstance(rec.get("curve"), str):
                rec["curve"] = json.loads(rec["curve"])
            records.append(rec)
        return records
    finally:
        if started:
            ray.shutdown()


# -- summary --------------------------------------------------------------------------------------
def _stats(values):
    v = np.array([x for x in values if x is not None and not (isinstance(x, float) and np.isnan(x))], dtype=float)
    if not len(v):
        return {"mean": None, "std": None, "min": None, "max": None}
    return {"mean": float(v.mean()), "std": float(v.std()), "min": float(v.min()), "max": float(v.max())}


def summarize(out: str, records: list[dict]) -> list[dict]:
    """Write summary.csv, groups.csv and comparison.png; print the group table; return the groups."""
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=_SUMMARY_KEYS, extrasaction="ignore")
        w.writeheader()
        w.writerows(records)
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r.get("group", r["trial"]), []).append(r)
    rows = []
    for g, recs in groups.items():
        ok = [r for r in recs if r.get("status") == "ok"]
        row = {"group": g, "algo": recs[0].get("algo"), "env": recs[0].get("env"), "trials": len(recs),
               "ok": len(ok), "target_return": recs[0].get("target_return")}
        for key in ("eval_return", "train_return", "success_rate", "env_steps", "wall_time"):
            for s, v in _stats([r.get(key) for r in ok]).items():
                row[f"{key}_{s}"] = v
        if row["target_return"] is not None:
            hits = [r for r in ok if r.get("steps_to_target") is not None]
            row["reached_target"] = f"{len(hits)}/{len(ok)}"
            for key in ("steps_to_target", "time_to_target"):
                for s, v in _stats([r.get(key) for r in hits]).items():
                    row[f"{key}_{s}"] = v
        rows.append(row)
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(os.path.join(out, "groups.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    plot_comparison(os.path.join(out, "comparison.png"), records)
    ok = sum(r.get("status") == "ok" for r in records)
    print(f"{ok}/{len(records)} trials finished; {os.path.join(out, 'summary.csv')}, groups.csv, comparison.png")
    fmt = lambda v, p=".1f": "-" if v is None else format(v, p)          # noqa: E731
    for r in rows:
        line = (f"  {r['group']:<44} ok {r['ok']}/{r['trials']}  eval {fmt(r['eval_return_mean'])} "
                f"+- {fmt(r['eval_return_std'])}  train {fmt(r['train_return_mean'])}  "
                f"steps {fmt(r['env_steps_mean'], '.3g')}  time {fmt(r['wall_time_mean'], '.0f')} s")
        if r.get("target_return") is not None:
            line += (f"  to {r['target_return']:g}: {r['reached_target']} in "
                     f"{fmt(r.get('steps_to_target_mean'), '.3g')} steps / {fmt(r.get('time_to_target_mean'), '.0f')} s")
        print(line)
    for r in records:
        if r.get("status") != "ok":
            print(f"  {r['trial']}: {r.get('status')}: {r.get('error', '')}")
    return rows


def plot_comparison(png_path: str, records: list[dict], points: int = 200) -> None:
    """Per environment (a row): mean training return over seeds and its min-max spread, against
    environment steps (left) and wall-clock (right), on the range every seed covers."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curves: dict[str, dict[str, list]] = {}
    for r in records:
        c = r.get("curve")
        if r.get("status") == "ok" and c is None and r.get("run_dir"):
            c = _read_curve(r["run_dir"])
        if r.get("status") == "ok" and c and len(c["episode_return"]):
            curves.setdefault(r.get("env") or "", {}).setdefault(r.get("group", r["trial"]), []).append(
                tuple(np.asarray(c[k], dtype=float) for k in ("env_steps", "wall_time", "episode_return")))
    envs = sorted(curves) or [""]
    fig, axes = plt.subplots(len(envs), 2, figsize=(11, 3.8 * len(envs)), squeeze=False)
    for row, env in zip(axes, envs):
        for k, (g, cs) in enumerate(sorted(curves.get(env, {}).items())):
            color = f"C{k % 10}"
            for ax, xi in zip(row, (0, 1)):
                lo, hi = max(c[xi][0] for c in cs), min(c[xi][-1] for c in cs)
                if len(cs) == 1 or hi <= lo:
                    for j, c in enumerate(cs):
                        ax.plot(c[xi], c[2], color=color, lw=1.2, label=f"{g} (n={len(cs)})" if j == 0 else None)
                    continue
                x = np.linspace(lo, hi, points)
                ys = np.array([np.interp(x, c[xi], c[2]) for c in cs])
                ax.plot(x, ys.mean(0), color=color, lw=1.5, label=f"{g} (n={len(cs)}, mean, min-max)")
                ax.fill_between(x, ys.min(0), ys.max(0), color=color, alpha=0.2, lw=0)
        row[0].set_xlabel("environment steps")
        row[1].set_xlabel("wall-clock (s)")
        for ax in row:
            ax.set_ylabel("training episode return")
            ax.set_title(env, fontsize=10)
            ax.grid(alpha=0.3)
        if curves.get(env):
            row[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
