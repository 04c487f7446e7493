"""constraint.realizable_bias (SolverSettings.realizable_bias): the touching rows' drift
correction projected onto the range of their rows of J, against numpy's least squares on J
itself (an independent route: the kernel works on G = J M^-1 J^T)."""
import numpy as np

from diffgym.sim.constraint import realizable_bias


def _problem(rng, nc, nv, dist):
    J = rng.standard_normal((3 * nc, nv))
    A = rng.standard_normal((nv, nv))
    Minv = np.linalg.inv(A @ A.T + nv * np.eye(nv))
    G = J @ Minv @ J.T
    G = 0.5 * (G + G.T)
    b = np.zeros(3 * nc)
    b[2::3] = 0.2 * np.asarray(dist) / 0.01           # erp d / dt, tangent rows 0
    g = J @ rng.standard_normal(nv) + b
    return J, G, b, g


def _call(G, b, g, nc, pair, dist, skin=1e-3):
    isl = np.zeros(nc, dtype=np.int64)
    return realizable_bias(G, b, g, nc, np.asarray(pair, dtype=np.int64), np.asarray(dist, float),
                           skin, np.zeros((2, nc)), np.zeros(0), isl, np.zeros(0, np.int64), 1)


def test_redundant_rows_get_the_least_squares_realizable_offsets():
    rng = np.random.default_rng(0)
    nc, nv = 4, 6                                     # 12 rows on 6 dofs: redundant
    dist = [-1e-4, -2e-5, 3e-6, -7e-5]
    J, G, b, g = _problem(rng, nc, nv, dist)
    b0, g0 = b.copy(), g.copy()
    assert _call(G, b, g, nc, [0, 0, 0, 0], dist) == 1
    P = J @ np.linalg.pinv(J)
    np.testing.assert_allclose(b, P @ b0, atol=1e-12 * np.abs(b0).max())
    np.testing.assert_allclose(g - g0, b - b0, atol=1e-15)     # g = J v_free + b follows
    assert np.abs(b - b0).max() > 1e-3 * np.abs(b0).max()      # (it was not realizable)


def test_realizable_and_independent_offsets_are_left_alone():
    rng = np.random.default_rng(1)
    nc, nv = 4, 6
    J, G, _, g = _problem(rng, nc, nv, [0.0] * nc)
    b = J @ rng.standard_normal(nv) * 1e-4               # realizable
    b_in = b.copy()
    _call(G, b, g, nc, [0] * nc, [-1e-5] * nc)
    np.testing.assert_allclose(b, b_in, rtol=0, atol=1e-15)
    J, G, b, g = _problem(rng, 2, 9, [-1e-4, -2e-4])      # 6 independent rows
    b_in = b.copy()
    assert _call(G, b, g, 2, [0, 0], [-1e-4, -2e-4]) == 0
    assert np.array_equal(b, b_in)


def test_gaps_keep_their_approach_allowance():
    """A pair only within the skin (every point at > 1e-9 m) is a gap: its rows keep their
    offsets (projecting the allowance would push the rows that touch) and are left out of the
    projection of the others."""
    rng = np.random.default_rng(2)
    nc, nv = 4, 4                                      # contacts 0, 1: 6 rows on 4 dofs
    dist = [-1e-4, -2e-5, 5e-4, 5e-4]
    J, G, b, g = _problem(rng, nc, nv, dist)
    b0 = b.copy()
    assert _call(G, b, g, nc, [0, 0, 1, 1], dist) == 1   # contacts 2, 3: another pair, apart
    assert np.array_equal(b[6:], b0[6:])
    S = np.arange(6)
    Js = J[S]
    np.testing.assert_allclose(b[S], Js @ np.linalg.pinv(Js) @ b0[S],
                               atol=1e-12 * np.abs(b0).max())
    assert np.abs(b[S] - b0[S]).max() > 1e-3 * np.abs(b0[S]).max()
