"""Equality constraints (connect, weld) with a side on a mocap body (issue 15): MuJoCo's way to
drag a body by a target the user sets. The mocap side's pose enters the rows' position error and
its velocity their offsets (``diffgym.sim.equality``); the step's derivatives with respect to the
mocap bodies' pose and velocity (``jac.dq_dmocap``, ``jac.dv_dmocap``, ``diffgym.sim.mocap.
mocap_jacobian``) against central differences, with contacts on the mocap geoms and with the
equalities."""
import warnings

import numpy as np
import pinocchio as pin
import pytest

import diffgym

from test_mocap import BALL

HAND = """<mujoco><option timestep="0.002"/><worldbody>
<body name="target" mocap="true" pos="0 0 1"><geom type="sphere" size="0.02" contype="0"
 conaffinity="0"/></body>
<body name="hand" pos="0 0 1"><freejoint/><geom type="box" size="0.05 0.04 0.03" mass="1.5"/></body>
</worldbody><equality><weld body1="target" body2="hand"/></equality></mujoco>"""

ARM = """<mujoco><option timestep="0.002"/>{default}<worldbody>
<body name="target" mocap="true" pos="0.4 0 0.8"><geom type="sphere" size="0.02" contype="0"
 conaffinity="0"/></body>
<body name="arm" pos="0 0 1"><joint name="j1" type="hinge" axis="0 1 0"/><geom type="capsule"
 fromto="0 0 0 0.3 0 0" size="0.03" contype="0" conaffinity="0"/>
 <body name="fore" pos="0.3 0 0"><joint name="j2" type="hinge" axis="0 1 0"/><geom type="capsule"
 fromto="0 0 0 0.3 0 0" size="0.03" contype="0" conaffinity="0"/></body></body>
</worldbody><equality><connect body1="fore" body2="target" anchor="0.1 0 -0.2"/></equality>
</mujoco>"""

# two mocap bodies: a target dragging a two-link arm (ball shoulder; connect) and a box (weld, offset), and a
# paddle; a ball on the floor
SCENE = """<mujoco><option timestep="0.002"/><worldbody>
<geom name="floor" type="plane" size="5 5 .1" friction="0.8"/>
<body name="target" mocap="true" pos="0.4 0 0.9"><geom name="t" type="sphere" size="0.02"
 contype="0" conaffinity="0"/></body>
<body name="paddle" mocap="true" pos="-0.3 0 0.1"><geom name="pad" type="box" size="0.05 0.2 0.1"
 friction="0.3"/></body>
<body name="arm" pos="0 0 1"><joint name="j1" type="ball"/><geom type="capsule"
 fromto="0 0 0 0.25 0 0" size="0.03"/>
 <body name="fore" pos="0.25 0 0" euler="0 60 0"><joint name="j2" type="hinge" axis="0 1 0"/><geom type="capsule"
 fromto="0 0 0 0.25 0 0" size="0.03"/></body></body>
<body name="hand" pos="0.6 0 0.6"><freejoint/><geom type="box" size="0.04 0.03 0.02"/></body>
<body name="ball" pos="0 0 0.1"><freejoint/><geom name="b" type="sphere" size="0.1" friction="0.8"/>
</body></worldbody><equality><connect body1="fore" body2="target" anchor="0.25 0 0"/>
<weld body1="target" body2="hand" relpose="0.1 0 -0.4 1 0 0 0"/></equality></mujoco>"""


def _quat(R):
    x = pin.Quaternion(R).coeffs()
    return [x[3], x[0], x[1], x[2]]


def mocap_differences(sim, q, v, tau, eps=1e-7):
    """Central differences of one step's (q1, v1) with respect to each mocap body's pos,
    rotation (R <- exp(d) R), vel and angvel (12 columns a body), the warm start held."""
    mz = sim._mocap
    ws = sim.warm_start_state()
    cq, cv = [], []
    for i in range(len(mz.names)):
        base = (mz.pos[i].copy(), mz.R[i].copy(), mz.lin[i].copy(), mz.ang[i].copy())
        for a in range(12):
            out = []
            for s in (1.0, -1.0):
                p, R, lin, ang = (x.copy() for x in base)
                d = np.zeros(3)
                d[a % 3] = s * eps
                if a < 3:
                    p += d
                elif a < 6:
                    R = pin.exp3(d) @ R
                elif a < 9:
                    lin += d
                else:
                    ang += d
                sim.set_mocap(i, p, _quat(R), vel=lin, angvel=ang)
                sim.set_warm_start_state(ws)
                out.append(sim.step(q, v, tau))
            sim.set_mocap(i, base[0], _quat(base[1]), vel=base[2], angvel=base[3])
            cq.append(pin.difference(sim.model, out[1][0], out[0][0]) / (2 * eps))
            cv.append((out[0][1] - out[1][1]) / (2 * eps))
    sim.set_warm_start_state(ws)
    return np.array(cq).T, np.array(cv).T


