"""``diffgym bench --smooth``: the smooth gradient mode measured against the exact one.

1. **Gradients across a contact event.** A 1-D sweep of an initial condition across the event,
   the same exact forward rollout for both modes, and the derivative of a final quantity with
   respect to the swept one, chained from the step Jacobians (``jac.state``) of each mode:

   * ``hopper``: Gymnasium's hopper (``assets/hopper.xml``, dt 2 ms) dropped from rest, its
     root raised by ``z0`` (swept); ``d rootz(T) / d z0`` and ``d rootz_dot(T) / d z0`` after a
     horizon ``T`` that puts the foot strike inside the rollout for every ``z0``;
   * ``cartpole``: the cart (``assets/cartpole.xml``, dt 16.6 ms) launched at ``v0`` (swept)
     towards its rail stop at 2.4 m from 2.2 m, pole upright, no force;
     ``d x(T) / d v0`` (the stop turns a slope of ``T`` into 0).

   Per mode: the derivative along the sweep (sampled rows), its standard deviation over the
   sweep, its total variation (sum of |jumps| between neighbouring samples) and its largest jump,
   and the mean distance to the secant slope of the final quantity between neighbouring samples
   (the slope of the landscape at the sweep's resolution).
2. **Cost.** Seconds per step with ``jacobian=True`` in each mode (and without) at the same
   recorded states of ``hopper``, ``go1`` and ``billiards`` (the scenarios of ``diffgym bench``,
   after ``--jac-warmup`` steps), blocks alternating exact / smooth / forward, ``--repeats``
   rounds, the median reported; the smooth mode's relaxed Newton iterations per step.
3. **long_range against the scene's size.** Seconds per step with Jacobian in the exact and the
   long_range mode on billiards with 16 and 64 balls (``billiards_mjcf``: the shipped table and
   balls, the rack grown), at the same recorded states, and the potential's own share (its
   evaluation and force derivative); the growth exponent in the number of balls.
"""
from __future__ import annotations

import math
import time
import warnings

import numpy as np

from .sim.forward import Simulator, SolverWarning
from .sim.gradient_modes import Exact, Smooth
from .resources import asset_path


def _rollout_jacobians(sim, q, v, steps, modes):
    """Final (q, v) of the exact rollout and, per mode, the chained state Jacobian."""
    P = {m: np.eye(2 * sim.nv) for m in modes}
    tau = np.zeros(sim.nv)
    sim.reset_warmstart()
    for _ in range(steps):
        q0, v0 = q, v
        for m, mode in modes.items():
            sim.gradient = mode
            sim.reset_warmstart()
            q, v, jac = sim.step(q0, v0, tau, jacobian=True)
            P[m] = jac.state @ P[m]
    sim.gradient = Exact()
    return q, v, P


def sweep(name: str, n: int = 41, rhos=(1e-3, 1e-2, 1e-1)):
    """The derivative of the final quantity along the sweep; returns (xs, outputs, grads) where
    grads[label][mode] is an array over the sweep."""
    modes = {"exact": Exact(), **{f"smooth {r:g}": Smooth(rho=r) for r in rhos}}
    if name == "hopper":
        sim = Simulator.from_file(asset_path("hopper.xml"))
        xs = np.linspace(0.0, 0.03, n)
        steps = 50
        outs = {"rootz(T)": (1, 1)}                # (row, column) of the chained Jacobian

        def start(x):
            q = sim.q0.copy()
            q[1] += x
            return q, np.zeros(sim.nv)
    elif name == "cartpole":
        sim = Simulator.from_file(asset_path("cartpole.xml"))
        xs = np.linspace(0.6, 1.6, n)
        steps = 15
        outs = {"x(T)": (0, sim.nv)}

        def start(x):
            q = sim.q0.copy()
            q[0] = 2.2
            v = np.zeros(sim.nv)
            v[0] = x
            return q, v
    else:
        raise ValueError(f"no sweep for {name!r}")
    finals = {k: np.empty(n) for k in outs}
    grads = {k: {m: np.empty(n) for m in modes} for k in outs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverWarning)
        for i, x in enumerate(xs):
            q, v = start(x)
            q1, v1, P = _rollout_jacobians(sim, q, v, steps, modes)
            state = np.concatenate([q1, v1])
            for k, (row, col) in outs.items():
                finals[k][i] = state[row]
                for m in modes:
                    grads[k][m][i] = P[m][row, col]
    return xs, finals, grads, steps, sim.dt


def _stats(xs, final, g):
    secant = np.diff(final) / np.diff(xs)
    mid = 0.5 * (g[1:] + g[:-1])
    jumps = np.abs(np.diff(g))
    return float(np.std(g)), float(jumps.sum()), float(jumps.max()), float(np.mean(np.abs(mid - secant)))


