"""Mocap bodies (issue 15): poses the user sets each step (``Simulator.set_mocap``, as MuJoCo's
``data.mocap_pos``/``mocap_quat``), contacts that feel the mocap body's velocity, step Jacobians
against central differences with the mocap pose held, MuJoCo on the same file, and the files
MuJoCo refuses refused with their line."""
import pickle
import re
import warnings

import numpy as np
import pinocchio as pin
import pytest

import diffgym

PADDLE = """<mujoco><option timestep="0.002"/>{default}<worldbody>
<geom name="floor" type="plane" size="5 5 .1" friction="0.5"/>
<body name="paddle" mocap="true" pos="-0.3 0 0.1"><geom name="pad" type="box" size="0.05 0.2 0.08"
 friction="0.5"/></body>
<body name="box" pos="0 0 0.1"><freejoint/><geom name="b" type="box" size="0.1 0.1 0.1"
 friction="0.5" density="500"/></body>
</worldbody></mujoco>"""

BALL = """<mujoco><option timestep="0.002"/><worldbody>
<geom name="floor" type="plane" size="5 5 .1" friction="0.8"/>
<body name="paddle" mocap="true" pos="-0.25 0 0.1"><geom name="pad" type="box" size="0.05 0.2 0.1"
 friction="0.3"/></body>
<body name="ball" pos="0 0 0.1"><freejoint/><geom name="b" type="sphere" size="0.1" friction="0.8"/>
</body></worldbody></mujoco>"""


def test_paddle_pushes_box_like_mujoco():
    """A mocap paddle driven at 0.5 m/s pushes a 4 kg box over a floor with friction 0.5. In
    diffgym the box keeps touching the paddle's face at the paddle's speed, without entering it
    (the contact rows hold the paddle's velocity); MuJoCo's mocap body has no velocity, so its
    soft contact lets the paddle sink into the box until the penetration pushes it (14-16 mm with
    the default solref, 3.5-4 mm with solref 0.004): the trajectories agree within that."""
    mujoco = pytest.importorskip("mujoco")
    sim = diffgym.Simulator.from_string(PADDLE.format(default=""))
    m = mujoco.MjModel.from_xml_string(PADDLE.format(default='<default><geom solref="0.004 1"/>'
                                                             '</default>'))
    d = mujoco.MjData(m)
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    dx, gap = [], []
    for k in range(500):
        px = -0.3 + 0.5 * sim.dt * k
        sim.set_mocap("paddle", [px, 0, 0.1])
        q0 = q
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.converged
        d.mocap_pos[0] = [px, 0, 0.1]
        mujoco.mj_step(m, d)
        dx.append(q[0] - d.qpos[0])
        gap.append(q0[0] - 0.1 - (px + 0.05))        # box back face - paddle front, step start
    dx, gap = np.array(dx), np.array(gap)
    touching = np.flatnonzero(gap < 1e-3)
    assert len(touching) > 300
    first = touching[0]
    # the paddle never enters the box; inside the contact skin (1 mm) the gap closes by erp =
    # 0.2 a step (constraint.py), then the box rides on the face, never left behind
    assert gap[first:].min() > -1e-9, gap[first:].min()
    assert np.all(np.abs(gap[-200:]) < 1e-9), np.abs(gap[-200:]).max()
    assert v[0] == pytest.approx(0.5, abs=1e-9) and abs(q[2] - 0.1) < 1e-6
    assert np.abs(dx).max() < 5e-3                           # measured 4.0 mm (MuJoCo behind)
    assert dx[-1] > 0


@pytest.mark.parametrize("n", [200, 320])
def test_rotating_paddle_jacobian_central_differences(n):
    """A paddle turning at 2 rad/s and moving at 0.6 m/s pushes a ball, which slides on the
    paddle: the step Jacobian (mocap pose and velocity held) against central differences."""
    sim = diffgym.Simulator.from_string(BALL)

    def pose(k):
        a = 2.0 * sim.dt * k
        return [-0.25 + 0.6 * sim.dt * k, 0.0, 0.1], [np.cos(a / 2), 0, 0, np.sin(a / 2)]

    q, v = sim.q0.copy(), np.zeros(sim.nv)
    for k in range(n):
        sim.set_mocap("paddle", *pose(k))
        q, v = sim.step(q, v, np.zeros(sim.nv))
    sim.set_mocap("paddle", *pose(n))
    vel, angvel = sim.mocap_velocity("paddle")
    np.testing.assert_allclose(vel, [0.6, 0, 0], atol=1e-9)
    np.testing.assert_allclose(angvel, [0, 0, 2.0], atol=1e-9)
    tau = np.zeros(sim.nv)
    _, _, jac = sim.step(q, v, tau, jacobian=True)
    assert ("pad", "b") in sim.last.contact_geoms
    assert sim.last.contact_modes[sim.last.contact_geoms.index(("pad", "b"))] != "breaking"
    assert jac.diagnostics.min_margin > 1e-3
    eps, nv = 1e-7, sim.nv
    Dq, Dv = np.zeros((nv, nv)), np.zeros((nv, nv))
    for i in range(nv):
        e = np.zeros(nv)
        e[i] = eps
        Dq[:, i] = (sim.step(pin.integrate(sim.model, q, e), v, tau)[1]
                    - sim.step(pin.integrate(sim.model, q, -e), v, tau)[1]) / (2 * eps)
        Dv[:, i] = (sim.step(q, v + e, tau)[1] - sim.step(q, v - e, tau)[1]) / (2 * eps)
    # (measured 3.4e-5 and 1.4e-4 on |Dq| of 685 and 1016)
    assert np.abs(jac.dv_dq - Dq).max() < 1e-6 * np.abs(Dq).max()
    assert np.abs(jac.dv_dv - Dv).max() < 1e-6


