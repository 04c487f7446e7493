"""SHAC: Short-Horizon Actor-Critic (Xu et al., ICLR 2022) on diffgym's differentiable environments.

One file, read top to bottom like a CleanRL script: the networks, the observation normalizer,
one short-horizon differentiable rollout (the actor loss), the critic's TD(lambda) targets, and
the training loop with logging, checkpoints and exact resume.

The method. N environments run in parallel. Each iteration unrolls the policy for ``horizon``
steps through :class:`diffgym.torch_bridge.TorchVecEnv`, whose backward pass multiplies by the
simulator's analytical step Jacobians, and minimizes

    L_actor = -1/(h N) sum_envs [ sum_{t<h} gamma^t r_t  +  gamma^h V_target(s_h) ]

by backpropagating through the dynamics, the rewards and the (frozen) target critic. A window is
cut short per environment where its episode ends: at a done row the sum stops there, bootstrapped
from ``V_target(info["final_obs"])`` when the episode was truncated (time limit) and not at all
when it terminated (a real end, or a diverged simulation); the next episode starts a new sum
without history. The critic V is then regressed onto TD(lambda) targets computed from the window
(rewards, done flags and target-critic values, all detached) for ``critic_iterations`` passes of
``critic_minibatches`` shuffled minibatches, and the target critic follows it by Polyak averaging
``target <- alpha * target + (1 - alpha) * critic``. The graph is cut (``tenv.detach()``) at every
window start: gradients never flow further back than ``horizon`` steps, which is what keeps them
usable on long episodes with stiff contact.

The actor is the one of the SHAC paper's code (``ActorStochasticMLP``): an MLP (ELU + LayerNorm)
giving the mean ``mu(obs)`` and a state-independent learned ``log_std`` (initialised at -1).
Training acts with ``tanh(mu + std * eps)``, eps ~ N(0, I) (the reparameterization trick, so the
noise scale is learned by the same first-order gradient); evaluation acts with ``tanh(mu)``.
There is no entropy term and no likelihood: SHAC never needs log-probabilities.

Two knobs beyond the paper's, both off by default (so the defaults are the published SHAC):
``reward_scale`` multiplies the rewards inside SHAC (the SHAC code's ``rew_scale``; it keeps the
critic's targets O(1) so it can follow them at its learning rate; logged returns stay unscaled),
and ``bound_coef`` adds ``bound_coef * mean(max(|mu| - 1, 0)^2)`` to the actor loss (rl_games'
"bounds loss"). The second matters on stiff, hard-limited systems: a saturated tanh and a cart
pressed against a hard rail stop both have zero derivative, so once the actor pushes its mean
deep into saturation the first-order gradient can never bring it back; the penalty does.

Observations are normalized by running mean/std statistics (float64), updated after every window
with the observations it produced and frozen inside a window, so that the normalization is a
fixed affine map the gradient flows through. Adam uses betas (0.7, 0.95); learning rates decay
linearly to 1e-5 at the last iteration (``lr_schedule: linear``) or stay constant; actor and
critic gradients are clipped to ``grad_norm`` (the pre-clip norm is logged). An actor gradient
that is not finite (a simulation blew up inside the window) skips that actor step and is counted
in ``nonfinite_grads``.

Logged every ``log_every`` iterations through ``run.log``: ``episode_return`` (mean undiscounted
return of the episodes finished since the last row; empty when none finished), ``episode_length``,
``episodes``, ``actor_loss``, ``value_loss``, ``grad_norm``, ``actor_lr``, ``critic_lr``,
``action_std``, ``steps_per_s`` (environment steps per second of wall-clock) and
``nonfinite_grads``.

A checkpoint holds everything the next iteration depends on: networks, optimizers, normalizer,
the RNG states (torch generator, global torch/numpy/random, every environment's reset RNG), the
environment states, episode clocks and running returns, the current observations and the
counters, so ``--resume`` continues the run exactly as if it had never stopped. (Saving a
checkpoint also clears the contact solver's warm start, in both the saved and the resumed run,
because a warm start is not part of the state.)
"""
from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn as nn

