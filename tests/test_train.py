"""Training: config validation, smoke runs of every shipped config, interrupted runs that resume,
and sweeps (local pool with a failing trial, and Ray)."""
import csv
import os
import subprocess
import sys

import pytest
import yaml

from diffgym.resources import configs_dir
from diffgym.train import train
from diffgym.train.config import ConfigError, load_config
from diffgym.train.run import Run

CONFIGS = sorted(f for f in os.listdir(configs_dir()) if f.endswith(".yaml"))
TINY = {"shac": ["env.num_envs=2", "shac.horizon=4", "shac.critic_minibatches=2", "total_env_steps=16",
                 "eval_episodes=1", "env.episode_steps=6", "gif=false", "checkpoint_every=1"],
        "ppo": ["env.num_envs=2", "ppo.n_steps=8", "ppo.batch_size=8", "ppo.n_epochs=1",
                "total_env_steps=32", "eval_episodes=1", "env.episode_steps=6", "gif=false",
                "checkpoint_every=1"]}


def rows(run_dir):
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


def test_ten_configs_ship_and_validate():
    assert len(CONFIGS) == 10
    for name in CONFIGS:
        cfg = load_config(os.path.join(configs_dir(), name))
        assert cfg.algo in name and cfg.env.id.startswith("Diff")
    sweep = os.path.join(configs_dir(), "sweeps", "shac_vs_ppo.yaml")
    from diffgym.train.sweep import expand
    _, trials = expand(sweep, out="/tmp/unused")
    assert len(trials) == 12 and {t.seed for t in trials} == {0, 1, 2}


def test_config_errors_name_the_key_and_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: shac\nshac: {actor_lrr: 0.1}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*shac\.actor_lrr"):
        load_config(bad)
    bad.write_text("algo: shac\nenv: {num_envs: many}\n")
    with pytest.raises(ConfigError, match=r"env\.num_envs: expected an integer"):
        load_config(bad)
    bad.write_text("algo: sac\n")
    with pytest.raises(ConfigError, match="algo"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    cfg = load_config("cartpole_shac.yaml", ["shac.actor_lr=1e-3", "seed=3", "shac.actor_mlp=[8, 8]"])
    assert cfg.shac.actor_lr == 1e-3 and cfg.seed == 3 and cfg.shac.actor_mlp == [8, 8]
    with pytest.raises(ConfigError, match="shac.nope"):
        load_config("cartpole_shac.yaml", ["shac.nope=1"])


@pytest.mark.parametrize("name", ["cartpole_ppo.yaml", "hopper_shac.yaml", "go1_ppo.yaml", "push_shac.yaml",
                                  "billiards_ppo.yaml"])
def test_smoke_runs(name, tmp_path):
    cfg = load_config(name)
    cfg = load_config(name, TINY[cfg.algo])
    out = train(cfg, str(tmp_path / "run"))
    assert out["env_steps"] >= cfg.total_env_steps
    for f in ("config.yaml", "metrics.csv", "checkpoint_last.pt", "eval.json", "learning_curve.png"):
        assert os.path.isfile(tmp_path / "run" / f), f
    assert len(rows(tmp_path / "run")) >= 1


def test_gif_of_the_trained_policy(tmp_path):
    cfg = load_config("cartpole_shac.yaml", [x for x in TINY["shac"] if x != "gif=false"] + ["gif=true"])
    train(cfg, str(tmp_path))
    with open(tmp_path / "policy.gif", "rb") as f:
        assert f.read(6) in (b"GIF89a", b"GIF87a")


class Interrupt(Exception):
    pass


class KilledRun(Run):
    """A run that dies (like a kill) right after logging ``kill_at`` environment steps."""
    kill_at = None

    def log(self, env_steps, **m):
        super().log(env_steps, **m)
        if env_steps == self.kill_at:
            raise KeyboardInterrupt


@pytest.mark.parametrize("algo", ["shac", "ppo"])
def test_interrupted_run_resumes_from_its_checkpoint(algo, tmp_path):
    ov = TINY[algo] + ["total_env_steps=" + ("48" if algo == "shac" else "96")]
    cfg = load_config(f"cartpole_{algo}.yaml", ov)
    full = tmp_path / "full"
    train(cfg, str(full))
    from diffgym.train import ppo, shac
    run = KilledRun(cfg, str(tmp_path / "cut"))
    run.kill_at = 24 if algo == "shac" else 48
    with pytest.raises(KeyboardInterrupt):
        (shac.train_shac if algo == "shac" else ppo.train_ppo)(cfg, run)
    # one more row was logged after the last checkpoint in the PPO case; resume drops nothing else
    out = train(cfg, str(tmp_path / "cut"), resume=True)
    assert out["env_steps"] == cfg.total_env_steps
    a, b = rows(full), rows(tmp_path / "cut")
    assert [r["env_steps"] for r in a] == [r["env_steps"] for r in b]      # continuous, no duplicates
    if algo == "shac":      # SHAC resumes exactly: the same losses as the uninterrupted run
        assert [r["actor_loss"] for r in a] == [r["actor_loss"] for r in b]


def test_cli_train_and_resume(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "diffgym", "train", "cartpole_shac.yaml", *TINY["shac"], "--run-dir", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "evaluation over 1 episodes" in out.stdout
    out = subprocess.run([sys.executable, "-m", "diffgym", "train", "--resume", str(tmp_path), "total_env_steps=32"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(rows(tmp_path)[-1]["env_steps"]) == 32
    bad = subprocess.run([sys.executable, "-m", "diffgym", "train", "cartpole_shac.yaml", "shac.lr=1"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "shac.lr" in bad.stderr


def _sweep_file(tmp_path):
    spec = {"name": "smoke", "trials": [{"base": "cartpole_shac.yaml"},
                                        {"base": "cartpole_ppo.yaml", "overrides": ["env.id=DiffNope-v0"]}],
            "seeds": [0], "overrides": TINY["shac"][:1] + ["total_env_steps=16", "eval_episodes=1",
                                                           "env.episode_steps=6", "shac.horizon=4",
                                                           "shac.critic_minibatches=2", "ppo.n_steps=8",
                                                           "ppo.batch_size=8"]}
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def test_local_sweep_survives_a_failing_trial(tmp_path):
    from diffgym.train.sweep import run_sweep
    recs = run_sweep(str(_sweep_file(tmp_path)), workers=2, out=str(tmp_path / "out"))
    status = {r["group"].split(":")[0]: r["status"] for r in recs}
    assert status == {"shac": "ok", "ppo": "failed"}
    failed = [r for r in recs if r["status"] == "failed"][0]
    assert "DiffNope" in failed["error"] and os.path.isfile(os.path.join(failed["run_dir"], "error.txt"))
    assert os.path.isfile(tmp_path / "out" / "summary.csv") and os.path.isfile(tmp_path / "out" / "comparison.png")


def test_ray_sweep(tmp_path):
    ray = pytest.importorskip("ray")
    from diffgym.train.sweep import run_sweep
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        recs = run_sweep(str(_sweep_file(tmp_path)), use_ray=True, out=str(tmp_path / "out"))
    finally:
        ray.shutdown()
    assert sorted(r["status"] for r in recs) == ["failed", "ok"]
    assert os.path.isfile(tmp_path / "out" / "summary.csv")