def report_sweep(name: str, n: int = 41, rows: int = 11, rhos=(1e-3, 1e-2, 1e-1)) -> None:
    t0 = time.perf_counter()
    xs, finals, grads, steps, dt = sweep(name, n, rhos)
    swept = "z0 (m)" if name == "hopper" else "v0 (m/s)"
    for k, g in grads.items():
        modes = list(g)
        print(f"{name}: d {k} / d {swept.split()[0]}, T = {steps} steps of {dt:g} s, {n} samples "
              f"of {swept} in [{xs[0]:g}, {xs[-1]:g}] ({time.perf_counter() - t0:.0f} s)")
        head = f"{swept:>10} {k:>13} " + " ".join(f"{m:>13}" for m in modes)
        print(head)
        for i in np.linspace(0, n - 1, rows).round().astype(int):
            print(f"{xs[i]:10.4f} {finals[k][i]:13.5g} " + " ".join(f"{g[m][i]:13.5g}" for m in modes))
        print(f"{'':>10} {'':>13} " + " ".join(f"{'-' * 13}" for _ in modes))
        for j, label in enumerate(("std", "total var.", "max jump", "|g - secant|")):
            vals = [_stats(xs, finals[k], g[m])[j] for m in modes]
            print(f"{label:>24} " + " ".join(f"{v:13.4g}" for v in vals))
        print()


def time_modes(names=("hopper", "go1", "billiards"), states: int = 50, warmup: int = 200,
               repeats: int = 3, rho: float = 3e-3):
    from .bench import MODELS, scenario
    rows = []
    for name in names:
        sc = scenario(name, asset_path(MODELS[name]))
        sim = sc.sim
        zero = np.zeros(sim.nv)
        ctrl = sc.control
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SolverWarning)
            q, v = sc.q0.copy(), sc.v0.copy()
            for _ in range(warmup):
                q, v = sim.step(q, v, ctrl(q, v) if ctrl else zero)
            taken = []
            for _ in range(states):
                tau = (ctrl(q, v) if ctrl else zero).copy()
                taken.append((q, v, tau))
                q, v = sim.step(q, v, tau)
            times = {"fwd": [], "exact": [], "smooth": []}
            iters, rows_m, contacts = [], [], []
            for mode in (Exact(), Smooth(rho=rho)):      # untimed: set-up and compilation
                sim.gradient = mode
                sim.step(*taken[0], jacobian=True)
            for r in range(repeats):
                for kind in ("exact", "smooth", "fwd"):
                    sim.gradient = Smooth(rho=rho) if kind == "smooth" else Exact()
                    sim.reset_warmstart()
                    t0 = time.perf_counter()
                    for qs, vs, ts in taken:
                        if kind == "fwd":
                            sim.step(qs, vs, ts)
                        else:
                            sim.step(qs, vs, ts, jacobian=True)
                            if kind == "smooth" and r == 0:
                                rel = sim.cache.get("relaxed")
                                iters.append(rel.iterations if rel is not None else 0)
                                cons = sim.cache["cons"]
                                rows_m.append(cons.m if cons is not None else 0)
                                contacts.append(len(sim.last.contact_modes))
                    times[kind].append((time.perf_counter() - t0) / states)
            sim.gradient = Exact()
        med = {k: float(np.median(t)) for k, t in times.items()}
        rows.append((name, sim.nv, float(np.mean(contacts)), float(np.mean(rows_m)),
                     float(np.mean(iters)), med["fwd"], med["exact"], med["smooth"]))
    return rows


def report_cost(states: int = 50, warmup: int = 200, repeats: int = 3, rho: float = 3e-3) -> None:
    rows = time_modes(states=states, warmup=warmup, repeats=repeats, rho=rho)
    print(f"cost of a step with Jacobian, smooth (rho = {rho:g}) vs exact, at the same {states} "
          f"recorded states after {warmup} steps; median of {repeats} rounds (blocks alternate "
          "exact, smooth, forward)")
    print(f"{'model':>10} {'nv':>4} {'contacts':>8} {'rows':>6} {'newton':>7} {'fwd (ms)':>9} "
          f"{'exact (ms)':>10} {'smooth (ms)':>11} {'smooth/exact':>12} {'smooth jac only/exact jac only':>31}")
    for name, nv, c, m, it, tf, te, ts in rows:
        extra = (ts - tf) / (te - tf) if te > tf else float("nan")
        print(f"{name:>10} {nv:>4} {c:8.1f} {m:6.1f} {it:7.1f} {1e3 * tf:9.3f} {1e3 * te:10.3f} "
              f"{1e3 * ts:11.3f} {ts / te:12.2f} {extra:31.2f}")


def main(args) -> int:
    states = int(getattr(args, "jac_states", 50) or 50)
    warmup = int(getattr(args, "jac_warmup", 200))
    repeats = max(1, int(getattr(args, "repeats", 3) or 1))
    for name in ("hopper", "cartpole"):
        report_sweep(name)
    report_cost(min(states, 50), warmup, repeats)
    print()
    report_long_range((16, 64), states=min(states, 10), repeats=repeats)
    return 0


