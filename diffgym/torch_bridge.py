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
to x is (P^+)^T g_t = P (P^T P)^-1 g_t, which P^T maps back to g_t exactly. For models without
quaternions (the cart-pole, the hopper) P is [I; 0] and neither map is formed.

When an episode ends inside a window, that row's ``info["final_obs"]`` is the terminal
observation (with gradient), ``obs`` is the new reset observation, and the row's state restarts
without history. ``detach()`` cuts the graph for every row (the start of a new short-horizon
window in SHAC).

Cost. One autograd Function (:class:`_EnvStep`, defined once) per step; the vector env's
float64 outputs become tensors without a copy (``torch.from_numpy``; one cast for a float32
bridge); the backward pass is one batched matrix product per Jacobian block over all N copies
(numpy ``matmul`` on the step's float64 arrays). ``python -m diffgym bench --bridge`` measures
the whole bridge against the bare numpy chain of the same step Jacobians.
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
        # the gradient mode of the step Jacobians backward() applies (make_vec(..., gradient=...))
        self.gradient = venv.gradient
        self.num_envs, self.obs_dim, self.act_dim = venv.num_envs, venv.obs_dim, venv.n_a
        self.state_size = venv.state_size
        self.n_x = venv.n_x
        self.state: torch.Tensor | None = None
        self.initial_state: torch.Tensor | None = None
        self._identity = bool(getattr(venv, "identity_tangent", False))
        self._P_cache = None       # (venv.version, tangent maps at the venv's current state)
        self._last = None          # the numpy leftovers of the last forward step
        self._np_dtype = {torch.float64: np.dtype(np.float64), torch.float32: np.dtype(np.float32),
                          torch.float16: np.dtype(np.float16)}.get(dtype)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs, _ = self.venv.reset(seed=seed)
        self._set_state_tensor(self.venv.get_state())
        return self._tensor(obs)

    def _tensor(self, arr: np.ndarray) -> torch.Tensor:
        """A float64 numpy array as a tensor of the bridge's dtype (no copy for float64; the
        cast, if any, in numpy, which costs less than a torch op on arrays this small)."""
        if self._np_dtype is not None and arr.dtype != self._np_dtype:
            arr = arr.astype(self._np_dtype)
        t = torch.from_numpy(arr)
        return t if t.dtype == self.dtype else t.to(self.dtype)

    def _set_state_tensor(self, X: np.ndarray) -> None:
        self.state = self._tensor(X).requires_grad_(True)
        self.initial_state = self.state

    def detach(self) -> None:
        """Cut the graph: later gradients stop at the current state (a new leaf tensor)."""
        self._set_state_tensor(self.venv.get_state())    # raises if the envs were never reset

    def _tangent_maps_now(self) -> np.ndarray:
        """Tangent maps at the venv's current state, reusing those of the last step's end."""
        venv = self.venv
        if self._P_cache is not None and self._P_cache[0] == venv.version:
            return self._P_cache[1]
        return venv.tangent_maps()

    def step(self, actions: torch.Tensor):
        if self.state is None:
            raise RuntimeError("TorchVecEnv: call reset() before step()")
        if not isinstance(actions, torch.Tensor):
            raise TypeError(f"actions must be a torch.Tensor, got {type(actions).__name__}")
        if tuple(actions.shape) != (self.num_envs, self.act_dim):
            raise ValueError(f"actions must have shape ({self.num_envs}, {self.act_dim}), "
                             f"got {tuple(actions.shape)}")
        a = actions if actions.dtype == self.dtype else actions.to(self.dtype)
        # (non-finite actions are rejected by the vector env, naming the rows)
        x_final, final_obs, rew = _EnvStep.apply(self.state, a, self)
        obs_np, term, trunc, info = self._last
        self._last = None
        term_t, trunc_t = torch.from_numpy(term), torch.from_numpy(trunc)
        done = term | trunc
        if done.any():
            # rows whose episode ended restart from their reset state, without history
            x_reset = self._tensor(self.venv.get_state())
            mask = torch.from_numpy(done)[:, None]
            self.state = torch.where(mask, x_reset, x_final)
            obs = torch.where(mask, self._tensor(obs_np), final_obs)
        else:
            self.state, obs = x_final, final_obs
        out_info = {k: v for k, v in info.items() if k not in ("final_obs", "final_state")}
        out_info["final_obs"] = final_obs
        return obs, rew, term_t, trunc_t, out_info


class _EnvStep(torch.autograd.Function):
    """One batched environment step: (x, a) -> (x_next, obs_next, reward), with the analytical
    step Jacobians saved for the backward pass. ``bridge`` is the :class:`TorchVecEnv` (not a
    tensor, no gradient); the step's numpy leftovers go to ``bridge._last``."""

    @staticmethod
    def forward(ctx, x, a, bridge):
        venv = bridge.venv
        a_np = a.detach().numpy()
        if a_np.dtype != np.float64:
            a_np = a_np.astype(np.float64)
        P_in = None if bridge._identity else bridge._tangent_maps_now()
        obs, rew, term, trunc, info, jac = venv.step_with_jacobian(a_np)
        x_final = info["final_state"]
        P_out = None
        if not bridge._identity:
            P_out = venv.tangent_maps(x_final)
            done = term | trunc
            # the next step starts where this one ended, except in rows that were reset
            if done.any():
                P_next = P_out.copy()
                P_next[done] = venv.tangent_maps(venv.get_state()[done])
            else:
                P_next = P_out
            bridge._P_cache = (venv.version, P_next)
        ctx.jac, ctx.P_in, ctx.P_out = jac, P_in, P_out
        ctx.S, ctx.dtypes = bridge.state_size, (x.dtype, a.dtype)
        ctx.set_materialize_grads(False)
        bridge._last = (obs, term, trunc, info)
        return bridge._tensor(x_final), bridge._tensor(info["final_obs"]), bridge._tensor(rew)

    @staticmethod
    def backward(ctx, g_xn, g_obs, g_r):
        need_x, need_a = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (g_xn is None and g_obs is None and g_r is None) or not (need_x or need_a):
            return None, None, None
        g_x, g_a = step_vjp(ctx.jac, ctx.P_in, ctx.P_out, _as_numpy(g_xn), _as_numpy(g_obs),
                            _as_numpy(g_r), state_size=ctx.S, need_x=need_x, need_a=need_a)
        return _as_tensor(g_x, ctx.dtypes[0]), _as_tensor(g_a, ctx.dtypes[1]), None


_NP = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16}


