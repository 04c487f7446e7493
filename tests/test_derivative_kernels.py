"""The compiled step Jacobian (derivative_kernels.py) against the numpy reference
(``step_jacobian(sim, compiled=False)``) on the scenes of test_gradients.py, and its pieces."""
import warnings

import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym.sim import derivative_kernels as K
from diffgym.sim import derivatives as D
from diffgym.resources import asset_path

from test_gradients import BLOCKS, BOX, SHAPE, place_at_distance

RTOL = 1e-10


def rel_diff(a, b) -> float:
    """Max over the six blocks of max|A - B| / max|B|, with max|B| floored at 1e-3 of the
    largest entry of the whole Jacobian: a block that vanishes in exact arithmetic (dv/dv of a
    box held by sticking contacts) holds rounding noise only, which is compared at that scale."""
    big = max(np.abs(getattr(b, k)).max() for k in BLOCKS)
    err = 0.0
    for k in BLOCKS:
        A, B = getattr(a, k), getattr(b, k)
        assert A.shape == B.shape and np.isfinite(A).all()
        err = max(err, np.abs(A - B).max() / max(np.abs(B).max(), 1e-3 * big, 1e-300))
    return err


def compare(sim, q, v, tau):
    """rel_diff of the compiled and reference Jacobians of one step."""
    sim.reset_warmstart()
    sim.step(q, v, tau)
    a = D.step_jacobian(sim, compiled=True)
    b = D.step_jacobian(sim, compiled=False)
    assert sim.__dict__.get("_djit") is not None and sim._djit.ok   # the compiled route ran
    return rel_diff(a, b)


def _box(euler=""):
    return diffgym.Simulator.from_string(BOX.format(euler=euler))


def scene_free_flight():
    sim = _box()
    q = sim.q0
    q[2] = 0.5
    return (sim, q, np.array([1, 0.2, 0.3, 0.5, -0.3, 0.2]),
            np.array([0.1, 0.2, 0.3, 0.01, 0.02, 0.03]))


def scene_resting_box():
    sim = _box()
    return sim, sim.q0, np.zeros(6), np.array([0.1, 0.2, 0.3, 0.01, 0.02, 0.03])


def scene_sliding_box():
    sim = _box()
    return sim, sim.q0, np.array([1.0, 0.3, 0, 0, 0, 0]), np.zeros(6)


def scene_spinning_box_on_edge():
    sim = _box('euler="20 0 0"')
    q = sim.q0
    R = pin.Quaternion(q[6], q[3], q[4], q[5]).toRotationMatrix()
    half = np.array([0.1, 0.15, 0.1])
    q[2] = -min((R @ (half * np.array([sx, sy, sz])))[2]
                for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1))
    return sim, q, np.array([1.0, 0.5, 0, 0, 0, 2.0]), np.zeros(6)


def scene_joint_at_limit():
    sim = diffgym.Simulator.from_string("""<mujoco><option timestep="0.01"/><worldbody>
      <body name="p" pos="0 0 1"><joint name="h" type="hinge" axis="0 1 0" range="-30 30"/>
      <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.05"/></body></worldbody></mujoco>""")
    return sim, np.array([np.radians(30)]), np.zeros(1), np.zeros(1)


def scene_two_spheres():
    sim = diffgym.Simulator.from_string("""<mujoco><option timestep="0.01"/><worldbody>
      <geom type="plane" size="5 5 .1"/>
      <body name="a" pos="0 0 0.1"><freejoint/><geom type="sphere" size="0.1"/></body>
      <body name="b" pos="0.19 0.03 0.1"><freejoint/><geom type="sphere" size="0.1"/></body>
      </worldbody></mujoco>""")
    return sim, sim.q0, np.r_[0.5, 0, 0, 0, 0, 0, -0.2, 0.1, 0, 0, 0, 0.3], np.zeros(12)


def _settle(sim, q, v, steps, control):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            q, v = sim.step(q, v, control(q, v))
    return q, v


def scene_hopper(name="hopper.xml", steps=200):
    sim = diffgym.Simulator.from_file(asset_path(name), ignore_unsupported=("option.integrator",))
    zero = np.zeros(sim.nv)
    q, v = _settle(sim, sim.q0, zero, steps, lambda q, v: zero)
    return sim, q, v, np.array([0, 0, 0, 1.0, 2.0, -1.0])


def scene_hopper_gymnasium():
    return scene_hopper("hopper_gymnasium.xml", 60)


