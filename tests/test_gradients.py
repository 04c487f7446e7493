"""Step Jacobians against central finite differences of the whole step (issue: analytical step
Jacobians). Every state below has no contact changing mode inside the stencil."""
import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym.resources import asset_path

BLOCKS = ("dq_dq", "dq_dv", "dq_dtau", "dv_dq", "dv_dv", "dv_dtau")
BOX = """<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1" friction="0.5"/>
<body name="box" pos="0 0 0.1" {euler}><freejoint/><geom type="box" size="0.1 0.15 0.1" friction="0.5"/>
</body></worldbody></mujoco>"""


def fd_step_jacobian(sim, q, v, tau, eps=1e-7):
    """Central differences of the whole step, tangent perturbations of q."""
    nv = sim.nv
    out = {k: np.zeros((nv, nv)) for k in BLOCKS}

    def run(qq, vv, tt):
        sim.reset_warmstart()
        return sim.step(qq, vv, tt)

    for i in range(nv):
        e = np.zeros(nv)
        e[i] = eps
        for name, plus, minus in (
                ("q", (pin.integrate(sim.model, q, e), v, tau), (pin.integrate(sim.model, q, -e), v, tau)),
                ("v", (q, v + e, tau), (q, v - e, tau)),
                ("tau", (q, v, tau + e), (q, v, tau - e))):
            qa, va = run(*plus)
            qb, vb = run(*minus)
            out["dq_d" + name][:, i] = pin.difference(sim.model, qb, qa) / (2 * eps)
            out["dv_d" + name][:, i] = (va - vb) / (2 * eps)
    return out


def assert_jacobian_matches(sim, q, v, tau, rtol=1e-4, atol=1e-7, expect_modes=None):
    sim.reset_warmstart()
    _, _, jac = sim.step(q, v, tau, jacobian=True)
    if expect_modes is not None:
        assert set(sim.last.contact_modes) == set(expect_modes), sim.last
    fd = fd_step_jacobian(sim, q, v, tau)
    for k in BLOCKS:
        A, F = getattr(jac, k), fd[k]
        scale = np.abs(F).max()
        err = np.abs(A - F).max()
        assert err <= rtol * scale + atol, f"{k}: max error {err:.3e} (scale {scale:.3e})"
    return jac


def test_free_flight():
    sim = diffgym.Simulator.from_string(BOX.format(euler=""))
    q = sim.q0
    q[2] = 0.5
    assert_jacobian_matches(sim, q, np.array([1, 0.2, 0.3, 0.5, -0.3, 0.2]),
                            np.array([0.1, 0.2, 0.3, 0.01, 0.02, 0.03]))
    assert sim.last.num_contacts == 0


def test_resting_box_sticking():
    sim = diffgym.Simulator.from_string(BOX.format(euler=""))
    assert_jacobian_matches(sim, sim.q0, np.zeros(6), np.array([0.1, 0.2, 0.3, 0.01, 0.02, 0.03]),
                            expect_modes={"sticking"})


def test_sliding_box():
    sim = diffgym.Simulator.from_string(BOX.format(euler=""))
    assert_jacobian_matches(sim, sim.q0, np.array([1.0, 0.3, 0, 0, 0, 0]), np.zeros(6),
                            expect_modes={"sliding"})


def test_box_on_edge_sliding_and_spinning():
    # two contact points (an edge): the normal impulses are determinate. On a full face with
    # four sliding points that spin, the split of normal impulse between the corners is not
    # unique (see README, "Indeterminate contact sets"), so neither is a finite difference.
    sim = diffgym.Simulator.from_string(BOX.format(euler='euler="20 0 0"'))
    q = sim.q0
    # put the lowest edge exactly on the ground
    R = pin.Quaternion(q[6], q[3], q[4], q[5]).toRotationMatrix()
    half = np.array([0.1, 0.15, 0.1])
    zmin = min((R @ (half * np.array([sx, sy, sz])))[2] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1))
    q[2] = -zmin
    jac = assert_jacobian_matches(sim, q, np.array([1.0, 0.5, 0, 0, 0, 2.0]), np.zeros(6))
    assert sim.last.num_contacts == 2 and "sliding" in sim.last.contact_modes
    assert np.isfinite(jac.state).all()