def test_set_mocap_velocity_pose_and_pickle():
    sim = diffgym.Simulator.from_string(BALL)
    pos, quat = sim.mocap_pose("paddle")
    np.testing.assert_allclose(pos, [-0.25, 0, 0.1])
    np.testing.assert_allclose(quat, [1, 0, 0, 0])
    sim.set_mocap(0, [-0.2, 0, 0.1])                 # by index; velocity by finite difference
    np.testing.assert_allclose(sim.mocap_velocity(0)[0], [0.05 / sim.dt, 0, 0])
    sim.set_mocap("paddle", [-0.3, 0, 0.1], [0, 0, 0, 1], vel=0, angvel=0)   # a jump
    assert not np.any(np.concatenate(sim.mocap_velocity("paddle")))
    sim.set_mocap("paddle", vel=[0.1, 0, 0])
    # the geoms follow: the pad's world placement, and a copy keeps pose and velocity
    g = sim.geom_id("pad")
    np.testing.assert_allclose(sim.geom_model.geometryObjects[g].placement.translation,
                               [-0.3, 0, 0.1])
    copy = pickle.loads(pickle.dumps(sim))
    for a, b in zip(copy.mocap_pose("paddle") + copy.mocap_velocity("paddle"),
                    sim.mocap_pose("paddle") + sim.mocap_velocity("paddle")):
        np.testing.assert_array_equal(a, b)
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    np.testing.assert_array_equal(copy.step(q, v, np.zeros(6))[0], sim.step(q, v, np.zeros(6))[0])
    for bad, err in (({"body": "nope"}, KeyError), ({"body": 3}, IndexError),
                     ({"body": 0, "quat": [0, 0, 0, 0]}, ValueError),
                     ({"body": 0, "pos": [np.nan, 0, 0]}, ValueError),
                     ({"body": 0, "vel": [1, 2]}, ValueError)):
        with pytest.raises(err):
            sim.set_mocap(**bad)
    plain = diffgym.Simulator.from_string(BALL.replace(' mocap="true"', ""))
    assert plain.mocap_names == ()
    with pytest.raises(ValueError, match="no mocap body"):
        plain.set_mocap(0, [0, 0, 0])


@pytest.mark.parametrize("body, message", [
    ('<body name="m" mocap="true"><joint type="hinge"/><geom size=".1"/></body>',
     "a mocap body cannot have joints"),
    ('<body name="p"><joint type="hinge"/><geom size=".1"/>'
     '<body name="m" mocap="true"><geom size=".1"/></body></body>',
     "a mocap body must be a child of the world"),
    ('<body name="m" mocap="true"><geom type="plane" size="1 1 .1"/></body>',
     "a plane on the mocap body 'm'"),
    ('<body name="m" mocap="true"><geom size=".1"/><body name="c"><joint type="hinge"/>'
     '<geom size=".1"/></body></body>', "a body with joints under the mocap body 'm'"),
    ('<body name="m" mocap="yes"><geom size=".1"/></body>', "mocap='yes'"),
])
def test_bad_mocap_bodies_refused_with_line(body, message):
    xml = f"<mujoco><worldbody>\n{body}\n</worldbody></mujoco>"
    with pytest.raises(diffgym.ModelError, match=r"<string>:2: ") as info:
        diffgym.Simulator.from_string(xml)
    assert message in str(info.value), str(info.value)


def test_equality_without_a_moving_side_refused():
    """An equality between a mocap body and the world (or two mocap bodies) acts on nothing
    that moves: refused with the line (a mocap body's equality with a moving body is simulated:
    tests/test_mocap_equality.py)."""
    xml = ("<mujoco><worldbody><body name='m' mocap='true'><geom size='.1'/></body>\n"
           "<body name='n' mocap='true' pos='1 0 0'><geom size='.1'/></body></worldbody>\n"
           "<equality><weld body1='n' body2='m'/></equality></mujoco>")
    with pytest.raises(diffgym.ModelError, match=re.escape("<string>:3: ") + ".*nor body2 'm'"):
        diffgym.Simulator.from_string(xml)
    with pytest.raises(diffgym.ModelError, match=re.escape("<string>:3: ") + ".*move rigidly"):
        diffgym.Simulator.from_string(xml.replace("body1='n'", "body1='m'"))
    with pytest.raises(diffgym.ModelError, match="neither body1 'world'"):
        diffgym.Simulator.from_string(xml.replace("body1='n'", "body1='world'"))


