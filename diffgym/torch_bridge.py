"""A torch bridge: diffgym environments as differentiable functions of torch tensors.

    from diffgym.torch_bridge import TorchVecEnv
    tenv = TorchVecEnv(diffgym.make_vec("DiffCartPole-v0", 64, seed=0))
    obs = tenv.reset()
    for t in range(32):
        obs, rew, terminated, truncated, info = tenv.step(policy(obs))
        loss = loss - rew.sum()
    loss.backward()          # gradients for every action and for tenv.initial_state

The forward pass steps the simulator; the backward pass multiplies by the transposed analytical
step Jacobians (``step_with_jacobian``), never finite differences. The state is held as a tensor
of full coordinates ``x = [q, v, extra]``; gradients are carried between steps in tangent
coordinates (pinocchio's q (+) dq) and converted at the ends with the environment's tangent map
P (``x (+) dx = x + P dx``): an incoming gradient g on x becomes P^T g, and the gradient handed
to x is (P^+)^T g_t, which P^T maps back to g_t exactly. For models without quaternions (the
cart-pole, the hopper) P is the identity.

When an episode ends inside a window, that row's ``info["final_obs"]`` is the terminal
observation (with gradient), ``obs`` is the new reset observation, and the row's state restarts
without history. ``detach()`` cuts the graph for every row (the start of a new short-horizon
window in SHAC).
"""
from __future__ import annotations

import numpy as np
import torch

from .vector import DiffVectorEnv


class TorchVecEnv:
    """A :class:`DiffVectorEnv` seen from torch (CPU tensors of ``dtype``)."""

    def __init__(self, venv: DiffVectorEnv, dtype: torch.dtype = torch.float32):
        if not isinstance(venv, DiffVectorEnv):
            raise TypeError(f"TorchVecEnv needs a diffgym DiffVectorEnv (diffgym.make_vec), got "
                            f"{type(venv).__name__}")
        self.venv = venv
        self.dtype = dtype
        self.num_envs, self.obs_dim, self.act_dim = venv.num_envs, venv.obs_dim, venv.n_a
        self.state_size = venv.state_size
        self.state: torch.Tensor | None = None
        self.initial_state: torch.Tensor | None = None
        self._last = None

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs, _ = self.venv.reset(seed=seed)
        self._set_state_tensor(self.venv.get_state())
        return torch.as_tensor(obs, dtype=self.dtype)

    def _set_state_tensor(self, X: np.ndarray) -> None:
        self.state = torch.as_tensor(X, dtype=self.dtype).requires_grad_(True)
        self.initial_state = self.state

    def detach(self) -> None:
        """Cut the graph: later gradients stop at the current state (a new leaf tensor)."""
        self._set_state_tensor(self.venv.get_state())    # raises if the envs were never reset

    def _forward_numpy(self, a: np.ndarray):
        venv = self.venv
        P_in = venv.tangent_maps()
        obs, rew, term, trunc, info, jac = venv.step_with_jacobian(a)
        x_final = info["final_state"]
        P_out = np.stack([env.tangent_map(x) for env, x in zip(venv.envs, x_final)])
        self._last = (obs, term, trunc, info)
        return x_final, info["final_obs"], rew, jac, P_in, P_out

    def step(self, actions: torch.Tensor):
        if self.state is None:
            raise RuntimeError("TorchVecEnv: call reset() before step()")
        if not isinstance(actions, torch.Tensor):
            raise TypeError(f"actions must be a torch.Tensor, got {type(actions).__name__}")
        if tuple(actions.shape) != (self.num_envs, self.act_dim):
            raise ValueError(f"actions must have shape ({self.num_envs}, {self.act_dim}), "
                             f"got {tuple(actions.shape)}")
        if not torch.isfinite(actions).all():
            raise ValueError("actions contain NaN or inf")
        fn = _EnvStepFn(self)
        x_final, final_obs, rew = fn.apply(self.state, actions.to(self.dtype))
        obs_np, term, trunc, info = self._last
        done = term | trunc
        if done.any():
            # rows whose episode ended restart from their reset state, without history
            x_reset = torch.as_tensor(self.venv.get_state(), dtype=self.dtype)
            mask = torch.as_tensor(done)[:, None]
            self.state = torch.where(mask, x_reset, x_final)
            obs = torch.where(mask, torch.as_tensor(obs_np, dtype=self.dtype), final_obs)
        else:
            self.state, obs = x_final, final_obs
        out_info = {k: v for k, v in info.items() if k not in ("final_obs", "final_state")}
        out_info["final_obs"] = final_obs
        return (obs, rew, torch.as_tensor(term), torch.as_tensor(trunc), out_info)


def _EnvStepFn(bridge: TorchVecEnv):
    """A per-call autograd Function class closing over the bridge (keeps its dtype)."""

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, a):
            x_next, obs, rew, jac, P_in, P_out = bridge._forward_numpy(
                a.detach().cpu().numpy().astype(np.float64))
            ctx.jac, ctx.P_in, ctx.P_out = jac, P_in, P_out
            t = lambda arr: torch.as_tensor(np.asarray(arr), dtype=bridge.dtype)  # noqa: E731
            return t(x_next), t(obs), t(rew)

        @staticmethod
        def backward(ctx, g_xn, g_obs, g_r):
            g_x, g_a = step_vjp(ctx.jac, ctx.P_in, ctx.P_out,
                                g_xn.detach().double().numpy(), g_obs.detach().double().numpy(),
                                g_r.detach().double().numpy())
            return (torch.as_tensor(g_x, dtype=bridge.dtype), torch.as_tensor(g_a, dtype=bridge.dtype))

    return Fn


def step_vjp(jac, P_in, P_out, g_xn, g_obs, g_r):
    """Vector-Jacobian product of one batched step (see the module doc for the coordinates)."""
    gt = np.einsum("nij,ni->nj", P_out, g_xn) + np.einsum("noj,no->nj", jac.obs_state, g_obs)
    g_x_t = np.einsum("nij,ni->nj", jac.state_state, gt) + jac.reward_state * g_r[:, None]
    g_a = np.einsum("nij,ni->nj", jac.state_action, gt) + jac.reward_action * g_r[:, None]
    g_x = np.einsum("nji,nj->ni", _pinv_batched(P_in), g_x_t)
    return g_x, g_a


def _pinv_batched(P: np.ndarray) -> np.ndarray:
    """Pseudo-inverses (N, n_x, S) of tangent maps (N, S, n_x); the identity is common."""
    N, S, n = P.shape
    if S == n and np.array_equal(P, np.broadcast_to(np.eye(n), P.shape)):
        return P.copy()
    return np.linalg.pinv(P)