def test_joint_held_at_limit():
    sim = diffgym.Simulator.from_string("""<mujoco><option timestep="0.01"/><worldbody>
      <body name="p" pos="0 0 1"><joint name="h" type="hinge" axis="0 1 0" range="-30 30"/>
      <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.05"/></body></worldbody></mujoco>""")
    assert_jacobian_matches(sim, np.array([np.radians(30)]), np.zeros(1), np.zeros(1))
    assert sim.last.limit_active.any()


def test_two_spheres_in_contact():
    sim = diffgym.Simulator.from_string("""<mujoco><option timestep="0.01"/><worldbody>
      <geom type="plane" size="5 5 .1"/>
      <body name="a" pos="0 0 0.1"><freejoint/><geom type="sphere" size="0.1"/></body>
      <body name="b" pos="0.19 0.03 0.1"><freejoint/><geom type="sphere" size="0.1"/></body>
      </worldbody></mujoco>""")
    assert_jacobian_matches(sim, sim.q0, np.r_[0.5, 0, 0, 0, 0, 0, -0.2, 0.1, 0, 0, 0, 0.3], np.zeros(12))
    assert sim.last.num_contacts == 3


def test_hopper_on_one_foot():
    sim = diffgym.Simulator.from_file(asset_path("hopper_gymnasium.xml"), ignore_unsupported=("option.integrator",))
    q, v = sim.q0, np.zeros(6)
    for _ in range(60):
        q, v = sim.step(q, v, np.zeros(6))
    assert sim.last.num_contacts >= 1
    assert_jacobian_matches(sim, q, v, np.array([0, 0, 0, 1.0, 2.0, -1.0]))


def test_go1_standing():
    sim = diffgym.Simulator.from_file(asset_path("go1.urdf"), ignore_unsupported=("joint.frictionloss",))
    q, v = sim.q0, np.zeros(sim.nv)
    # settle onto the feet with a PD hold of the reference pose
    kp, kd = 40.0, 1.0
    q_ref = sim.q0
    for _ in range(30):
        tau = np.zeros(sim.nv)
        tau[6:] = kp * (q_ref[7:] - q[7:]) - kd * v[6:]
        q, v = sim.step(q, v, tau)
    tau = np.zeros(sim.nv)
    tau[6:] = kp * (q_ref[7:] - q[7:]) - kd * v[6:]
    assert sim.last.num_contacts >= 4
    assert_jacobian_matches(sim, q, v, tau, rtol=1e-4, atol=1e-6)


def test_rollout_gradient_20_steps():
    """Gradient of a 20-step rollout loss w.r.t. initial state and torques, chained from the
    step Jacobians, against finite differences of the same rollout."""
    sim = diffgym.Simulator.from_string(BOX.format(euler=""))
    rng = np.random.default_rng(0)
    T = 20
    # planar pushes only: a spinning box on four sliding corners is statically indeterminate
    taus = rng.normal(scale=[5, 5, 0, 0, 0, 0], size=(T, 6))
    q0, v0 = sim.q0, np.array([2.0, 0.4, 0, 0, 0, 0])
    target = np.array([0.3, 0.1])

    def loss_and_grad(q, v, taus, grad=True):
        sim.reset_warmstart()
        jacs = []
        for t in range(T):
            if grad:
                q, v, jac = sim.step(q, v, taus[t], jacobian=True)
                jacs.append(jac)
            else:
                q, v = sim.step(q, v, taus[t])
        L = 0.5 * np.sum((q[:2] - target) ** 2) + 0.5 * np.sum(v ** 2)
        if not grad:
            return L
        # adjoint through the chain; the free-flyer tangent's linear part is in the body frame
        R = pin.Quaternion(q[6], q[3], q[4], q[5]).toRotationMatrix()
        gq = np.zeros(6)
        gq[:3] = R.T @ np.r_[q[:2] - target, 0.0]
        gv = v.copy()
        gtau = np.zeros((T, 6))
        for t in reversed(range(T)):
            j = jacs[t]
            gtau[t] = j.dq_dtau.T @ gq + j.dv_dtau.T @ gv
            gq, gv = j.dq_dq.T @ gq + j.dv_dq.T @ gv, j.dq_dv.T @ gq + j.dv_dv.T @ gv
        return L, gq, gv, gtau

    L, gq, gv, gtau = loss_and_grad(q0, v0, taus)
    eps = 1e-6
    for t in (0, 7, 19):
        for i in (0, 1, 5):
            tp, tm = taus.copy(), taus.copy()
            tp[t, i] += eps
            tm[t, i] -= eps
            fd = (loss_and_grad(q0, v0, tp, False) - loss_and_grad(q0, v0, tm, False)) / (2 * eps)
            assert abs(fd - gtau[t, i]) <= 1e-4 * abs(fd) + 1e-7, (t, i, fd, gtau[t, i])
    for i in range(6):
        e = np.zeros(6)
        e[i] = eps
        fd = (loss_and_grad(q0, v0 + e, taus, False) - loss_and_grad(q0, v0 - e, taus, False)) / (2 * eps)
        assert abs(fd - gv[i]) <= 1e-4 * abs(fd) + 1e-7, (i, fd, gv[i])
        fdq = (loss_and_grad(pin.integrate(sim.model, q0, e), v0, taus, False)
               - loss_and_grad(pin.integrate(sim.model, q0, -e), v0, taus, False)) / (2 * eps)
        assert abs(fdq - gq[i]) <= 1e-4 * abs(fdq) + 1e-7, (i, fdq, gq[i])