def _pd(sim, kp=40.0, kd=1.0):
    def control(q, v):
        tau = np.zeros(sim.nv)
        tau[6:] = kp * (sim.q0[7:] - q[7:]) - kd * v[6:]
        return tau
    return control


def scene_go1():
    sim = diffgym.Simulator.from_file(asset_path("go1.urdf"), ignore_unsupported=("joint.frictionloss",))
    ctrl = _pd(sim)
    q, v = _settle(sim, sim.q0, np.zeros(sim.nv), 30, ctrl)
    return sim, q, v, ctrl(q, v)


def scene_cartpole_at_limit():
    sim = diffgym.Simulator.from_file(asset_path("cartpole.xml"))
    push = np.r_[50.0, np.zeros(sim.nv - 1)]
    q, v = sim.q0, np.zeros(sim.nv)
    for _ in range(300):
        q, v = sim.step(q, v, push)
        if sim.cache["cons"] is not None and sim.cache["res"].limit_active.any():
            break
    return sim, q, v, push


def scene_cartpole_free():
    sim = diffgym.Simulator.from_file(asset_path("cartpole.xml"))
    q = sim.q0
    q[-1] += 0.3
    return sim, q, np.zeros(sim.nv), np.r_[1.0, np.zeros(sim.nv - 1)]


def scene_ur5_on_plane():
    sim = diffgym.Simulator.from_file(asset_path("ur5.urdf"), floating_base=False)
    q, v = _settle(sim, np.array([0.0, -0.3, 1.8, -1.57, -1.57, 0.0]), np.zeros(6), 400,
                   lambda q, v: -2.0 * v)
    return sim, q, v, -2.0 * v


def _shape(geom, euler, ground='<geom type="plane" size="5 5 .1" friction="0.5"/>',
           v=(0.3, 0.1, 0, 1.0, 0.5, 2.0)):
    def make():
        sim = diffgym.Simulator.from_string(SHAPE.format(ground=ground, euler=euler, geom=geom))
        return sim, place_at_distance(sim, sim.q0), np.array(v, float), np.zeros(6)
    return make


SCENES = {
    "free-flight": scene_free_flight,
    "resting-box": scene_resting_box,            # four coplanar points: rank-deficient mode system
    "sliding-box": scene_sliding_box,
    "spinning-box-edge": scene_spinning_box_on_edge,
    "joint-at-limit": scene_joint_at_limit,
    "two-spheres": scene_two_spheres,            # sphere-sphere: the kernel's closed form
    "hopper": scene_hopper,
    "hopper-gymnasium": scene_hopper_gymnasium,
    "go1": scene_go1,
    "cartpole-limit": scene_cartpole_at_limit,
    "cartpole-free": scene_cartpole_free,
    "ur5-on-plane": scene_ur5_on_plane,
    "capsule-end": _shape('<geom type="capsule" size="0.05 0.2" friction="0.5"/>', "30 20 0",
                          v=(0.3, 0.1, -0.1, 0, 0, 3.0)),
    "box-corner": _shape('<geom type="box" size="0.1 0.15 0.2" friction="0.5"/>', "30 20 0"),
    "sphere": _shape('<geom type="sphere" size="0.1" friction="0.5"/>', "0 0 0"),
    "cylinder-rim": _shape('<geom type="cylinder" size="0.1 0.2" friction="0.5"/>', "30 0 0"),
    "ellipsoid": _shape('<geom type="ellipsoid" size="0.1 0.15 0.2" friction="0.5"/>', "30 20 0"),
    "box-on-box (fd fallback)": _shape(
        '<geom type="box" size="0.1 0.15 0.05" friction="0.5"/>', "20 10 0",
        '<geom type="box" pos="0 0 -0.1" size="1 1 0.1" friction="0.5"/>'),
}
NEEDS_ERD = {"go1", "ur5-on-plane"}


@pytest.mark.parametrize("name", list(SCENES))
def test_compiled_matches_reference(name):
    try:
        sim, q, v, tau = SCENES[name]()
    except FileNotFoundError as exc:        # example-robot-data / gymnasium not installed
        if name in NEEDS_ERD or "gymnasium" in name:
            pytest.skip(str(exc))
        raise
    err = compare(sim, q, v, tau)
    assert err <= RTOL, f"{name}: compiled vs reference {err:.3e}"


