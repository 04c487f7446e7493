"""Training safety: resuming never runs code from the run directory, a damaged checkpoint falls
back to the previous one (and the run still continues exactly), hostile YAML is refused fast,
environment ids and keyword arguments are checked before anything is created, and the progress
bar counts the steps actually run."""
import csv
import os
import pickle
import time

import numpy as np
import pytest
import torch

from diffgym.train import train
from diffgym.train.config import ConfigError, load_config
from diffgym.train.run import CheckpointError, Run, from_plain, read_checkpoint, to_plain

TINY = {"shac": ["env.num_envs=2", "shac.horizon=4", "shac.critic_minibatches=2", "total_env_steps=16",
                 "eval_episodes=1", "env.episode_steps=6", "gif=false", "checkpoint_every=1"],
        "ppo": ["env.num_envs=2", "ppo.n_steps=8", "ppo.batch_size=8", "ppo.n_epochs=1",
                "total_env_steps=32", "eval_episodes=1", "env.episode_steps=6", "gif=false",
                "checkpoint_every=1"]}
NOT_REPRODUCIBLE = {"wall_time", "steps_per_s"}


def rows(run_dir):
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


class Evil:
    """Unpickling this runs ``touch MARKER`` (what a crafted checkpoint would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_pickle(marker) -> bytes:
    return pickle.dumps({"algo": "shac", "env_steps": 8, "payload": Evil(marker)})


def test_evil_pickle_really_runs_code(tmp_path):
    """The control: the crafted payload does create the marker when something unpickles it."""
    marker = tmp_path / "ran"
    pickle.loads(_evil_pickle(marker))
    assert marker.exists()


# -- 1. resuming never executes code --------------------------------------------------------------
@pytest.fixture(scope="module")
def shac_run(tmp_path_factory):
    """A finished tiny SHAC run (2 iterations, a checkpoint after each)."""
    d = tmp_path_factory.mktemp("shac_run")
    cfg = load_config("cartpole_shac.yaml", TINY["shac"])
    train(cfg, str(d))
    return cfg, d


def _copy_run(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("which", ["torch_save", "old_format"])
def test_resume_refuses_a_checkpoint_that_would_run_code(shac_run, tmp_path, which, capsys):
    cfg, src = shac_run
    run_dir = _copy_run(src, tmp_path / "run")
    marker = tmp_path / "marker"
    ckpt = run_dir / "checkpoint_last.pt"
    if which == "torch_save":       # a torch checkpoint whose pickle calls os.system
        torch.save({"algo": "shac", "env_steps": 16, "payload": Evil(marker)}, ckpt)
        match = r"checkpoint_last\.pt: refused: .*(posix|os)\.system"
    else:                           # what diffgym wrote before: numpy objects in the pickle
        torch.save({"algo": "shac", "env_steps": 16, "ep_ret": np.zeros(2),
                    "rng": {"numpy": np.random.get_state()}}, ckpt)
        match = r"checkpoint_last\.pt: written by an older diffgym version"
    with pytest.raises(CheckpointError, match=match):
        train(cfg, str(run_dir), resume=True)
    assert not marker.exists()
    assert [r["env_steps"] for r in rows(run_dir)] == ["8", "16"]      # nothing was cut or rewritten
    from diffgym.cli import main                                       # the command line: a sentence
    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "diffgym train: " in err and "checkpoint_last.pt" in err and "Traceback" not in err
    assert not marker.exists()


def test_ppo_resume_reads_no_sb3_pickles(tmp_path):
    """ppo_model.zip and vecnormalize.pkl (SB3's formats, which unpickle) are written for SB3 users
    but never read on resume: replaced by crafted files, the resumed run neither runs them nor
    needs them, and it continues from diffgym's own checkpoint."""
    cfg = load_config("cartpole_ppo.yaml", TINY["ppo"])
    run_dir = tmp_path / "run"
    train(cfg, str(run_dir))
    marker = tmp_path / "marker"
    for name in ("vecnormalize.pkl", "ppo_model.zip"):
        (run_dir / name).write_bytes(_evil_pickle(marker))
    out = train(load_config(str(run_dir / "config.yaml"), ["total_env_steps=48"]), str(run_dir), resume=True)
    assert out["env_steps"] == 48 and not marker.exists()
    assert [int(r["env_steps"]) for r in rows(run_dir)] == [16, 32, 48]


@pytest.mark.parametrize("algo,override", [("shac", "shac.actor_mlp=[16]"), ("ppo", "ppo.net_arch=[16]")])
def test_resume_with_a_config_the_checkpoint_does_not_fit(algo, override, tmp_path, capsys):
    cfg = load_config(f"cartpole_{algo}.yaml", TINY[algo])
    train(cfg, str(tmp_path))
    from diffgym.cli import main
    assert main(["train", "--resume", str(tmp_path), override]) == 2
    err = capsys.readouterr().err
    assert "the checkpoint does not fit this run" in err and "Traceback" not in err
    assert load_config(tmp_path / "config.yaml") == cfg          # a refused resume leaves the config
    assert main(["train", "--resume", str(tmp_path), "env.num_envs=3", "ppo.batch_size=8"]) == 2
    assert "holds 2 environments" in capsys.readouterr().err.split("diffgym train: ")[-1]
    assert load_config(tmp_path / "config.yaml") == cfg
    assert main(["train", "--resume", str(tmp_path), f"total_env_steps={2 * cfg.total_env_steps}"]) == 0
    assert load_config(tmp_path / "config.yaml").total_env_steps == 2 * cfg.total_env_steps


def test_checkpoint_holds_plain_data_only(shac_run, tmp_path):
    cfg, run_dir = shac_run
    ckpt = torch.load(run_dir / "checkpoint_last.pt", weights_only=True)    # no pickled objects at all
    assert ckpt["format"] == 2 and ckpt["algo"] == "shac" and ckpt["iteration"] == 2
    back = read_checkpoint(str(run_dir / "checkpoint_last.pt"))
    assert isinstance(back["ep_ret"], np.ndarray) and isinstance(back["rng"]["python"], tuple)
    assert back["rng"]["numpy"][1].dtype == np.uint32 and isinstance(back["env"][0]["np_random"]["state"]["state"], int)
    # the codec: exact round trips of the types checkpoints hold; anything else refused by key
    state = {"u32": np.array([0, 2**32 - 1], dtype=np.uint32), "u64": np.array([2**64 - 1], dtype=np.uint64),
             "b": np.array([True, False]), "f": np.float32(1.5), "big": 2**127 + 1, "t": (1, (2.5, None)),
             "tensor": torch.arange(3), 7: "int key"}
    path = tmp_path / "c.pt"
    torch.save(to_plain(state), path)
    got = from_plain(torch.load(path, weights_only=True))
    assert got["u32"].dtype == np.uint32 and got["u32"].tolist() == [0, 2**32 - 1]
    assert got["u64"].dtype == np.uint64 and got["u64"][0] == np.uint64(2**64 - 1)
    assert got["b"].dtype == bool and got["f"] == 1.5 and got["big"] == 2**127 + 1 and got["t"] == (1, (2.5, None))
    assert torch.equal(got["tensor"], torch.arange(3)) and got[7] == "int key"
    with pytest.raises(TypeError, match=r"checkpoint\.rng\.gen: Generator is not plain data"):
        to_plain({"rng": {"gen": np.random.default_rng(0)}})
    with pytest.raises(TypeError, match=r"checkpoint\.x: a numpy array of dtype object"):
        to_plain({"x": np.array([None])})


# -- 2. a damaged last checkpoint falls back to the previous one ---------------------------------
class KilledRun(Run):
    kill_at = None

    def log(self, env_steps, **m):
        super().log(env_steps, **m)
        if env_steps == self.kill_at:
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def shac_full(tmp_path_factory):
    """An uninterrupted 6-iteration run to compare the resumed ones with."""
    d = tmp_path_factory.mktemp("full")
    cfg = load_config("cartpole_shac.yaml", TINY["shac"] + ["total_env_steps=48"])
    train(cfg, str(d))
    return cfg, d


def _damage(path, how, marker):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "random":
        path.write_bytes(np.random.default_rng(0).bytes(len(data)))
    elif how == "flipped":           # one byte changed inside the archive: a checksum fails
        b = bytearray(data)
        b[len(b) // 3] ^= 0xFF
        path.write_bytes(bytes(b))
    elif how == "legacy_pickle":     # not a torch archive but a pickle that would run code
        path.write_bytes(_evil_pickle(marker))


@pytest.mark.parametrize("how", ["truncated", "empty", "random", "flipped", "legacy_pickle"])
def test_damaged_last_checkpoint_falls_back_to_the_previous_one(shac_full, tmp_path, how, capsys):
    from diffgym.train import shac
    cfg, full = shac_full
    _check_fallback(cfg, full, tmp_path, how, capsys, shac.train_shac, kill_at=32, per_iter=8)


def test_damaged_ppo_checkpoint_falls_back_exactly(tmp_path, capsys):
    from diffgym.train import ppo
    cfg = load_config("cartpole_ppo.yaml", TINY["ppo"] + ["total_env_steps=96"])
    train(cfg, str(tmp_path / "full"))
    _check_fallback(cfg, tmp_path / "full", tmp_path, "truncated", capsys, ppo.train_ppo, kill_at=64, per_iter=16)


def _check_fallback(cfg, full, tmp_path, how, capsys, fn, kill_at, per_iter):
    cut = tmp_path / "cut"
    run = KilledRun(cfg, str(cut))
    run.kill_at = kill_at         # killed in iteration 4, before its checkpoint: last = 3, previous = 2
    with pytest.raises(KeyboardInterrupt):
        fn(cfg, run)
    run.close()
    assert read_checkpoint(str(cut / "checkpoint_last.pt"))["iteration"] == 3
    assert read_checkpoint(str(cut / "checkpoint_prev.pt"))["iteration"] == 2
    marker = tmp_path / "marker"
    _damage(cut / "checkpoint_last.pt", how, marker)
    capsys.readouterr()
    out = train(cfg, str(cut), resume=True)
    err = capsys.readouterr().err
    assert "checkpoint_last.pt: " in err and ("empty" in err or "damaged" in err)
    assert "resuming from the previous checkpoint" in err
    assert f"checkpoint_prev.pt (iteration 2, {2 * per_iter} environment steps)" in err
    assert os.path.isfile(cut / "checkpoint_last.pt.damaged") and not marker.exists()
    assert out["env_steps"] == cfg.total_env_steps
    a, b = rows(full), rows(cut)
    assert [r["env_steps"] for r in a] == [r["env_steps"] for r in b]        # cut back to iteration 2
    keys = sorted(set(a[0]) - NOT_REPRODUCIBLE)
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]   # and exact from there
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(cut / "tb"))
    ea.Reload()
    assert [e.step for e in ea.Scalars("iteration")] == [int(r["env_steps"]) for r in a]