# -- collision-geometry term: closed forms for every shape on a plane, and the FD fallback ----
SHAPE = """<mujoco><option timestep="0.01"/><worldbody>{ground}
<body name="b" pos="0 0 1" euler="{euler}"><freejoint/>{geom}</body></worldbody></mujoco>"""


def place_at_distance(sim, q, gap=-2e-5, pair=0):
    """q with the free body moved vertically so that collision pair `pair` is `gap` apart."""
    q = q.copy()
    for _ in range(3):
        pin.forwardKinematics(sim.model, sim.data, q)
        pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, sim.geom_data)
        pin.computeDistance(sim.geom_model, sim.geom_data, pair)
        q[2] -= sim.geom_data.distanceResults[pair].min_distance - gap
    return q


@pytest.mark.parametrize("geom, euler, v", [
    # a tilted cylinder on its rim, spinning about its own axis: the lowest rim point stays
    # put in the world while the body turns (a body-fixed rim point would be wrong)
    ('<geom type="cylinder" size="0.1 0.2" friction="0.5"/>', "30 0 0", [0.3, 0.1, 0, 0, 0, 3.0]),
    ('<geom type="ellipsoid" size="0.1 0.15 0.2" friction="0.5"/>', "30 20 0", [0.3, 0.1, 0, 1.0, 0.5, 2.0]),
    ('<geom type="capsule" size="0.05 0.2" friction="0.5"/>', "30 20 0", [0.3, 0.1, -0.1, 0, 0, 3.0]),
    ('<geom type="box" size="0.1 0.15 0.2" friction="0.5"/>', "30 20 0", [0.3, 0.1, 0, 1.0, 0.5, 2.0]),
], ids=["cylinder-rim", "ellipsoid", "capsule", "box-corner"])
def test_shape_on_plane_closed_form(geom, euler, v, monkeypatch):
    from diffgym.sim import derivatives
    monkeypatch.setattr(derivatives, "_collision_fd", lambda *a: pytest.fail("fallback used"))
    sim = diffgym.Simulator.from_string(SHAPE.format(
        ground='<geom type="plane" size="5 5 .1" friction="0.5"/>', euler=euler, geom=geom))
    q = place_at_distance(sim, sim.q0)
    # (an ellipsoid's body-fixed surface samples within the margin are speculative, breaking
    # contacts beside its support point; a cylinder keeps its other cap's lowest rim point as
    # one, collision_driver._plane_pair)
    modes = {"sliding", "breaking"} if ("ellipsoid" in geom or "cylinder" in geom) else {"sliding"}
    assert_jacobian_matches(sim, q, np.array(v, float), np.zeros(6), expect_modes=modes)


