"""The body-space Newton step of large linear active sets (solver_kernels.body_factor /
body_pinv): the minimum-norm least-squares solution of ``J M^-1 J^T lam = r`` through the
sparse ``K = J^T J`` of the island's dofs, checked against an SVD pseudo-inverse (numpy) and,
on whole steps of a ball rack and a box pile, against pinocchio's own ADMM on the same
problem."""
import warnings

import numpy as np
import pytest

import diffgym
import diffgym.sim.forward as fw
from diffgym.sim import solver_kernels as sk
from diffgym.bench_scaling import balls_mjcf, boxes_mjcf
from diffgym.sim.solver import NCPSolver


def _free_bodies_rows(rng, nb, floor_rows, null=None):
    """Rows of a chain of nb free bodies: ``floor_rows`` contacts on each, one between
    neighbours; one row made redundant; ``null``: a dof combination no row sees."""
    n = 6 * nb
    rows = []
    for b in range(nb):
        for _ in range(floor_rows):
            r = np.zeros((3, n))
            r[:, 6 * b:6 * b + 6] = rng.normal(size=(3, 6))
            rows.append(r)
        if b + 1 < nb:
            r = np.zeros((3, n))
            r[:, 6 * b:6 * b + 12] = rng.normal(size=(3, 12))
            rows.append(r)
    J = np.vstack(rows)
    J[3] = J[0] + J[1]
    if null is not None:
        J = J - np.outer(J @ null, null) / (null @ null)
    Minv = np.zeros((n, n))
    for b in range(nb):
        A = rng.normal(size=(6, 6))
        Minv[6 * b:6 * b + 6, 6 * b:6 * b + 6] = A @ A.T + np.eye(6)
    tree_lo = np.repeat(np.arange(nb) * 6, 6)
    return J, Minv, tree_lo, tree_lo + 6


@pytest.mark.parametrize("case", ["redundant", "null dof"])
def test_body_pinv_is_the_minimum_norm_least_squares_solution(case):
    rng = np.random.default_rng(3)
    nb = 5
    null = None
    if case == "null dof":
        null = np.zeros(6 * nb)
        null[[2, 5, 11]] = (0.5, 1.0, -1.0)        # a spin two bodies share, as gears
    J, Minv, lo, hi = _free_bodies_rows(rng, nb, 2, null)
    Jb, M, tlo, thi = sk.island_body(J, np.triu(Minv), lo, hi, np.arange(J.shape[0]))
    np.testing.assert_allclose(M, np.linalg.inv(Minv), rtol=0, atol=1e-10)
    fac = sk.body_factor(Jb, M, tlo, thi)
    assert fac[0]
    assert fac[5].shape[1] == (0 if null is None else 1)         # the null basis found
    G = J @ Minv @ J.T
    for _ in range(3):
        r = rng.normal(size=G.shape[0])
        x = sk.body_pinv(Jb, M, tlo, thi, *fac[1:], r)
        ref = np.linalg.pinv(G, rcond=1e-11) @ r
        np.testing.assert_allclose(x, ref, rtol=0, atol=1e-10 * np.abs(ref).max())


def _capture(sim, steps, v=None):
    """Step a scene, keeping the compiled call's (G, g, nc, mu, lam, sigma) of each step."""
    out = []
    orig = fw._constrained_step         # (the step's compiled call: the solve and its check)

    def spy(*a):
        r = orig(*a)
        nc = a[0].shape[0]
        G, g, lam, sigma = [fw._unpack_step(r[8], r[9], r[11], r[12], nc, r[2], a[9].shape[1])[i]
                            for i in (4, 5, 6, 7)]
        out.append((G, g, nc, a[6], lam, sigma, np.array([r[0]])))
        return r
    q, v = sim.q0, np.zeros(sim.nv) if v is None else v
    fw._constrained_step = spy
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", fw.SolverWarning)
            for _ in range(steps):
                q, v = sim.step(q, v, np.zeros(sim.nv))
                assert sim.last.method == "newton" and sim.last.converged
    finally:
        fw._constrained_step = orig
    return q, v, out


@pytest.mark.parametrize("scene", ["balls", "boxes"])
def test_rack_and_pile_converge_in_stage1_and_match_pinocchio_admm(scene):
    """A rack of 36 touching balls (one island of 288 rows, more than its dofs, and a
    counter-rotating spin of neighbours no contact holds: the body-space steps) and a pile of
    16 boxes (4 islands, 4 redundant corners a face): every step converges in the compiled active-set Newton, the
    rack stays at rest, and the constraint velocities (unique, unlike the impulses) agree with
    pinocchio's ADMM on the same problem."""
    xml = balls_mjcf(36) if scene == "balls" else boxes_mjcf(16)
    sim = diffgym.Simulator.from_string(xml)
    q, v, steps = _capture(sim, 15)
    assert np.abs(v).max() < 1e-6
    G, g, nc, mu, lam, sigma, ok = steps[-1]
    assert ok.all()
    if scene == "balls":
        assert G.shape[0] >= sk.BODY_MIN_ROWS           # (one island: the body-space steps)
    pin = NCPSolver()._pin_admm(G, g, nc, mu, np.zeros_like(lam), 1e-12, 20000)
    if pin is None:
        pytest.skip("pinocchio without ADMMConstraintSolver")
    np.testing.assert_allclose(sigma, pin[1], rtol=0, atol=1e-7)
    # the same problem by the dense path of stage 1 (no body-space rows): the same velocities
    dense = sk.solve_stage1(G, g, nc, mu, np.zeros(0), np.zeros(0, np.int64), False, 1e-9,
                            1e-10, 20, 12, 240, sk._NO_J, sk._NO_J, sk._NO_I, sk._NO_I)
    if dense[0]:
        np.testing.assert_allclose(sigma, dense[2], rtol=0, atol=1e-8)