def test_weld_to_mocap_follows_its_motion_exactly():
    """Closed form: a free box welded to a mocap target that translates at a constant velocity,
    then turns at a constant rate about its own origin, moves with it exactly (the rows hold the
    target's velocity; the pose set before a step is the step's start): the box's pose after
    step k is the target's at t_{k+1}, to rounding, and the weld carries its weight (impulse m g
    dt upwards)."""
    sim = diffgym.Simulator.from_string(HAND)
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    dt, vel = sim.dt, np.array([0.5, -0.2, 0.3])
    for k in range(100):
        sim.set_mocap("target", [0, 0, 1] + vel * dt * k, [1, 0, 0, 0], vel=vel, angvel=0)
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.converged
        np.testing.assert_allclose(q[:3], [0, 0, 1] + vel * dt * (k + 1), atol=1e-12)
        np.testing.assert_allclose(v[:3], vel, atol=1e-12)
    assert sim.last.constraint_labels[2] == "weld weld0 [z]"
    assert sim.last.constraint_impulses[2] == pytest.approx(1.5 * 9.81 * dt, rel=1e-9)
    p0 = q[:3].copy()
    w = 3.0
    for k in range(100):
        a = w * dt * k
        sim.set_mocap("target", p0, [np.cos(a / 2), 0, np.sin(a / 2), 0], vel=0, angvel=[0, w, 0])
        q, v = sim.step(q, v, np.zeros(sim.nv))
        R = pin.Quaternion(q[6], *q[3:6]).toRotationMatrix()
        np.testing.assert_allclose(R, pin.exp3(np.array([0, w * dt * (k + 1), 0])), atol=1e-12)
        np.testing.assert_allclose(q[:3], p0, atol=1e-12)


def test_connect_to_mocap_drags_an_arm_like_mujoco():
    """A two-link arm whose forearm point is connected to a mocap target moving on a circle:
    the point follows the target (diffgym's constraint is hard: within 2e-5 m once the first
    step's missing velocity has decayed, the lag of the target's backward-difference velocity),
    and MuJoCo on the same file with ``solref="0.004 1"`` (its soft connect lets the point trail
    by up to 1.6 mm) gives joint angles within 0.015 rad over 3 s (measured 0.0108; 0.054 with
    MuJoCo's default solref)."""
    mujoco = pytest.importorskip("mujoco")
    sim = diffgym.Simulator.from_string(ARM.format(default=""))
    m = mujoco.MjModel.from_xml_string(ARM.format(
        default='<default><equality solref="0.004 1"/></default>'))
    d = mujoco.MjData(m)
    data = sim.model.createData()
    j2 = sim.model.getJointId("j2")

    def target(t):
        return np.array([0.4 + 0.1 * np.sin(2 * t), 0, 0.8 + 0.1 * (1 - np.cos(2 * t))])

    q, v = sim.q0.copy(), np.zeros(sim.nv)
    dq, gap = [], []
    for k in range(1500):
        p = target(k * sim.dt)
        sim.set_mocap("target", p)
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.converged
        d.mocap_pos[0] = p
        mujoco.mj_step(m, d)
        dq.append(np.abs(q - d.qpos).max())
        pin.forwardKinematics(sim.model, data, q)
        gap.append(np.linalg.norm(data.oMi[j2].act(np.array([0.1, 0, -0.2]))
                                  - target((k + 1) * sim.dt)))
    gap = np.array(gap)
    assert gap[0] == pytest.approx(2 * 0.1 * sim.dt, rel=1e-3)    # (vel 0 at the first step)
    assert gap[100:].max() < 2e-5, gap[100:].max()
    assert max(dq) < 0.015, max(dq)


