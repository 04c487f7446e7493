"""The compiled pieces of the polytope narrow phase against independent references: the small
SVD (``collision_derivatives._k_svd3``) against LAPACK, the patch reduction and the narrow rows'
frames against the numpy code they replace, and the compiled polytope route of the driver
against its Python route (coal's patch, ``_snap`` and ``_patch_distances`` per pair) on random
box piles."""
import warnings

import numpy as np
import pytest

from diffgym.sim.collision_derivatives import _k_svd3
from diffgym.sim.collision_driver import _reduce_patch
from diffgym.sim.collision_kernels import narrow_rows, reduce_patch
from diffgym.sim.frames import tangent_frames


def test_svd3_matches_lapack():
    rng = np.random.default_rng(1)
    for trial in range(600):
        k = int(rng.integers(1, 9))
        if trial % 3 == 0:          # points near a line or a plane: the rank decisions' cases
            B = rng.normal(size=(int(rng.integers(1, 3)), 3))
            D = rng.normal(size=(k, B.shape[0])) @ B \
                + rng.normal(size=(k, 3)) * 10 ** rng.uniform(-16, -6)
        else:
            D = rng.normal(size=(k, 3)) * 10 ** rng.uniform(-3, 1)
        s, Vt = _k_svd3(D)
        _, s0, Vt0 = np.linalg.svd(D, full_matrices=False)
        r = len(s0)
        assert np.all(np.abs(s[:r] - s0) <= 1e-14 * s0[0]), (D, s, s0)
        assert np.all(s[r:] <= 1e-14 * s0[0])
        assert np.allclose(Vt @ Vt.T, np.eye(3), atol=1e-14)
        assert np.allclose((D @ Vt.T) ** 2 @ np.ones(3), (D ** 2) @ np.ones(3), rtol=1e-13, atol=0)
        for i in range(r):          # vectors of well separated values above round-off
            gap = min(s0[i - 1] - s0[i] if i else np.inf, s0[i] - s0[i + 1] if i + 1 < r else s0[i])
            if s0[i] > 1e-10 * s0[0] and gap > 1e-6 * s0[0]:
                assert abs(abs(Vt[i] @ Vt0[i]) - 1.0) < 1e-9, (D, i)


def test_reduce_patch_matches_numpy():
    rng = np.random.default_rng(2)
    for trial in range(400):
        m = int(rng.integers(1, 12))
        n = rng.normal(size=3)
        n /= np.linalg.norm(n)
        e1 = np.cross(n, [1.0, 0.0, 0.0] if abs(n[0]) < 0.9 else [0.0, 1.0, 0.0])
        e1 /= np.linalg.norm(e1)
        e2 = np.cross(n, e1)
        uv = rng.normal(size=(m, 2))
        if trial % 4 == 0:          # a regular polygon: ties
            a = np.arange(m) * 2 * np.pi / m
            uv = np.c_[np.cos(a), np.sin(a)]
        P = uv[:, :1] * e1 + uv[:, 1:] * e2 + rng.normal(size=3)
        for mp in (1, 2, 3, 4):
            a, b = reduce_patch(np.ascontiguousarray(P), mp), _reduce_patch(P, mp)
            if trial % 4:
                assert np.array_equal(a, b)
            else:       # exact ties, broken by round-off (numpy's BLAS dots): as large a span
                assert len(a) == len(b) and abs(_area(uv[a]) - _area(uv[b])) < 1e-12


def _area(uv):
    """Area of the convex polygon through the points uv (k, 2)."""
    if len(uv) < 3:
        return float(np.ptp(uv, axis=0).max()) if len(uv) == 2 else 0.0
    c = uv.mean(axis=0)
    w = uv[np.argsort(np.arctan2(uv[:, 1] - c[1], uv[:, 0] - c[0]))]
    return 0.5 * abs(float(np.sum(w[:, 0] * np.roll(w[:, 1], -1) - np.roll(w[:, 0], -1) * w[:, 1])))


