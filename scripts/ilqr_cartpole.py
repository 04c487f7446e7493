"""iLQR swing-up of DiffCartPole-v0 with the environment's analytical step Jacobians.

The Jacobians in a user's own optimizer, outside torch: each iteration rolls the environment out
from a snapshot (``env.unwrapped.snapshot()`` / ``restore``) with ``step_with_jacobian``, which
returns the linearization ``x' ~ A dx + B du`` of every step (``jac.state_state``,
``jac.state_action``); a Riccati backward pass on those and on a Gauss-Newton model of the cost
gives the feedback law ``du = k + K dx``; a line search rolls it out and keeps the first step
size that lowers the cost. No finite differences anywhere.

Cost (sum over the horizon, hinge angle 0 = hanging, pi = upright; actions a in [-1, 1], 100 N
at |a| = 1)::

    l(x, a) = 0.5 (w_pos x^2 + w_ang 2 cos^2(hinge / 2) + w_vel xdot^2 + w_om thetadot^2 + w_u a^2)
    (w_pos, w_ang, w_vel, w_om, w_u) = (1, 10, 0.5, 0.5, 0.05)

i.e. ``w_ang (1 + cos hinge)``, zero upright, written as a squared residual so its Gauss-Newton
Hessian is positive semidefinite; the final state is weighted ``terminal`` times.

    python scripts/ilqr_cartpole.py --out runs/ilqr_cartpole       # ~20 s: ilqr_cartpole.png, .json
"""
from __future__ import annotations

import argparse
import json
import os
import time

import gymnasium as gym
import numpy as np

import diffgym
import diffgym.envs  # noqa: F401  (registers the ids)

W_POS, W_ANG, W_VEL, W_OM, W_U = 1.0, 10.0, 0.5, 0.5, 0.05


def residual(x, a, weight=1.0):
    """Residuals r (5,) of the stage cost 0.5 |r|^2 and their Jacobians dr/dx (5, 4), dr/da (5, 1)."""
    pos, hinge, vel, om = x[:4]
    s = np.sqrt(weight)
    r = s * np.array([np.sqrt(W_POS) * pos, np.sqrt(2 * W_ANG) * np.cos(0.5 * hinge),
                      np.sqrt(W_VEL) * vel, np.sqrt(W_OM) * om, np.sqrt(W_U) * a[0]])
    rx = np.zeros((5, 4))
    rx[0, 0] = s * np.sqrt(W_POS)
    rx[1, 1] = -s * np.sqrt(2 * W_ANG) * 0.5 * np.sin(0.5 * hinge)
    rx[2, 2] = s * np.sqrt(W_VEL)
    rx[3, 3] = s * np.sqrt(W_OM)
    ra = np.zeros((5, 1))
    ra[4, 0] = s * np.sqrt(W_U)
    return r, rx, ra


def rollout(env, snap, actions, xs_ref=None, k=None, K=None, alpha=1.0):
    """Roll out from the snapshot: open loop (``actions``) or with the feedback law
    a = clip(a_ref + alpha k + K (x - x_ref)). Returns states (T+1, 4), actions (T, 1),
    Jacobians [(A, B)] and the cost."""
    u = env.unwrapped
    u.restore(snap)
    T = len(actions)
    xs = [u.get_state()]
    acts, jacs = [], []
    for t in range(T):
        a = actions[t].copy()
        if k is not None:
            dx = u.state_difference(xs_ref[t], xs[-1])
            a = a + alpha * k[t] + K[t] @ dx
        a = np.clip(a, -1.0, 1.0)
        *_, jac = u.step_with_jacobian(a)
        xs.append(u.get_state())
        acts.append(a)
        jacs.append((jac.state_state, jac.state_action))
    xs, acts = np.array(xs), np.array(acts)
    return xs, acts, jacs, total_cost(xs, acts)


def total_cost(xs, acts, terminal=50.0):
    c = sum(0.5 * float(residual(x, a)[0] @ residual(x, a)[0]) for x, a in zip(xs[:-1], acts))
    r, _, _ = residual(xs[-1], np.zeros(1), terminal)
    return c + 0.5 * float(r @ r)