@pytest.mark.parametrize("n", [200, 320])
def test_mocap_jacobian_paddle_pushing_a_ball(n):
    """d(q1, v1)/d(mocap pos, rot, vel, angvel) of a turning paddle pushing a ball against
    central differences of the step (the contact's point, frame and distance move with the
    paddle's pose; its offset holds the paddle's velocity)."""
    sim = diffgym.Simulator.from_string(BALL)

    def pose(k):
        a = 2.0 * sim.dt * k
        return [-0.25 + 0.6 * sim.dt * k, 0.0, 0.1], [np.cos(a / 2), 0, 0, np.sin(a / 2)]

    q, v, tau = sim.q0.copy(), np.zeros(sim.nv), np.zeros(sim.nv)
    for k in range(n):
        sim.set_mocap("paddle", *pose(k))
        q, v = sim.step(q, v, tau)
    sim.set_mocap("paddle", *pose(n))
    ws = sim.warm_start_state()
    _, _, jac = sim.step(q, v, tau, jacobian=True)
    assert ("pad", "b") in sim.last.contact_geoms and jac.mocap_note is None
    assert sim.last.contact_modes[sim.last.contact_geoms.index(("pad", "b"))] != "breaking"
    assert jac.diagnostics.min_margin > 1e-3
    assert jac.dv_dmocap.shape == (sim.nv, 12)
    sim.set_warm_start_state(ws)
    Dq, Dv = mocap_differences(sim, q, v, tau)
    # (measured 3.4e-5 on entries of 685 at n = 200, 1.4e-4 of 1,016 at n = 320; dq: 6.8e-8 of
    # 1.37, 2.8e-7 of 2.02)
    assert np.abs(jac.dv_dmocap - Dv).max() < 1e-6 * np.abs(Dv).max()
    assert np.abs(jac.dq_dmocap - Dq).max() < 1e-6 * np.abs(Dq).max()
    assert np.abs(Dv[:, 6:]).max() > 1.0           # (the velocity columns act)


def test_mocap_jacobian_with_equalities_and_contacts():
    """Two mocap bodies (a target dragging an arm by a connect and a box by an offset weld, a
    paddle) and a ball on the floor, along a rollout with a random target motion: at the visited
    states whose modes are not at a switch (margin > 1e-3), the mocap columns and the state
    blocks against central differences (measured at 3 of the 4 states: dv_dmocap 2.1e-7 to
    2.2e-7 on entries of 632 to 692, dv_dq 2.4e-7 to 8.5e-7 of 187 to 214)."""
    sim = diffgym.Simulator.from_string(SCENE)
    rng = np.random.default_rng(3)
    q, v, tau = sim.q0.copy(), np.zeros(sim.nv), np.zeros(sim.nv)
    p, R = np.array([0.4, 0, 0.9]), np.eye(3)
    lin, w = np.zeros(3), np.zeros(3)
    checked = 0
    for k in range(240):
        lin = 0.95 * lin + rng.normal(0, 0.05, 3) * [1, 0, 1]
        w = 0.95 * w + rng.normal(0, 0.2, 3) * [0, 1, 0]
        p = p + sim.dt * lin
        R = pin.exp3(sim.dt * w) @ R
        sim.set_mocap("target", p, _quat(R))
        sim.set_mocap("paddle", [-0.3 + 0.4 * sim.dt * k, 0, 0.1])
        if k % 60 == 59:
            ws = sim.warm_start_state()
            _, _, jac = sim.step(q, v, tau, jacobian=True)
            assert sim.last.converged and jac.mocap_note is None
            if jac.diagnostics.min_margin > 1e-3:
                sim.set_warm_start_state(ws)
                Dq, Dv = mocap_differences(sim, q, v, tau)
                assert np.abs(Dv[:, :12]).max() > 1.0          # (the target's columns act)
                assert np.abs(jac.dv_dmocap - Dv).max() < 1e-7 * max(1.0, np.abs(Dv).max())
                assert np.abs(jac.dq_dmocap - Dq).max() < 1e-7 * max(1.0, np.abs(Dq).max())
                e, nv = 1e-7, sim.nv
                Sq, Sv = np.zeros((nv, nv)), np.zeros((nv, nv))
                for i in range(nv):
                    d = np.zeros(nv)
                    d[i] = e
                    out = []
                    for a, b in ((pin.integrate(sim.model, q, d), v),
                                 (pin.integrate(sim.model, q, -d), v), (q, v + d), (q, v - d)):
                        sim.set_warm_start_state(ws)
                        out.append(sim.step(a, b, tau)[1])
                    Sq[:, i] = (out[0] - out[1]) / (2 * e)
                    Sv[:, i] = (out[2] - out[3]) / (2 * e)
                assert np.abs(jac.dv_dq - Sq).max() < 1e-7 * np.abs(Sq).max()
                assert np.abs(jac.dv_dv - Sv).max() < 1e-6
                checked += 1
            sim.set_warm_start_state(ws)
        q, v = sim.step(q, v, tau)
        assert sim.last.converged
    assert checked >= 2