def test_first_run_kernel_preparation_is_announced(monkeypatch, capsys):
    from diffgym.train import run as run_mod
    make = run_mod._make_env

    def slow_make(cfg, **kw):         # as slow as a first-run compile, relative to the notice delay
        time.sleep(0.5)
        return make(cfg, **kw)

    monkeypatch.setattr(run_mod, "COMPILE_NOTICE_AFTER", 0.05)
    monkeypatch.setattr(run_mod, "_make_env", slow_make)
    run_mod.prepare_env(load_config("cartpole_shac.yaml", TINY["shac"]), jacobian=True)
    err = capsys.readouterr().err
    assert "preparing the simulator's compiled kernels for DiffCartPole-v0 (compiled once" in err
    assert "simulator kernels ready" in err


def test_no_usable_checkpoint_is_a_clear_error(shac_run, tmp_path, capsys):
    cfg, src = shac_run
    run_dir = _copy_run(src, tmp_path / "run")
    (run_dir / "checkpoint_last.pt").write_bytes(b"")
    (run_dir / "checkpoint_prev.pt").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(CheckpointError, match=r"no usable checkpoint: .*checkpoint_last\.pt: empty.*"
                                              r"checkpoint_prev\.pt: damaged"):
        Run(cfg, str(run_dir), resume=True).load_checkpoint()
    # a kill between the two renames of a checkpoint write leaves only the previous one: used
    run_dir2 = _copy_run(src, tmp_path / "run2")
    os.remove(run_dir2 / "checkpoint_last.pt")
    ck = Run(cfg, str(run_dir2), resume=True).load_checkpoint()
    assert ck["iteration"] == 1 and "checkpoint_last.pt is missing" in capsys.readouterr().err
    assert [r["env_steps"] for r in rows(run_dir2)] == ["8"]