def ilqr(env, snap, actions, iterations=60, terminal=50.0, verbose=True):
    """iLQR (Gauss-Newton cost model, Levenberg-Marquardt regularization on Q_uu, control
    limits by clamping, backtracking line search). Returns the history of costs, the final trajectory and wall-clock times."""
    xs, acts, jacs, cost = rollout(env, snap, actions)
    history = [cost]
    times = [0.0]
    mu = 1e-6
    t0 = time.perf_counter()
    T = len(acts)
    for it in range(iterations):
        # backward pass on the analytical step Jacobians
        r, rx, _ = residual(xs[-1], np.zeros(1), terminal)
        Vx, Vxx = rx.T @ r, rx.T @ rx
        k, K = np.zeros((T, 1)), np.zeros((T, 1, 4))
        ok = True
        for t in reversed(range(T)):
            A, B = jacs[t]
            r, rx, ra = residual(xs[t], acts[t])
            Qx = rx.T @ r + A.T @ Vx
            Qu = ra.T @ r + B.T @ Vx
            Qxx = rx.T @ rx + A.T @ Vxx @ A
            Quu = ra.T @ ra + B.T @ Vxx @ B + mu * np.eye(1)
            Qux = ra.T @ rx + B.T @ Vxx @ A
            if Quu[0, 0] <= 0:
                ok = False
                break
            k[t] = -np.linalg.solve(Quu, Qu)
            K[t] = -np.linalg.solve(Quu, Qux)
            # control limits (a box QP in one dimension): a step that would leave [-1, 1] is
            # cut at the bound, and a clamped action gets no feedback
            a_new = np.clip(acts[t] + k[t], -1.0, 1.0)
            if np.any(a_new != acts[t] + k[t]):
                k[t] = a_new - acts[t]
                K[t] = 0.0
            Vx = Qx + K[t].T @ Quu @ k[t] + K[t].T @ Qu + Qux.T @ k[t]
            Vxx = Qxx + K[t].T @ Quu @ K[t] + K[t].T @ Qux + Qux.T @ K[t]
            Vxx = 0.5 * (Vxx + Vxx.T)
        if not ok:
            mu *= 10
            continue
        # forward pass: backtracking line search
        for alpha in (1.0, 0.5, 0.25, 0.1, 0.05, 0.01):
            xs_n, acts_n, jacs_n, cost_n = rollout(env, snap, acts, xs, k, K, alpha)
            if cost_n < cost:
                break
        if cost_n < cost:
            xs, acts, jacs, cost = xs_n, acts_n, jacs_n, cost_n
            mu = max(mu / 3, 1e-9)
        else:
            mu *= 10
        history.append(cost)
        times.append(time.perf_counter() - t0)
        if verbose:
            print(f"iteration {it + 1:3d}: cost {cost:10.4f}  (step {alpha:.2f}, mu {mu:.1e})")
        if mu > 1e8:
            break
    return history, times, xs, acts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/ilqr_cartpole", help="output directory")
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--horizon", type=int, default=150, help="steps of 1/60 s")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    env = gym.make("DiffCartPole-v0", episode_steps=args.horizon + 1)
    env.reset(seed=args.seed)
    snap = env.unwrapped.snapshot()
    rng = np.random.default_rng(args.seed)
    init = rng.uniform(-0.1, 0.1, (args.horizon, 1))
    t0 = time.perf_counter()
    history, times, xs, acts = ilqr(env, snap, init, iterations=args.iterations)
    wall = time.perf_counter() - t0
    theta = np.pi - np.mod(np.pi - (xs[:, 1] - np.pi), 2 * np.pi)     # 0 = upright
    result = {"iterations": len(history) - 1, "initial_cost": history[0], "final_cost": history[-1],
              "wall_clock_s": wall, "final_state": xs[-1].tolist(),
              "final_angle_from_upright_rad": float(theta[-1]),
              "max_abs_cart_position_m": float(np.abs(xs[:, 0]).max()),
              "costs": history}
    with open(os.path.join(args.out, "ilqr_cartpole.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"cost {history[0]:.2f} -> {history[-1]:.3f} in {len(history) - 1} iterations, {wall:.1f} s; "
          f"final angle from upright {theta[-1]:+.4f} rad, |x| max {np.abs(xs[:, 0]).max():.2f} m")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:                                 # (matplotlib is in the train/dev extras)
        print("matplotlib not installed: no plot")
        return result
    dt = env.unwrapped.dt
    t = np.arange(len(xs)) * dt
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].semilogy(range(len(history)), history, "o-", ms=3)
    ax[0].set_xlabel("iLQR iteration")
    ax[0].set_ylabel("cost")
    ax[0].set_title("cost per iteration (analytical step Jacobians)")
    ax[0].grid(True, which="both", alpha=0.3)
    ax[1].plot(t, theta, label="pole angle from upright (rad)")
    ax[1].plot(t, xs[:, 0], label="cart position (m)")
    ax[1].step(t[:-1], acts[:, 0], where="post", label="action (x 100 N)", alpha=0.7)
    ax[1].set_xlabel("time (s)")
    ax[1].set_title("optimized swing-up")
    ax[1].legend(loc="lower right", fontsize=8)
    ax[1].grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "ilqr_cartpole.png"), dpi=110)
    print(f"wrote {os.path.join(args.out, 'ilqr_cartpole.png')}")
    return result


if __name__ == "__main__":
    main()
