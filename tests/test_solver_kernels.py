"""The compiled stage 1 of the NCP solve (diffgym/sim/solver_kernels.py) against the Python reference
(``SolverSettings(compiled=False)``) on problems recorded from simulations (hopper, Go1, boxes
resting / sliding / stacked, a pendulum on its joint limit, billiards) and on random problems
(SPD and rank-deficient G, warm and cold starts). Stage 1b (``solver_kernels.proximal``) has one
implementation, shared by both paths; tests/test_solver.py checks it against pinocchio's ADMM.

Agreement required: the same modes, limit_active, converged flag and method on every problem;
lam within 1e-10 (relative to max |lam|) except where G is rank deficient and the difference lies
in its null space (the impulses of redundant contacts are then not determined by the data beyond
rounding: a 1-ulp change of g moves the reference's own lam as much), where G (lam_c - lam_r)
must vanish; sigma within 1e-12 |g|; every accepted compiled solution within the tolerance."""
import numpy as np
import pytest

import diffgym
import diffgym.sim.solver as solver_mod
import diffgym.sim.solver_kernels as sk
from diffgym.resources import asset_path
from diffgym.sim.solver import NCPSolver, SolverSettings, _natres, natural_residual

BOX = """<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1" friction="{mu}"/>
<body name="box" pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.15 0.1" friction="{mu}"/>
</body></worldbody></mujoco>"""
STACK = """<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1" friction="0.6"/>
<body pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.1 0.1" friction="0.6"/></body>
<body pos="0.02 0.01 0.3"><freejoint/><geom type="box" size="0.1 0.1 0.1" friction="0.6"/></body>
<body pos="-0.01 0.02 0.5"><freejoint/><geom type="box" size="0.1 0.1 0.1" friction="0.6"/></body>
</worldbody></mujoco>"""
PENDULUM = """<mujoco><option timestep="0.01"/><worldbody>
<body pos="0 0 1"><joint name="h" type="hinge" axis="0 1 0" limited="true" range="-30 30"/>
<geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.05"/></body></worldbody></mujoco>"""


def reference():
    return NCPSolver(SolverSettings(compiled=False))


# -- recorded problems ---------------------------------------------------------------------
def _record(sim, name, out):
    """Record every solve() call of ``sim``'s solver: (name, G, g, nc, mu, lam0, modes0)."""
    class Recording(NCPSolver):
        # (a solver of another type: the step then calls solve() instead of its fused kernel)
        def solve(self, G, g, nc, mu, lam0=None, modes0=None):
            out.append((name, np.array(G), np.array(g), int(nc), np.array(mu, dtype=float),
                        None if lam0 is None else np.array(lam0, dtype=float),
                        None if modes0 is None else np.array(modes0)))
            return super().solve(G, g, nc, mu, lam0, modes0)

    sim.solver = Recording(sim.solver.settings)


def _recorded_problems():
    import gymnasium as gym
    out = []
    rng = np.random.default_rng(0)
    sim = diffgym.Simulator.from_file(asset_path("hopper.xml"))
    _record(sim, "hopper", out)
    q, v = sim.q0, np.zeros(sim.nv)
    for _ in range(120):
        tau = np.concatenate((np.zeros(3), 30.0 * rng.uniform(-1, 1, sim.nv - 3)))
        q, v = sim.step(q, v, tau)
    for env_id, name, steps in (("DiffGo1-v0", "go1", 150), ("DiffBilliards-v0", "billiards", 12)):
        env = gym.make(env_id)
        env.reset(seed=0)
        _record(env.unwrapped.sim, name, out)
        env.action_space.seed(0)
        for _ in range(steps):
            env.step(env.action_space.sample())
    # the Go1 without torques: lands, folds its legs, lies on its thighs (calf limits active)
    sim = diffgym.Simulator.from_file(asset_path("go1.urdf"), ignore_unsupported=("joint.frictionloss",))
    q, v = sim.q0, np.zeros(sim.nv)
    q[2] += 0.1
    for _ in range(300):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    _record(sim, "go1 lying", out)
    for _ in range(100):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    for xml, name, v0, steps in ((BOX.format(mu=0.5), "box resting", None, 30),
                                 (BOX.format(mu=0.3), "box sliding", [2.0, 0.5, 0, 0, 0, 1.0], 60),
                                 (STACK, "box stack", None, 70),
                                 (PENDULUM, "pendulum on its limit", [3.0], 40)):
        sim = diffgym.Simulator.from_string(xml)
        _record(sim, name, out)
        q = sim.q0
        v = np.zeros(sim.nv) if v0 is None else np.array(v0, dtype=float)
        for _ in range(steps):
            q, v = sim.step(q, v, np.zeros(sim.nv))
    return out