# -- 3. hostile YAML ------------------------------------------------------------------------------
def _alias_bomb(levels=9):
    lines = ["algo: shac", "env:", "  id: DiffCartPole-v0", "  kwargs:",
             "    lol0: &lol0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"    lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("kind,match", [
    ("alias_bomb", r"bomb\.yaml: refused: more than 20000 values at env\.kwargs\.lol\d(\[\d\])? once its "
                   r"aliases are expanded"),
    ("brackets", r"bomb\.yaml: refused: (brackets nested|nesting) deeper than 64 levels "
                 r"(at shac\.actor_mlp)?.*\(line 1"),
    ("flat", r"bomb\.yaml: refused: more than 20000 values at shac\.actor_mlp\[\d+\] \(line 1\)"),
    ("indent", r"bomb\.yaml: refused: nesting deeper than 64 levels at env\.kwargs\.k\.k\.k"),
    ("self_alias", r"bomb\.yaml: refused: alias \*a at env\.kwargs\.x\[1\] refers to a value that contains it"),
    ("oversized", r"bomb\.yaml: refused: \d+ bytes, more than the 1048576"),
])
def test_hostile_yaml_is_refused_quickly(tmp_path, kind, match):
    text = {"alias_bomb": _alias_bomb(),
            "brackets": "shac: {actor_mlp: " + "[" * 5000 + "]" * 5000 + "}\n",
            "flat": "shac: {actor_mlp: [" + "64, " * 200_000 + "64]}\n",
            "indent": "env:\n  kwargs:\n" + "".join("  " * (i + 2) + "k:\n" for i in range(200)) + "  " * 202 + "1\n",
            "self_alias": "env:\n  kwargs:\n    x: &a [1, *a]\n",
            "oversized": "seed: 1\n" + "# padding\n" * 120_000}[kind]
    p = tmp_path / "bomb.yaml"
    p.write_text(text)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=match):
        load_config(p)
    assert time.perf_counter() - t0 < 5.0          # refused, not expanded (a hang guard, not a benchmark)
    # the sweep reader is the same reader
    from diffgym.train.sweep import expand
    with pytest.raises(ConfigError, match=match):
        expand(str(p), out=str(tmp_path / "o"))


