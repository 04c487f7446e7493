"""Inverse problems on the step Jacobians (small versions of scripts/inverse_cube.py and
scripts/inverse_go1_standing.py) and the Gauss-Newton / LM solver of diffgym.inverse."""
import os
import sys

import numpy as np
import pytest

from diffgym import inverse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "scripts"))

import inverse_cube  # noqa: E402
import inverse_go1_standing  # noqa: E402


# -- the solver on closed-form problems ------------------------------------------------------
def _rosenbrock(x):
    r = np.array([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])
    J = np.array([[-20.0 * x[0], 10.0], [-1.0, 0.0]])
    return r, J


@pytest.mark.parametrize("method", inverse.METHODS)
def test_least_squares_rosenbrock(method):
    res = inverse.least_squares(_rosenbrock, [-1.2, 1.0], method=method, tol=1e-12, max_iter=100)
    assert res.converged, res.message
    assert np.allclose(res.x, [1.0, 1.0], atol=1e-10)
    assert res.residual_norms[0] > res.residual_norms[-1] <= 1e-12
    # the residual never increases (accepted steps only)
    assert all(b < a for a, b in zip(res.residual_norms, res.residual_norms[1:]))
    assert len(res.iterates) == len(res.residual_norms) == res.iterations + 1


def test_least_squares_minimum_norm_step():
    """An underdetermined linear residual: one Gauss-Newton step lands on the solution closest
    to the start (the minimum-norm step), not on an arbitrary one."""
    A = np.array([[1.0, 2.0, 0.0, 1.0], [0.0, 1.0, 1.0, -1.0]])
    b = np.array([1.0, 2.0])
    x0 = np.array([0.5, -1.0, 2.0, 0.0])
    res = inverse.least_squares(lambda x: (A @ x - b, A), x0, tol=1e-12)
    assert res.converged and res.iterations == 1 and res.ranks[0] == 2
    expected = x0 + np.linalg.pinv(A) @ (b - A @ x0)
    assert np.allclose(res.x, expected, atol=1e-12)


def test_least_squares_rejects_bad_input():
    with pytest.raises(ValueError, match="method"):
        inverse.least_squares(_rosenbrock, [0.0, 0.0], method="newton")
    with pytest.raises(ValueError, match="tol"):
        inverse.least_squares(_rosenbrock, [0.0, 0.0], tol=0.0)
    with pytest.raises(ValueError, match="shapes"):
        inverse.least_squares(lambda x: (np.zeros(2), np.zeros(2)), [0.0, 0.0])
    with pytest.raises(ValueError, match=r"taus must have shape \(T, nv=6\)"):
        inverse.rollout(inverse_cube.CubeThrow(2).sim, np.zeros(7), np.zeros(6), np.zeros((3, 5)))


def test_least_squares_reports_a_floor():
    """A residual with a nonzero minimum: the solver stops and says so, converged=False."""
    res = inverse.least_squares(lambda x: (np.array([x[0] - 1.0, x[0] + 1.0]), np.array([[1.0], [1.0]])),
                                [3.0], tol=1e-10)
    assert not res.converged and "no decrease" in res.message
    assert res.residual_norms[-1] == pytest.approx(np.sqrt(2.0))


# -- the thrown cube --------------------------------------------------------------------------
def test_cube_rollout_jacobian_matches_finite_differences():
    """d(q_N, v_N)/d(q0, v0) chained over 10 steps (flight, landing on a corner, sliding)
    against central differences of the whole rollout."""
    prob = inverse_cube.CubeThrow(10)
    modes = prob.modes(prob.v_true)
    assert modes[-1] == "s" and "b" in "".join(modes)          # it lands and slides
    v0 = prob.v_true + 0.1 * inverse_cube.DIRECTION
    qN, vN, S = inverse.rollout_jacobian(prob.sim, prob.q0, v0, prob.taus)
    qF, vF, F = inverse.fd_rollout_jacobian(prob.sim, prob.q0, v0, prob.taus, eps=1e-6)
    assert np.array_equal(qN, qF) and np.array_equal(vN, vF)
    assert np.abs(S - F).max() <= 1e-6 * np.abs(F).max()


def test_cube_initial_velocity_recovered():
    """Gauss-Newton on the chained analytical Jacobians and on central-difference Jacobians of
    the rollout: both reach ||r|| < 1e-8 from 0.3 m/s away, on the same iterates."""
    prob = inverse_cube.CubeThrow(10)
    out = inverse_cube.solve(prob, prob.v_true + 0.3 * inverse_cube.DIRECTION, tol=1e-10, max_iter=15)
    a, f = out["analytic"], out["finite-diff"]
    for res in (a, f):
        assert res.converged and res.residual_norms[-1] < 1e-8, res.message
        assert np.linalg.norm(res.x - prob.v_true) < 1e-8
        assert res.iterations <= 8
    assert a.iterations == f.iterations
    k = min(len(a.errors), len(f.errors))
    assert np.allclose(a.errors[:k - 1], f.errors[:k - 1], rtol=1e-4, atol=1e-9)
    assert np.linalg.norm(a.x - f.x) < 1e-9


# -- the Go1 standing -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def go1():
    return inverse_go1_standing.Standing(settle=150)


def test_go1_holding_torques(go1):
    sim = go1.sim
    d, _ = inverse_go1_standing.foot_heights(sim, go1.q, inverse_go1_standing.foot_geoms(sim))
    assert np.abs(d).max() < 1e-12
    r0, J0 = go1(np.zeros(go1.nu))
    assert sim.last.contact_modes == ["sticking"] * 4
    assert np.linalg.norm(r0) > 0.05                 # without torques it sags
    assert np.linalg.matrix_rank(J0) == 6            # squeezing patterns are absorbed
    res = inverse.least_squares(go1, np.zeros(go1.nu), method="gauss-newton", tol=1e-8)
    assert res.converged and res.residual_norms[-1] <= 1e-8 and res.iterations <= 3, res.message
    # minimum norm: orthogonal to the null space of dv1/du
    null = np.linalg.svd(J0)[2][6:]
    assert np.abs(null @ res.x).max() < 1e-6 * np.linalg.norm(res.x)
    lm = inverse.least_squares(go1, np.zeros(go1.nu), method="levenberg-marquardt", tol=1e-8)
    assert lm.converged and lm.iterations <= 10
    vmax, drift = go1.hold(res.x, 100)
    assert vmax < 1e-9 and drift < 1e-9
