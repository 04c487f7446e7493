"""Training: config validation, the run directory, smoke runs of every shipped config, and
interrupted runs that resume (SHAC and PPO continue exactly as if never stopped)."""
import csv
import json
import math
import os
import subprocess
import sys

import pytest

from diffgym.resources import configs_dir
from diffgym.train import train
from diffgym.train.config import ConfigError, config_to_dict, load_config
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
    assert {c.rsplit("_", 1)[0] for c in CONFIGS} == {"cartpole", "hopper", "go1", "push", "billiards"}
    for name in CONFIGS:
        cfg = load_config(os.path.join(configs_dir(), name))
        assert cfg.algo == name.rsplit("_", 1)[1][:-5] and cfg.env.id.startswith("Diff")
    published = {"cartpole_ppo.yaml": (240, 128, 3840), "hopper_ppo.yaml": (32, 256, 1024)}
    for name, (n_steps, n_envs, batch) in published.items():
        cfg = load_config(name)
        assert (cfg.ppo.n_steps, cfg.env.num_envs, cfg.ppo.batch_size) == (n_steps, n_envs, batch)
    hop = load_config("hopper_shac.yaml")
    assert (hop.env.num_envs, hop.shac.actor_lr, hop.shac.critic_lr, hop.shac.actor_mlp) == \
        (256, 2e-3, 2e-4, [128, 64, 32])


