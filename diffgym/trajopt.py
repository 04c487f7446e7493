"""``diffgym trajopt``: the trajectory-optimization benchmark of the long-range-gradients paper
(``shared/papers/contact-model-long-range-gradients.txt``, section 6 and appendix A.6) on
DiffBilliards-v0 and DiffPush-v0, per gradient mode against a gradient-free baseline.

Tasks (the paper's Table 3 settings by default):

- ``billiards``: the decision variables are the cue ball's initial position and velocity in the
  table plane ``p = (x0, y0, vx0, vy0)``; the balls then roll for ``--billiards-steps`` (100)
  steps of 0.04 s with no further force. Two random target balls and spots (the
  environment's reset with the task seed). Loss: the paper's
  ``sum_k ReLU(|x_k - x*_k|^2 - eps^2)`` over the two target balls, ``eps`` = the environment's
  success radius (5 cm). Adam, lr 3e-2, betas (0.3, 0.5), ``--iters`` (400) iterations.
  The environment's spots are uniform on the table, so both targets are often out of reach of
  any one shot (behind the cue ball, or on opposite sides); ``--billiards-spots reachable``
  instead puts them where a random shot at the first target ball (1-3 m/s, within 3 degrees,
  simulated in the exact mode) leaves the two target balls, so a solution is known to exist.
- ``push``: receding horizon: at every executed frame (``--push-frames``, 200) the next
  ``--push-window`` (48) pose actions of the rod are optimized for ``--push-iters`` (50) Adam
  iterations (lr 1e-2, betas (0.3, 0.5)) on the window's loss ``ReLU(|box - target|^2 - eps^2)``
  at its end (eps = 2 cm, the environment's success radius), and the first action is
  executed; the next window starts from the shifted plan.

The paper does not state its epsilons in numbers; we use the environments' success radii.

Starts: ``trivial`` (billiards: the cue ball at its reset spot at rest, aimed at nothing; push:
every action holds the rod's starting pose, 0.2 m from the box's centre, or
``--push-rod-distance``) and ``sampling``
(``--samples`` random decision vectors simulated forward, the best one starts the optimizer;
their rollouts count in the budget).

Methods: one per gradient mode named in ``--modes`` (the simulator's ``gradient=``; gradients
by reverse accumulation of the step Jacobians ``step_with_jacobian``), ``long_range+smooth``
(``LongRange(rho=--rho)``: the long-range forward, its derivative through the relaxed contact
problem, so that it passes sticking contacts), and ``cmaes``
(a numpy CMA-ES, Hansen's standard (mu/mu_w, lambda) update with rank-one and rank-mu
covariance adaptation, forward simulation in the exact mode) at the same number of rollouts.

Writes ``results.csv`` (one row per task, start, method, seed; ``exact_replay_loss``: the final
decision, or the executed actions, replayed in the exact simulator), ``history.csv`` (loss per
iteration or executed frame, and for billiards gradient runs the gradient's norm), ``<task>_<start>.png``
and prints a summary table. A run whose simulation raises (a solver failure) ends there, with the
error and the decision in ``results.csv``'s ``error`` column; the benchmark goes on.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import time

import numpy as np

BETAS = (0.3, 0.5)


class Adam:
    def __init__(self, x, lr, betas=BETAS, eps=1e-8):
        self.x = np.array(x, dtype=float)
        self.lr = lr
        self.b1, self.b2 = betas
        self.eps = eps
        self.m = np.zeros_like(self.x)
        self.v = np.zeros_like(self.x)
        self.t = 0

    def step(self, g):
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * g
        self.v = self.b2 * self.v + (1 - self.b2) * g * g
        mh = self.m / (1 - self.b1 ** self.t)
        vh = self.v / (1 - self.b2 ** self.t)
        self.x = self.x - self.lr * mh / (np.sqrt(vh) + self.eps)
        return self.x


class CMAES:
    """Minimal (mu/mu_w, lambda)-CMA-ES (Hansen, "The CMA Evolution Strategy: A Tutorial")."""

    def __init__(self, x0, sigma, seed, max_lam=None):
        n = self.n = len(x0)
        self.rng = np.random.default_rng(seed)
        self.mean = np.array(x0, dtype=float)
        self.sigma = float(sigma)
        self.lam = 4 + int(3 * math.log(n))
        if max_lam is not None:
            self.lam = max(2, min(self.lam, int(max_lam)))
        mu = self.mu = self.lam // 2
        w = math.log(mu + 0.5) - np.log(np.arange(1, mu + 1))
        self.w = w / w.sum()
        self.mueff = 1.0 / np.sum(self.w ** 2)
        me = self.mueff
        self.cc = (4 + me / n) / (n + 4 + 2 * me / n)
        self.cs = (me + 2) / (n + me + 5)
        self.c1 = 2 / ((n + 1.3) ** 2 + me)
        self.cmu = min(1 - self.c1, 2 * (me - 2 + 1 / me) / ((n + 2) ** 2 + me))
        self.damps = 1 + 2 * max(0, math.sqrt((me - 1) / (n + 1)) - 1) + self.cs
        self.chin = math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n * n))
        self.pc = np.zeros(n)
        self.ps = np.zeros(n)
        self.C = np.eye(n)
        self.gen = 0

    def ask(self):
        vals, B = np.linalg.eigh(self.C)
        D = np.sqrt(np.maximum(vals, 1e-20))
        self._BD = (B, D)
        z = self.rng.standard_normal((self.lam, self.n))
        return self.mean + self.sigma * (z * D) @ B.T

    def tell(self, X, f):
        n = self.n
        order = np.argsort(f)
        old = self.mean
        Y = (X[order[:self.mu]] - old) / self.sigma
        yw = self.w @ Y
        self.mean = old + self.sigma * yw
        B, D = self._BD
        Cinvsqrt_y = B @ ((B.T @ yw) / D)
        self.gen += 1
        self.ps = (1 - self.cs) * self.ps + math.sqrt(self.cs * (2 - self.cs) * self.mueff) * Cinvsqrt_y
        hsig = (np.linalg.norm(self.ps) / math.sqrt(1 - (1 - self.cs) ** (2 * self.gen))
                / self.chin < 1.4 + 2 / (n + 1))
        self.pc = (1 - self.cc) * self.pc + hsig * math.sqrt(self.cc * (2 - self.cc) * self.mueff) * yw
        self.C = ((1 - self.c1 - self.cmu) * self.C
                  + self.c1 * (np.outer(self.pc, self.pc) + (1 - hsig) * self.cc * (2 - self.cc) * self.C)
                  + self.cmu * (Y.T * self.w) @ Y)
        self.sigma *= math.exp((self.cs / self.damps) * (np.linalg.norm(self.ps) / self.chin - 1))


def method_mode(method: str, args) -> "str | dict":
    """The gradient mode a method runs with: ``cmaes`` the exact forward (no gradients),
    ``long_range+smooth`` the long-range barrier with its derivative through the contact
    problem relaxed at ``--rho`` (``LongRange(rho=...)``), any other name that mode."""
    if method == "cmaes":
        return "exact"
    scale = getattr(args, "scale", None)
    extra = {} if scale is None else {"scale": scale}
    if method == "long_range+smooth":
        return {"mode": "long_range", "rho": args.rho, **extra}
    if method == "long_range" and extra:
        return {"mode": "long_range", **extra}
    return method


def _make(env_id, mode, **kw):
    import gymnasium as gym

    import diffgym  # noqa: F401  (registers the environments)
    return gym.make(env_id, sim_options={"gradient": mode}, episode_steps=10 ** 7, **kw).unwrapped


def _relu_loss(pos, goal, eps):
    """sum_k ReLU(|pos_k - goal_k|^2 - eps^2), its gradient in pos, and every-k-within-eps."""
    d = pos - goal
    d2 = np.sum(d * d, axis=-1)
    on = d2 > eps * eps
    return float(np.sum(np.where(on, d2 - eps * eps, 0.0))), 2.0 * d * on[..., None], bool(np.all(~on))


# -- billiards ---------------------------------------------------------------------------------
class Billiards:
    LOWER = np.array([-1.2, -0.6, -4.0, -4.0])
    UPPER = np.array([-0.3, 0.6, 4.0, 4.0])
    lr = 3e-2

    def __init__(self, mode, seed, steps, spots: str = "uniform"):
        self.env = e = _make("DiffBilliards-v0", mode)
        e.reset(seed=seed)
        self.x0 = e.get_state()
        self.balls, self.spots = e._task(self.x0)
        self.eps = e.success_radius
        self.steps = steps
        self.trivial = np.array([self.x0[0], self.x0[1], 0.0, 0.0])
        self.rng = np.random.default_rng(10_000 + seed)
        self.shot = None
        if spots == "reachable":
            self.spots, self.shot = self._reachable_spots(seed, mode)
        elif spots != "uniform":
            raise ValueError(f"billiards spots must be 'uniform' or 'reachable', got {spots!r}")

    def _reachable_spots(self, seed, mode):
        """Spots one shot is known to reach: a random shot from the cue ball's start (speed 1-3
        m/s, aimed within 3 degrees of the first target ball), simulated in the exact mode; the
        two target balls' final positions, once both moved more than 2 eps (a shot that leaves
        a target in place is drawn again). Returns (spots (2, 2), the shot (x0, y0, vx0, vy0))."""
        rng = np.random.default_rng(30_000 + seed)
        ex = self if mode == "exact" else Billiards("exact", seed, self.steps)
        start = self.x0[7 * self.balls[:, None] + np.arange(2)]
        for _ in range(200):
            aim = start[0] - self.trivial[:2]
            ang = math.atan2(aim[1], aim[0]) + math.radians(rng.uniform(-3.0, 3.0))
            speed = rng.uniform(1.0, 3.0)
            shot = np.array([self.trivial[0], self.trivial[1],
                             speed * math.cos(ang), speed * math.sin(ang)])
            ex.rollout(shot, False)
            x = ex.env.get_state()
            end = x[7 * self.balls[:, None] + np.arange(2)]
            if np.all(np.linalg.norm(end - start, axis=1) > 2 * self.eps):
                return end.copy(), shot
        raise RuntimeError(f"billiards seed {seed}: no random shot moved both target balls")

    def sample(self):
        return self.rng.uniform(self.LOWER, self.UPPER)

    def rollout(self, p, grad):
        e = self.env
        p = np.clip(p, self.LOWER, self.UPPER)
        x = self.x0.copy()
        x[0:2] = p[:2]
        x[e.nq:e.nq + 2] = p[2:]
        e.set_state(x)
        e.sim.reset_warmstart()
        a = np.zeros(2)
        jacs = []
        for _ in range(self.steps):
            if grad:
                *_, jac = e.step_with_jacobian(a)
                jacs.append(jac.state_state)
            else:
                e.step(a)
        x = e.get_state()
        iq = 7 * self.balls
        loss, dpos, ok = _relu_loss(x[iq[:, None] + np.arange(2)], self.spots, self.eps)
        if not grad:
            return loss, None, ok
        lam = np.zeros(e.n_x)
        for k, b in enumerate(self.balls):
            lam[6 * b:6 * b + 2] += dpos[k]
        for J in reversed(jacs):
            lam = J.T @ lam
        g = np.array([lam[0], lam[1], lam[e.nv], lam[e.nv + 1]])
        g[(p <= self.LOWER) & (g > 0)] = 0.0          # projected: no push against a bound
        g[(p >= self.UPPER) & (g < 0)] = 0.0
        return loss, g, ok


def run_billiards(method, start, seed, args, log):
    mode = method_mode(method, args)
    spots = getattr(args, "billiards_spots", "uniform")
    task = Billiards(mode, seed, args.billiards_steps, spots)
    hist = []
    gnorm = []                          # |g| per rollout (nan: a rollout without a gradient)
    error = ""
    t0 = time.perf_counter()
    budget = args.iters
    best = (math.inf, None, False)
    p = task.trivial.copy()
    if start == "sampling":
        for _ in range(args.samples):
            q = task.sample()
            loss, _, ok = task.rollout(q, False)
            hist.append(loss)
            gnorm.append(math.nan)
            if loss < best[0]:
                best, p = (loss, q, ok), q
    if method == "cmaes":
        loss, _, ok = task.rollout(p, False)         # the start itself, first
        hist.append(loss)
        if loss < best[0]:
            best = (loss, p, ok)
        es = CMAES(p, sigma=0.5, seed=seed, max_lam=budget - 1)
        used = 1
        while used < budget:
            X = np.clip(es.ask(), task.LOWER, task.UPPER)[:budget - used]
            f = []
            for x in X:
                loss, _, ok = task.rollout(x, False)
                f.append(loss)
                hist.append(loss)
                if loss < best[0]:
                    best = (loss, x, ok)
            used += len(X)
            if len(X) == es.lam:
                es.tell(X, np.array(f))
    else:
        opt = Adam(p, Billiards.lr)
        for it in range(budget):
            try:
                loss, g, ok = task.rollout(opt.x, True)
            except Exception as exc:     # (a failed simulation ends this run, not the benchmark)
                error = (f"{type(exc).__name__}: {exc} (rollout {len(hist)}, decision "
                         f"{np.array2string(np.asarray(opt.x), precision=17, separator=',')})")
                log(f"  billiards {start} {method} seed {seed}: stopped, {error}")
                break
            hist.append(loss)
            gnorm.append(float(np.linalg.norm(g)))
            if loss < best[0]:
                best = (loss, opt.x.copy(), ok)
            if loss == 0.0:
                break
            if not np.any(g):
                break                      # zero gradient: Adam cannot move (deterministic)
            opt.step(g)
            opt.x = np.clip(opt.x, task.LOWER, task.UPPER)
            if it % 20 == 0:
                log(f"  billiards {start} {method} seed {seed} it {it}: loss {loss:.4g} |g| {np.linalg.norm(g):.3g}")
    wall = time.perf_counter() - t0
    # the best decision replayed in the exact simulator (a long_range loss is its own rollout's)
    ex = task if mode == "exact" else Billiards("exact", seed, args.billiards_steps, spots)
    exact_loss, _, exact_ok = ex.rollout(best[1] if best[1] is not None else p, False)
    return dict(loss=best[0], success=best[2], wall=wall, rollouts=len(hist),
                exact_loss=exact_loss, exact_success=exact_ok, error=error,
                gnorm=gnorm if method != "cmaes" else []), hist


# -- push --------------------------------------------------------------------------------------
class Push:
    lr = 1e-2

    def __init__(self, mode, seed, rod_distance=None):
        self.env = e = _make("DiffPush-v0", mode)
        if rod_distance is not None:      # the rod's start distance from the box's centre
            e.ROD_START_DISTANCE = float(rod_distance)
        e.reset(seed=seed)
        self.x = e.get_state()
        self.eps = e.SUCCESS_RADIUS
        self.rng = np.random.default_rng(20_000 + seed)
        pose = e._rod_pose(self.x)
        self.hold = np.clip([pose[0] / e.WORKSPACE, pose[1] / e.WORKSPACE, pose[2] / np.pi], -1, 1)

    def box_loss(self, x):
        e = self.env
        b = e._box_q
        tgt = x[e.nq + e.nv:e.nq + e.nv + 2]
        return _relu_loss(x[b:b + 2][None], tgt[None], self.eps)

    def rollout(self, x0, A, grad):
        e = self.env
        e.set_state(x0)
        e.sim.reset_warmstart()
        jx, ja = [], []
        for a in A:
            if grad:
                *_, jac = e.step_with_jacobian(a)
                jx.append(jac.state_state)
                ja.append(jac.state_action)
            else:
                e.step(a)
        x = e.get_state()
        loss, dpos, ok = self.box_loss(x)
        if not grad:
            return loss, None, ok
        lam = np.zeros(e.n_x)
        lam[e._box_v:e._box_v + 2] = dpos[0]
        G = np.zeros_like(A)
        for t in range(len(A) - 1, -1, -1):
            G[t] = ja[t].T @ lam
            lam = jx[t].T @ lam
        G[(np.abs(A) >= 1.0) & (np.sign(G) == -np.sign(A))] = 0.0   # clipped: derivative 0
        return loss, G, ok

    def execute(self, a):
        e = self.env
        e.set_state(self.x)
        e.sim.reset_warmstart()
        e.step(a)
        self.x = e.get_state()


def run_push(method, start, seed, args, log):
    mode = method_mode(method, args)
    task = Push(mode, seed, getattr(args, "push_rod_distance", None))
    h = args.push_window
    A = np.tile(task.hold, (h, 1))
    hist = []
    executed = []
    rollouts = 0
    t0 = time.perf_counter()
    x_start = task.x.copy()
    for frame in range(args.push_frames):
        if start == "sampling" and frame == 0:
            best = task.rollout(task.x, A, False)[0]
            for _ in range(args.samples):
                # a random pose target held for the window, blended in from the hold pose
                B = np.tile(task.rng.uniform(-1, 1, 3), (h, 1))
                loss = task.rollout(task.x, B, False)[0]
                rollouts += 1
                if loss < best:
                    best, A = loss, B
        if method == "cmaes":
            es = CMAES(A.ravel(), sigma=0.3, seed=seed * 1000 + frame,
                       max_lam=args.push_iters - 1)
            used, bestw = 1, (task.rollout(task.x, A, False)[0], A)     # the start, first
            rollouts += 1
            while used < args.push_iters:
                X = np.clip(es.ask(), -1, 1)[:args.push_iters - used]
                f = [task.rollout(task.x, x.reshape(h, 3), False)[0] for x in X]
                rollouts += len(X)
                used += len(X)
                for x, v in zip(X, f):
                    if v < bestw[0]:
                        bestw = (v, x.reshape(h, 3))
                if len(X) == es.lam:
                    es.tell(X, np.array(f))
            A = bestw[1]
        else:
            opt = Adam(A.ravel(), Push.lr)
            for _ in range(args.push_iters):
                loss, G, _ = task.rollout(task.x, opt.x.reshape(h, 3), True)
                rollouts += 1
                if loss == 0.0 or not np.any(G):
                    break
                opt.step(G.ravel())
                opt.x = np.clip(opt.x, -1, 1)
            A = opt.x.reshape(h, 3)
        task.execute(A[0])
        executed.append(A[0].copy())
        A = np.vstack([A[1:], A[-1:]])
        loss, _, ok = task.box_loss(task.x)
        hist.append(loss)
        if frame % 10 == 0:
            log(f"  push {start} {method} seed {seed} frame {frame}: loss {loss:.4g}")
    loss, _, ok = task.box_loss(task.x)
    wall = time.perf_counter() - t0
    # the executed actions replayed in the exact simulator
    ex = task if mode == "exact" else Push("exact", seed, getattr(args, "push_rod_distance", None))
    exact_loss, _, exact_ok = ex.rollout(x_start, np.array(executed).reshape(-1, 3), False)
    return dict(loss=loss, success=ok, wall=wall, rollouts=rollouts, exact_loss=exact_loss,
                exact_success=exact_ok), hist


def _plot(out, task, start, curves, xlabel, grads=None):
    """The loss curves of every run (and, with ``grads``, the gradient's norm per rollout of
    every gradient run on a second, logarithmic panel)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    grads = {k: g for k, g in (grads or {}).items() if len(g) and np.any(np.isfinite(g))}
    if grads:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(6, 7), sharex=True)
    else:
        fig, ax = plt.subplots(figsize=(6, 4))
    colors = {}
    for (method, seed), h in sorted(curves.items()):
        c = colors.setdefault(method, f"C{len(colors)}")
        if not len(h):
            continue
        y = np.minimum.accumulate(h) / h[0] if task == "billiards" and h[0] > 0 else h
        ax.plot(y, color=c, lw=1,
                label=method if seed == min(s for (m, s) in curves if m == method) else None)
    if task != "billiards":
        ax.set_yscale("symlog", linthresh=1e-4)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("best loss so far / first loss, per run" if task == "billiards"
                  else "loss after the frame")
    ax.set_title(f"{task}, {start} start")
    ax.legend()
    if grads:
        for (method, seed), g in sorted(grads.items()):
            c = colors.setdefault(method, f"C{len(colors)}")
            ax2.semilogy(np.where(g > 0, g, np.nan), color=c, lw=0.8,
                         label=method if seed == min(s for (m, s) in grads if m == method) else None)
        ax2.set_xlabel(xlabel)
        ax2.set_ylabel("|gradient| per rollout")
        ax2.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{task}_{start}.png"), dpi=110)
    plt.close(fig)