def _as_numpy(g: torch.Tensor | None) -> np.ndarray | None:
    """An incoming gradient as float64 numpy (a view when it is float64 already)."""
    if g is None:
        return None
    if g.dtype in _NP:
        return g.detach().numpy().astype(np.float64, copy=False)
    return g.detach().to(torch.float64).numpy()


def _as_tensor(g: np.ndarray | None, dtype: torch.dtype) -> torch.Tensor | None:
    if g is None:
        return None
    if dtype in _NP:
        return torch.from_numpy(g.astype(_NP[dtype], copy=False))
    return torch.from_numpy(g).to(dtype)


def step_vjp(jac, P_in, P_out, g_xn, g_obs, g_r, state_size: int | None = None,
             need_x: bool = True, need_a: bool = True):
    """Vector-Jacobian product of one batched step (see the module doc for the coordinates).

    ``jac`` is the step's :class:`~diffgym.vector.BatchedJacobian`; ``P_in`` / ``P_out`` the
    tangent maps (N, S, n_x) at the start and end state, or None for [I; 0] (then pass
    ``state_size`` S); ``g_xn`` (N, S), ``g_obs`` (N, n_obs), ``g_r`` (N,) the incoming
    gradients (any may be None: zero).
    Returns ``(g_x (N, S), g_a (N, n_a))`` (None where not needed). Every product is batched
    over the N copies: ``g^T J`` as ``(N, 1, m) @ (N, m, n)``."""
    Jxx, Jxa = jac.state_state, jac.state_action
    N, n_x = Jxx.shape[0], Jxx.shape[1]
    S = (P_in.shape[1] if P_in is not None else g_xn.shape[1] if g_xn is not None
         else n_x if state_size is None else state_size)
    # gt: the gradient on the step's end state in tangent coordinates, (N, 1, n_x)
    gt = None
    if g_xn is not None:
        gt = (g_xn[:, None, :n_x] if P_out is None else np.matmul(g_xn[:, None, :], P_out))
    if g_obs is not None:
        go = np.matmul(g_obs[:, None, :], jac.obs_state)
        gt = go if gt is None else gt + go
    g_x = g_a = None
    if need_x:
        g_xt = np.zeros((N, n_x)) if gt is None else np.matmul(gt, Jxx)[:, 0]
        if g_r is not None:
            g_xt += jac.reward_state * g_r[:, None]
        if P_in is None:
            if S == n_x:
                g_x = g_xt
            else:
                g_x = np.zeros((N, S))
                g_x[:, :n_x] = g_xt
        else:
            # (P^+)^T g = P (P^T P)^-1 g: P has full column rank
            PtP = np.matmul(P_in.transpose(0, 2, 1), P_in)
            g_x = np.matmul(P_in, np.linalg.solve(PtP, g_xt[:, :, None]))[:, :, 0]
    if need_a:
        g_a = np.zeros(jac.reward_action.shape) if gt is None else np.matmul(gt, Jxa)[:, 0]
        if g_r is not None:
            g_a += jac.reward_action * g_r[:, None]
    return g_x, g_a
