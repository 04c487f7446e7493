"""The mode system of the step derivatives solved island by island of its active rows
(``derivative_kernels._island_min_norm``): against the pseudo-inverse of the whole system, the
dense LAPACK route of the numpy reference on whole steps of ball racks and box piles (boxes on
their faces: rank-deficient blocks), and central differences along random rollouts."""
import warnings

import numpy as np
import pytest

import diffgym
from diffgym.bench_scaling import balls_mjcf, boxes_mjcf
from diffgym.gradcheck import check_step_jacobians
from diffgym.sim import collision_derivatives as CD
from diffgym.sim import derivative_kernels as K
from diffgym.sim import derivatives as D

from test_derivative_kernels import rel_diff


def _system(rng, consistent):
    """A mode system of three islands: a full-rank block, a rank-deficient block (six rows of
    rank three, as four coplanar contact points give) and trivial rows (``d lam = 0``: breaking
    contacts) read by both blocks' rows, each block on its own dofs."""
    m, nv = 15, 10
    A = np.zeros((m, m))
    W = np.zeros((m, m))
    JM = np.zeros((m, nv))
    A[0:4, 0:4] = rng.normal(size=(4, 4)) + 4 * np.eye(4)
    Jb = rng.normal(size=(6, 3))
    A[4:10, 4:10] = Jb @ Jb.T                              # symmetric, rank 3
    for k in range(10, m):                                 # trivial rows, read by the others
        A[k, k] = 1.0
    A[1, 11] = A[5, 12] = A[7, 14] = 0.7
    W[:10, :10] = np.diag(rng.uniform(0.5, 1.5, 10))
    JM[0:4, 0:4] = rng.normal(size=(4, 4))
    JM[4:10, 4:10] = rng.normal(size=(6, 6))
    WD = rng.normal(size=(m, 3 * nv))
    WD[10:] = 0.0                                          # W's rows are zero there
    if consistent:                                         # in the range of the deficient block
        WD[4:10] = A[4:10, 4:10] @ rng.normal(size=(6, 3 * nv))
    return A, W, WD, JM


@pytest.mark.parametrize("seed", range(3))
def test_island_solve_is_the_minimum_norm_solution_of_the_whole_system(seed):
    rng = np.random.default_rng(seed)
    A, W, WD, JM = _system(rng, consistent=True)
    YT, status = K._island_min_norm(A, W, JM)
    assert status == 0
    want = JM.T @ np.linalg.pinv(A, rcond=1e-12) @ WD     # M^-1 J^T A^+ W D
    assert np.abs(YT.T @ WD - want).max() <= 1e-10 * np.abs(want).max()


def test_island_solve_of_an_inconsistent_deficient_block():
    """A rank-deficient block whose right-hand side leaves its rows' range, linked to a
    trivial row: the whole system's least-squares solution is not the block's, and the block's
    whole component (through the trivial rows) is solved as one; unlinked, the block's own
    solution is the whole system's."""
    for unlink in (False, True):
        A, W, WD, JM = _system(np.random.default_rng(5), consistent=False)
        if unlink:
            A[5, 12] = A[7, 14] = 0.0
        YT, status = K._island_min_norm(A, W, JM)
        assert status == 0
        want = JM.T @ np.linalg.pinv(A, rcond=1e-12) @ WD
        assert np.abs(YT.T @ WD - want).max() <= 1e-10 * np.abs(want).max()
    # the reduced block's answer differs: the check is what makes the result exact
    A, W, WD, JM = _system(np.random.default_rng(5), consistent=False)
    want = JM.T @ np.linalg.pinv(A, rcond=1e-12) @ WD
    keep = np.r_[0:10]
    red = JM[keep].T @ np.linalg.pinv(A[np.ix_(keep, keep)], rcond=1e-12) @ WD[keep]
    assert np.abs(red - want).max() > 1e-6 * np.abs(want).max()


