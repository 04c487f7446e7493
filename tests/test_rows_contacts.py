"""The rows' mixed solve with many contacts (issue 15): Talos after its fall, and a box on the
floor connected above its top and pulled sideways (a problem with no solution above a friction
bound, in closed form)."""
import warnings

import numpy as np
import pytest

import diffgym
from diffgym.sim.equality import KIND_EQ, KIND_FRICTION, ExtraRows
from diffgym.sim.forward import SolverWarning


def _talos():
    """The model zoo's Talos run (diffgym.bench_zoo: lifted 1 cm above the ground, joint
    velocities kicked by rng(0) in [-0.5, 0.5], zero torque)."""
    from diffgym.bench_zoo import KICK, _lift_robot
    from diffgym.resources import example_robot_data_dir
    path = example_robot_data_dir() + "/robots/talos_data/robots/talos_reduced.urdf"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = diffgym.Simulator.from_file(path)
    v = np.random.default_rng(0).uniform(-KICK, KICK, sim.nv)
    v[:6] = 0.0
    return sim, _lift_robot(sim, sim.q0.copy()), v


def _natural_residual(G, g, nc, nl, mu, kind, bound, lam):
    """The whole mixed problem's natural-map residual, written here from its definition (an
    oracle independent of the kernels): contacts (t1, t2, n) with De Saxce's modified velocity
    projected onto the cone |lam_t| <= mu lam_n, limits onto lam >= 0, dry friction onto
    |lam| <= bound, bilateral rows |sigma|; each row scaled by its Delassus diagonal."""
    sigma = G @ lam + g
    d = np.maximum(np.diagonal(G), 1e-12 * max(1.0, np.diagonal(G).max()))
    res = 0.0
    for c in range(nc):
        r = slice(3 * c, 3 * c + 3)
        s = sigma[r].copy()
        s[2] += mu[c] * np.hypot(s[0], s[1])
        dc = d[r].mean()
        y = lam[r] - s / dc
        yt, yn = np.hypot(y[0], y[1]), y[2]
        if yt <= mu[c] * yn:
            p = y
        elif mu[c] * yt <= -yn:
            p = np.zeros(3)
        else:
            a = (mu[c] * yt + yn) / (mu[c] ** 2 + 1)
            p = np.array([y[0] * mu[c] * a / yt, y[1] * mu[c] * a / yt, a])
        res = max(res, dc * np.linalg.norm(lam[r] - p))
    s0 = 3 * nc + nl
    for i in range(3 * nc, len(g)):
        y = lam[i] - sigma[i] / d[i]
        if i < s0:
            p = max(y, 0.0)
        elif kind[i - s0] == KIND_EQ:
            res = max(res, abs(sigma[i]))
            continue
        elif kind[i - s0] == KIND_FRICTION:
            p = min(max(y, -bound[i - s0]), bound[i - s0])
        else:
            p = max(y, 0.0)
        res = max(res, d[i] * abs(lam[i] - p))
    return res


