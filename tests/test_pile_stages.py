"""Which solver stage solves the steps of box piles (issue 16, "a solver that converges on
piles"): columns of boxes face on face (``bench_scaling.boxes_mjcf``: four coplanar contact
points per face, more rows than the dofs they hold, impulses not unique), a 3-box stack and a
box on its face. Every step must converge in the compiled stage 1 / 1b (``sim.last.method``
"newton" or "prox+newton"), not in the slow later stages (pinocchio's ADMM, the semismooth
Newton: thousands of iterations in Python).

At rest they do. Pushed by random forces (the rollout of tests/test_deriv_islands.py) they do
not yet: measured on 60 steps, the 3-box stack is solved by the slow stages on 36 steps, a
column of four on 53, a pile of 16 on all 60. The cause (see the report of session 10's
h-piles): with the modes of the exact solution given, the mode equations' minimum-norm point
has negative normal impulses at some corners of a patch (the impulses are an affine set; the
exact solution is another point of it), so the active-set mode tests switch correct modes
away, and almost every active set on the way contains sliding corners. Those tests are marked
``xfail(strict=True)``: they fail today, and pass (then the mark must go) once stage 1 handles
it."""
import subprocess
import sys
import warnings

import numpy as np
import pytest

import diffgym
from diffgym.bench_scaling import boxes_mjcf

SLOW_STAGES = ("pinadmm+newton", "ssn+newton", "admm+newton", "pgs+newton", "admm", "pgs")
STAGE_ONE = ("newton", "prox+newton")


def _methods(n_boxes, steps, push):
    """(method, converged) of each step: from rest (push False) or along the random rollout of
    tests/test_deriv_islands.py (initial velocities 0.05 N(0, 1), forces 0.3 N(0, 1))."""
    sim = diffgym.Simulator.from_string(boxes_mjcf(n_boxes))
    rng = np.random.default_rng(1)
    q = sim.q0
    v = 0.05 * rng.normal(size=sim.nv) if push else np.zeros(sim.nv)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            tau = 0.3 * rng.normal(size=sim.nv) if push else np.zeros(sim.nv)
            q, v = sim.step(q, v, tau)
            out.append((sim.last.method, bool(sim.last.converged)))
    return out, v


@pytest.mark.parametrize("n_boxes", [1, 3, 4, 16])
def test_resting_piles_converge_in_stage_one(n_boxes):
    """A box on its face, a 3-box stack, a column of four and 16 boxes in four columns, from
    rest: every step converges in stage 1 / 1b and the pile stays at rest."""
    log, v = _methods(n_boxes, 60, push=False)
    assert all(c for _, c in log)
    slow = [k for k, (m, _) in enumerate(log) if m not in STAGE_ONE]
    assert not slow, [log[k][0] for k in slow]
    assert np.abs(v).max() < 1e-6


@pytest.mark.xfail(strict=True, reason="issue 16: stage 1 fails on pushed box piles "
                   "(module docstring); remove the mark when it passes")
@pytest.mark.parametrize("n_boxes", [3, 4])
def test_pushed_piles_converge_in_stage_one(n_boxes):
    """The 3-box stack and a column of four under random forces: every step converges, and in
    stage 1 / 1b (no slow stage)."""
    log, _ = _methods(n_boxes, 20, push=True)
    assert all(c for _, c in log)
    slow = [m for m, _ in log if m in SLOW_STAGES]
    assert not slow, (len(slow), slow)


_HISTORY = r"""
import sys, warnings, numpy as np
import diffgym
from diffgym import bench_drops
from diffgym.bench_scaling import boxes_mjcf
if sys.argv[1] == "after":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bench_drops.run_scene(bench_drops.make_scene(7, 11))   # an ellipsoid and a box
sim = diffgym.Simulator.from_string(boxes_mjcf(16))
rng = np.random.default_rng(1)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    q, v = sim.q0, 0.05 * rng.normal(size=sim.nv)
    for _ in range(2):
        q, v = sim.step(q, v, 0.3 * rng.normal(size=sim.nv))
c = sim.cache["cons"].contacts
sys.stdout.write(np.concatenate([c.pos.ravel(), c.normal.ravel(), c.dist]).tobytes().hex())
"""


@pytest.mark.xfail(strict=True, reason="coal's box-box GJK/EPA answer for the same placements "
                   "depends on what the process ran before (module docstring of this test)")
def test_box_patch_rows_do_not_depend_on_process_history():
    """The second step's contact rows of a 16-box pile are the same, bit for bit, in a fresh
    process and in one that ran a drop scene (an ellipsoid and a box, bench_drops scene 11 of
    seed 7) before building the pile. Today they are not: for the same placements (checked
    equal bit for bit) coal's collision result for resting box-box pairs has a penetration
    depth of -5.0e-12 in a fresh process and -1.4e-17 / 0 after that scene, its contact
    position moves by 2.5e-12 and its patch points by 5e-12; the separating-axis snap of the
    driver (``CollisionDriver._snap`` / ``patch_along``) removes all but the last bits (the
    rows' positions differ by up to 4e-17 at the second step, distances by 3e-20; normals are
    equal; at the first step the rows are still equal). It is not
    diffgym's caches (a fresh Simulator has fresh coal requests, results and functors), not
    the import order, and not flush-to-zero in numpy's thread."""
    runs = [subprocess.run([sys.executable, "-c", _HISTORY, which], capture_output=True,
                           text=True, timeout=600) for which in ("fresh", "after")]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout
