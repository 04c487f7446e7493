"""Sweeps: expansion of grids / random searches / seeds, a local process pool that survives a
failing trial and continues an interrupted sweep, the summary and plot, and Ray Tune."""
import csv
import os

import numpy as np
import pytest
import yaml

from diffgym.resources import configs_dir
from diffgym.train.config import ConfigError, load_config
from diffgym.train.sweep import Trial, expand, plot_comparison, run_sweep, run_trial, summarize

TINY = ["env.num_envs=2", "total_env_steps=16", "eval_episodes=1", "env.episode_steps=6", "shac.horizon=4",
        "shac.critic_minibatches=2", "ppo.n_steps=8", "ppo.batch_size=8", "ppo.n_epochs=1"]


def write(tmp_path, spec, name="sweep.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(spec))
    return str(p)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_shipped_sweeps_expand():
    out, trials = expand(os.path.join(configs_dir(), "sweeps", "shac_vs_ppo.yaml"), out="/tmp/unused")
    assert len(trials) == 12 and {t.seed for t in trials} == {0, 1, 2}
    assert {(t.algo, t.env_id) for t in trials} == {(a, e) for a in ("shac", "ppo")
                                                      for e in ("DiffCartPole-v0", "DiffHopper-v0")}
    assert all(t.target_return is not None for t in trials)
    _, smoke = expand("smoke.yaml")                        # a name in configs/sweeps/
    assert len(smoke) == 2


def test_grid_random_and_seeds(tmp_path):
    p = write(tmp_path, {"base": "cartpole_shac.yaml", "seeds": 2, "overrides": ["total_env_steps=100"],
                         "grid": {"shac.actor_lr": [1e-3, 2e-3], "shac.horizon": [8, 16, 32]}})
    out, trials = expand(p, out=str(tmp_path / "o"))
    assert len(trials) == 12 and len({t.group for t in trials}) == 6
    cfgs = [load_config(t.config_path, t.overrides) for t in trials]
    assert {(c.shac.actor_lr, c.shac.horizon) for c in cfgs} == {(a, h) for a in (1e-3, 2e-3) for h in (8, 16, 32)}
    assert all(c.total_env_steps == 100 and not c.gif for c in cfgs) and {c.seed for c in cfgs} == {0, 1}
    assert len({t.run_dir for t in trials}) == 12
    spec = {"base": "cartpole_shac.yaml", "num_samples": 5, "search_seed": 3,
            "random": {"shac.critic_lr": {"low": 1e-4, "high": 1e-2, "log": True}, "shac.horizon": [8, 16]}}
    a = [load_config(t.config_path, t.overrides) for t in expand(write(tmp_path, spec), out="o")[1]]
    b = [load_config(t.config_path, t.overrides) for t in expand(write(tmp_path, spec), out="o")[1]]
    assert [c.shac.critic_lr for c in a] == [c.shac.critic_lr for c in b]      # reproducible draws
    assert len({c.shac.critic_lr for c in a}) == 5 and all(1e-4 <= c.shac.critic_lr <= 1e-2 for c in a)
    assert {c.shac.horizon for c in a} <= {8, 16}


@pytest.mark.parametrize("spec,match", [
    ({"base": "cartpole_shac.yaml", "seedz": [0]}, "unknown key seedz"),
    ({"base": "nope.yaml"}, "base config not found: nope.yaml"),
    ({"trials": [{"base": "cartpole_shac.yaml", "overrides": ["shac.nope=1"]}]}, r"trials\[0\].*shac\.nope"),
    ({"base": "cartpole_shac.yaml", "grid": {"seed": [1]}, "random": {"seed": [1]}}, "grid or random"),
    ({"base": "cartpole_shac.yaml", "grid": {"shac.horizon": 8}}, "grid must map"),
    ({"base": "cartpole_shac.yaml", "seeds": ["a"]}, "seeds must be"),
    ({"base": "cartpole_shac.yaml", "random": {"shac.actor_lr": {"low": 1, "high": 0}}}, "low < high"),
])
def test_sweep_errors(tmp_path, spec, match):
    with pytest.raises(ConfigError, match=match):
        expand(write(tmp_path, spec), out=str(tmp_path / "o"))
    with pytest.raises(ConfigError, match="sweep file not found"):
        expand(str(tmp_path / "missing.yaml"))


def test_local_sweep_survives_a_failing_trial_and_continues(tmp_path, capsys, monkeypatch):
    """One trial raises (its environment rejects a value), one trial's process is killed (as by
    the OOM killer): both are recorded as failed and the third finishes and is summarized."""
    import multiprocessing.process
    import signal
    import threading
    from diffgym.cli import main
    spec = {"name": "smoke", "seeds": [0], "overrides": TINY, "target_return": -1e9,
            "trials": [{"base": "cartpole_shac.yaml"},
                       {"base": "cartpole_ppo.yaml", "overrides": ["env.kwargs.frame_skip=0"]},
                       {"base": "cartpole_shac.yaml", "label": "killed", "overrides": ["shac.horizon=2"]}]}
    out = tmp_path / "out"
    started, start = [], multiprocessing.process.BaseProcess.start

    def recording_start(self):
        start(self)
        started.append(self)

    def kill(name):
        for _ in range(6000):
            for p in list(started):
                if p.name.startswith(name) and p.pid:
                    os.kill(p.pid, signal.SIGKILL)
                    return
            threading.Event().wait(0.01)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", recording_start)
    killer = threading.Thread(target=kill, args=("t002_",), daemon=True)
    killer.start()
    assert main(["sweep", write(tmp_path, spec), "--workers", "3", "--out", str(out)]) == 1   # two failed
    killer.join(timeout=60)
    monkeypatch.undo()
    summary = {r["group"].split(":")[0]: r for r in read_csv(out / "summary.csv")}
    assert summary["shac"]["status"] == "ok" and summary["ppo"]["status"] == "failed"
    assert "frame_skip must be >= 1" in summary["ppo"]["error"]
    assert "Traceback" in open(os.path.join(summary["ppo"]["run_dir"], "error.txt")).read()
    assert summary["killed"]["status"] == "failed" and "process died (exit code -9)" in summary["killed"]["error"]
    assert float(summary["shac"]["env_steps"]) == 16 and float(summary["shac"]["steps_to_target"]) == 16   # the first row with a finished episode
    assert os.path.getsize(os.path.join(summary["shac"]["run_dir"], "log.txt")) > 0     # the trial's output
    groups = {g["group"].split(":")[0]: g for g in read_csv(out / "groups.csv")}
    assert groups["shac"]["ok"] == "1" and groups["ppo"]["ok"] == "0" and groups["shac"]["reached_target"] == "1/1"
    assert groups["killed"]["ok"] == "0"
    assert os.path.getsize(out / "comparison.png") > 1000 and os.path.isfile(out / "sweep.yaml")
    assert "1/3 trials finished" in capsys.readouterr().out
    # running it again keeps the finished trial (same result, not re-run) and retries the others
    shac_dir = summary["shac"]["run_dir"]
    mtime = os.path.getmtime(os.path.join(shac_dir, "metrics.csv"))
    recs = run_sweep(write(tmp_path, spec), workers=3, out=str(out))
    assert [r["status"] for r in recs] == ["ok", "failed", "ok"]
    assert os.path.getmtime(os.path.join(shac_dir, "metrics.csv")) == mtime
    assert recs[0]["eval_return"] == float(summary["shac"]["eval_return"])


def test_sweep_checks_environments_before_running(tmp_path):
    spec = {"trials": [{"base": "cartpole_shac.yaml"},
                       {"base": "cartpole_ppo.yaml", "overrides": ["env.id=DiffNope-v0"]}]}
    with pytest.raises(ConfigError, match=r"trials\[1\] \(cartpole_ppo.yaml\): .*env\.id: unknown environment "
                                          r"'DiffNope-v0'"):
        expand(write(tmp_path, spec), out=str(tmp_path / "o"))
    assert not os.path.exists(tmp_path / "o")


def test_interrupted_trial_resumes_in_the_sweep(tmp_path):
    """A trial whose directory holds a checkpoint of the same config continues from it."""
    from diffgym.train import shac
    from diffgym.train.run import Run
    _, (trial,) = expand(write(tmp_path, {"base": "cartpole_shac.yaml", "overrides": TINY + ["checkpoint_every=1",
                                                                                     "total_env_steps=24"]}),
                         out=str(tmp_path / "o"))
    cfg = load_config(trial.config_path, trial.overrides)

    class Killed(Run):
        def log(self, env_steps, **m):
            super().log(env_steps, **m)
            if env_steps == 16:          # after the checkpoint of iteration 1
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        shac.train_shac(cfg, Killed(cfg, trial.run_dir))
    rec = run_trial(trial)
    assert rec["status"] == "ok" and rec["resumed"] and rec["env_steps"] == 24
    assert rec["curve"]["env_steps"] == [16.0, 24.0]      # rows with finished episodes
    # a different config in the same directory is not resumed but run afresh
    changed = Trial(**{**trial.__dict__, "overrides": trial.overrides + ["shac.actor_lr=1e-4"],
                       "config": {**trial.config, "shac": {**trial.config["shac"], "actor_lr": 1e-4}}})
    rec = run_trial(changed)
    assert rec["status"] == "ok" and not rec["resumed"]


def test_summary_statistics_and_plot(tmp_path):
    rng = np.random.default_rng(0)
    records = []
    for env, algos in (("DiffCartPole-v0", ("shac", "ppo")), ("DiffHopper-v0", ("shac",))):
        for algo in algos:
            for seed in range(3):
                steps = np.arange(1, 51) * 1000.0
                ret = -1000 + 20 * steps / 1000 + rng.normal(0, 5, 50) + 10 * seed
                records.append({"trial": f"{algo}{env}{seed}", "group": f"{algo}:{env}", "algo": algo, "env": env,
                                "seed": seed, "status": "ok", "eval_return": -100.0 + seed, "env_steps": 50000,
                                "steps_to_target": 1000.0 * (10 + seed), "time_to_target": 1.0 + seed,
                                "target_return": -800.0,
                                "curve": {"env_steps": steps.tolist(), "wall_time": (steps / 500).tolist(),
                                          "episode_return": ret.tolist()}})
    records.append({"trial": "broken", "group": "ppo:DiffHopper-v0", "algo": "ppo", "env": "DiffHopper-v0",
                    "seed": 0, "status": "failed", "error": "boom", "target_return": -800.0})
    rows = {r["group"]: r for r in summarize(str(tmp_path), records)}
    g = rows["shac:DiffCartPole-v0"]
    assert g["ok"] == 3 and g["eval_return_mean"] == pytest.approx(-99.0)
    assert (g["eval_return_min"], g["eval_return_max"]) == (-100.0, -98.0)
    assert g["steps_to_target_mean"] == pytest.approx(11000.0) and g["reached_target"] == "3/3"
    assert rows["ppo:DiffHopper-v0"]["ok"] == 0 and rows["ppo:DiffHopper-v0"]["eval_return_mean"] is None
    plot_comparison(str(tmp_path / "c.png"), records)
    from PIL import Image
    with Image.open(tmp_path / "c.png") as im:       # two environments: two rows of two panels
        assert im.size[1] > 1.8 * 380


def test_ray_sweep(tmp_path):
    ray = pytest.importorskip("ray")
    spec = {"name": "smoke_ray", "seeds": [0], "overrides": TINY,
            "trials": [{"base": "cartpole_shac.yaml"},
                       {"base": "cartpole_ppo.yaml", "overrides": ["env.kwargs.frame_skip=0"]}]}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        recs = run_sweep(write(tmp_path, spec), use_ray=True, out=str(tmp_path / "out"))
    finally:
        ray.shutdown()
    by = {r["algo"]: r for r in recs}
    assert by["shac"]["status"] == "ok" and by["shac"]["env_steps"] == 16
    assert by["ppo"]["status"] == "failed" and "frame_skip must be >= 1" in by["ppo"]["error"]
    assert by["shac"]["curve"]["env_steps"][-1] == 16        # curves come back with the results
    assert os.path.isfile(tmp_path / "out" / "summary.csv") and os.path.isfile(tmp_path / "out" / "comparison.png")
    assert os.path.isfile(os.path.join(by["shac"]["run_dir"], "eval.json"))