def test_talos_after_its_fall_converges(monkeypatch):
    """The zoo's Talos falls and lies on the ground from about 1.9 s with 10-11 contacts on its
    links, its URDF's joint dry friction (20 rows) sticking on most joints. Sticking joints weld
    links into rigid groups touching the ground at several points: the reduced contact problem
    is rank deficient (at step 1120, 39 rows of rank 26) and its impulses are not unique; the
    rounds' stage 1 failed there and the later stages ended unconverged (before the mixed
    proximal solve: steps 981 and 1120-1122 of these 1,150 unconverged, ADMM up to 92,450
    iterations a step). Every step now converges at the solver's tolerance, no step reaches
    the later stages, and the steps solved by ``mixedprox`` satisfy the whole problem: their
    natural residual, computed here from its definition on the problem the step solved, is
    within the tolerance, and the step Jacobian there matches central differences."""
    solved = []
    orig = ExtraRows.solve

    def spy(self, solver, G, g, nc, nl, mu, rs, lam0=None, modes0=None):
        out = orig(self, solver, G, g, nc, nl, mu, rs, lam0, modes0)
        if out[7] == "mixedprox":
            solved.append((G.copy(), g.copy(), nc, nl, np.array(mu), rs.kind.copy(),
                           rs.bound.copy(), out[0].copy()))
        return out

    monkeypatch.setattr(ExtraRows, "solve", spy)
    sim, q, v = _talos()
    tol = sim.solver.settings.tol
    zero = np.zeros(sim.nv)
    bad = []
    at = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(1150):
            q0, v0 = q, v
            q, v = sim.step(q, v, zero)
            last = sim.last
            if at is None and k > 1000 and last.method == "mixedprox+rows":
                at = (q0, v0)
            if not last.converged or last.method not in ("newton+rows", "mixedprox+rows",
                                                         "elimination+rows"):
                bad.append((k, last.method, last.converged, last.residual))
    assert q[2] < 0.3                        # (it has fallen)
    assert not bad, bad
    assert max(p[2] for p in solved) >= 10    # (the failure mode is reached)
    for G, g, nc, nl, mu, kind, bound, lam in solved:
        assert (kind == KIND_FRICTION).sum() == 20
        assert _natural_residual(G, g, nc, nl, mu, kind, bound, lam) <= tol
    # the step Jacobian at the first such step after 2 s, against central differences in tau
    # (measured: within 4.1e-10 of entries up to 0.08)
    q0, v0 = at
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jac = sim.step(q0, v0, zero, jacobian=True)[2]
        h = 1e-6
        for j in range(sim.nv):
            e = np.zeros(sim.nv)
            e[j] = h
            fd = (sim.step(q0, v0, e)[1] - sim.step(q0, v0, -e)[1]) / (2 * h)
            assert np.abs(fd - jac.dv_dtau[:, j]).max() <= 2e-9, j


def _chain_xml(n, frictionloss):
    """A free chain of n capsules (0.2 m, 1 kg) joined by pairs of hinges with joint dry
    friction, dropped from 0.3 m: the smallest scene found with Talos's failure mode (links
    welded by sticking friction rows, lying on the ground at several points)."""
    geom = '<geom type="capsule" fromto="0 0 0 0.2 0 0" size="0.03" mass="1"/>'
    body = ""
    for _ in range(n - 1):
        body = (f'<body pos="0.25 0 0"><joint type="hinge" axis="0 0 1" '
                f'frictionloss="{frictionloss}"/><joint type="hinge" axis="0 1 0" '
                f'frictionloss="{frictionloss}"/>{geom}{body}</body>')
    return ('<mujoco><option timestep="0.002"/><worldbody><geom type="plane" size="5 5 0.1"/>'
            f'<body pos="0 0 0.3"><freejoint/>{geom}{body}</body></worldbody></mujoco>')


def test_chain_of_capsules_with_joint_friction_converges():
    """Talos's failure mode in a small scene: 5 capsules, 8 friction rows, thrown (velocities
    from rng(1) in [-2, 2]) and lying on the ground after it. Before the mixed proximal solve
    167 of these 600 steps ended unconverged in the later stages (75.8 s of CPU; 1.1 s now).
    Every step converges, none in the later stages, and some need the proximal solve."""
    sim = diffgym.Simulator.from_string(_chain_xml(5, 0.5))
    q, v = sim.q0.copy(), np.random.default_rng(1).uniform(-2, 2, sim.nv)
    methods = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(600):
            q, v = sim.step(q, v, np.zeros(sim.nv))
            assert sim.last.converged, (len(methods), sim.last.method, sim.last.residual)
            methods.append(sim.last.method)
    assert set(methods) <= {"newton+rows", "elimination+rows", "mixedprox+rows"}
    assert "mixedprox+rows" in methods
    assert q[2] < 0.1


BOX = """<mujoco><option timestep="0.01"/><worldbody>
<geom type="plane" size="5 5 0.1" friction="{mu} 0.005 0.0001"/>
<body name="m" mocap="true" pos="0 0 0.35"/>
<body name="b" pos="0 0 0.1"><freejoint/>
<geom type="box" size="0.1 0.1 0.1" mass="1" friction="{mu} 0.005 0.0001"/></body></worldbody>
<equality><connect body1="b" body2="m" anchor="0 0 0.25"/></equality></mujoco>"""


