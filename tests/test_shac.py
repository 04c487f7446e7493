"""SHAC (diffgym.train.shac): the actor loss and its gradient, TD(lambda) targets, a smoke run
from the shipped cart-pole config, and exact resume from a checkpoint."""
from __future__ import annotations

import csv
import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import diffgym  # noqa: E402
from diffgym.torch_bridge import TorchVecEnv  # noqa: E402
from diffgym.train import shac  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE_YAML = os.path.join(ROOT, "configs", "cartpole_shac.yaml")


# ---------------------------------------------------------------------------------------------
# The actor loss: value and gradient in a tiny float64 setting
# ---------------------------------------------------------------------------------------------
def _tiny(episode_steps: int, horizon: int = 4, seed: int = 3, **window_kwargs):
    torch.manual_seed(seed)
    venv = diffgym.make_vec("DiffCartPole-v0", num_envs=2, seed=seed, episode_steps=episode_steps)
    tenv = TorchVecEnv(venv, dtype=torch.float64)
    obs = tenv.reset(seed=seed)
    actor = shac.Actor(tenv.obs_dim, tenv.act_dim, [8]).double()
    critic = shac.Critic(tenv.obs_dim, [8]).double().requires_grad_(False)
    rms = shac.RunningMeanStd(tenv.obs_dim)
    rms.update(obs + 0.1 * torch.randn(5, 2, tenv.obs_dim, dtype=torch.float64))
    snap = shac._env_snapshot(venv)

    def loss_fn(deterministic=False):
        shac._env_restore(venv, snap)
        tenv.detach()
        gen = torch.Generator().manual_seed(11)
        return shac.rollout_window(tenv, obs, actor, critic, rms, horizon, 0.9, gen,
                                   deterministic=deterministic, **window_kwargs)
    return venv, tenv, obs, actor, critic, rms, loss_fn