@pytest.mark.parametrize("loader", ["libyaml", "python"])
def test_both_yaml_parsers_apply_the_limits(loader):
    """With libyaml (the default where PyYAML has it) and without (pure-Python PyYAML)."""
    from diffgym.train import config
    cls = config._LimitedLoader if loader == "python" else config._LimitedCLoader
    for text, match in ((_alias_bomb(), "aliases are expanded"), ("a: " + "[" * 5000 + "]" * 5000, "deeper than 64"),
                        ("a: &x [1, *x]", "refers to a value that contains it"),
                        ("a: [" + "1, " * 30_000 + "1]", "more than 20000 values at a")):
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match=match):
            config.yaml_load(text, "x.yaml: ", cls)
        assert time.perf_counter() - t0 < 10.0       # refused early (a hang guard, not a benchmark)
    assert config.yaml_load("a: &b {x: 1}\nb: {<<: *b, y: 2}\nc: [*b, 1e-3]\n", "", cls) == \
        {"a": {"x": 1}, "b": {"x": 1, "y": 2}, "c": [{"x": 1}, "1e-3"]}


def test_ordinary_anchors_and_overrides_still_work(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("algo: shac\nshac: &s {actor_mlp: &w [32, 32], critic_mlp: *w}\nenv: {num_envs: 4}\n")
    cfg = load_config(p)
    assert cfg.shac.actor_mlp == [32, 32] and cfg.shac.critic_mlp == [32, 32]
    with pytest.raises(ConfigError, match=r"override shac\.actor_mlp: .*refused: .*deeper than 64 levels"):
        load_config(p, ["shac.actor_mlp=" + "[" * 500 + "]" * 500])


# -- 4. the environment is checked before anything is created ------------------------------------
def test_unknown_env_id_or_kwarg_is_found_before_the_run_directory(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"env\.id: unknown environment 'DiffHoper-v0' \(did you mean "
                                          r"DiffHopper-v0\?\); diffgym's environments: .*DiffCartPole-v0"):
        load_config("hopper_shac.yaml", ["env.id=DiffHoper-v0"])
    with pytest.raises(ConfigError, match=r"env\.kwargs\.frame_skp: DiffCartPole-v0 has no parameter "
                                          r"'frame_skp' \(did you mean frame_skip\?\)"):
        load_config("cartpole_shac.yaml", ["env.kwargs.frame_skp=2"])
    with pytest.raises(ConfigError, match=r"env\.kwargs\.comand: .*did you mean command\?"):
        load_config("go1_shac.yaml", ["env.kwargs.comand=[0.5, 0]"])
    with pytest.raises(ConfigError, match=r"env\.id: CartPole-v1 is not a differentiable diffgym environment"):
        load_config("cartpole_shac.yaml", ["env.id=CartPole-v1"])
    cfg = load_config("hopper_shac.yaml", ["env.kwargs.reset_noise_scale=0.01", "env.kwargs.frame_skip=2"])
    assert cfg.env.kwargs == {"reset_noise_scale": 0.01, "frame_skip": 2}     # real parameters pass
    from diffgym.cli import main
    run_dir = tmp_path / "run"
    assert main(["train", "cartpole_shac.yaml", "env.id=DiffNope-v0", "--run-dir", str(run_dir)]) == 2
    assert "env.id: unknown environment 'DiffNope-v0'" in capsys.readouterr().err
    # a value the environment's constructor rejects: found by building it, still before the directory
    assert main(["train", "cartpole_shac.yaml", *TINY["shac"], "env.kwargs.frame_skip=0",
                 "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "env.kwargs: DiffCartPole-v0 rejects {'frame_skip': 0" in err and "frame_skip must be >= 1" in err
    assert not run_dir.exists()


# -- 5. the progress bar -------------------------------------------------------------------------
@pytest.mark.parametrize("algo,total,expected", [("shac", 20, 24), ("ppo", 40, 48)])
def test_progress_bar_total_is_the_steps_run(algo, total, expected, tmp_path):
    """total_env_steps not a multiple of an iteration: the bar's total is the steps the whole
    iterations take, and the count ends exactly there, fresh and resumed."""
    from diffgym.train import ppo, shac
    fn = shac.train_shac if algo == "shac" else ppo.train_ppo
    cfg = load_config(f"cartpole_{algo}.yaml", TINY[algo] + [f"total_env_steps={total}"])
    run = Run(cfg, str(tmp_path))
    out = fn(cfg, run)
    bar = run.last_progress
    assert out["env_steps"] == expected
    assert bar.total_at_start == bar.total == bar.n == expected
    cfg2 = load_config(f"cartpole_{algo}.yaml", TINY[algo] + [f"total_env_steps={total + 20}"])
    run = Run(cfg2, str(tmp_path), resume=True)
    out = fn(cfg2, run)
    bar = run.last_progress
    assert bar.total_at_start == bar.total == bar.n == out["env_steps"] and bar.n > expected


def test_progress_bar_times_from_the_end_of_the_first_iteration(capsys):
    from diffgym.train.run import Progress
    bar = Progress(100, 0, "x")
    assert "first iteration" in str(bar._bar) and "step/s" not in str(bar._bar)
    t_open = bar._bar.start_t
    time.sleep(0.05)                # the one-time work of a first iteration
    t_done = time.time()
    bar.update(10)
    bar.update(10)
    assert bar._bar.n == 20 and bar._bar.initial == 10           # the rate counts from step 10 ...
    assert bar._bar.start_t >= t_done > t_open                   # ... and from the end of the first update
    assert "step/s" in str(bar._bar) and bar.n == 20
    bar.close()