@pytest.mark.parametrize("mu", [0.1, 0.2, 0.28])
def test_connected_box_pulled_sideways_closed_form(mu):
    """A 1 kg box (half-width w = 0.1 m) resting on the floor, connected at a point 0.15 m above
    its top (h = 0.35 m above the floor) to a mocap anchor moving sideways at 0.2 m/s. The
    connect fixes the point's velocity and the floor forbids any tilt (every rotation about a
    horizontal axis through that point drives a bottom corner into the floor), so the box
    slides with v = 0.2 m/s, no rotation, its leading edge pressed down. Moments about the
    centre of mass over one step: the connect's impulse F_y = m v + mu N acts 0.25 m above it,
    friction mu N and the leading edge's normal impulse N at 0.1 m below and 0.1 m ahead:
    N (w - mu h) = 0.25 m v, so N = 0.25 m v / (w - mu h), the trailing edge carries nothing,
    and there is a solution only for mu < w / h = 0.2857 (test below)."""
    sim = diffgym.Simulator.from_string(BOX.format(mu=mu))
    sim.set_mocap("m", pos=np.array([0.0, 0.0, 0.35]), vel=np.array([0.0, 0.2, 0.0]))
    q1, v1 = sim.step(sim.q0.copy(), np.zeros(sim.nv), np.zeros(sim.nv))
    last = sim.last
    assert last.converged and last.method == "newton+rows"
    np.testing.assert_allclose(v1, [0, 0.2, 0, 0, 0, 0], atol=1e-12)
    p, imp = last.contact_points, last.contact_impulses_world
    front = p[:, 1] > 0
    assert front.sum() == 2 and (~front).sum() == 2
    n = 0.25 * 1.0 * v1[1] / (0.1 - 0.35 * mu)
    assert imp[front, 2].sum() == pytest.approx(n, rel=1e-10)
    assert abs(imp[~front, 2]).max() <= 1e-12
    assert imp[:, 1].sum() == pytest.approx(-mu * n, rel=1e-10)


@pytest.mark.parametrize("mu", [0.29, 1.0])
def test_connected_box_above_the_painleve_bound_reports_no_solution(mu):
    """The same box with friction at or above w / h: N (w - mu h) = 0.25 m v has no solution
    with N >= 0 (a Painleve-type inconsistency of the rigid connect, the rigid floor and
    Coulomb friction, not a solver failure: the leading edge would need an infinite or
    negative normal impulse). Every step says so (converged=False, a SolverWarning on the
    first, no exception) and returns the defined answer of such a step (``mixed_soft``: the
    solution with every row made slightly compliant, ``G + rho I``): its velocities are those
    of the limit rho -> 0 to O(rho), here the box tips forward into the floor while its point
    follows the anchor within 3 mm over 5 steps (1.7 mm at the 4th). (Measured on the first step's problem: with
    rho 1e-4 and 1e-6 of the mean Delassus diagonal the leading edge's normal velocity is
    -0.0212 and -0.0211 m/s, the normal impulse 45 and 4,545 N s: no finite impulse exists.)"""
    import pinocchio as pin
    sim = diffgym.Simulator.from_string(BOX.format(mu=mu))
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    vs = []
    for k in range(5):
        anchor = np.array([0.0, 0.002 * (k + 1), 0.35])
        sim.set_mocap("m", pos=anchor, vel=np.array([0.0, 0.2, 0.0]))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            q, v = sim.step(q, v, np.zeros(sim.nv))
        assert any(issubclass(x.category, SolverWarning) for x in w) == (k == 0)
        assert not sim.last.converged and sim.last.method == "soft+rows"
        assert np.isfinite(q).all() and np.isfinite(v).all()
        vs.append(v)
        p = q[:3] + pin.Quaternion(q[6], q[3], q[4], q[5]).toRotationMatrix() @ [0, 0, 0.25]
        assert np.linalg.norm(p - anchor) < 3e-3
    assert v[3] < -0.3                       # (it tips forward: rotation about x)