def test_config_errors_name_the_key_and_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: shac\nshac: {actor_lrr: 0.1}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*unknown key shac\.actor_lrr \(did you mean shac\.actor_lr\?\)"):
        load_config(bad)
    bad.write_text("algo: shac\nenv: {num_envs: many}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: env\.num_envs: expected an integer, got 'many'"):
        load_config(bad)
    bad.write_text("shac: {actor_mlp: 64}\n")
    with pytest.raises(ConfigError, match=r"shac\.actor_mlp: expected a list"):
        load_config(bad)
    bad.write_text("gif: 1\n")
    with pytest.raises(ConfigError, match=r"gif: expected true or false"):
        load_config(bad)
    bad.write_text("algo: sac\n")
    with pytest.raises(ConfigError, match=r"algo: must be one of \['shac', 'ppo'\], got 'sac'"):
        load_config(bad)
    bad.write_text("env: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"env: expected a mapping"):
        load_config(bad)
    bad.write_text("algo: shac\n  nested: : oops\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"config file not found: .*missing\.yaml"):
        load_config(tmp_path / "missing.yaml")
    # values
    with pytest.raises(ConfigError, match=r"ppo\.batch_size: 9999 exceeds the 16 samples"):
        load_config("cartpole_ppo.yaml", ["env.num_envs=2", "ppo.n_steps=8", "ppo.batch_size=9999"])
    with pytest.raises(ConfigError, match=r"shac\.actor_lr: must be >= 0"):
        load_config("cartpole_shac.yaml", ["shac.actor_lr=-1"])
    with pytest.raises(ConfigError, match=r"shac\.gamma: must be in \[0, 1\]"):
        load_config("cartpole_shac.yaml", ["shac.gamma=1.5"])
    with pytest.raises(ConfigError, match=r"env\.num_envs: must be >= 1"):
        load_config("cartpole_shac.yaml", ["env.num_envs=0"])
    # overrides
    cfg = load_config("cartpole_shac.yaml", ["shac.actor_lr=1e-3", "seed=3", "shac.actor_mlp=[8, 8]",
                                             "total_env_steps=1e5", "env.kwargs.frame_skip=2", "env.episode_steps=null"])
    assert cfg.shac.actor_lr == 1e-3 and cfg.seed == 3 and cfg.shac.actor_mlp == [8, 8]
    assert cfg.total_env_steps == 100_000 and isinstance(cfg.total_env_steps, int)
    assert cfg.env.kwargs == {"frame_skip": 2} and cfg.env.episode_steps is None
    with pytest.raises(ConfigError, match=r"unknown key shac\.nope"):
        load_config("cartpole_shac.yaml", ["shac.nope=1"])
    with pytest.raises(ConfigError, match="must look like key=value"):
        load_config("cartpole_shac.yaml", ["seed"])
    with pytest.raises(ConfigError, match=r"override seed\.x: seed is not a section"):
        load_config("cartpole_shac.yaml", ["seed.x=1"])
    # the resolved config round-trips through the run directory's config.yaml
    import yaml
    p = tmp_path / "resolved.yaml"
    p.write_text(yaml.safe_dump(config_to_dict(cfg)))
    assert load_config(p) == cfg


@pytest.mark.parametrize("name", CONFIGS)
def test_smoke_runs_every_config(name, tmp_path):
    cfg = load_config(name)
    cfg = load_config(name, TINY[cfg.algo])
    out = train(cfg, str(tmp_path / "run"))
    assert out["env_steps"] == cfg.total_env_steps
    for f in ("config.yaml", "metrics.csv", "checkpoint_last.pt", "eval.json", "learning_curve.png"):
        assert os.path.isfile(tmp_path / "run" / f), f
    r = rows(tmp_path / "run")
    assert int(r[-1]["env_steps"]) == cfg.total_env_steps
    assert [int(x["iteration"]) for x in r] == list(range(1, len(r) + 1))
    ev = json.load(open(tmp_path / "run" / "eval.json"))
    assert ev["episodes"] == 1 and math.isfinite(ev["return_mean"]) and ev["length_mean"] <= 6
    assert load_config(tmp_path / "run" / "config.yaml") == cfg
    assert os.listdir(tmp_path / "run" / "tb")          # TensorBoard events
    if cfg.algo == "ppo":                               # loadable outside diffgym
        from stable_baselines3 import PPO
        assert PPO.load(tmp_path / "run" / "ppo_model.zip").num_timesteps == cfg.total_env_steps


def test_gif_of_the_trained_policy(tmp_path):
    cfg = load_config("cartpole_shac.yaml", [x for x in TINY["shac"] if x != "gif=false"] + ["gif=true"])
    train(cfg, str(tmp_path))
    from PIL import Image
    with Image.open(tmp_path / "policy.gif") as im:
        assert im.format == "GIF" and 3 <= im.n_frames <= 7      # the reset frame and up to 6 steps
        assert im.size[0] > 16 and im.size[1] > 16


class KilledRun(Run):
    """A run that dies (like a kill) right after logging ``kill_at`` environment steps."""
    kill_at = None

    def log(self, env_steps, **m):
        super().log(env_steps, **m)
        if env_steps == self.kill_at:
            raise KeyboardInterrupt


NOT_REPRODUCIBLE = {"wall_time", "steps_per_s"}


@pytest.mark.parametrize("algo,every", [("shac", 1), ("ppo", 1), ("ppo", 2)])
def test_interrupted_run_resumes_exactly(algo, every, tmp_path):
    """Killed half-way, resumed: the same total steps, a continuous CSV and (both algorithms
    restore their complete state) the same metrics as the run that was never stopped."""
    ov = TINY[algo] + ["total_env_steps=" + ("48" if algo == "shac" else "96"), f"checkpoint_every={every}"]
    cfg = load_config(f"cartpole_{algo}.yaml", ov)
    train(cfg, str(tmp_path / "full"))
    from diffgym.train import ppo, shac
    run = KilledRun(cfg, str(tmp_path / "cut"))
    run.kill_at = 24 if algo == "shac" else 48           # after iteration 3 of 6
    with pytest.raises(KeyboardInterrupt):
        (shac.train_shac if algo == "shac" else ppo.train_ppo)(cfg, run)
    cut = rows(tmp_path / "cut")
    assert int(cut[-1]["env_steps"]) == run.kill_at        # the killed iteration was logged ...
    out = train(cfg, str(tmp_path / "cut"), resume=True)   # ... and is dropped and redone
    assert out["env_steps"] == cfg.total_env_steps
    a, b = rows(tmp_path / "full"), rows(tmp_path / "cut")
    assert [r["env_steps"] for r in a] == [r["env_steps"] for r in b]      # continuous, no duplicates
    keys = sorted(set(a[0]) - NOT_REPRODUCIBLE)
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    wall = [float(r["wall_time"]) for r in b]
    assert wall == sorted(wall)                            # the clock continues across the resume
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tmp_path / "cut" / "tb"))
    ea.Reload()                                            # the killed iteration's events were purged
    assert [e.step for e in ea.Scalars("iteration")] == [int(r["env_steps"]) for r in a]
    assert json.load(open(tmp_path / "full" / "eval.json")) == json.load(open(tmp_path / "cut" / "eval.json"))