def test_narrow_rows_frames_and_order():
    rng = np.random.default_rng(3)
    m = 40
    pairs = np.array([[i, i + 1] for i in range(10)], dtype=np.int64)
    pair = rng.integers(0, 10, size=m).astype(np.int64)
    nrm = rng.normal(size=(m, 3))
    nrm[::5, 0] = 0.95          # both helpers of tangent_frames
    nrm /= np.linalg.norm(nrm, axis=1, keepdims=True)
    pos, dist = rng.normal(size=(m, 3)), rng.normal(size=m)
    pt = rng.integers(0, 4, size=m).astype(np.int64)
    mu = rng.uniform(size=10)
    for by_pair in (False, True):
        P, g1, g2, p, X, N, D, f, F = narrow_rows(pair, pt, pos, nrm, dist, pairs, mu, by_pair)
        order = np.argsort(pair, kind="stable") if by_pair else np.arange(m)
        assert np.array_equal(P, pair[order]) and np.array_equal(p, pt[order])
        assert np.array_equal(g1, pairs[pair[order], 0]) and np.array_equal(g2, pairs[pair[order], 1])
        assert np.array_equal(X, pos[order]) and np.array_equal(N, nrm[order])
        assert np.array_equal(D, dist[order]) and np.array_equal(f, mu[pair[order]])
        assert np.allclose(F, tangent_frames(nrm[order]), rtol=0, atol=1e-15)


@pytest.mark.parametrize("n, force", [(8, 8.0), (16, 3.0)])
def test_compiled_polytope_route_matches_python_route(n, force):
    """The same contacts from the driver's compiled polytope route and from its per-pair
    Python route (the route of the pairs it does not take), at states of a tumbling pile."""
    from diffgym.bench_scaling import SCENES
    from diffgym.sim.forward import Simulator
    sim = Simulator.from_string(SCENES["boxes"](n))
    drv = sim.collision
    fast = drv._poly_fast.copy()
    assert fast.any()
    detect = drv.detect
    seen = {"rows": 0, "per_point": 0}

    import coal
    fresh = coal.CollisionRequest(coal.CollisionRequestFlag.NO_REQUEST, 1)
    default = (np.array(fresh.cached_gjk_guess), np.array(fresh.cached_support_func_guess))

    def guesses():
        nar = drv.__dict__.get("_narrow")
        return {} if nar is None else {
            k: (np.array(s[0].cached_gjk_guess), np.array(s[0].cached_support_func_guess))
            for k, s in nar._slots.items()}

    def both(*args):
        """detect by the compiled route, then by the Python route, at the step's placements,
        each from the same state of coal's requests: their GJK runs start from the guess the
        last call on the pair cached (``enable_cached_gjk_guess``), and where the closest
        points are not unique (two box faces a few 1e-3 rad from parallel, 1 cm apart: the
        16-box pile at step 6 since stage 1c) two calls in a row returned witness points 2.3e-6
        m apart, whichever route ran"""
        before = guesses()
        a = detect(*args)
        ppa = set(drv.per_point_pairs)
        for k, s in drv.__dict__["_narrow"]._slots.items():
            s[0].cached_gjk_guess, s[0].cached_support_func_guess = before.get(k, default)
        drv._poly_fast = np.zeros_like(fast)
        try:
            b = detect(*args)
        finally:
            drv._poly_fast = fast
        assert ppa == set(drv.per_point_pairs)
        assert np.array_equal(a.pair, b.pair) and np.array_equal(a.point, b.point)
        # (round-off of the world vertices, compiled loops against numpy's BLAS products, is
        # amplified where the axis of a separated pair is the direction between two close
        # points: up to ~4e-13 m seen)
        np.testing.assert_allclose(a.pos, b.pos, rtol=0, atol=1e-11)
        np.testing.assert_allclose(a.normal, b.normal, rtol=0, atol=1e-11)
        np.testing.assert_allclose(a.dist, b.dist, rtol=0, atol=1e-12)
        seen["rows"] += len(a)
        seen["per_point"] += len(ppa)
        return a

    drv.detect = both
    rng = np.random.default_rng(n)
    q, v = sim.q0, np.zeros(sim.nv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t in range(40):
            q, v = sim.step(q, v, rng.normal(size=sim.nv) * force)[:2]
    assert seen["rows"] > 0 and seen["per_point"] > 0