def _g_system(rng, consistent, rank=6):
    """A mode system whose first 12 rows are rows of G = J M^-1 J^T (sticking contacts, W's
    rows e_k), J's rows on body 1's 6 dofs of rank ``rank`` (12 rows: redundant, G's block rank
    deficient, as four coplanar contact points give), and 3 trivial rows (breaking contacts of
    body 1 against body 2) whose columns those rows read; M^-1 block diagonal by body."""
    m, nv = 15, 12
    J = np.zeros((m, nv))
    J[:12, :6] = rng.normal(size=(12, rank)) @ rng.normal(size=(rank, 6))
    J[12:] = rng.normal(size=(3, nv))
    Minv = np.zeros((nv, nv))
    for b in (0, 6):
        R = rng.normal(size=(6, 6))
        Minv[b:b + 6, b:b + 6] = R @ R.T + 6 * np.eye(6)
    G = J @ Minv @ J.T
    A = np.eye(m)
    A[:12] = G[:12]
    W = np.zeros((m, m))
    W[:12, :12] = np.eye(12)
    JM = J @ Minv
    WD = np.zeros((m, 3 * nv))
    WD[:12] = rng.normal(size=(12, 3 * nv))
    if consistent:                                       # in the range of J's rows
        WD[:12] = J[:12] @ rng.normal(size=(nv, 3 * nv))
    grow = np.zeros(m, dtype=bool)
    grow[:12] = True
    return A, W, WD, JM, J, grow


@pytest.mark.parametrize("consistent", [True, False])
@pytest.mark.parametrize("rank", [6, 5])
def test_rows_of_g_solved_by_the_rows_pseudo_inverse(consistent, rank):
    """A block of rows of G with J's rows of full column rank on the block's dofs
    (``_rows_pinv``: M^-1 J^T G^+ = J^+) and redundant (G's block of rank 6 in 12 rows), linked
    to trivial rows, for a right-hand side in J's range and not: the whole system's
    minimum-norm solution, as the QR route (no row marked) gives; with J of rank 5 the block
    is not of full column rank and the QR route runs."""
    A, W, WD, JM, J, grow = _g_system(np.random.default_rng(7), consistent, rank)
    want = JM.T @ np.linalg.pinv(A, rcond=1e-12) @ WD
    YT, status = K._island_min_norm_rows(A, W, JM, J, grow)
    assert status == 0
    got = YT.T @ WD
    assert np.abs(got - want).max() <= 1e-10 * np.abs(want).max()
    YQ, status = K._island_min_norm(A, W, JM)
    assert status == 0
    assert np.abs(YQ.T @ WD - want).max() <= 1e-10 * np.abs(want).max()
    X, ok = K._rows_pinv(J, np.arange(12), 12, np.arange(6), 6)
    assert ok == (rank == 6)
    if ok:                                              # and the block's YT is J^+'s transpose
        assert np.abs(X - np.linalg.pinv(J[:12, :6]).T).max() <= 1e-12 * np.abs(X).max()
    # a row of J reaching outside the block's columns: not taken as the block's pseudo-inverse
    J2 = J.copy()
    J2[3, 8] = 1.0
    assert not K._rows_pinv(J2, np.arange(12), 12, np.arange(6), 6)[1]


def test_g_rows_of_the_mode_system():
    """``g_rows`` marks exactly the rows whose equation is G's row (A's row = G's, W's = e_k)."""
    from diffgym.sim.solver import BREAKING, SLIDING, STICKING
    rng = np.random.default_rng(3)
    nc, nl = 4, 2
    m = 3 * nc + nl
    Jr = rng.normal(size=(m, 9))
    G = Jr @ Jr.T
    modes = np.array([BREAKING, STICKING, SLIDING, SLIDING])
    mu = np.array([0.5, 0.5, 0.5, 0.0])
    lam = np.abs(rng.normal(size=m))
    sigma = rng.normal(size=m)
    act = np.array([True, False])
    A, W = K.mode_system(lam, sigma, modes, act, G, nc, mu)
    g = K.g_rows(modes, act, nc, m)
    want = [np.array_equal(A[k], G[k]) and np.array_equal(W[k], np.eye(m)[k]) for k in range(m)]
    assert g.tolist() == want
    assert g.sum() == 3 + 1 + 1 + 1                      # sticking, two normal rows, a limit


def _rollout_states(sim, rng, steps, vscale, fscale):
    q, v = sim.q0, vscale * rng.normal(size=sim.nv)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            tau = fscale * rng.normal(size=sim.nv)
            out.append((q, v, tau))
            q, v = sim.step(q, v, tau)
    return out