def _random_problems():
    """Random G = J M^-1 J^T: SPD (more DOFs than rows) or PSD of low rank, g, mu, warm starts."""
    rng = np.random.default_rng(5)
    out = []
    for trial in range(150):
        nc = int(rng.integers(0, 6))
        nl = int(rng.integers(0 if nc else 1, 3))
        m = 3 * nc + nl
        n = m + int(rng.integers(1, 5)) if trial % 3 else max(1, m // 2)   # every 3rd: rank < m
        J = rng.standard_normal((m, n))
        A = rng.standard_normal((n, n))
        G = J @ np.linalg.solve(A @ A.T + 0.5 * np.eye(n), J.T)
        G = 0.5 * (G + G.T)
        if trial % 7 == 0 and nc:                # a zero Delassus row (planar-model-like)
            G[0, :] = 0.0
            G[:, 0] = 0.0
        g = rng.standard_normal(m)
        mu = rng.uniform(0.0 if trial % 5 == 0 else 0.1, 1.0, nc)
        lam0 = modes0 = None
        if trial % 2:
            lam0 = rng.standard_normal(m) * 0.3
            lam0[2:3 * nc:3] = np.abs(lam0[2:3 * nc:3])
            modes0 = np.concatenate((rng.integers(0, 3, nc), rng.integers(0, 2, nl)))
        out.append((f"random {trial}", G, g, nc, mu, lam0, modes0))
    return out


RECORDED = _recorded_problems()
RANDOM = _random_problems()


def _ulp_flips(ref, args, method):
    G, g = args[0], args[1]
    for i in range(len(g)):
        for to in (np.inf, -np.inf):
            gp = g.copy()
            gp[i] = np.nextafter(gp[i], to)
            if ref.solve(G, gp, *args[2:]).method == method:
                return True
    return False


def _compare(problems):
    """Both solvers on every problem (warm start as recorded, and cold). Returns statistics."""
    ref, comp = reference(), NCPSolver()
    assert comp.settings.compiled
    stats = dict(n=0, null_space=0, max_lam=0.0, max_sigma=0.0, its_diff=0, rounding_method=0,
                 stage1_rule=0, null_space_scenes=set())
    for name, G, g, nc, mu, lam0, modes0 in problems:
        for warm in (True, False):
            args = (G, g, nc, mu) + ((lam0, modes0) if warm else (None, None))
            a = ref.solve(*args)
            b = comp.solve(*args)
            what = (name, warm, a.method, b.method, a.modes, b.modes)
            if a.method != b.method and b.method == "newton" and b.converged:
                # the compiled stage 1 switches a sticking contact whose Newton stalled with a
                # slip to sliding (solver_kernels._infeasible_sticking; the Python stage 1 does
                # not): it solves in stage 1 what the reference leaves to later stages. Its
                # solution must satisfy the problem's conditions to the tolerance.
                assert natural_residual(b.lam, b.sigma, nc, mu, np.diag(G)) <= comp.settings.tol
                stats["stage1_rule"] += 1
                stats["n"] += 1
                continue
            if a.method != b.method:
                # allowed only where the reference's own choice is decided by rounding (a
                # numerically singular Newton system that passes the rank test): a 1-ulp change
                # of one entry of g makes the reference take the compiled path too
                if not _ulp_flips(ref, args, b.method):
                    # or the fallback stages took another path to the same solution (the
                    # Python stage 1 fails where the compiled one does not, or the reverse, by
                    # rounding, and stage 1b / stages 2-4 finish): both converged, to the same
                    # constraint velocity
                    assert a.converged and b.converged, what
                    vs = max(1.0, float(np.abs(g).max()))
                    assert float(np.abs(a.sigma - b.sigma).max()) <= 1e-12 * vs + 10.0 * max(
                        a.residual, b.residual), what
                stats["rounding_method"] += 1
                if b.converged:                  # then only: a solution to the tolerance
                    dG = np.diag(G)
                    assert natural_residual(b.lam, b.sigma, nc, mu, dG) <= comp.settings.tol
                stats["n"] += 1
                continue
            assert a.converged == b.converged, what
            assert np.array_equal(a.modes, b.modes) and b.modes.dtype == np.int64, what
            assert np.array_equal(a.limit_active, b.limit_active), what
            assert b.limit_active.dtype == np.bool_ and b.lam.dtype == np.float64
            vs = max(1.0, float(np.abs(g).max()))
            ls = max(1e-300, float(np.abs(a.lam).max()))
            d = float(np.abs(a.lam - b.lam).max()) / ls
            # where Newton stalled (redundant constraints whose g is inconsistent at the level of
            # the tolerance) both were accepted on their natural residual: they agree to that level
            slack = 1e-12 * vs + 10.0 * max(a.residual, b.residual)
            if d > 1e-10:
                # redundant impulses: the difference is in the null space of G
                stats["null_space"] += 1
                stats["null_space_scenes"].add(name)
                assert float(np.abs(G @ (a.lam - b.lam)).max()) <= slack, what
            else:
                stats["max_lam"] = max(stats["max_lam"], d)
            ds = float(np.abs(a.sigma - b.sigma).max())
            assert ds <= slack, (what, ds)
            ds /= vs
            stats["max_sigma"] = max(stats["max_sigma"], ds)
            if b.converged:
                dG = np.diag(G)
                res = natural_residual(b.lam, b.sigma, nc, mu, dG) if G.shape[0] else 0.0
                assert res <= comp.settings.tol and b.residual <= comp.settings.tol, what
                assert abs(b.residual - res) <= 1e-3 * comp.settings.tol   # (dG clamped there)
            stats["its_diff"] += a.iterations != b.iterations
            stats["n"] += 1
    return stats


def test_recorded_problems_compiled_matches_reference():
    names = {p[0] for p in RECORDED}
    assert {"hopper", "go1", "billiards", "box resting", "box sliding", "box stack",
            "pendulum on its limit"} <= names
    assert any(p[3] == 4 for p in RECORDED if p[0] == "go1")                     # four feet
    assert any(p[1].shape[0] > 3 * p[3] for p in RECORDED if p[0] == "go1 lying")  # + limits
    st = _compare(RECORDED)
    assert st["n"] == 2 * len(RECORDED)
    # impulses differ (along the null space of G, checked above) only where contacts are
    # redundant: the box stack and the Go1 lying on its body and limits
    assert st["null_space_scenes"] <= {"box stack", "go1 lying"}, st
    assert st["its_diff"] <= 0.05 * st["n"], st             # rounding-level refinement stops
    assert st["rounding_method"] <= 0.002 * st["n"], st
    print(st)


def test_random_problems_compiled_matches_reference():
    st = _compare(RANDOM)
    assert st["n"] == 2 * len(RANDOM)
    assert st["null_space"] <= 0.05 * st["n"], st
    assert st["rounding_method"] <= 0.01 * st["n"], st
    print(st)


def test_stage1_paths_are_exercised():
    """The recorded set covers the kernel's branches: sliding, rank-deficient (planar hopper,
    four coplanar box corners), joint limits, zero Delassus rows, mode switches, fallbacks."""
    ref = reference()
    methods = set()
    modes_seen = set()
    lim = False
    for name, G, g, nc, mu, lam0, modes0 in RECORDED:
        r = ref.solve(G, g, nc, mu, lam0, modes0)
        methods.add(r.method)
        modes_seen.update(r.modes.tolist())
        lim |= bool(r.limit_active.any())
    assert modes_seen == {0, 1, 2} and lim
    assert "newton" in methods and len(methods) >= 2            # some fall back to stages 2-4
    hop = [p for p in RECORDED if p[0] == "hopper" and p[3] > 0]
    assert any((np.diag(p[1]) == 0.0).any() for p in hop)       # planar: zero-diagonal rows


def test_fallback_stages_polish_with_the_compiled_active_set(monkeypatch):
    """Stages 2-4 stay in Python, but their polish (and the SSN stage's active set) runs the
    compiled kernel (stage 1b runs inside solve_stage1); the result is the reference's."""
    fallback = [p for p in RECORDED if reference().solve(*p[1:]).method != "newton"]
    assert fallback
    calls = []
    orig = sk.active_set

    def spy(*a):
        calls.append(1)
        return orig(*a)

    monkeypatch.setattr(sk, "active_set", spy)
    for name, G, g, nc, mu, lam0, modes0 in fallback[:10]:
        n0 = len(calls)
        a = reference().solve(G, g, nc, mu, lam0, modes0)
        assert len(calls) == n0                                  # the reference never calls it
        b = NCPSolver().solve(G, g, nc, mu, lam0, modes0)
        # (stage 1b, "prox+newton", runs inside the compiled solve_stage1)
        assert len(calls) > n0 or b.method == "prox+newton" or not b.method.endswith("+newton")
        assert a.method == b.method and np.array_equal(a.modes, b.modes)
        assert np.array_equal(a.limit_active, b.limit_active)
        assert np.abs(a.sigma - b.sigma).max() <= 1e-12 * max(1.0, np.abs(g).max())


def test_reference_path_does_not_touch_the_kernels(monkeypatch):
    def boom(*a):
        raise AssertionError("kernel called with compiled=False")

    monkeypatch.setattr(sk, "solve_stage1", boom)
    monkeypatch.setattr(sk, "active_set", boom)
    for name, G, g, nc, mu, lam0, modes0 in RECORDED[::25]:
        reference().solve(G, g, nc, mu, lam0, modes0)
    with pytest.raises(AssertionError):
        NCPSolver().solve(*RECORDED[0][1:])


def test_box_lying_flat_shares_its_load_evenly():
    """Four coplanar contacts (rank-deficient G): the compiled minimum-norm solution shares the
    load equally, as the reference, from a cold start and from an uneven warm start."""
    sim = diffgym.Simulator.from_string(BOX.format(mu=0.5))
    q, v = sim.q0, np.zeros(6)
    for _ in range(30):
        q, v = sim.step(q, v, np.zeros(6))
    G, g, nc, mu = sim.cache["G"], sim.cache["g"], sim.cache["cons"].nc, sim.cache["cons"].mu
    assert nc == 4 and np.linalg.matrix_rank(G) < 12
    for lam0, modes0 in ((None, None), (np.array([0, 0, 4.0, 0, 0, 0, 0, 0, 1, 0, 0, 1.0]),
                                         np.array([1, 1, 1, 1]))):
        a = reference().solve(G, g, nc, mu, lam0, modes0)
        b = NCPSolver().solve(G, g, nc, mu, lam0, modes0)
        assert b.method == "newton" and b.modes.tolist() == [1] * 4
        assert np.allclose(b.lam, a.lam, rtol=0, atol=1e-10 * np.abs(a.lam).max())
        if lam0 is None:
            ln = b.lam[2::3]
            assert np.allclose(ln, ln.mean(), rtol=1e-9)


def test_result_types_and_empty_and_limit_only_problems():
    for G, g, nc, mu in ((np.zeros((0, 0)), np.zeros(0), 0, np.zeros(0)),
                         (np.array([[2.0]]), np.array([-1.0]), 0, np.zeros(0)),
                         (np.diag([2.0, 1.5, 3.0]), np.array([0.1, 0.0, -1.0]), 1, [0.5])):
        a = reference().solve(G, g, nc, mu)
        b = NCPSolver().solve(G, g, nc, mu)
        assert type(b.iterations) is int and type(b.residual) is float
        assert a.method == b.method and a.iterations == b.iterations
        assert np.array_equal(a.lam, b.lam) and np.array_equal(a.modes, b.modes)
        assert b.modes.dtype == np.int64 and b.limit_active.dtype == np.bool_
    # a Fortran-ordered G and list inputs give the same result
    G = np.asfortranarray(np.array([[2.0, 0.1, 0.2], [0.1, 1.5, -0.1], [0.2, -0.1, 3.0]]))
    b = NCPSolver().solve(G, [1.0, -2.0, -0.5], 1, [0.3], [0.0, 0.0, 0.1], [2])
    a = reference().solve(np.ascontiguousarray(G), np.array([1.0, -2.0, -0.5]), 1,
                          np.array([0.3]), np.array([0.0, 0.0, 0.1]), np.array([2]))
    assert b.modes.tolist() == a.modes.tolist() == [2] and np.allclose(a.lam, b.lam, atol=1e-14)
    # modes0 with the wrong length is refused
    with pytest.raises(ValueError):
        NCPSolver().solve(np.eye(4), -np.ones(4), 1, [0.5], None, np.array([1, 1, 0]))


# -- the kernels' pieces ---------------------------------------------------------------------
def test_min_norm_least_squares_against_lapack():
    rng = np.random.default_rng(2)
    for t in range(200):
        n = int(rng.integers(1, 40))          # both the Jacobi SVD and the dgelsd branch
        r = int(rng.integers(0, n + 1))
        A = rng.standard_normal((n, r)) @ rng.standard_normal((r, n)) if r else np.zeros((n, n))
        if t % 4 == 0:
            A[:, int(rng.integers(n))] = 0.0
            A[int(rng.integers(n)), :] = 0.0
        F = rng.standard_normal(n)
        x = sk._lstsq(np.ascontiguousarray(A), F)
        y = np.linalg.lstsq(A, F, rcond=1e-11)[0]
        cond = np.linalg.cond(A[np.ix_(*[np.flatnonzero(np.abs(A).sum(1 - k) > 0) for k in (1, 0)])]) \
            if r and np.abs(A).sum() > 0 else 1.0
        assert np.abs(x - y).max() <= 1e-13 * min(cond, 1e12) * max(1.0, np.abs(y).max()) + 1e-12, t


def test_rank_test_and_residual_are_the_references():
    rng = np.random.default_rng(4)
    for t in range(100):
        n = int(rng.integers(1, 15))
        r = int(rng.integers(1, n + 1))
        J = rng.standard_normal((n, r))
        A = J @ J.T + (1e-9 if t % 3 else 0.0) * np.eye(n)
        assert sk._rank_deficient(A) == NCPSolver._rank_deficient(A), t
    for name, G, g, nc, mu, lam0, modes0 in RECORDED[::7] + RANDOM[::3]:
        lam = rng.standard_normal(G.shape[0])
        sigma = G @ lam + g
        dG = np.maximum(np.diag(G), 1e-12)
        dc = (dG[0:3 * nc:3] + dG[1:3 * nc:3] + dG[2:3 * nc:3]) / 3.0
        a = _natres(lam, sigma, nc, mu, dc, dG[3 * nc:])
        b = sk.natres(lam, sigma, nc, np.ascontiguousarray(mu), dc, dG)
        assert b == pytest.approx(a, rel=1e-14, abs=0.0)


def test_lu_solve_matches_numpy_and_reports_singular():
    rng = np.random.default_rng(6)
    for _ in range(50):
        n = int(rng.integers(1, 20))
        A = rng.standard_normal((n, n))
        F = rng.standard_normal(n)
        ok, x = sk._lu_solve(A, F)
        assert ok and np.allclose(x, np.linalg.solve(A, F), rtol=1e-10, atol=1e-12)
    ok, _ = sk._lu_solve(np.zeros((3, 3)), np.ones(3))
    assert not ok
    assert solver_mod.SolverSettings().compiled is True