# -- long_range: cost against the scene's size ---------------------------------------------------
def billiards_mjcf(n: int, dt: float = 0.04) -> str:
    """The billiards scene (``assets/billiards.xml``: pool balls of radius 28.6 mm, 0.17 kg, free
    joints, friction 0.2, four box cushions) with ``n`` balls: the cue ball at x = -0.5 and
    ``n - 1`` balls in a triangle rack with the shipped rack's 0.57 mm gaps (rows grow along x)."""
    r, gap = 0.0286, 0.00057
    pitch = 2 * r + gap
    balls = [(-0.5, 0.0)]
    row = 0
    while len(balls) < n:
        for k in range(row + 1):
            if len(balls) == n:
                break
            balls.append((0.3 + row * pitch * math.sqrt(3) / 2, (k - row / 2) * pitch))
        row += 1
    half_x = max(1.4, balls[-1][0] + 0.3)
    half_y = max(0.8, (row / 2) * pitch + 0.3)
    bodies = "".join(
        f'<body name="b{i}" pos="{x:.5f} {y:.5f} {r}"><freejoint/><geom name="b{i}" type="sphere" '
        f'size="{r}" mass="0.17"/></body>' for i, (x, y) in enumerate(balls))
    walls = "".join(
        f'<geom name="cushion_{k}" type="box" pos="{px} {py} 0.05" size="{sx} {sy} 0.05"/>'
        for k, (px, py, sx, sy) in enumerate(((0, half_y, half_x, 0.05), (0, -half_y, half_x, 0.05),
                                              (half_x, 0, 0.05, half_y), (-half_x, 0, 0.05, half_y))))
    return (f'<mujoco model="billiards{n}"><option timestep="{dt}" gravity="0 0 -9.81"/>'
            '<default><geom friction="0.2"/></default><worldbody>'
            f'<geom name="table" type="plane" size="{half_x} {half_y} 0.1"/>' + walls + bodies
            + "</worldbody></mujoco>")


def time_long_range(sizes=(16, 64), states: int = 20, warmup: int = 10, repeats: int = 3,
                    scale: float = 1e-8):
    """Per scene size n: seconds per step with Jacobian in the exact and the long_range mode at
    the same recorded states of ``billiards_mjcf(n)`` (the cue ball sent at 2 m/s into the rack),
    blocks alternating exact / long_range, median of ``repeats`` rounds; and the potential's own
    share: its evaluation and its force derivative alone."""
    from .sim.gradient_modes import LongRange
    rows = []
    for n in sizes:
        sim = Simulator.from_string(billiards_mjcf(n))
        q, v = sim.q0.copy(), np.zeros(sim.nv)
        v[0] = 2.0
        zero = np.zeros(sim.nv)
        lr_mode = LongRange(scale=scale)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SolverWarning)
            for _ in range(warmup):
                q, v = sim.step(q, v, zero)
            taken = []
            for _ in range(states):
                taken.append((q, v))
                q, v = sim.step(q, v, zero)
            for mode in (Exact(), lr_mode):              # untimed: set-up and compilation
                sim.gradient = mode
                sim.step(*taken[0], zero, jacobian=True)
            times = {"exact": [], "long_range": [], "potential": []}
            for _ in range(repeats):
                for kind in ("exact", "long_range", "potential"):
                    sim.gradient = lr_mode if kind != "exact" else Exact()
                    sim.reset_warmstart()
                    t0 = time.perf_counter()
                    for qs, vs in taken:
                        if kind == "potential":
                            lr = sim.long_range
                            sim._long_range_force(np.asarray(sim.data.J).reshape(6, sim.nv))
                            lr.force_derivative()
                        else:
                            sim.step(qs, vs, zero, jacobian=True)
                    times[kind].append((time.perf_counter() - t0) / states)
            sim.gradient = Exact()
        med = {k: float(np.median(t)) for k, t in times.items()}
        rows.append((n, sim.nv, len(sim.long_range.pairs), med["exact"], med["long_range"],
                     med["potential"]))
    return rows


def report_long_range(sizes=(16, 64), states: int = 20, repeats: int = 3) -> None:
    rows = time_long_range(sizes, states=states, repeats=repeats)
    print(f"cost of a step with Jacobian, long_range vs exact, billiards with n balls (cue ball at "
          f"2 m/s into the rack), {states} recorded states, median of {repeats} rounds (blocks "
          "alternate exact, long_range, potential alone)")
    print(f"{'balls':>6} {'nv':>5} {'pairs':>6} {'exact (ms)':>11} {'long_range (ms)':>16} "
          f"{'lr/exact':>9} {'potential+deriv (ms)':>21}")
    for n, nv, p, te, tl, tp in rows:
        print(f"{n:>6} {nv:>5} {p:>6} {1e3 * te:11.2f} {1e3 * tl:16.2f} {tl / te:9.2f} "
              f"{1e3 * tp:21.3f}")
    if len(rows) >= 2:
        (n0, *_, te0, tl0, tp0), (n1, *_, te1, tl1, tp1) = rows[0], rows[-1]
        k = math.log(n1 / n0)
        print(f"scaling exponent in n ({n0} -> {n1}): exact {math.log(te1 / te0) / k:.2f}, "
              f"long_range {math.log(tl1 / tl0) / k:.2f}, potential+derivative "
              f"{math.log(tp1 / tp0) / k:.2f}")