@pytest.mark.parametrize("episode_steps,bound_coef", [(100, 0.0), (3, 0.0), (3, 0.5)])
def test_actor_gradient_matches_finite_differences(episode_steps, bound_coef):
    """episode_steps=3: an episode is truncated inside the 4-step window (bootstrap through
    final_obs, then a fresh episode); bound_coef with a large output layer: the bound penalty."""
    venv, tenv, obs, actor, critic, rms, loss_fn = _tiny(episode_steps, reward_scale=0.5,
                                                         bound_coef=bound_coef)
    if bound_coef:
        with torch.no_grad():
            actor.mu[-1].weight.mul_(20.0)
            assert float(actor(rms.normalize(obs))[1].abs().max()) > 1.0   # the penalty is active
    win = loss_fn()
    assert bool(win.dones.any()) == (episode_steps == 3)
    actor.zero_grad()
    win.actor_loss.backward()
    grads = [p.grad for p in actor.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(float(g.abs().max()) > 0 for g in grads), "every actor parameter must get a gradient"

    # central differences on one weight of the first layer, one output bias and the log-std
    checks = [(actor.mu[0].weight, (3, 2)), (actor.mu[-1].bias, (0,)), (actor.log_std, (0,))]
    for param, idx in checks:
        analytic = float(param.grad[idx])
        eps = 1e-6
        with torch.no_grad():
            param[idx] += eps
            lp = float(loss_fn().actor_loss)
            param[idx] -= 2 * eps
            lm = float(loss_fn().actor_loss)
            param[idx] += eps
        fd = (lp - lm) / (2 * eps)
        assert analytic == pytest.approx(fd, rel=1e-4, abs=1e-8), (param.shape, idx, analytic, fd)


def test_actor_loss_value_matches_a_plain_rollout():
    """-(sum gamma^t r_t + gamma^h V(s_h)) / (h N): at a truncation inside the window the sum
    stops there, bootstrapped from V(final_obs), and the next episode starts a new sum."""
    gamma, h, E = 0.9, 4, 3
    venv, tenv, obs, actor, critic, rms, loss_fn = _tiny(E, horizon=h)
    snap = shac._env_snapshot(venv)
    win = loss_fn(deterministic=True)
    assert win.dones[E - 1].all() and not win.dones[:E - 1].any()
    # replay with the plain numpy vector step (no torch graph) and the same policy
    shac._env_restore(venv, snap)
    with torch.no_grad():
        def pol(o):
            return actor(rms.normalize(torch.as_tensor(o)))[0].numpy()

        def V(o):
            return critic(rms.normalize(torch.as_tensor(o))).numpy()
        o = obs.numpy()
        ret, disc, total = np.zeros(2), np.ones(2), 0.0
        for t in range(h):
            o, r, te, tr, info = venv.step(pol(o))
            ret += disc * r
            ends = (te | tr) if t < h - 1 else np.ones(2, bool)
            boot = np.where(te, 0.0, V(info["final_obs"]))
            total += float(np.sum((ret + disc * gamma * boot)[ends]))
            disc = np.where(te | tr, 1.0, disc * gamma)
            ret = np.where(te | tr, 0.0, ret)
    assert float(win.actor_loss.detach()) == pytest.approx(-total / (h * 2), rel=1e-9)


def test_td_lambda_targets_limits():
    g = 0.9
    r = torch.tensor([[1.0], [2.0], [3.0]])
    v = torch.tensor([[10.0], [20.0], [30.0]])       # V(s_{t+1})
    d = torch.zeros(3, 1, dtype=torch.bool)
    # lambda = 0: one-step targets
    assert torch.allclose(shac.td_lambda_targets(r, v, d, g, 0.0), r + g * v)
    # lambda = 1: Monte-Carlo returns bootstrapped at the window end
    mc = torch.tensor([[1 + g * 2 + g * g * 3 + g ** 3 * 30], [2 + g * 3 + g * g * 30], [3 + g * 30]])
    assert torch.allclose(shac.td_lambda_targets(r, v, d, g, 1.0), mc)
    # an episode end at t = 0 cuts the return there (v[0] is its bootstrap, 0 if terminated)
    d[0] = True
    out = shac.td_lambda_targets(r, v, d, g, 1.0)
    assert float(out[0]) == pytest.approx(1 + g * 10)
    assert float(out[1]) == pytest.approx(float(mc[1]))
    lam = 0.5
    out = shac.td_lambda_targets(r, v, torch.zeros(3, 1, dtype=torch.bool), g, lam)
    G2 = 3 + g * 30
    G1 = 2 + g * ((1 - lam) * 20 + lam * G2)
    G0 = 1 + g * ((1 - lam) * 10 + lam * G1)
    assert torch.allclose(out[:, 0], torch.tensor([G0, G1, G2]))


def test_running_mean_std_matches_numpy():
    rms = shac.RunningMeanStd(3)
    rng = np.random.default_rng(0)
    chunks = [rng.normal(2.0, 3.0, size=(n, 3)) for n in (7, 50, 13)]
    for c in chunks:
        rms.update(torch.as_tensor(c))
    allx = np.concatenate(chunks)
    assert np.allclose(rms.mean.numpy(), allx.mean(0), atol=1e-4)
    assert np.allclose(rms.var.numpy(), allx.var(0), rtol=1e-3)


# ---------------------------------------------------------------------------------------------
# Training runs from the shipped config: smoke run and exact resume
# ---------------------------------------------------------------------------------------------
def _load(tmp_path, name, *overrides):
    from diffgym.train.config import load_config
    return load_config(CARTPOLE_YAML, [
        "env.num_envs=4", "shac.horizon=8", "shac.critic_iterations=2", "shac.critic_minibatches=2",
        "eval_episodes=1", "gif=false", "log_every=1", "seed=7",
        f"run_dir={tmp_path / name}", *overrides])


def _rows(run_dir):
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


def test_smoke_run_logs_finite_metrics_and_checkpoints(tmp_path):
    from diffgym.train.run import Run
    # 10 iterations of 4 envs x 8 steps with 30-step episodes: episodes end inside windows
    cfg = _load(tmp_path, "smoke", "total_env_steps=320", "checkpoint_every=5", "env.episode_steps=30")
    out = shac.train_shac(cfg, Run(cfg, cfg.run_dir, resume=False))
    assert out["iterations"] == 10 and out["env_steps"] == 320
    rows = _rows(cfg.run_dir)
    assert [int(r["iteration"]) for r in rows] == list(range(1, 11))
    assert [int(r["env_steps"]) for r in rows] == [32 * k for k in range(1, 11)]
    for key in ("actor_loss", "value_loss", "grad_norm", "steps_per_s", "action_std"):
        vals = [float(r[key]) for r in rows]
        assert all(math.isfinite(v) for v in vals), (key, vals)
    assert all(float(r["steps_per_s"]) > 0 for r in rows)
    returns = [float(r["episode_return"]) for r in rows if r["episode_return"] not in ("", "nan")]
    assert len(returns) >= 2 and all(math.isfinite(v) and v < 0 for v in returns)
    assert sum(int(r["episodes"]) for r in rows) == 4 * (320 // 4 // 30)   # 10 episodes of 30 steps
    # the critic fits its targets: the value loss falls from its first value
    assert float(rows[-1]["value_loss"]) < float(rows[0]["value_loss"])
    # resuming with a different number of environments is refused with a clear message
    bad = _load(tmp_path, "smoke", "total_env_steps=320", "env.num_envs=2")
    with pytest.raises(ValueError, match="env.num_envs is 2"):
        shac.train_shac(bad, Run(bad, bad.run_dir, resume=True))


class _Killed(Exception):
    pass


def test_resume_continues_exactly(tmp_path):
    from diffgym.train.run import Run
    over = ("total_env_steps=192", "checkpoint_every=2", "env.episode_steps=20")   # 6 iterations
    cfg = _load(tmp_path, "full", *over)
    shac.train_shac(cfg, Run(cfg, cfg.run_dir, resume=False))
    full = _rows(cfg.run_dir)

    cfg2 = _load(tmp_path, "killed", *over)
    run = Run(cfg2, cfg2.run_dir, resume=False)
    log = run.log

    def dying_log(env_steps, **m):          # the process dies during iteration 5
        if m["iteration"] == 5:
            raise _Killed
        log(env_steps, **m)
    run.log = dying_log
    with pytest.raises(_Killed):
        shac.train_shac(cfg2, run)
    shac.train_shac(cfg2, Run(cfg2, cfg2.run_dir, resume=True))   # resumes from iteration 4
    resumed = [r for r in _rows(cfg2.run_dir) if int(r["iteration"]) >= 5]
    assert [int(r["iteration"]) for r in resumed] == [5, 6]
    for a, b in zip(full[4:], resumed):
        for key in ("env_steps", "episode_return", "actor_loss", "value_loss", "grad_norm", "action_std"):
            assert a[key] == b[key], (key, a[key], b[key])
    # and the final networks, optimizers and normalizer are bitwise the same
    ck_full = Run(cfg, cfg.run_dir, resume=True).load_checkpoint()
    ck_res = Run(cfg2, cfg2.run_dir, resume=True).load_checkpoint()
    assert ck_full["iteration"] == ck_res["iteration"] == 6
    for part in ("actor", "critic", "target_critic"):
        for k, v in ck_full[part].items():
            assert torch.equal(v, ck_res[part][k]), (part, k)
    assert torch.equal(ck_full["obs_rms"]["mean"], ck_res["obs_rms"]["mean"])
    for a, b in zip(ck_full["env"], ck_res["env"]):          # every copy's snapshot
        assert np.array_equal(a["state"], b["state"]) and a["elapsed"] == b["elapsed"]
        assert a["np_random"] == b["np_random"]
        wa, wb = a["warm_start"], b["warm_start"]
        assert (wa is None) == (wb is None)
        if wa is not None:
            assert all(np.array_equal(x, y) for x, y in zip(wa, wb))
