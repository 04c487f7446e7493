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
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from .forward import Simulator, SolverWarning
from .gradient_modes import Exact, Smooth
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
    return 0