def test_compiled_matches_reference_along_a_rollout(monkeypatch):
    """Many states of a pushed, tumbling box (contacts appearing, sliding, sticking, breaking).
    (Before plane contact points were put on the plane, a box sliding to rest gave badly
    conditioned mode systems that the kernel handed back to the reference's solve, status 2;
    with coplanar points they are well conditioned. test_status_2_finishes_with_the_reference_
    solve covers that path.)"""
    statuses = []
    kernel = K.dynamics_terms

    def spy(*a):
        out = kernel(*a)
        statuses.append(out[0])
        return out
    monkeypatch.setattr(K, "dynamics_terms", spy)
    sim = _box('euler="10 5 0"')
    rng = np.random.default_rng(3)
    q, v = sim.q0, np.zeros(6)
    q[2] += 0.05
    worst, with_contacts = 0.0, 0
    for t in range(120):
        tau = rng.normal(scale=[4, 4, 2, 0.3, 0.3, 0.3])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # (a few steps do not reach the tolerance)
            q, v, jac = sim.step(q, v, tau, jacobian=True)
        worst = max(worst, rel_diff(jac, D.step_jacobian(sim, compiled=False)))
        with_contacts += sim.cache["cons"] is not None and sim.cache["cons"].nc > 0
    assert with_contacts > 50
    assert statuses.count(0) > 50
    assert worst <= RTOL, worst


def test_default_route_is_compiled_and_reference_is_kept(monkeypatch):
    sim, q, v, tau = scene_resting_box()
    sim.step(q, v, tau)
    calls = []
    real = K.dynamics_terms
    monkeypatch.setattr(K, "dynamics_terms", lambda *a: calls.append(1) or real(*a))
    D.step_jacobian(sim)
    assert calls == [1]
    D.step_jacobian(sim, compiled=False)
    monkeypatch.setattr(D, "COMPILED", False)
    D.step_jacobian(sim)
    assert calls == [1]


def test_per_joint_copies_match_the_views():
    """Where pinocchio's vectors could not be viewed in place, the per-joint copies give the
    same Jacobian (the route taken on another memory layout)."""
    sim, q, v, tau = scene_go1() if _has_erd() else scene_two_spheres()
    sim.step(q, v, tau)
    a = D.step_jacobian(sim)
    st = D._compiled_state(sim)
    assert not st.gather and not st.scatter                  # views on this build
    st.gather, st.scatter = True, True
    st.oM, st.ov, st.fext = np.zeros_like(st.oM), np.zeros_like(st.ov), np.zeros_like(st.fext)
    b = D.step_jacobian(sim)
    for k in BLOCKS:
        A = getattr(a, k)
        np.testing.assert_allclose(getattr(b, k), A, rtol=0, atol=1e-12 * np.abs(A).max())


def _has_erd():
    try:
        asset_path("go1.urdf")
        return True
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("m, rank", [(1, 1), (6, 6), (12, 12), (12, 6), (8, 5), (9, 1), (30, 22)])
def test_qr_min_norm_matches_lapack(m, rank):
    """The pivoted-QR solve against the reference (LU, or SVD least squares when rank deficient),
    and its refusal where the rank is in doubt (then the reference's solve is used)."""
    rng = np.random.default_rng(m * 100 + rank)
    U, _ = np.linalg.qr(rng.normal(size=(m, m)))
    V, _ = np.linalg.qr(rng.normal(size=(m, m)))
    A = (U * np.r_[np.logspace(0, -3, rank), np.zeros(m - rank)]) @ V.T
    B = rng.normal(size=(m, 7))
    X, status = K._qr_min_norm(A, B)
    ref = D._solve_min_norm(A, B)
    assert status == 0
    np.testing.assert_allclose(X, ref, rtol=0, atol=1e-9 * np.abs(ref).max())
    if m > 1:
        A2 = (U * np.r_[np.logspace(0, -3, m - 1), 1e-10]) @ V.T
        assert K._qr_min_norm(A2, B)[1] == 1


def test_status_2_finishes_with_the_reference_solve(monkeypatch):
    """Where the kernel hands the solve back (status 2, with A, W D, J M^-1, Vq, Vv, Vt), the
    Python finish gives the reference's Jacobian."""
    sim, q, v, tau = scene_sliding_box()
    sim.step(q, v, tau)
    monkeypatch.setattr(K, "dynamics_terms", _status2)
    assert rel_diff(D.step_jacobian(sim), D.step_jacobian(sim, compiled=False)) <= RTOL


