"""Random drop benchmark after the single-level contact paper's 3,600-drop test.

``diffgym bench --drops`` (or ``python -m diffgym.bench_drops``) drops primitives (box, capsule,
sphere, cylinder, ellipsoid) and pairs of them on a floor with a random pose, size and velocity,
at simulation rates of 10 to 100 Hz, for 1.5 s each, and counts the runs that fail each of these
categories (a run can fail several):

* ``nonconv``: a step whose solver did not reach its tolerance (``sim.last.converged`` False);
* ``energy``: the mechanical energy (kinetic + gravity) exceeds its initial value by more than
  ``1e-3 (E0 - E_rest) + m g 1e-4 m`` at some step (the scene is passive: no actuation, no
  damping; the slack covers the Baumgarte push-out of a 0.1 mm penetration);
* ``through``: a body's lowest point ends more than 5 cm below the floor, or its centre goes
  below the floor at any step;
* ``pen``: the deepest penetration (floor: the lowest point of each shape in closed form,
  independent of the collision code; between bodies: the signed distances the next step
  detects) exceeds 1 mm at rates >= 30 Hz or 1 cm at any rate;
* ``exception``: the step raised (SimulationError or anything else).

Runs are seeded: run ``i`` of seed ``s`` is the same scene whatever ``--n``. The table gives
counts per shape and per rate, then solver statistics (worst residual, most iterations of a
step, how many steps were solved by a fallback stage rather than the active-set Newton from the
warm or the cold start).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

SHAPES = ("box", "capsule", "sphere", "cylinder", "ellipsoid", "pair")
RATES = (10, 20, 30, 50, 100)
KINDS = ("box", "capsule", "sphere", "cylinder", "ellipsoid")
CATEGORIES = ("nonconv", "energy", "through", "pen", "exception")
DURATION = 1.5
GRAVITY = 9.81


def _rand_size(kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "sphere":
        return np.array([rng.uniform(0.03, 0.15)])
    if kind in ("capsule", "cylinder"):
        return np.array([rng.uniform(0.03, 0.1), rng.uniform(0.03, 0.2)])
    return rng.uniform(0.03, 0.2, size=3)            # box half sizes, ellipsoid radii


def _rand_quat(rng: np.random.Generator) -> np.ndarray:
    """Uniform random unit quaternion (w x y z)."""
    q = rng.normal(size=4)
    return q / np.linalg.norm(q)


@dataclass
class Scene:
    index: int
    shape: str
    rate: int
    kinds: list
    sizes: list
    pos: list
    quat: list              # (w x y z), MJCF order
    vlin: list
    vang: list

    def mjcf(self) -> str:
        bodies = []
        for b, (kind, size, p, qt) in enumerate(zip(self.kinds, self.sizes, self.pos, self.quat)):
            bodies.append(
                f'<body name="b{b}" pos="{p[0]:.17g} {p[1]:.17g} {p[2]:.17g}" '
                f'quat="{qt[0]:.17g} {qt[1]:.17g} {qt[2]:.17g} {qt[3]:.17g}">'
                f'<freejoint name="j{b}"/>'
                f'<geom name="g{b}" type="{kind}" size="{" ".join(f"{s:.17g}" for s in size)}" '
                f'friction="{0.8}"/></body>')
        return (f'<mujoco model="drop{self.index}_{self.shape}_{self.rate}hz">'
                f'<option timestep="{1.0 / self.rate:.17g}" gravity="0 0 {-GRAVITY}"/>'
                '<worldbody><geom name="floor" type="plane" size="5 5 0.1" friction="0.8"/>'
                + "".join(bodies) + "</worldbody></mujoco>")


def make_scene(seed: int, index: int) -> Scene:
    """Run ``index``: its shape and rate cycle through SHAPES x RATES; the rest is random."""
    rng = np.random.default_rng([seed, index])
    shape = SHAPES[index % len(SHAPES)]
    rate = RATES[(index // len(SHAPES)) % len(RATES)]
    kinds = [rng.choice(KINDS), rng.choice(KINDS)] if shape == "pair" else [shape]
    kinds = [str(k) for k in kinds]
    sizes = [_rand_size(k, rng) for k in kinds]
    pos, quat, vlin, vang = [], [], [], []
    z = 0.0
    xy = rng.uniform(-0.2, 0.2, size=2)
    for k, s in zip(kinds, sizes):
        reach = float(np.linalg.norm(s[:3])) if k in ("box", "ellipsoid") else float(s[0] + (s[1] if len(s) > 1 else 0.0))
        z += reach + rng.uniform(0.05, 0.5)
        # the second body of a pair above the first, offset by less than their sizes: they meet
        pos.append(np.array([xy[0] + rng.uniform(-0.05, 0.05), xy[1] + rng.uniform(-0.05, 0.05), z]))
        z += reach
        quat.append(_rand_quat(rng))
        vlin.append(rng.uniform(-1.0, 1.0, size=3))
        vang.append(rng.uniform(-5.0, 5.0, size=3))
    return Scene(index, shape, rate, kinds, sizes, pos, quat, vlin, vang)


def _lowest_height(kind: str, size: np.ndarray, R: np.ndarray, t: np.ndarray) -> float:
    """Height of the lowest point of a shape above the floor z = 0 (closed form)."""
    n = np.array([0.0, 0.0, 1.0])
    if kind == "sphere":
        return float(t[2] - size[0])
    if kind == "box":
        return float(t[2] - np.abs(R[2, :]) @ size[:3])
    if kind == "capsule":
        return float(t[2] - abs(R[2, 2]) * size[1] - size[0])
    if kind == "cylinder":
        a = R[:, 2]
        return float(t[2] - abs(a[2]) * size[1] - size[0] * math.sqrt(max(0.0, 1.0 - a[2] * a[2])))
    if kind == "ellipsoid":
        # support of the ellipsoid x = t + R diag(r) u, |u| = 1, along -n: sqrt(n^T E n)
        Rn = R.T @ n
        return float(t[2] - math.sqrt(float(np.sum((size[:3] * Rn) ** 2))))
    raise ValueError(kind)


@dataclass
class RunResult:
    scene: Scene
    fails: set = field(default_factory=set)
    steps: int = 0
    nonconv_steps: int = 0
    fallback_steps: int = 0      # steps solved after the active-set Newton (warm, then cold start)
    slow_steps: int = 0          # ... by the slow stages (ADMM, SSN, PGS), not the proximal one
    max_residual: float = 0.0
    max_iterations: int = 0
    max_pen: float = 0.0
    max_gain: float = 0.0
    error: str = ""
    seconds: float = 0.0


def run_scene(scene: Scene, tol: float = 1e-9) -> RunResult:
    import pinocchio as pin

    from .sim.forward import Simulator

    out = RunResult(scene)
    t0 = time.perf_counter()
    try:
        sim = Simulator.from_string(scene.mjcf(), tol=tol)
    except Exception as exc:      # noqa: BLE001 - reported as a failure of the run
        out.fails.add("exception")
        out.error = f"load: {type(exc).__name__}: {exc}"
        return out
    model, data = sim.model, pin.Data(sim.model)
    q = sim.q0.copy()
    v = np.zeros(sim.nv)
    bodies = []
    for b, kind in enumerate(scene.kinds):
        jt = model.joints[model.getJointId(f"j{b}")]
        jr = model.joints[model.getJointId(f"j{b}_rot")]
        v[jt.idx_v:jt.idx_v + 3] = scene.vlin[b]
        v[jr.idx_v:jr.idx_v + 3] = scene.vang[b]
        bodies.append((kind, scene.sizes[b], jt.idx_q, jr.idx_q))
    mass = float(sum(model.inertias[i].mass for i in range(1, model.njoints)))
    tau = np.zeros(sim.nv)

    def energy(q, v):
        return (pin.computeKineticEnergy(model, data, q, v) + pin.computePotentialEnergy(model, data, q))

    def heights(q):
        hs = []
        for kind, size, iq, ir in bodies:
            x, y, z, w = q[ir:ir + 4]
            R = pin.Quaternion(w, x, y, z).toRotationMatrix()
            hs.append((_lowest_height(kind, size, R, q[iq:iq + 3]), q[iq + 2]))
        return hs

    e0 = energy(q, v)
    e_rest = min(energy(q, np.zeros(sim.nv)) - mass * GRAVITY * min(h for h, _ in heights(q)), e0)
    slack = 1e-3 * max(e0 - e_rest, 0.0) + mass * GRAVITY * 1e-4
    n_steps = int(round(DURATION * scene.rate))
    pen_limit = 1e-3 if scene.rate >= 30 else 1e-2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(n_steps):
            try:
                q, v = sim.step(q, v, tau)
            except Exception as exc:      # noqa: BLE001 - the category counts it
                out.fails.add("exception")
                out.error = f"step {k}: {type(exc).__name__}: {exc}"
                break
            out.steps += 1
            last = sim.last
            if not last.converged:
                out.nonconv_steps += 1
                out.fails.add("nonconv")
            if last.method not in ("newton", "none"):
                out.fallback_steps += 1
                if not last.method.startswith("prox+newton"):
                    out.slow_steps += 1
            out.max_residual = max(out.max_residual, float(last.residual))
            out.max_iterations = max(out.max_iterations, int(last.iterations))
            if len(last.contact_distances):
                # distances of the state this step started from, between bodies (floor: below)
                geoms = last.contact_geoms
                between = [i for i, (a, b) in enumerate(geoms) if "floor" not in (a, b)]
                if between:
                    out.max_pen = max(out.max_pen, -float(np.min(last.contact_distances[between])))
            hs = heights(q)
            for h, zc in hs:
                out.max_pen = max(out.max_pen, -h)
                if zc < 0.0:
                    out.fails.add("through")
            gain = energy(q, v) - e0
            out.max_gain = max(out.max_gain, gain)
            if gain > slack:
                out.fails.add("energy")
        if "exception" not in out.fails and any(h < -0.05 for h, _ in heights(q)):
            out.fails.add("through")
    if out.max_pen > pen_limit:
        out.fails.add("pen")
    out.seconds = time.perf_counter() - t0
    return out


def _table(results: list[RunResult], key, keys, title) -> str:
    lines = [f"{title:<10} {'runs':>5} " + " ".join(f"{c:>9}" for c in CATEGORIES)
             + f" {'any fail':>9} {'fallback':>11} {'slow':>6} {'max res':>9} {'max its':>8} {'max pen':>9}"]
    for kv in list(keys) + ["all"]:
        rs = [r for r in results if kv == "all" or key(r) == kv]
        if not rs:
            continue
        counts = [sum(c in r.fails for r in rs) for c in CATEGORIES]
        anyf = sum(bool(r.fails) for r in rs)
        fb = sum(r.fallback_steps for r in rs)
        st = sum(r.steps for r in rs)
        slow = sum(r.slow_steps for r in rs)
        lines.append(f"{str(kv):<10} {len(rs):>5} " + " ".join(f"{c:>9d}" for c in counts)
                     + f" {anyf:>9d} {fb:>5d}/{st:<6d}{slow:>5d} {max(r.max_residual for r in rs):>9.1e}"
                     f" {max(r.max_iterations for r in rs):>8d} {max(r.max_pen for r in rs):>9.1e}")
    return "\n".join(lines)


def format_report(results: list[RunResult], seconds: float, list_all: bool = False) -> str:
    parts = [_table(results, lambda r: r.scene.shape, SHAPES, "shape"), "",
             _table(results, lambda r: r.scene.rate, RATES, "rate (Hz)"), ""]
    steps = sum(r.steps for r in results)
    parts.append(f"{len(results)} runs, {steps} steps in {seconds:.1f} s; counts are runs failing "
                 "each category (a run may fail several); fallback = steps solved by a stage after "
                 "the active-set Newton (warm, then cold start) / steps, slow = those solved by the ADMM, "
                 "SSN or PGS stages (not the proximal one); max pen in m.")
    bad = [r for r in results if r.fails]
    if bad:
        parts.append("failing runs:" if list_all else "failing runs (first 15; --list-all: all):")
        for r in (bad if list_all else bad[:15]):
            s = r.scene
            parts.append(f"  #{s.index} {s.shape}({'+'.join(s.kinds)}) {s.rate} Hz: "
                         f"{','.join(sorted(r.fails))} pen {r.max_pen:.1e} gain {r.max_gain:.1e} "
                         f"res {r.max_residual:.1e} {r.error}")
    return "\n".join(parts)


def run(n: int, seed: int = 0, progress: bool = False, start: int = 0,
        ids: list | None = None) -> tuple[list[RunResult], float]:
    """Runs start .. start + n - 1 of ``seed``, or the runs ``ids`` (then n and start are not
    read)."""
    t0 = time.perf_counter()
    results = []
    todo = list(ids) if ids is not None else list(range(start, start + n))
    for done, i in enumerate(todo, 1):
        results.append(run_scene(make_scene(seed, i)))
        if progress and done % 50 == 0:
            print(f"  {done}/{len(todo)} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                  flush=True)
    return results, time.perf_counter() - t0


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--n", type=int, default=300,
                        help="number of drops (the paper's test: 3600; default 300, ~10 per "
                             "shape and rate)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random scenes")
    parser.add_argument("--start", type=int, default=0, help="index of the first run")
    parser.add_argument("--ids", type=int, nargs="+", default=None,
                        help="run only these run indices (of --seed; --n and --start unread), "
                             "e.g. the failing runs a full run listed")
    parser.add_argument("--list-all", action="store_true",
                        help="list every failing run (default: the first 15)")
    return parser


def main(args) -> int:
    n = int(args.n)
    if n < 1:
        raise SystemExit(f"--n must be positive, got {n}")
    ids = getattr(args, "ids", None)
    if ids is not None and any(i < 0 for i in ids):
        raise SystemExit(f"--ids must be non-negative run indices, got {ids}")
    results, seconds = run(n, int(args.seed), progress=True, start=int(getattr(args, "start", 0)),
                           ids=ids)
    print(format_report(results, seconds, list_all=bool(getattr(args, "list_all", False))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(add_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0])).parse_args()))