def test_convex_mesh_on_plane_closed_form(tmp_path, monkeypatch):
    """A convex mesh (a tilted cube given as vertices and faces) sliding and spinning on one
    corner: the closed-form vertex route, checked against central differences of the step."""
    from diffgym.sim import derivatives
    monkeypatch.setattr(derivatives, "_collision_fd", lambda *a: pytest.fail("fallback used"))
    (tmp_path / "cube.obj").write_text(
        "".join(f"v {x} {y} {z}\n" for x in (-0.1, 0.1) for y in (-0.15, 0.15) for z in (-0.2, 0.2))
        + "f 1 2 4\nf 1 4 3\nf 5 7 8\nf 5 8 6\nf 1 5 6\nf 1 6 2\nf 3 4 8\nf 3 8 7\nf 1 3 7\n"
          "f 1 7 5\nf 2 6 8\nf 2 8 4\n")
    (tmp_path / "scene.xml").write_text(SHAPE.format(
        ground='<geom type="plane" size="5 5 .1" friction="0.5"/>', euler="30 20 0",
        geom='<geom type="mesh" mesh="cube" mass="2" friction="0.5"/>').replace(
        "<worldbody>", '<asset><mesh name="cube" file="cube.obj"/></asset><worldbody>'))
    sim = diffgym.Simulator.from_file(str(tmp_path / "scene.xml"))
    q = place_at_distance(sim, sim.q0)
    assert_jacobian_matches(sim, q, np.array([0.3, 0.1, 0, 1.0, 0.5, 2.0]), np.zeros(6),
                            expect_modes={"sliding"})


@pytest.mark.parametrize("ground, geom, euler, v, modes, points", [
    # a ball on a static cylinder lying on its side, sliding and spinning on it (sphere-cylinder,
    # with the driver's exact single-point route switched off below: coal's point and the
    # fallback, as for a pair without a closed form)
    ('<geom type="cylinder" fromto="-1 0 0.05 1 0 0.05" size="0.05" friction="0.5"/>',
     '<geom type="sphere" pos="0.01 0.02 0" size="0.05" friction="0.5"/>', "0 0 0", [0.3, 0.02, 0, 0, 0, 3.0],
     {"sliding"}, 1),
], ids=["cylinder-sphere-sliding"])
def test_collision_fd_fallback(ground, geom, euler, v, modes, points, monkeypatch):
    """Pairs without closed-form geometry derivatives go through derivatives._collision_fd
    (a central difference of the collision output alone); the whole step Jacobian must still
    match central differences of the whole step, and must not without that term."""
    from diffgym.sim import derivatives
    calls = []
    real = derivatives._collision_fd

    def spy(sim, cons, idx, dp, dn, dd):
        calls.append(list(idx))
        return real(sim, cons, idx, dp, dn, dd)

    monkeypatch.setattr(derivatives, "_collision_fd", spy)
    sim = diffgym.Simulator.from_string(SHAPE.format(ground=ground, euler=euler, geom=geom))
    sim.collision._convex.clear()       # (convex_support's closed form off: the fallback runs)
    q = place_at_distance(sim, sim.q0)
    v = np.array(v, float)
    jac = assert_jacobian_matches(sim, q, v, np.zeros(6), expect_modes=modes)
    assert calls and len(calls[-1]) == sim.last.num_contacts
    if points is not None:
        assert sim.last.num_contacts == points
    # the fallback term matters: without it (contact frame glued to the body) dv/dq is wrong
    monkeypatch.setattr(derivatives, "_collision_fd", lambda *a: None)
    sim.reset_warmstart()
    _, _, bad = sim.step(q, v, np.zeros(6), jacobian=True)
    assert np.abs(bad.dv_dq - jac.dv_dq).max() > 1e-3 * np.abs(jac.dv_dq).max()


# -- sphere-box: closed form (derivatives._sphere_box), a static wall and a moving box -------
WALL = """<mujoco><option timestep="0.01"/><worldbody>
<geom type="plane" size="5 5 .1" friction="0.5"/>
<geom type="box" pos="0.3 0 0.1" size="0.1 0.5 0.1" friction="0.4"/>
<body name="ball" pos="0 0 0.05"><freejoint/><geom type="sphere" size="0.05" mass="0.2" friction="0.5"/></body>
</worldbody></mujoco>"""


