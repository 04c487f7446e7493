"""Optimize a billiards shot by gradient descent through the simulator's step Jacobians.

The Billiards experiment of the long-range-gradients contact-model paper, in small: the
decision variables are the cue ball's initial position and velocity in the table plane
(``p = [x0, y0, vx0, vy0]``, the paper's four control dimensions); the balls then roll for
``--horizon`` steps of ``DiffBilliards-v0`` (dt = 0.04 s) with no further force, and the loss is
the squared distance of one object ball (``--ball``) from its spot at the end::

    L(p) = |p_ball(T) - spot|^2

dL/dp is exact: the forward rollout calls ``step_with_jacobian`` and chains the analytical step
Jacobians in forward mode (a (n_x, 4) sensitivity matrix, ``S <- J_x S``); no finite
differences are used for the optimization (``--check-grad`` compares once against central
differences). With hard contact the gradient is zero while the cue ball misses the ball that
matters, so, as in the paper's second initialization strategy, ``--samples`` random shots are
simulated first and the best one (with a non-zero gradient) starts Adam (the paper's
beta = (0.3, 0.5)).

    python scripts/billiards_shot.py --out runs/billiards_shot          # about 2-3 minutes

Without ``--spot`` the spot is where the ball ends after a hidden random reference shot, so the
task is known to be solvable (a spot chosen by hand may be out of reach of any single shot:
contacts here are inelastic, so a ball inside the rack moves little).

Writes ``loss.csv`` (iteration, loss, distance, gradient norm, parameters), ``loss.png`` (loss
against iteration) and ``shot.png`` (the table at the start and end of the best shot) to --out.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import gymnasium as gym  # noqa: E402

import diffgym  # noqa: E402,F401  (registers the environments)

# parameter bounds: the cue ball stays behind the head string, speeds up to 4 m/s
LOWER = np.array([-1.1, -0.5, -4.0, -4.0])
UPPER = np.array([-0.3, 0.5, 4.0, 4.0])


class Shot:
    """The rollout L(p) and its exact gradient for one billiards task."""

    def __init__(self, ball: int, spot, horizon: int, seed: int = 0):
        self.env = gym.make("DiffBilliards-v0", target_balls=(ball, 1 if ball != 1 else 2),
                            spots=(spot, (0.0, 0.0)), episode_steps=horizon).unwrapped
        self.seed = seed
        self.env.reset(seed=seed)
        self.x_rest = self.env.get_state()
        self.ball, self.spot, self.horizon = ball, np.asarray(spot, float), horizon
        e = self.env
        # tangent directions of the four parameters: cue x, y (q tangent 0, 1), vx, vy (nv + 0, 1)
        self.E = np.zeros((e.n_x, 4))
        self.E[0, 0] = self.E[1, 1] = self.E[e.nv, 2] = self.E[e.nv + 1, 3] = 1.0

    def initial_state(self, p):
        x = self.x_rest.copy()
        e = self.env
        x[0:2] = p[:2]
        x[e.nq:e.nq + 2] = p[2:]
        return x

    def rollout(self, p, gradient: bool = True):
        """Loss, gradient (4,) or None, and the final state."""
        e = self.env
        e.reset(seed=self.seed)                 # restarts the episode clock
        e.set_state(self.initial_state(p))
        S = self.E.copy()
        a = np.zeros(2)
        for _ in range(self.horizon):
            if gradient:
                *_, jac = e.step_with_jacobian(a)
                S = jac.state_state @ S
            else:
                e.step(a)
        x = e.get_state()
        d = x[7 * self.ball:7 * self.ball + 2] - self.spot
        loss = float(d @ d)
        if not gradient:
            return loss, None, x
        iv = 6 * self.ball                      # tangent index of the ball's x (translation joint)
        g = 2.0 * d @ S[iv:iv + 2]
        return loss, g, x

    def fd_gradient(self, p, eps=1e-6):
        g = np.zeros(4)
        for i in range(4):
            dp = np.zeros(4)
            dp[i] = eps
            g[i] = (self.rollout(p + dp, False)[0] - self.rollout(p - dp, False)[0]) / (2 * eps)
        return g


def random_shot(rng, shot: Shot) -> np.ndarray:
    """A shot from behind the head string aimed at the ball that matters, off-centre by up to
    1.5 ball radii, at 1 to 3.5 m/s."""
    target = shot.x_rest[7 * shot.ball:7 * shot.ball + 2]
    p = np.array([rng.uniform(-0.8, -0.4), rng.uniform(-0.4, 0.4), 0.0, 0.0])
    aim = target - p[:2]
    aim /= np.linalg.norm(aim)
    aim = target + rng.uniform(-1.5, 1.5) * 0.0286 * np.array([-aim[1], aim[0]]) - p[:2]
    p[2:] = rng.uniform(1.0, 3.5) * aim / np.linalg.norm(aim)
    return p


def reachable_spot(ball: int, horizon: int, seed: int):
    """Where ``ball`` ends after a hidden random reference shot that moves it by at least 10 cm
    (so the task is known to be solvable); returns (spot, reference shot)."""
    probe = Shot(ball, (0.0, 0.0), horizon, seed=seed)
    rng = np.random.default_rng(seed + 1000)
    start = probe.x_rest[7 * ball:7 * ball + 2]
    for _ in range(50):
        p = random_shot(rng, probe)
        x = probe.rollout(p, gradient=False)[2]
        end = x[7 * ball:7 * ball + 2]
        if np.linalg.norm(end - start) > 0.1 and np.all(np.abs(end) < [1.2, 0.6]):
            return end.copy(), p
    raise RuntimeError(f"no reference shot moved ball {ball} by 10 cm; choose --spot")


def optimize(shot: Shot, iters: int, samples: int, lr: np.ndarray, seed: int, log=print,
             check_grad: bool = False):
    """Sampling, then Adam steps with backtracking; returns (history, best p, best loss).

    A hard-contact rollout is piecewise smooth: a step that makes a ball miss another changes
    the loss discontinuously and can zero the gradient. A step whose loss is higher, or whose
    gradient vanishes, is therefore undone and retried at half the length (at most 6 times);
    accepted steps let the length grow back. Every iteration logs the accepted rollout.
    """
    rng = np.random.default_rng(seed)
    # sampling (forward only): shots from behind the head string aimed at the ball that
    # matters, off-centre by up to 1.5 ball radii, at 1 to 3.5 m/s
    cands = []
    t0 = time.perf_counter()
    for _ in range(samples):
        p = random_shot(rng, shot)
        cands.append((shot.rollout(p, gradient=False)[0], len(cands), p))
    cands.sort(key=lambda c: c[0])
    p = None
    for loss, _, cand in cands:                      # the best shot whose gradient is non-zero
        loss, g, _ = shot.rollout(cand)
        if np.linalg.norm(g) > 0:
            p = cand
            break
    if p is None:
        raise RuntimeError(f"none of {samples} sampled shots moved ball {shot.ball}; raise --samples")
    log(f"sampling: best of {samples} shots loss {loss:.4g} ({time.perf_counter() - t0:.1f} s)")
    if check_grad:
        g_fd = shot.fd_gradient(p)
        rel = np.abs(g - g_fd).max() / max(1e-12, np.abs(g_fd).max())
        log(f"gradient check at the start: analytical {np.array2string(g, precision=5)}, "
            f"central differences {np.array2string(g_fd, precision=5)}, max rel. error {rel:.2e}")
    m, v = np.zeros(4), np.zeros(4)
    b1, b2, eps = 0.3, 0.5, 1e-8                    # the paper's Adam betas
    scale = 1.0
    history = [(0, loss, float(np.sqrt(loss)), float(np.linalg.norm(g)), *p)]
    log(f"iter    0  loss {loss:.5f}  distance {np.sqrt(loss):.4f} m  |grad| {np.linalg.norm(g):.3g}")
    for it in range(1, iters + 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        step = lr * (m / (1 - b1 ** it)) / (np.sqrt(v / (1 - b2 ** it)) + eps)
        for _ in range(7):
            p_new = np.clip(p - scale * step, LOWER, UPPER)
            loss_new, g_new, _ = shot.rollout(p_new)
            if loss_new <= loss and np.linalg.norm(g_new) > 0:
                scale = min(1.0, 1.5 * scale)
                p, loss, g = p_new, loss_new, g_new
                break
            scale *= 0.5
        history.append((it, loss, float(np.sqrt(loss)), float(np.linalg.norm(g)), *p))
        stuck = scale < 1e-6
        if it % max(1, iters // 10) == 0 or it == iters or stuck:
            log(f"iter {it:4d}  loss {loss:.5f}  distance {np.sqrt(loss):.4f} m  |grad| "
                f"{np.linalg.norm(g):.3g}  step scale {scale:.3g}")
        if stuck:
            log("stopped: no descent along the gradient down to a 1e-6 step (the shot sits on a "
                "contact-mode boundary, where the loss jumps)")
            break
    return history, p, loss


def plot(history, shot: Shot, best_p, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    h = np.array(history)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.semilogy(h[:, 0], h[:, 1], "-o", ms=2)
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"loss |p_ball{shot.ball}(T) - spot|^2 (m^2)")
    ax.set_title("billiards shot: Adam on exact Jacobians")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss.png"), dpi=120)
    plt.close(fig)
    _, _, x_end = shot.rollout(best_p, gradient=False)
    x0 = shot.initial_state(best_p)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.add_patch(plt.Rectangle((-1.3, -0.7), 2.6, 1.4, color=(0.1, 0.5, 0.2)))
    r = 0.0286
    for b in range(16):
        col = "white" if b == 0 else ("gold" if b == shot.ball else (0.8, 0.2, 0.1))
        ax.add_patch(plt.Circle(x0[7 * b:7 * b + 2], r, color=col, alpha=0.35))
        ax.add_patch(plt.Circle(x_end[7 * b:7 * b + 2], r, color=col, ec="k", lw=0.5))
    ax.add_patch(plt.Circle(shot.spot, 0.05, fill=False, color="cyan", lw=2))
    ax.annotate("", xy=x0[:2] + 0.15 * best_p[2:], xytext=x0[:2],
                arrowprops=dict(arrowstyle="->", color="white"))
    ax.set_xlim(-1.35, 1.35)
    ax.set_ylim(-0.75, 0.75)
    ax.set_aspect("equal")
    ax.set_title(f"start (faint) and end after {shot.horizon} steps; ball {shot.ball} (gold) to the cyan spot")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "shot.png"), dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ball", type=int, default=15, help="object ball to place (1..15), default 15 (a back corner of the rack)")
    ap.add_argument("--spot", type=float, nargs=2, default=None, metavar=("X", "Y"),
                    help="its target spot (m); default: where the ball ends after a hidden random "
                         "reference shot (so the task is solvable), printed")
    ap.add_argument("--horizon", type=int, default=50, help="steps of 0.04 s (default 50 = 2 s; the paper: 100)")
    ap.add_argument("--iters", type=int, default=40, help="Adam iterations (default 40)")
    ap.add_argument("--samples", type=int, default=8, help="random shots to start from (default 8)")
    ap.add_argument("--lr", type=float, nargs=2, default=(0.01, 0.05), metavar=("POS", "VEL"),
                    help="Adam step sizes for the position (m) and velocity (m/s) parameters")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-grad", action="store_true",
                    help="compare the gradient with central differences once (8 extra rollouts)")
    ap.add_argument("--out", default="runs/billiards_shot", help="output folder (default runs/billiards_shot)")
    args = ap.parse_args(argv)
    if not 1 <= args.ball <= 15:
        ap.error(f"--ball must be in 1..15, got {args.ball}")
    if args.horizon < 1 or args.iters < 0 or args.samples < 1:
        ap.error("--horizon and --samples must be >= 1 and --iters >= 0")
    os.makedirs(args.out, exist_ok=True)
    spot = args.spot
    if spot is None:
        spot, p_ref = reachable_spot(args.ball, args.horizon, args.seed)
        print(f"spot {np.round(spot, 4)} = end of ball {args.ball} after the hidden reference shot "
              f"x0={p_ref[0]:.4f} y0={p_ref[1]:.4f} v=({p_ref[2]:.4f}, {p_ref[3]:.4f}) m/s")
    shot = Shot(args.ball, spot, args.horizon, seed=args.seed)
    lr = np.array([args.lr[0], args.lr[0], args.lr[1], args.lr[1]])
    t0 = time.perf_counter()
    history, best_p, best_loss = optimize(shot, args.iters, args.samples, lr, args.seed,
                                          check_grad=args.check_grad)
    elapsed = time.perf_counter() - t0
    with open(os.path.join(args.out, "loss.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["iteration", "loss", "distance", "grad_norm", "x0", "y0", "vx0", "vy0"])
        w.writerows(history)
    plot(history, shot, best_p, args.out)
    print(f"start loss {history[0][1]:.5f} (distance {history[0][2]:.4f} m) -> best {best_loss:.6f} "
          f"(distance {np.sqrt(best_loss):.4f} m) in {len(history) - 1} iterations, {elapsed:.1f} s; "
          f"shot x0={best_p[0]:.4f} y0={best_p[1]:.4f} v=({best_p[2]:.4f}, {best_p[3]:.4f}) m/s")
    print(f"wrote {args.out}/loss.csv, loss.png, shot.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