def test_mocap_jacobian_refuses_what_it_does_not_cover():
    """A restitution contact on the step: the mocap columns are not computed (None) and
    ``mocap_note`` says why; a model with mocap bodies and no constraint row: zero columns."""
    sim = diffgym.Simulator.from_string(HAND.split("<equality>")[0] + "</mujoco>")
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    _, _, jac = sim.step(q, v, np.zeros(sim.nv), jacobian=True)
    assert jac.dv_dmocap.shape == (6, 12) and not jac.dv_dmocap.any()
    sim = diffgym.Simulator.from_string(BALL.replace(
        "</mujoco>", '<custom><numeric name="diffgym:restitution:b" data="0.5"/></custom></mujoco>'))
    q, v = sim.q0.copy(), np.array([0, 0, -1.0, 0, 0, 0])
    q[2] = 0.1005
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, _, jac = sim.step(q, v, np.zeros(sim.nv), jacobian=True)
    assert getattr(sim.cache["cons"], "restitution", None) is not None
    assert jac.dv_dmocap is None and jac.dq_dmocap is None and "restitution" in jac.mocap_note


def test_mocap_columns_are_those_of_their_step():
    """The mocap columns are computed when first read, from the step they belong to: read after
    the mocap body was moved and more steps were taken, they equal those read at once (a pickle
    of the Jacobian, taken right after its step, holds them as values)."""
    import pickle
    sim = diffgym.Simulator.from_string(BALL)
    q, v, tau = sim.q0.copy(), np.zeros(sim.nv), np.zeros(sim.nv)
    for k in range(200):
        a = 2.0 * sim.dt * k
        sim.set_mocap("paddle", [-0.25 + 0.6 * sim.dt * k, 0.0, 0.1],
                      [np.cos(a / 2), 0, 0, np.sin(a / 2)])
        q, v, jac = sim.step(q, v, tau, jacobian=True)
    at_once = pickle.loads(pickle.dumps(jac))
    sim.set_mocap("paddle", [0.3, 0.2, 0.1], vel=[1, 0, 0], angvel=0)
    for _ in range(3):
        q, v = sim.step(q, v, tau)
    assert np.abs(at_once.dv_dmocap).max() > 1.0 and at_once.mocap_note is None
    np.testing.assert_array_equal(jac.dv_dmocap, at_once.dv_dmocap)
    np.testing.assert_array_equal(jac.dq_dmocap, at_once.dq_dmocap)


def test_weld_by_sites_on_a_body_under_a_mocap_body():
    """``site1``/``site2`` form, the mocap side's site on a jointless body under the mocap body:
    the hand follows the site on the turning, moving target (within 1e-5 m after 100 steps: the
    offset point's circle taken a step at a time, measured 1.0e-6)."""
    xml = """<mujoco><worldbody>
  <body name="target" mocap="true" pos="0 0 1"><body name="tip" pos="0.1 0 0"><site name="s1"
   pos="0 0 0.05" euler="0 0 30"/></body></body>
  <body name="hand" pos="0.1 0 1.05" euler="0 0 30"><freejoint/><geom type="box"
   size=".05 .04 .03"/><site name="s2"/></body>
</worldbody><equality><weld site1="s2" site2="s1"/></equality></mujoco>"""
    sim = diffgym.Simulator.from_string(xml)
    q, v = sim.q0, np.zeros(sim.nv)
    for k in range(100):
        a = sim.dt * k
        sim.set_mocap("target", pos=[0.5 * sim.dt * k, 0, 1],
                      quat=[np.cos(a / 2), 0, 0, np.sin(a / 2)], vel=[0.5, 0, 0], angvel=[0, 0, 1])
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.converged
    t = 100 * sim.dt
    R = pin.exp3(np.array([0, 0, t]))
    np.testing.assert_allclose(q[:3], [0.5 * t, 0, 1] + R @ [0.1, 0, 0.05], atol=1e-5)
    Rh = pin.Quaternion(q[6], *q[3:6]).toRotationMatrix()
    np.testing.assert_allclose(Rh, R @ pin.exp3(np.array([0, 0, np.pi / 6])), atol=1e-9)