@pytest.mark.parametrize("centre, v", [
    # on the floor against the wall's face, rolling into it and sliding along it
    ([0.15 + 2e-5, 0.0, 0.05 - 2e-5], [0.5, 0.3, 0, 0, 0, 2.0]),
    # on the wall's top edge (no floor contact) and on its corner, sliding along them
    ([0.2 - 0.6 * (0.05 - 2e-5), 0.1, 0.2 + 0.8 * (0.05 - 2e-5)], [0.3, 3.0, -0.2, 1.0, 0, 0]),
    (list(np.array([0.2, 0.5, 0.2]) + (0.05 - 2e-5) * np.array([-0.5, 0.6, 0.7]) / np.sqrt(1.1)),
     list(2.0 * np.array([0.6, 0.5, 0.0]) - 0.2 * np.array([-0.5, 0.6, 0.7]) / np.sqrt(1.1)) + [0, 1.0, 0.5]),
], ids=["face", "edge", "corner"])
def test_sphere_against_static_box_closed_form(centre, v, monkeypatch):
    from diffgym.sim import derivatives
    monkeypatch.setattr(derivatives, "_collision_fd", lambda *a: pytest.fail("fallback used"))
    sim = diffgym.Simulator.from_string(WALL)
    q = sim.q0
    q[:3] = centre
    assert_jacobian_matches(sim, q, np.array(v, float), np.zeros(6))
    assert "sliding" in sim.last.contact_modes
    c = sim.cache["cons"].contacts
    kinds = [(sim.sm.geoms[int(a)].kind, sim.sm.geoms[int(b)].kind) for a, b in zip(c.geom1, c.geom2)]
    assert ("box", "sphere") in kinds, (kinds, sim.last)


@pytest.mark.parametrize("region", ["face", "edge", "corner"])
def test_moving_box_against_sphere_closed_form(region, monkeypatch):
    """A free box, turned at random, and a free ball (no gravity) pressed together: the contact
    on a face, an edge or a corner of the box; both bodies move."""
    from diffgym.sim import derivatives
    monkeypatch.setattr(derivatives, "_collision_fd", lambda *a: pytest.fail("fallback used"))
    sim = diffgym.Simulator.from_string("""<mujoco><option timestep="0.01" gravity="0 0 0"/><worldbody>
      <body name="ball" pos="1 0 0"><freejoint/><geom type="sphere" size="0.05" mass="0.3" friction="0.5"/></body>
      <body name="box"><freejoint/><geom type="box" size="0.1 0.15 0.2" mass="1" friction="0.5"/></body>
      </worldbody></mujoco>""")
    rng = np.random.default_rng(["face", "edge", "corner"].index(region))
    half = np.array([0.1, 0.15, 0.2])
    k = ["face", "edge", "corner"].index(region) + 1
    axes = rng.permutation(3)[:k]
    sgn = rng.choice([-1.0, 1.0], 3)
    p = rng.uniform(-0.8, 0.8, 3) * half
    p[axes] = sgn[axes] * half[axes]
    n = np.zeros(3)
    n[axes] = sgn[axes] * rng.uniform(0.4, 1.0, k)
    n /= np.linalg.norm(n)
    R = pin.Quaternion(*rng.normal(size=4)).normalized().toRotationMatrix()
    t = np.array([0.1, -0.2, 0.3])
    q = sim.q0
    q[7:10], q[10:14] = t, pin.Quaternion(R).coeffs()
    q[:3] = t + R @ (p + (0.05 - 2e-5) * n)
    nw = R @ n
    tw = np.cross(nw, rng.normal(size=3))
    tw /= np.linalg.norm(tw)
    # pressed together and sliding past each other
    v = np.r_[-0.4 * nw + 1.5 * tw, 0.5, -1.0, 0.3, 0.3 * nw - 0.5 * tw, 0.4, 0.2, -0.6]
    assert_jacobian_matches(sim, q, v, np.zeros(12), expect_modes={"sliding"})
    assert sim.last.num_contacts == 1