def _status2(ddq_dq, ddq_dv, Minv_u, kstiff, has_stiff, damping, damped, dt, Jc, G, corr, Dq,
             lam, sigma, modes, limit_active, mu, nc, dI_dq, dI_dv, bias_v):
    """What dynamics_terms returns with status 2 (numpy; no stiffness)."""
    nv = ddq_dq.shape[0]
    M = np.where(np.triu(np.ones((nv, nv), bool)), Minv_u, Minv_u.T)
    Vq = dt * ddq_dq + M @ corr
    Vv = np.eye(nv) + dt * (ddq_dv - M * damping[None, :]) if damped else np.eye(nv) + dt * ddq_dv
    Vt = dt * M
    JVv = Jc @ Vv + (bias_v[:, None] * Jc if len(bias_v) else 0.0)
    Dm = np.hstack([Jc @ Vq + Dq, JVv, Jc @ Vt])
    A, W = K.mode_system(lam, sigma, modes, limit_active, G, nc, mu)
    return 2, A, W @ Dm, Jc @ M, Vq, Vv, Vt


def _rack_and_stack(kind):
    from diffgym.bench_scaling import SCENES
    return diffgym.Simulator.from_string(SCENES[kind](4) if kind == "balls"
                                         else SCENES["boxes"](3))


@pytest.mark.parametrize("kind", ["balls", "boxes"])
def test_kernel_geometry_rows_are_the_python_rows(kind):
    """The rows ``contact_terms`` closes itself (two spheres, a shape on the plane) equal, bit for
    bit, what ``geometry_derivatives`` computes for them, at states a pushed 4-ball rack and a
    3-box stack visit; with ``skip`` the Python geometry leaves them to the kernel and the
    contact terms are the same; the compiled route's joint Jacobians for the polytope pairs
    (``_FrameKin``) are ``_Kin``'s."""
    sim = _rack_and_stack(kind)
    rng = np.random.default_rng(7)
    q, v = sim.q0, np.zeros(sim.nv)
    seen = two_spheres = 0
    for _ in range(25):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q, v = sim.step(q, v, rng.normal(scale=0.3, size=sim.nv))
        C = sim.cache
        cons, res = C["cons"], C["res"]
        if cons is None or cons.nc == 0:
            continue
        st = D._compiled_state(sim)
        JT = st.trees.kinematics_derivatives(C["q"], C["v1"], st.zero).J.T
        c = cons.contacts
        gj = st.gjoint
        joints = np.concatenate([gj[c.geom1], gj[c.geom2]])
        kin = D._Kin(sim.model, None, C["q"], C["v1"], joints, st.trees)
        fk = D._FrameKin(sim.model, None, C["q"], C["v1"], joints, st.trees, JT, st.oM, st.supp)
        assert set(fk.J) == set(kin.J)
        for j in kin.J:
            assert np.array_equal(fk.J[j], kin.J[j]) and np.array_equal(fk.o[j], kin.o[j])
        skip = ~st.python_geometry[c.geom1, c.geom2]
        assert skip.any()
        two_spheres += int(np.sum(skip & ~st.static_plane[c.geom1] & ~st.static_plane[c.geom2]))
        full = D.geometry_derivatives(sim, kin, cons)
        part = D.geometry_derivatives(sim, fk, cons, skip=skip)
        for a, b in zip(full, part):
            assert not np.any(b[skip])                        # left to the kernel
            assert np.array_equal(a[~skip], b[~skip])
        cc = sim.constraints
        args = (JT, st.oM, st.ov, st.fext, st.supp, st.dof_joint, st.parents, gj,
                st.static_plane, st.roll_radius, st.python_geometry, D._geom_placements(sim),
                c.geom1, c.geom2, c.pos, c.normal, c.dist, cons.dist, cons.frames, res.lam,
                C["v1"], sim.dt, cc.erp, cc.skin)
        lims = (cons.limits, cons.limit_dist, st.lim_v, st.lim_sign, C["v"], np.zeros(cons.nc))
        a = K.contact_terms(*args, True, *(x.copy() for x in full), *lims)
        b = K.contact_terms(*args, True, *part, *lims)          # (fills part's rows)
        for x, y in zip(full, part):
            assert np.array_equal(x, y)
        assert a[2] and b[2] and np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        seen += 1
    assert seen >= 20
    assert (two_spheres > 20) if kind == "balls" else (two_spheres == 0)