SCENE = """<mujoco><option timestep="0.002"/><worldbody>
<geom name="floor" type="plane" size="5 5 .1" friction="0.8"/>
<body name="paddle" mocap="true" pos="-0.25 0 0.1"><geom name="pad" type="box" size="0.05 0.3 0.1"
 friction="0.3"/><body name="fin" pos="0 0 0.15"><geom name="fin" type="capsule" size="0.02 0.1"
 euler="90 0 0"/></body></body>
<body name="b1" pos="0 0.12 0.1"><freejoint/><geom name="b1" type="sphere" size="0.1" friction="0.8"/>
</body>
<body name="b2" pos="0 -0.12 0.1"><freejoint/><geom name="b2" type="sphere" size="0.1" friction="0.8"/>
</body>
<body name="c" pos="0.3 0 0.1"><freejoint/><geom name="c" type="box" size="0.05 0.05 0.1"/></body>
</worldbody></mujoco>"""


def test_compiled_step_equals_the_stage_by_stage_one_with_a_mocap_paddle():
    """The fused compiled step adds the mocap offsets in its own kernel (forward._constrained_
    velocity); the stage-by-stage path (any other solver type) adds them after assembly
    (Simulator._mocap_offsets): the same steps, with a turning paddle (and a jointless body
    under it) pushing two balls into a box (several trees). The Jacobian there agrees with
    central differences."""
    from diffgym.sim.solver import NCPSolver

    class Staged(NCPSolver):
        pass

    sims = [diffgym.Simulator.from_string(SCENE) for _ in range(2)]
    sims[1].solver = Staged(sims[1].solver.settings)
    q, v = sims[0].q0.copy(), np.zeros(sims[0].nv)
    touched = 0
    for k in range(300):
        a = 1.0 * 0.002 * k
        for s in sims:
            s.set_mocap("paddle", [-0.25 + 0.6 * 0.002 * k, 0.0, 0.1],
                        [np.cos(a / 2), 0, 0, np.sin(a / 2)])
        (q0, v0), (q1, v1) = (s.step(q, v, np.zeros(s.nv)) for s in sims)
        assert sims[0].last.converged and sims[0].last.contact_modes == sims[1].last.contact_modes
        # (both solve to the solver's tolerance, 1e-9 m/s: measured up to 2e-10 apart)
        np.testing.assert_allclose(v0, v1, rtol=0, atol=1e-8)
        np.testing.assert_allclose(q0, q1, rtol=0, atol=1e-10)
        touched += any("pad" in g for g in sims[0].last.contact_geoms)
        q, v = q0, v0
    assert touched > 100
    sim = sims[0]
    tau = np.zeros(sim.nv)
    _, _, jac = sim.step(q, v, tau, jacobian=True)
    assert ("pad", "b2") in sim.last.contact_geoms and jac.diagnostics.min_margin > 1e-3
    eps, nv = 1e-7, sim.nv
    Dq = np.zeros((nv, nv))
    for i in range(nv):
        e = np.zeros(nv)
        e[i] = eps
        Dq[:, i] = (sim.step(pin.integrate(sim.model, q, e), v, tau)[1]
                    - sim.step(pin.integrate(sim.model, q, -e), v, tau)[1]) / (2 * eps)
    assert np.abs(jac.dv_dq - Dq).max() < 1e-6 * np.abs(Dq).max()      # measured 4.2e-8


def test_keyframe_mpos_mquat_give_the_initial_mocap_pose():
    """A keyframe's ``mpos``/``mquat`` (MuJoCo's mocap poses of a key): the key that gives q0
    gives the mocap bodies' initial poses (its geoms moved there: the ball lands on the
    paddle's new place, 0.3 m higher); every key's are in ``sm.mocap_keyframes``."""
    xml = MOCAP_KEY.format(key='<keyframe><key name="up" qpos="0 0 1 1 0 0 0" mpos="0 0 0.8" '
                               'mquat="0.7071068 0 0 0.7071068"/></keyframe>')
    sim = diffgym.Simulator.from_string(xml)
    pos, quat = sim.mocap_pose("target")
    np.testing.assert_allclose(pos, [0, 0, 0.8])
    np.testing.assert_allclose(quat, [np.sqrt(0.5), 0, 0, np.sqrt(0.5)], atol=1e-7)
    assert set(sim.sm.mocap_keyframes) == {"up"}
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(400):
            q, v = sim.step(q, v, np.zeros(sim.nv))
    assert q[2] == pytest.approx(1.0, abs=2e-3)       # box top 0.9 + radius
    bad = MOCAP_KEY.format(key='<keyframe><key mpos="0 0"/></keyframe>')
    with pytest.raises(diffgym.ModelError, match="mpos: expected 3 numbers"):
        diffgym.Simulator.from_string(bad)


MOCAP_KEY = """<mujoco><worldbody>
<geom name="floor" type="plane" size="5 5 .1"/>
<body name="target" mocap="true" pos="0 0 0.5"><geom type="box" size="0.1 0.1 0.1"/></body>
<body name="ball" pos="0 0 1"><freejoint/><geom type="sphere" size="0.1"/></body>
</worldbody>{key}</mujoco>"""