import diffgym
from diffgym.torch_bridge import TorchVecEnv

if TYPE_CHECKING:                      # config.py and run.py belong to the training package
    from .config import TrainConfig
    from .run import Run

MIN_LR = 1e-5                           # the linear schedule ends here (as in the SHAC code)


# --------------------------------------------------------------------------------------------
# Networks and observation normalization
# --------------------------------------------------------------------------------------------
def mlp(sizes: list[int], out_dim: int) -> nn.Sequential:
    """Linear -> ELU -> LayerNorm for each hidden size, then a linear output (the SHAC MLPs)."""
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ELU(), nn.LayerNorm(b)]
    layers.append(nn.Linear(sizes[-1], out_dim))
    return nn.Sequential(*layers)


class Actor(nn.Module):
    """Gaussian policy in pre-tanh space: mean from an MLP, learned state-independent log-std."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int], log_std_init: float = -1.0):
        super().__init__()
        self.mu = mlp([obs_dim, *hidden], act_dim)
        self.log_std = nn.Parameter(torch.full((act_dim,), float(log_std_init)))

    def forward(self, obs_n: torch.Tensor, noise: torch.Tensor | None = None):
        """(action in [-1, 1], pre-tanh mean): tanh(mu + std * noise); ``noise=None`` acts with
        the deterministic mean tanh(mu)."""
        mu = self.mu(obs_n)
        return torch.tanh(mu if noise is None else mu + self.log_std.exp() * noise), mu


class Critic(nn.Module):
    def __init__(self, obs_dim: int, hidden: list[int]):
        super().__init__()
        self.v = mlp([obs_dim, *hidden], 1)

    def forward(self, obs_n: torch.Tensor) -> torch.Tensor:
        return self.v(obs_n).squeeze(-1)


class RunningMeanStd:
    """Running mean and variance (float64, parallel-update formula of Chan et al.)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        self.mean = torch.zeros(dim, dtype=torch.float64)
        self.var = torch.ones(dim, dtype=torch.float64)
        self.count = 1e-4
        self.eps = eps

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().to(torch.float64).reshape(-1, self.mean.numel())
        b_mean, b_var, b_n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, tot = b_mean - self.mean, self.count + b_n
        m2 = self.var * self.count + b_var * b_n + delta.square() * self.count * b_n / tot
        self.mean, self.var, self.count = self.mean + delta * b_n / tot, m2 / tot, tot

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x - mean) / std: an affine map with constant statistics, differentiable in x."""
        mean, std = self.mean.to(x.dtype), (self.var + self.eps).sqrt().to(x.dtype)
        return (x - mean) / std

    def state_dict(self) -> dict:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count}

    def load_state_dict(self, d: dict) -> None:
        self.mean, self.var, self.count = d["mean"].clone(), d["var"].clone(), float(d["count"])


# --------------------------------------------------------------------------------------------
# One short-horizon window: the differentiable actor loss and the critic's data
# --------------------------------------------------------------------------------------------
@dataclass
class Window:
    """What a window leaves behind (all detached except ``actor_loss``)."""
    actor_loss: torch.Tensor     # scalar, differentiable in the actor parameters
    obs_n: torch.Tensor          # (h, N, n_obs) normalized observations the actor acted on
    rewards: torch.Tensor        # (h, N) rewards times reward_scale
    dones: torch.Tensor          # (h, N) bool: the episode ended at this step (terminated|truncated)
    next_values: torch.Tensor    # (h, N) V_target of the next state; 0 where terminated
    new_obs: torch.Tensor        # (h, N, n_obs) raw observations returned by each step
    last_obs: torch.Tensor       # (N, n_obs) the observation to start the next window from


def rollout_window(tenv: TorchVecEnv, obs: torch.Tensor, actor: Actor, target_critic: Critic,
                   obs_rms: RunningMeanStd | None, horizon: int, gamma: float,
                   generator: torch.Generator | None, deterministic: bool = False,
                   reward_scale: float = 1.0, bound_coef: float = 0.0) -> Window:
    """Unroll ``horizon`` steps from the current env state and build the SHAC actor loss.

    ``tenv.detach()`` must have been called (the graph starts at the current state). ``obs_rms``
    is used frozen. The exploration noise comes from ``generator`` (reproducible windows).
    """
    N, dtype = tenv.num_envs, tenv.dtype
    norm = (lambda o: obs_rms.normalize(o)) if obs_rms is not None else (lambda o: o)  # noqa: E731
    ret = torch.zeros(N, dtype=dtype)       # discounted return since the window/episode start
    disc = torch.ones(N, dtype=dtype)       # gamma^(steps since the window/episode start)
    loss = torch.zeros((), dtype=dtype)
    bound = torch.zeros((), dtype=dtype)
    obs_buf, rew_buf, done_buf, nv_buf, new_obs_buf = [], [], [], [], []
    for t in range(horizon):
        obs_n = norm(obs)
        noise = None
        if not deterministic:
            noise = torch.randn((N, tenv.act_dim), generator=generator, dtype=dtype)
        action, mu = actor(obs_n, noise)
        if bound_coef:              # pull the pre-tanh mean back inside [-1, 1] (no saturation)
            bound = bound + (mu.abs() - 1.0).clamp_min(0.0).square().sum()
        obs, rew, term, trunc, info = tenv.step(action)
        rew = rew * reward_scale
        done = term | trunc
        # value of the state this step reached: the terminal obs for done rows; none if terminated
        v_next = target_critic(norm(info["final_obs"]))
        v_next = torch.where(term, torch.zeros_like(v_next), v_next)
        ret = ret + disc * rew
        ends = torch.ones_like(done) if t == horizon - 1 else done
        if ends.any():
            loss = loss - torch.where(ends, ret + disc * gamma * v_next, torch.zeros_like(ret)).sum()
        disc = torch.where(done, torch.ones_like(disc), disc * gamma)
        ret = torch.where(done, torch.zeros_like(ret), ret)
        obs_buf.append(obs_n.detach())
        rew_buf.append(rew.detach())
        done_buf.append(done)
        nv_buf.append(v_next.detach())
        new_obs_buf.append(obs.detach())
    return Window(actor_loss=(loss + bound_coef * bound) / (horizon * N), obs_n=torch.stack(obs_buf),
                  rewards=torch.stack(rew_buf), dones=torch.stack(done_buf),
                  next_values=torch.stack(nv_buf), new_obs=torch.stack(new_obs_buf),
                  last_obs=obs.detach())


def td_lambda_targets(rewards: torch.Tensor, next_values: torch.Tensor, dones: torch.Tensor,
                      gamma: float, lam: float) -> torch.Tensor:
    """TD(lambda) returns (h, N): G_t = r_t + gamma ((1 - lam) V_{t+1} + lam G_{t+1}), with
    G_{t+1} replaced by V_{t+1} at the window end and where the episode ended (``next_values``
    are already 0 where it terminated)."""
    h = rewards.shape[0]
    targets = torch.empty_like(rewards)
    G = next_values[h - 1]
    for t in reversed(range(h)):
        if t < h - 1:
            G = torch.where(dones[t], next_values[t], (1.0 - lam) * next_values[t] + lam * G)
        else:
            G = next_values[t]
        G = rewards[t] + gamma * G
        targets[t] = G
    return targets


# --------------------------------------------------------------------------------------------
# Bookkeeping helpers: episode statistics and exact environment snapshots
# --------------------------------------------------------------------------------------------
def _env_snapshot(venv) -> list[dict]:
    """Everything an environment copy carries between steps (state, episode clock, reset RNG,
    contact warm start)."""
    return venv.snapshot()


def _env_restore(venv, snap) -> None:
    if isinstance(snap, dict):     # (checkpoints written before per-copy snapshots)
        snap = [{"state": x, "elapsed": el, "np_random": rng}
                for x, el, rng in zip(snap["state"], snap["elapsed"], snap["np_random"])]
    venv.restore(snap)


def _lr_at(base: float, iteration: int, total: int, schedule: str) -> float:
    if schedule == "constant":
        return base
    frac = min(iteration / max(total, 1), 1.0)
    return base + (min(MIN_LR, base) - base) * frac


# --------------------------------------------------------------------------------------------
# The training loop
# --------------------------------------------------------------------------------------------
def train_shac(cfg: "TrainConfig", run: "Run") -> dict:
    sc = cfg.shac
    if sc.horizon < 1:
        raise ValueError(f"shac.horizon must be >= 1, got {sc.horizon}")
    if sc.lr_schedule not in ("linear", "constant"):
        raise ValueError(f"shac.lr_schedule must be 'linear' or 'constant', got {sc.lr_schedule!r}")
    if not 0.0 <= sc.target_alpha <= 1.0:
        raise ValueError(f"shac.target_alpha must be in [0, 1], got {sc.target_alpha}")
    if sc.critic_minibatches < 1 or sc.critic_iterations < 0:
        raise ValueError("shac.critic_minibatches must be >= 1 and shac.critic_iterations >= 0, got "
                         f"{sc.critic_minibatches} and {sc.critic_iterations}")
    if not sc.reward_scale > 0.0:
        raise ValueError(f"shac.reward_scale must be > 0, got {sc.reward_scale}")
    if cfg.device != "cpu":
        raise ValueError(f"device must be 'cpu' for SHAC (the simulator runs on the CPU), got {cfg.device!r}")
    torch.set_num_threads(1)            # tiny networks: threads cost more than they give
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    # ---- environments -------------------------------------------------------------------
    env_kwargs = dict(cfg.env.kwargs or {})
    if cfg.env.episode_steps is not None:
        env_kwargs["episode_steps"] = cfg.env.episode_steps
    env_kwargs["gradient"] = cfg.shac.gradient          # (config validation: no contradiction)
    venv = diffgym.make_vec(cfg.env.id, num_envs=cfg.env.num_envs, seed=cfg.seed,
                            num_workers=cfg.env.num_workers, **env_kwargs)
    tenv = TorchVecEnv(venv, dtype=torch.float32)
    N, h = tenv.num_envs, int(sc.horizon)
    steps_per_iter = N * h
    total_iters = max(1, math.ceil(cfg.total_env_steps / steps_per_iter))
    batch = steps_per_iter // sc.critic_minibatches
    if batch < 1:
        raise ValueError(f"shac.critic_minibatches={sc.critic_minibatches} exceeds the "
                         f"{steps_per_iter} samples of a window (num_envs * horizon)")

    # ---- networks, optimizers, normalizer, noise -----------------------------------------
    actor = Actor(tenv.obs_dim, tenv.act_dim, list(sc.actor_mlp), sc.actor_log_std_init)
    critic = Critic(tenv.obs_dim, list(sc.critic_mlp))
    target_critic = copy.deepcopy(critic).requires_grad_(False)
    betas = tuple(float(b) for b in sc.betas)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=sc.actor_lr, betas=betas)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=sc.critic_lr, betas=betas)
    obs_rms = RunningMeanStd(tenv.obs_dim) if sc.obs_norm else None
    gen = torch.Generator().manual_seed(cfg.seed)        # exploration noise and minibatch order

    iteration, env_steps, wall_offset = 0, 0, 0.0
    ep_ret = np.zeros(N)
    ep_len = np.zeros(N, dtype=np.int64)
    ckpt = run.load_checkpoint()                     # None unless run.resume and one exists
    if ckpt is None:
        obs = tenv.reset(seed=cfg.seed)
        if obs_rms is not None:
            obs_rms.update(obs)
    else:
        from .run import CheckpointMismatchError
        if ckpt.get("algo") != "shac":
            raise CheckpointMismatchError(f"--resume: the checkpoint in {run.dir} is not a SHAC checkpoint "
                                          f"(algo {ckpt.get('algo')!r})")
        try:
            env_snap = ckpt["env"]
            n_ck = len(env_snap["state"]) if isinstance(env_snap, dict) else len(env_snap)
        except (KeyError, TypeError) as exc:
            raise CheckpointMismatchError(f"--resume {run.dir}: the checkpoint has no environment "
                                          f"snapshot ({exc})") from None
        if n_ck != N:
            raise CheckpointMismatchError(f"--resume: the checkpoint holds {n_ck} environments, "
                                          f"env.num_envs is {N}")
        try:
            tenv.reset(seed=cfg.seed)
            _env_restore(venv, ckpt["env"])
            obs = ckpt["obs"].clone()
            actor.load_state_dict(ckpt["actor"])
            critic.load_state_dict(ckpt["critic"])
            target_critic.load_state_dict(ckpt["target_critic"])
            actor_opt.load_state_dict(ckpt["actor_opt"])
            critic_opt.load_state_dict(ckpt["critic_opt"])
            if obs_rms is not None:
                obs_rms.load_state_dict(ckpt["obs_rms"])
            gen.set_state(ckpt["rng"]["generator"])
            torch.set_rng_state(ckpt["rng"]["torch"])
            np.random.set_state(ckpt["rng"]["numpy"])
            random.setstate(ckpt["rng"]["python"])
            ep_ret = np.array(ckpt["ep_ret"], dtype=np.float64).reshape(N)
            ep_len = np.array(ckpt["ep_len"], dtype=np.int64).reshape(N)
            iteration, env_steps = int(ckpt["iteration"]), int(ckpt["env_steps"])
            wall_offset = float(ckpt.get("wall_time", 0.0))
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise CheckpointMismatchError(f"--resume {run.dir}: the checkpoint does not fit this run "
                                          f"(config {cfg.env.id}, networks {list(sc.actor_mlp)} / "
                                          f"{list(sc.critic_mlp)}): {type(exc).__name__}: {first}") from None

    def save_checkpoint() -> None:
        # a warm start is not state: clear it so the resumed run sees the same solver inputs
        venv.set_state(venv.get_state())
        run.save_checkpoint({
            "algo": "shac", "iteration": iteration, "env_steps": env_steps,
            "wall_time": wall_offset + time.perf_counter() - t_start,
            "actor": actor.state_dict(), "critic": critic.state_dict(),
            "target_critic": target_critic.state_dict(),
            "actor_opt": actor_opt.state_dict(), "critic_opt": critic_opt.state_dict(),
            "obs_rms": obs_rms.state_dict() if obs_rms is not None else None,
            "rng": {"generator": gen.get_state(), "torch": torch.get_rng_state(),
                    "numpy": np.random.get_state(), "python": random.getstate()},
            "env": _env_snapshot(venv), "obs": obs.clone(),
            "ep_ret": ep_ret.copy(), "ep_len": ep_len.copy()}, iteration)

    # ---- loop -----------------------------------------------------------------------------
    finished_ret: list[float] = []
    finished_len: list[int] = []
    last_metrics: dict = {}
    nonfinite = 0
    t_start = time.perf_counter()
    t_log, steps_log = t_start, env_steps
    # the bar counts whole iterations (the last may pass total_env_steps), from the resumed count
    with run.progress(total_iters * steps_per_iter) as bar:
        while iteration < total_iters:
            actor_lr = _lr_at(sc.actor_lr, iteration, total_iters, sc.lr_schedule)
            critic_lr = _lr_at(sc.critic_lr, iteration, total_iters, sc.lr_schedule)
            for g in actor_opt.param_groups:
                g["lr"] = actor_lr
            for g in critic_opt.param_groups:
                g["lr"] = critic_lr

            # actor: one differentiable window, one gradient step
            tenv.detach()
            win = rollout_window(tenv, obs, actor, target_critic, obs_rms, h, sc.gamma, gen,
                                 reward_scale=sc.reward_scale, bound_coef=sc.bound_coef)
            actor_opt.zero_grad(set_to_none=True)
            win.actor_loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(actor.parameters(), sc.grad_norm)
            if torch.isfinite(grad_norm):
                actor_opt.step()
            else:
                nonfinite += 1
            obs = win.last_obs
            tenv.state = tenv.state.detach()          # free the window's graph
            if obs_rms is not None:
                obs_rms.update(win.new_obs)

            # critic: TD(lambda) targets from the target critic, minibatch regression
            targets = td_lambda_targets(win.rewards, win.next_values, win.dones, sc.gamma, sc.lam)
            X, Y = win.obs_n.reshape(steps_per_iter, -1), targets.reshape(steps_per_iter)
            value_loss = float("nan")
            for _ in range(sc.critic_iterations):
                perm = torch.randperm(steps_per_iter, generator=gen)
                losses = []
                for k in range(sc.critic_minibatches):
                    idx = perm[k * batch:(k + 1) * batch]
                    loss_v = (critic(X[idx]) - Y[idx]).square().mean()
                    critic_opt.zero_grad(set_to_none=True)
                    loss_v.backward()
                    nn.utils.clip_grad_norm_(critic.parameters(), sc.grad_norm)
                    critic_opt.step()
                    losses.append(loss_v.item())
                value_loss = float(np.mean(losses))
            with torch.no_grad():
                for p_t, p in zip(target_critic.parameters(), critic.parameters()):
                    p_t.mul_(sc.target_alpha).add_((1.0 - sc.target_alpha) * p)

            # episode statistics (undiscounted), counters
            R, D = win.rewards.double().numpy() / sc.reward_scale, win.dones.numpy()
            for t in range(h):
                ep_ret += R[t]
                ep_len += 1
                for i in np.flatnonzero(D[t]):
                    finished_ret.append(float(ep_ret[i]))
                    finished_len.append(int(ep_len[i]))
                    ep_ret[i], ep_len[i] = 0.0, 0
            iteration += 1
            env_steps += steps_per_iter
            bar.update(steps_per_iter)

            if iteration % max(1, cfg.log_every) == 0 or iteration == total_iters:
                now = time.perf_counter()
                last_metrics = {
                    "iteration": iteration,
                    "episode_return": float(np.mean(finished_ret)) if finished_ret else float("nan"),
                    "episode_length": float(np.mean(finished_len)) if finished_len else float("nan"),
                    "episodes": len(finished_ret),
                    "actor_loss": float(win.actor_loss.item()), "value_loss": value_loss,
                    "grad_norm": float(grad_norm), "actor_lr": actor_lr, "critic_lr": critic_lr,
                    "action_std": float(actor.log_std.detach().exp().mean()),
                    "steps_per_s": (env_steps - steps_log) / max(now - t_log, 1e-9),
                    "nonfinite_grads": nonfinite,
                }
                run.log(env_steps, **last_metrics)
                if finished_ret:
                    bar.set_postfix(ret=f"{last_metrics['episode_return']:.1f}")
                finished_ret, finished_len = [], []
                t_log, steps_log = now, env_steps
            if cfg.checkpoint_every and iteration % cfg.checkpoint_every == 0:
                save_checkpoint()
    if not (cfg.checkpoint_every and iteration % cfg.checkpoint_every == 0):
        save_checkpoint()
    venv.close()

    # ---- final evaluation with the deterministic mean action --------------------------------
    def policy_fn(o: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            x = torch.as_tensor(np.asarray(o, dtype=np.float64)[None], dtype=torch.float32)
            if obs_rms is not None:
                x = obs_rms.normalize(x)
            return actor(x)[0][0].double().numpy()

    result = run.finish(policy_fn)
    return {"iterations": iteration, "env_steps": env_steps,
            "wall_time": wall_offset + time.perf_counter() - t_start,
            "last": last_metrics, "eval": result}