def test_run_directory_checkpoints(tmp_path):
    cfg = load_config("cartpole_shac.yaml", TINY["shac"])
    run = Run(cfg, str(tmp_path))
    for it, ret in enumerate([-5.0, -3.0, float("nan"), -4.0], start=1):
        run.log(it * 10, iteration=it, episode_return=ret)
        run.save_checkpoint({"algo": "shac", "env_steps": it * 10, "value": it}, it)
    best = json.load(open(tmp_path / "checkpoint_best.json"))
    assert best == {"iteration": 2, "env_steps": 20, "episode_return": -3.0}
    import torch
    assert torch.load(tmp_path / "checkpoint_best.pt", weights_only=False)["value"] == 2
    # a checkpoint that fails to write leaves the previous one whole
    with pytest.raises(Exception):
        run.save_checkpoint({"env_steps": 50, "bad": lambda: 0}, 5)
    assert torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)["value"] == 4
    run.log(50, iteration=5, episode_return=-1.0)          # after the last checkpoint: lost on resume
    run.close()
    again = Run(cfg, str(tmp_path), resume=True)
    assert again.load_checkpoint()["iteration"] == 4
    assert [r["env_steps"] for r in rows(tmp_path)] == ["10", "20", "30", "40"]
    again.log(50, iteration=5, episode_return=-2.0)
    again.save_checkpoint({"algo": "shac", "env_steps": 50, "value": 5}, 5)
    assert json.load(open(tmp_path / "checkpoint_best.json"))["iteration"] == 5     # best persisted: -2 > -3
    again.close()
    # a fresh run in the same directory starts clean
    Run(cfg, str(tmp_path)).close()
    assert not os.path.exists(tmp_path / "metrics.csv") and not os.path.exists(tmp_path / "checkpoint_best.pt")
    # resuming a directory that never reached a checkpoint starts over without stale rows
    run = Run(cfg, str(tmp_path))
    run.log(10, iteration=1, episode_return=-1.0)
    run.close()
    again = Run(cfg, str(tmp_path), resume=True)
    assert again.load_checkpoint() is None and not os.path.exists(tmp_path / "metrics.csv")
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        Run(cfg, str(tmp_path / "nothing"), resume=True)


def test_resume_refuses_another_algorithms_checkpoint(tmp_path):
    cfg = load_config("cartpole_shac.yaml", TINY["shac"])
    train(cfg, str(tmp_path))
    ppo_cfg = load_config("cartpole_ppo.yaml", TINY["ppo"])
    with pytest.raises(ValueError, match="not ppo"):
        train(ppo_cfg, str(tmp_path), resume=True)


def test_cli_train_and_resume(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "diffgym", "train", "cartpole_shac.yaml", *TINY["shac"], "--run-dir", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "evaluation over 1 episodes" in out.stdout and "shac DiffCartPole-v0" in out.stderr   # progress bar
    # extend the finished run: --resume with an override of the budget
    out = subprocess.run([sys.executable, "-m", "diffgym", "train", "--resume", str(tmp_path), "total_env_steps=32"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert [int(r["env_steps"]) for r in rows(tmp_path)] == [8, 16, 24, 32]
    bad = subprocess.run([sys.executable, "-m", "diffgym", "train", "cartpole_shac.yaml", "shac.lr=1"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "unknown key shac.lr" in bad.stderr


def test_cli_errors_in_process(capsys, tmp_path):
    from diffgym.cli import main
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["train"]) == 2
    assert "cartpole_shac.yaml" in capsys.readouterr().err       # lists the shipped configs


@pytest.mark.parametrize("algo", ["shac", "ppo"])
def test_num_workers_do_not_change_training(algo, tmp_path):
    """env.num_workers=2 (copies stepped in a worker process) trains exactly as 1: the same
    metrics and evaluation, PPO through the SB3 vec env, SHAC through the torch bridge."""
    ov = TINY[algo] + ["env.num_envs=3", "total_env_steps=" + ("24" if algo == "shac" else "48")]
    out = {}
    for nw in (1, 2):
        cfg = load_config(f"cartpole_{algo}.yaml", ov + [f"env.num_workers={nw}"])
        assert cfg.env.num_workers == nw
        train(cfg, str(tmp_path / str(nw)))
        r = rows(tmp_path / str(nw))
        keys = sorted(set(r[0]) - NOT_REPRODUCIBLE)
        out[nw] = ([[x[k] for k in keys] for x in r], json.load(open(tmp_path / str(nw) / "eval.json")))
    assert out[1] == out[2]
    with pytest.raises(ConfigError, match="env.num_workers"):
        load_config(f"cartpole_{algo}.yaml", ["env.num_workers=0"])
