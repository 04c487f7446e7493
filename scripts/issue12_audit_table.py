"""Issue 12: the gradient audit (diffgym.gradcheck) over whole random episodes of the five
environments and over the scene set of tests/test_gradient_audit.py and
tests/test_cylinder_contacts.py, as one table: per environment or scene the states audited
(of those visited; environment steps with every frame-skip sub-step), the block columns checked
and how many agreed with central differences, were explained by a mode switch inside the
stencil, sit at a state whose velocity is not unique (indeterminate) or failed; the largest
error among agreeing columns, among indeterminate ones and among failed ones (the bar: no
failure).

    python scripts/issue12_audit_table.py [--states N]    # N: audited steps per environment

The scenes are the tests' own (imported from the test modules), so the table and the tests
audit the same states.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time
import warnings

import numpy as np
import gymnasium as gym

import diffgym
import diffgym.envs  # noqa: F401
from diffgym.gradcheck import check_step_jacobians

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import test_gradient_audit as T  # noqa: E402
import test_cylinder_contacts as C  # noqa: E402


def row(name, rep, seconds):
    ind = [f.error for f in rep.findings if f.status == "indeterminate"]
    bad = [f.error for f in rep.findings if f.status == "failed"]
    worst_ok = max((b.worst_agreeing for b in rep.blocks.values()), default=0.0)
    sub = f" + {rep.substeps} sub-steps" if rep.substeps else ""
    vis = f" of {rep.visited}" if rep.visited else ""
    fmt = lambda x: f"{max(x):.1e}" if x else "-"  # noqa: E731
    print(f"| {name} | {rep.states}{vis}{sub} | {rep.checked} | {rep.agreeing} | {rep.explained} | "
          f"{rep.indeterminate} | {rep.failed} | {worst_ok:.1e} | {fmt(ind)} | {fmt(bad)} | "
          f"{seconds:.0f} |", flush=True)
    return rep


def scenes():
    """(name, thunk -> GradientReport) of the tests' scenes."""
    out = []
    sim_cart = lambda: diffgym.Simulator.from_file(diffgym.resources.asset_path("cartpole.xml"))  # noqa: E731

    def cart():
        sim = sim_cart()
        return T.audit(sim, start=(np.array([2.3, 2.5]), np.array([1.0, 0.0])),
                       actions=np.tile([60.0, 0.0], (25, 1)))
    out.append(("cart at its rail stop", cart))

    def hopper():
        sim = diffgym.Simulator.from_file(diffgym.resources.asset_path("hopper.xml"))
        q0 = sim.q0
        q0[1] += 1.0
        q0[3], q0[4] = -0.3, -0.01
        return T.audit(sim, start=(q0, np.zeros(6)), actions=np.tile([0, 0, 0, 0.0, 40.0, -5.0], (15, 1)))
    out.append(("hopper leg at its limit (in the air)", hopper))

    def balls():
        sim = diffgym.Simulator.from_string(T.TWO_BALLS)
        v0 = np.zeros(12)
        v0[0] = 1.0
        return T.audit(sim, start=(sim.q0, v0), actions=np.zeros((12, 12)))
    out.append(("two frictionless balls", balls))
    for euler, v0, steps, label in (("", [0] * 6, 25, "resting"), ("", [1.0, 0.3, 0, 0, 0, 0], 25, "sliding"),
                                    ('euler="20 0 0"', [1.0, 0.5, 0, 0, 0, 2.0], 8, "edge-spinning")):
        def box(euler=euler, v0=v0, steps=steps):
            sim = diffgym.Simulator.from_string(T.BOX.format(euler=euler))
            tau = [0.1, 0.2, 0.3, 0.01, 0.02, 0.03] if label == "resting" else [0] * 6
            return T.audit(sim, start=(T._on_ground(sim, sim.q0), np.array(v0, float)),
                           actions=np.tile(tau, (steps, 1)))
        out.append((f"frictional box, {label}", box))

    def feet():
        sim = diffgym.Simulator.from_string(T.FEET)
        return T.audit(sim, start=(T._on_ground(sim, sim.q0, pair=1), np.array([0.8, 0.3, 0, 0, 0, 6.0])),
                       actions=np.zeros((30, 6)))
    out.append(("box on three feet, sliding and spinning", feet))

    def flush():
        env = gym.make("DiffPush-v0", target=(0.3, 0.0))
        x = T._flush_push_state(env)
        return diffgym.envs.check_jacobians(env, start=x, actions=np.tile([0.6, 0.0, 0.0], (20, 1)),
                                            max_states=None)
    out.append(("DiffPush-v0 rod flush against the box face", flush))

    def pair(p):
        def run():
            import tempfile
            ground, geom, pos, euler = T.PAIRS[p]
            with tempfile.TemporaryDirectory() as d:
                d = pathlib.Path(d)
                asset = '<asset><mesh name="cube" file="cube.obj"/></asset>' if "mesh" in geom else ""
                (d / "cube.obj").write_text(T.MESH_OBJ)
                (d / "scene.xml").write_text(T.PAIR.format(asset=asset, ground=ground, geom=geom, pos=pos,
                                                           euler=euler))
                sim = diffgym.Simulator.from_file(str(d / "scene.xml"))
            v0 = np.array([0.6, 0.3, -0.5, 0.5, -0.3, 1.5])
            return T.audit(sim, start=(sim.q0, v0), actions=np.zeros((40, 6)), max_states=20, name=p)
        return run
    for p in T.PAIRS:
        out.append((f"pair {p}", pair(p)))

    def spheres():
        sim = diffgym.Simulator.from_string(T.TWO_BALLS.replace('friction="0"', 'friction="0.5"'))
        v0 = np.zeros(12)
        v0[0], v0[5] = 1.5, 3.0
        return T.audit(sim, start=(sim.q0, v0), actions=np.zeros((20, 12)))
    out.append(("pair sphere-sphere (both moving)", spheres))

    for euler, v0, label in (((0.0, 0.0, 10.0), [0] * 6, "resting on its cap"),
                             ((0.0, 0.0, 10.0), [0.6, 0.2, 0, 0, 0, 0], "sliding on its cap"),
                             ((90.0, 0.0, 30.0), [0.3, -0.4, 0, 0, 0, 0], "rolling on its side"),
                             ((20.0, 10.0, 0.0), [0.5, 0.2, 0, 0, 0, 2.0], "spinning on its rim")):
        def cyl(euler=euler, v0=v0):
            sim = diffgym.Simulator.from_string(C.STATIC.format(z=1, euler="0 0 0"))
            q = C._pose(sim, euler, C._touching_height(euler))
            return check_step_jacobians(sim, start=(q, np.array(v0, float)), actions=np.zeros((8, 6)),
                                        max_states=None)
        out.append((f"cylinder on a static box, {label}", cyl))
    for euler, z, label in (("0 0 0", 0.4 - 2e-5, "cap"), ("90 0 0", 0.3 - 2e-5, "side"), ("8 0 0", 0.44, "rim")):
        def cylfree(euler=euler, z=z):
            sim = diffgym.Simulator.from_string(C.ON_FREE_BOX.format(z=z, euler=euler))
            q, v = sim.q0, np.zeros(sim.nv)
            for _ in range(30):
                q, v = sim.step(q, v, np.zeros(sim.nv))
            tau = np.zeros(sim.nv)
            tau[0] = 8.0
            return check_step_jacobians(sim, start=(q, v), actions=np.tile(tau, (6, 1)), max_states=None)
        out.append((f"cylinder on a free box, pushed ({label})", cylfree))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--states", type=int, default=None,
                    help="audited steps per environment (default: the tests' numbers)")
    ap.add_argument("--only", default="", help="run only rows whose name contains this")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    print("| environment / scene | states audited | columns | agree | explained | indeterminate | "
          "failed | worst agreeing | worst indeterminate | worst failed | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    total = []
    for env_id, kw in T.EPISODES.items():
        if args.only and args.only not in env_id:
            continue
        n = args.states if args.states is not None else kw["max_states"]
        t0 = time.perf_counter()
        rep = diffgym.envs.check_jacobians(gym.make(env_id), seed=0, max_states=n)
        total.append(row(f"{env_id}, seed-0 random episode", rep, time.perf_counter() - t0))
    for name, run in scenes():
        if args.only and args.only not in name:
            continue
        t0 = time.perf_counter()
        total.append(row(name, run(), time.perf_counter() - t0))
    print(f"\nfailed columns over all rows: {sum(r.failed for r in total)}; "
          f"indeterminate: {sum(r.indeterminate for r in total)}; "
          f"checked: {sum(r.checked for r in total)}")
    return 1 if any(r.failed for r in total) else 0


if __name__ == "__main__":
    sys.exit(main())