@pytest.mark.parametrize("scene", ["balls", "boxes"])
def test_whole_steps_match_the_dense_reference(scene, monkeypatch):
    """Along a random rollout of a 16-ball rack and a pile of 16 boxes on their faces (the
    mode system rank-deficient: four coplanar points per face), the compiled route (islands)
    equals the numpy reference's dense LAPACK solve of the whole system (which it takes itself
    only where a block's rank is not clear)."""
    sim = diffgym.Simulator.from_string(balls_mjcf(16) if scene == "balls" else boxes_mjcf(16))
    dense = []
    solve = D._solve_min_norm
    monkeypatch.setattr(D, "_solve_min_norm", lambda A, B: dense.append(A.shape) or solve(A, B))
    states = _rollout_states(sim, np.random.default_rng(1), 12, 0.05, 0.3)
    deficient = islands = 0
    reasons = dict(CD.fallback_reasons)
    for q, v, tau in states[::3]:
        sim.reset_warmstart()
        sim.step(q, v, tau)
        dense.clear()
        a = D.step_jacobian(sim, compiled=True)
        islands += not dense
        dense.clear()
        b = D.step_jacobian(sim, compiled=False)
        # two exact solves of the same system agree to its conditioning times rounding: the
        # smallest singular value the least-squares solve keeps bounds it. 1e-9 on every state
        # here but one of the pile's (three contacts sliding at slips of 4e-11 to 4e-10 m/s,
        # genuinely: their slip-direction rows, scaled by 1 / (1 + mu lam_N / |slip|), give
        # singular values of 3e-11 of the largest, Jacobian entries of 1e7, and routes that
        # agreed to 2e-11 on one CPU and to 5.4e-8 on another)
        sv = a.diagnostics.singular_values
        kept = sv[sv > 1e-12 * sv[0]] if sv.size else sv
        cond = float(kept[0] / kept[-1]) if kept.size else 1.0
        assert rel_diff(a, b) < max(1e-9, 10 * np.finfo(float).eps * cond), cond
        # the first Jacobian after the step is the later ones (once differed by 9.5e-3: coal's
        # patch about its own normal matched no closed-form candidate, and the finite-difference
        # fallback carried coal's GJK guess from one call to the next)
        assert rel_diff(a, D.step_jacobian(sim, compiled=True)) < 1e-12
        deficient += bool(a.diagnostics.rank_deficient)
    # every box-box row of the pile has its closed form (stacked faces tilted within the patch
    # tolerance once fell back: "patch point: no match")
    assert CD.fallback_reasons == reasons
    assert islands >= 1            # the island solve ran (a sliding pile: some ranks not clear)
    if scene == "boxes":
        assert deficient                                   # the degenerate case was visited


@pytest.mark.parametrize("scene", ["balls", "boxes"])
def test_rollout_gradients_against_central_differences(scene):
    """Random forces on a rack of 4 balls and a column of 4 boxes, from random velocities:
    every column agrees with central differences or a mode switch inside the stencil (or an
    indeterminate velocity) explains it."""
    rng = np.random.default_rng(2)
    sim = diffgym.Simulator.from_string(balls_mjcf(4) if scene == "balls" else boxes_mjcf(4))
    acts = 0.5 * rng.normal(size=(8, sim.nv))
    # boxes: one column (dq of box 1's tilt) agrees only to 2.5e-6 at h = 1e-6 beside a kink
    # that h = 1e-5 and 1e-4 see (modes at x +- h unchanged); the dense solve of the whole
    # mode system gave the same two findings before the island solve (an open question of the
    # pile's collision derivatives, not of the mode system): checked at 3e-6 there
    tol = 3e-6 if scene == "boxes" else 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = check_step_jacobians(sim, actions=acts, max_states=3, tol=tol,
                                   start=(sim.q0, 0.05 * rng.normal(size=sim.nv)))
    assert rep.states == 3 and rep.checked
    assert rep.ok, str(rep)


def test_restitution_derivative_of_a_scene_of_many_trees_uses_the_tree_groups():
    """Four balls falling onto a floor with Newton's impact law (e = 0.8), a scene split into
    tree groups: at the impact steps the numpy reference's restitution term (the contacts'
    pre-step relative velocity and its q-derivative) is taken through the groups, not through a
    whole-model pinocchio Data, and equals the compiled route."""
    xml = balls_mjcf(4).replace(
        "</worldbody>", "</worldbody><custom><numeric name=\"diffgym:restitution\" "
        "data=\"0.8\"/></custom>")
    sim = diffgym.Simulator.from_string(xml)
    assert sim.__dict__.get("_trees") is not None
    q = sim.q0.copy()
    q[2::7] += 0.02                      # each free joint's z, 2 cm above the floor
    v = np.zeros(sim.nv)
    v[2::6] = -1.0
    impacts = 0
    for _ in range(4):
        q1, v1, jac = sim.step(q, v, np.zeros(sim.nv), jacobian=True)
        cons = sim.cache["cons"]
        if cons is not None and cons.restitution is not None and np.any(cons.restitution):
            impacts += 1
            ref = D.step_jacobian(sim, compiled=False)
            assert rel_diff(jac, ref) < 1e-9
        q, v = q1, v1
    assert impacts
    assert sim.__dict__.get("_ddata0") is None