def check_args(args: argparse.Namespace) -> None:
    """Refuses bad arguments before anything runs (ValueError naming the option and value):
    unknown tasks, starts or modes, a mode's bad parameters, counts below 1."""
    from .sim.gradient_modes import gradient_mode
    if args.summarize:
        for path in args.summarize:
            if not os.path.isfile(path):
                raise ValueError(f"--summarize: {path}: no such file")
        return
    for m in args.modes.split(","):
        if m.strip() != "cmaes":
            gradient_mode(method_mode(m.strip(), args))     # a clear error for an unknown mode
    for opt, val, allowed in (("--tasks", args.tasks, ("billiards", "push")),
                              ("--starts", args.starts, ("trivial", "sampling"))):
        for x in val.split(","):
            if x.strip() not in allowed:
                raise ValueError(f"{opt}: unknown {x.strip()!r} (one of {', '.join(allowed)})")
    for opt in ("seeds", "iters", "billiards_steps", "samples", "push_frames", "push_window",
                "push_iters"):
        if getattr(args, opt, 1) < 1:
            raise ValueError(f"--{opt.replace('_', '-')} must be >= 1, got {getattr(args, opt)}")


def main(args: argparse.Namespace) -> int:
    check_args(args)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """The benchmark of arguments already checked (``check_args``)."""
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    methods = [m.strip() for m in args.modes.split(",")]
    tasks = [t.strip() for t in args.tasks.split(",")]
    starts = [t.strip() for t in args.starts.split(",")]
    seeds = list(range(args.seed0, args.seed0 + args.seeds))
    os.makedirs(args.out, exist_ok=True)
    res_path = os.path.join(args.out, "results.csv")
    hist_path = os.path.join(args.out, "history.csv")
    rows = []
    with open(res_path, "w", newline="") as fr, open(hist_path, "w", newline="") as fh:
        wr, wh = csv.writer(fr), csv.writer(fh)
        wr.writerow(["task", "start", "method", "seed", "final_loss", "success", "wall_s", "rollouts",
                     "exact_replay_loss", "exact_replay_success", "error"])
        wh.writerow(["task", "start", "method", "seed", "index", "loss", "gnorm"])
        for task in tasks:
            for start in starts:
                curves, grads = {}, {}
                for seed in seeds:
                    for method in methods:
                        fn = run_billiards if task == "billiards" else run_push
                        try:
                            r, h = fn(method, start, seed, args, lambda s: print(s, flush=True))
                        except NotImplementedError as exc:      # a mode not in this build yet
                            print(f"{task} {start} {method}: skipped ({exc})", flush=True)
                            continue
                        curves[(method, seed)] = np.array(h)
                        row = [task, start, method, seed, f"{r['loss']:.6g}", int(r["success"]),
                               f"{r['wall']:.1f}", r["rollouts"], f"{r['exact_loss']:.6g}",
                               int(r["exact_success"]), r.get("error", "")]
                        wr.writerow(row)
                        fr.flush()
                        gn = r.pop("gnorm", None) or []
                        grads[(method, seed)] = np.array(gn, dtype=float)
                        for i, v in enumerate(h):
                            wh.writerow([task, start, method, seed, i, f"{v:.6g}",
                                         f"{gn[i]:.6g}" if i < len(gn) else ""])
                        fh.flush()
                        rows.append(dict(task=task, start=start, method=method, seed=seed, **r,
                                         first=h[0] if len(h) else float("nan")))
                        print(f"{task} {start} {method} seed {seed}: loss {h[0] if len(h) else float('nan'):.4g} -> "
                              f"{r['loss']:.4g}, success {r['success']}, {r['wall']:.0f} s, "
                              f"{r['rollouts']} rollouts", flush=True)
                _plot(args.out, task, start, curves,
                      "rollout" if task == "billiards" else "executed frame", grads)
    print("\n| task | start | method | seeds | success | median first loss | median final loss | improved | median wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for task in tasks:
        for start in starts:
            for method in methods:
                sel = [r for r in rows if (r["task"], r["start"], r["method"]) == (task, start, method)]
                if not sel:
                    continue
                fl = np.median([r["loss"] for r in sel])
                f0 = np.median([r["first"] for r in sel])
                imp = sum(r["loss"] < r["first"] * (1 - 1e-6) for r in sel)
                print(f"| {task} | {start} | {method} | {len(sel)} | {sum(r['success'] for r in sel)}/{len(sel)} "
                      f"| {f0:.4g} | {fl:.4g} | {imp}/{len(sel)} | {np.median([r['wall'] for r in sel]):.0f} |")
    print(f"\nwrote {res_path}, {hist_path} and the plots in {args.out}")
    return 0


def summarize(paths) -> str:
    """A markdown table of one or more ``results.csv`` files (per task, start and method:
    runs, successes, mean first and final loss, runs whose loss decreased, wall clock)."""
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            rows.extend(csv.DictReader(f))
    hist = {}
    for path in paths:
        hp = os.path.join(os.path.dirname(path), "history.csv")
        if os.path.exists(hp):
            with open(hp, newline="") as f:
                for r in csv.DictReader(f):
                    k = (r["task"], r["start"], r["method"], r["seed"])
                    hist.setdefault(k, float(r["loss"]))
    out = ["| task | start | method | runs | success | mean first loss | mean final loss | "
           "loss decreased | mean wall per run (s) | rollouts per run |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    keys = []
    for r in rows:
        k = (r["task"], r["start"], r["method"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        sel = [r for r in rows if (r["task"], r["start"], r["method"]) == k]
        first = [hist.get(k + (r["seed"],), float("nan")) for r in sel]
        final = [float(r["final_loss"]) for r in sel]
        dec = sum(b < a for a, b in zip(first, final))
        out.append(f"| {k[0]} | {k[1]} | {k[2]} | {len(sel)} | "
                   f"{sum(int(r['success']) for r in sel)}/{len(sel)} | {np.mean(first):.6g} | "
                   f"{np.mean(final):.6g} | {dec}/{len(sel)} | "
                   f"{np.mean([float(r['wall_s']) for r in sel]):.0f} | "
                   f"{np.mean([int(r['rollouts']) for r in sel]):.0f} |")
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--tasks", default="billiards,push", help="comma list of billiards, push")
    p.add_argument("--starts", default="trivial,sampling", help="comma list of trivial, sampling")
    p.add_argument("--modes", default="exact,long_range,smooth,cmaes",
                   help="comma list of gradient modes (any name diffgym.sim.gradient_modes knows), "
                        "long_range+smooth (long_range with its derivative through the relaxed "
                        "contact problem at --rho) and cmaes")
    p.add_argument("--scale", type=float, default=None,
                   help="long_range, long_range+smooth: the barrier's scale (default the "
                        "mode's, 1e-8)")
    p.add_argument("--rho", type=float, default=3e-3,
                   help="long_range+smooth: the relaxation level of the contact derivative")
    p.add_argument("--seeds", type=int, default=5, help="number of task seeds")
    p.add_argument("--seed0", type=int, default=0)
    p.add_argument("--iters", type=int, default=400, help="billiards: rollouts per run")
    p.add_argument("--billiards-steps", type=int, default=100)
    p.add_argument("--billiards-spots", default="uniform", choices=("uniform", "reachable"),
                   help="billiards: the environment's spots (uniform on the table: often out of "
                        "reach of any one shot) or 'reachable': where a random shot at the first "
                        "target ball puts the two target balls (a solution is known to exist)")
    p.add_argument("--samples", type=int, default=16, help="random-sampling start: samples")
    p.add_argument("--push-frames", type=int, default=200)
    p.add_argument("--push-window", type=int, default=48)
    p.add_argument("--push-iters", type=int, default=50, help="push: rollouts per window")
    p.add_argument("--push-rod-distance", type=float, default=None,
                   help="push: the rod's start distance from the box's centre (m; default the "
                        "environment's, 0.2)")
    p.add_argument("--out", default="runs/trajopt")
    p.add_argument("--summarize", nargs="+", metavar="RESULTS_CSV",
                   help="instead, print one table of these results.csv files")
    return p
