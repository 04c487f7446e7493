"""Issue 15: equality constraints (connect, weld, joint), joint dry friction (frictionloss),
ball-joint limits and fixed tendons, against closed forms and MuJoCo, and their step
Jacobians against central differences along rollouts (diffgym.sim.equality)."""
import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym.gradcheck import check_step_jacobians
from diffgym.sim.model import ModelError
from mixed_oracle import mixed_conditions as _mixed_conditions, step_conditions


def _link(name, pos, to, joint, inner=""):
    com = " ".join(str(0.5 * float(x)) for x in to.split())
    return (f'<body name="{name}" pos="{pos}"><joint name="{joint}" type="hinge" axis="0 1 0"/>'
            f'<inertial pos="{com}" mass="1" diaginertia="0.02 0.02 0.02"/>'
            f'<geom type="capsule" fromto="0 0 0 {to}" size="0.02" contype="0" conaffinity="0" '
            f'mass="0"/>{inner}</body>')


def loop_xml(dt=0.001, connect_attrs=""):
    """A double pendulum (a, b) whose end is connected to a third pendulum (c): a
    parallelogram four-bar linkage, one degree of freedom."""
    return (f'<mujoco><option timestep="{dt}"/><worldbody>'
            f'{_link("a", "0 0 1", "0 0 -0.5", "h1", _link("b", "0 0 -0.5", "1 0 0", "h2"))}'
            f'{_link("c", "1 0 1", "0 0 -0.5", "h3")}</worldbody>'
            f'<equality><connect body1="b" body2="c" anchor="1 0 0" {connect_attrs}/></equality>'
            '</mujoco>')


def _parallelogram_theta(th0, T, dt_out, h=1e-4):
    """The closed form: the crank angle of the parallelogram, a 1-dof pendulum with
    I = 2 (I_c + m (l/2)^2) + m l^2 (the coupler translates) and gravity torque
    g (2 m l/2 + m l) sin(theta), integrated by RK4 at step h."""
    m, l, g, Ic = 1.0, 0.5, 9.81, 0.02
    Ieff = 2 * (Ic + m * (l / 2) ** 2) + m * l ** 2
    K = g * (m * l + m * l)

    def f(y):
        return np.array([y[1], -K / Ieff * np.sin(y[0])])

    y = np.array([th0, 0.0])
    out = [th0]
    every = int(round(dt_out / h))
    for i in range(int(round(T / h))):
        k1 = f(y)
        k2 = f(y + h / 2 * k1)
        k3 = f(y + h / 2 * k2)
        k4 = f(y + h * k3)
        y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        if (i + 1) % every == 0:
            out.append(y[0])
    return np.array(out)


def _run_loop(dt, T=1.0, th0=0.6):
    sim = diffgym.Simulator.from_string(loop_xml(dt))
    q, v = np.array([th0, -th0, th0]), np.zeros(3)
    qs, viol = [q], 0.0
    for _ in range(int(round(T / dt))):
        q, v = sim.step(q, v, np.zeros(3))
        qs.append(q)
        viol = max(viol, abs(q[0] + q[1]), abs(q[2] - q[0]))
        assert sim.last.converged
    return np.array(qs), viol


def test_connect_loop_closed_form():
    """The closed loop keeps its constraint to rounding and follows the 1-dof closed form with
    the first-order error of the semi-implicit step (halving dt halves it)."""
    errs = []
    for dt in (1e-3, 5e-4):
        qs, viol = _run_loop(dt)
        assert viol < 1e-9
        ref = _parallelogram_theta(0.6, 1.0, dt)
        errs.append(float(np.abs(qs[:, 0] - ref).max()))
    # measured: 1.44e-3 and 0.72e-3
    assert errs[0] < 3e-3
    assert 1.7 < errs[0] / errs[1] < 2.3


def test_connect_loop_matches_mujoco():
    """Against MuJoCo on the same file, MuJoCo's soft connect made stiff (solref 2 dt):
    joint angles agree to 2e-5 rad over 1 s (measured 5.3e-6; MuJoCo's default solref, a
    softer constraint violated by 2e-4, gives 4.8e-4)."""
    mujoco = pytest.importorskip("mujoco")
    m = mujoco.MjModel.from_xml_string(loop_xml(1e-3, 'solref="0.002 1"'))
    d = mujoco.MjData(m)
    d.qpos[:] = [0.6, -0.6, 0.6]
    sim = diffgym.Simulator.from_string(loop_xml(1e-3))
    q, v = np.array([0.6, -0.6, 0.6]), np.zeros(3)
    err = 0.0
    for _ in range(1000):
        mujoco.mj_step(m, d)
        q, v = sim.step(q, v, np.zeros(3))
        err = max(err, float(np.abs(d.qpos - q).max()))
    assert err < 2e-5


WELD_XML = """<mujoco><option timestep="0.002"/><worldbody>
 <geom type="plane" size="5 5 0.1"/>
 <body name="arm" pos="0 0 1"><joint name="j1" type="hinge" axis="0 1 0"/>
  <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.03"/>
  <body name="hand" pos="0.5 0 0"><joint name="j2" type="hinge" axis="0 0 1"/>
   <geom type="box" size="0.05 0.05 0.05" pos="0.05 0 0"/></body></body>
 <body name="box" pos="0.3 0.5 0.5" euler="10 20 30"><freejoint name="box"/><geom type="box" size="0.1 0.1 0.1"/></body>
</worldbody>
<equality><weld body1="box"/><weld body1="hand" body2="arm"/></equality></mujoco>"""


def test_weld_holds_still():
    """A free box welded to the world does not move under gravity (its weld carries m g dt per
    step); a hand welded to its arm keeps its joint at zero while the arm swings."""
    sim = diffgym.Simulator.from_string(WELD_XML)
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    v[0] = 2.0
    iq = sim.model.joints[sim.joint_id("box")].idx_q     # translation, then box_rot's quaternion
    j2 = sim.model.joints[sim.joint_id("j2")].idx_q
    box0 = q[iq:iq + 7].copy()
    swing = 0.0
    for _ in range(500):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert np.abs(q[iq:iq + 7] - box0).max() < 1e-12
        assert abs(q[j2]) < 1e-12
        swing = max(swing, abs(q[0]))
    assert swing > 1.0                          # the arm did move
    labels = sim.last.constraint_labels
    lam = sim.last.constraint_impulses
    k = labels.index("weld weld0 [z]") if "weld weld0 [z]" in labels else 2
    mass = 1000 * 0.2 ** 3
    assert abs(abs(lam[k]) - mass * 9.81 * sim.dt) < 1e-10
    assert all(m == "equality" for m in sim.last.constraint_modes)


COUPLE_XML = """<mujoco><option timestep="0.002" gravity="0 0 {g}"/><worldbody>
 <body name="a" pos="0 0 1"><joint name="ja" type="hinge" axis="0 1 0"/>
  <inertial pos="0.2 0 0" mass="1" diaginertia="0.01 0.01 0.01"/>
  <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.03" contype="0" mass="0"/></body>
 <body name="b" pos="1 0 1"><joint name="jb" type="hinge" axis="0 1 0"/>
  <inertial pos="0.15 0 0" mass="2" diaginertia="0.01 0.01 0.01"/>
  <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.03" contype="0" mass="0"/></body>
</worldbody>
<equality><joint joint1="ja" joint2="jb" polycoef="0 2 0 0 0"/></equality>
<actuator><motor joint="jb" gear="1" ctrlrange="-1 1"/></actuator></mujoco>"""


def test_joint_coupling():
    """q_a = 2 q_b exactly under random actuation and gravity; without gravity the pair is one
    body of inertia I_b + 4 I_a under the torque on b (closed form of the first step)."""
    sim = diffgym.Simulator.from_string(COUPLE_XML.format(g=-9.81))
    q, v = sim.q0.copy(), np.zeros(2)
    rng = np.random.default_rng(0)
    for _ in range(400):
        q, v = sim.step(q, v, sim.actuation(rng.uniform(-1, 1, 1)))
        assert abs(q[0] - 2 * q[1]) < 1e-9 and abs(v[0] - 2 * v[1]) < 1e-9
    assert abs(q[1]) > 0.1
    # a polynomial coupling, violated by 0.1 at the start: the Baumgarte correction removes
    # a fraction erp of the error per step; then the error stays at the drift of the curved
    # constraint within a step (about dt^2 P'' v^2 / 2, of which erp is removed per step)
    sim = diffgym.Simulator.from_string(COUPLE_XML.format(g=-9.81).replace(
        "0 2 0 0 0", "0.1 2 -1.5 0.5 0.3"))
    q, v = sim.q0.copy(), np.zeros(2)
    worst = 0.0
    for k in range(300):
        q, v = sim.step(q, v, sim.actuation(rng.uniform(-1, 1, 1)))
        x = q[1]
        err = abs(q[0] - (0.1 + 2 * x - 1.5 * x ** 2 + 0.5 * x ** 3 + 0.3 * x ** 4))
        if k == 0:
            assert abs(err - 0.08) < 1e-3            # (1 - erp) of 0.1 after one step
        if k >= 100:
            ddP = abs(-3 + 3 * x + 3.6 * x ** 2)
            worst = max(worst, err / max(sim.dt ** 2 * ddP * v[1] ** 2 / 2 / 0.2, 1e-12))
    assert worst < 3.0, worst                       # (measured 1.1)
    sim = diffgym.Simulator.from_string(COUPLE_XML.format(g=0))
    Ia, Ib = 0.01 + 0.2 ** 2, 0.01 + 2 * 0.15 ** 2
    q1, v1 = sim.step(sim.q0, np.zeros(2), np.array([0.0, 0.7]))
    wb = sim.dt * 0.7 / (Ib + 4 * Ia)
    assert np.allclose(v1, [2 * wb, wb], rtol=1e-12, atol=1e-15)


FRICTION_XML = """<mujoco><option timestep="0.002" gravity="0 0 {g}"/><worldbody>
 <body name="p" pos="0 0 1"><joint name="h" type="hinge" axis="{axis}" frictionloss="0.5"/>
  <inertial pos="{com}" mass="1" diaginertia="0.01 0.01 0.01"/>
  <geom type="capsule" fromto="0 0 0 {com}" size="0.02" contype="0" mass="0"/></body>
</worldbody></mujoco>"""


def test_frictionloss_closed_form():
    """Dry friction f = 0.5 N m on a hinge (I = 0.26 kg m^2 about it): a spinning body
    decelerates at exactly f / I and then stays stopped; a torque below f does not move it, one
    above accelerates it at (tau - f) / I; under gravity a pendulum sticks below its breakaway
    angle asin(f / (m g l)) and slides above it."""
    sim = diffgym.Simulator.from_string(FRICTION_XML.format(g=0, axis="0 0 1", com="0.5 0 0"))
    I, f, dt = 0.26, 0.5, sim.dt
    q, v = sim.q0.copy(), np.array([1.0])
    for k in range(1, 301):
        q, v = sim.step(q, v, np.zeros(1))
        assert abs(v[0] - max(1.0 - k * dt * f / I, 0.0)) < 1e-12
    assert v[0] == 0.0 and sim.last.constraint_modes == ["sticking"]
    for tau in (0.4, 0.6):
        q, v = sim.q0.copy(), np.zeros(1)
        for _ in range(100):
            q, v = sim.step(q, v, np.array([tau]))
        assert abs(v[0] - max(tau - f, 0.0) * 100 * dt / I) < 1e-12
    sim = diffgym.Simulator.from_string(FRICTION_XML.format(g=-9.81, axis="0 1 0", com="0 0 -0.5"))
    brk = np.arcsin(f / (9.81 * 0.5))               # 0.1021 rad
    for th, moves in ((0.95 * brk, False), (1.05 * brk, True)):
        q, v = np.array([th]), np.zeros(1)
        for _ in range(50):
            q, v = sim.step(q, v, np.zeros(1))
        assert (abs(q[0] - th) > 1e-4) == moves
        if not moves:
            assert q[0] == th and v[0] == 0.0


BALL_XML = """<mujoco><option timestep="0.002"/><worldbody>
 <body name="p" pos="0 0 1"><joint name="ball" type="ball" range="0 30" {attrs}/>
  <inertial pos="0.3 0 0" mass="1" diaginertia="0.01 0.02 0.02"/>
  <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.02" contype="0" mass="0"/></body>
</worldbody></mujoco>"""


def _angle(qxyzw):
    return float(np.linalg.norm(pin.log3(pin.Quaternion(qxyzw[3], *qxyzw[:3]).toRotationMatrix())))


def test_ball_limit_cone():
    """A ball joint thrown towards its 30 degree cone stays inside it (up to the Baumgarte
    drift, measured 1.2e-3 degrees) and matches MuJoCo: to rounding before the limit, to 5e-3
    in the quaternion after it with MuJoCo's limit made stiff (solreflimit 2 dt; measured
    1.7e-3; MuJoCo overshoots the cone by 0.17 degrees)."""
    mujoco = pytest.importorskip("mujoco")
    sim = diffgym.Simulator.from_string(BALL_XML.format(attrs=""))
    m = mujoco.MjModel.from_xml_string(BALL_XML.format(attrs='solreflimit="0.004 1"'))
    d = mujoco.MjData(m)
    v0 = np.array([0.0, 2.0, 1.0])
    d.qvel[:] = v0
    q, v = sim.q0.copy(), v0.copy()
    first, amax, err_before, err_after = None, 0.0, 0.0, 0.0
    for i in range(500):
        mujoco.mj_step(m, d)
        q, v = sim.step(q, v, np.zeros(3))
        if first is None and sim.last.constraint_modes:
            first = i
        qm = np.r_[d.qpos[1:4], d.qpos[0]]
        qm = qm if qm @ q >= 0 else -qm
        if first is None:
            err_before = max(err_before, float(np.abs(qm - q).max()))
        else:
            err_after = max(err_after, float(np.abs(qm - q).max()))
        amax = max(amax, _angle(q))
    assert first is not None and first > 10
    assert np.degrees(amax) < 30.01
    assert np.degrees(amax) > 29.9
    assert err_before < 1e-12
    assert err_after < 5e-3


TENDON_XML = """<mujoco><option timestep="0.002" gravity="0 0 {g}"/><worldbody>
 <body name="a" pos="0 0 1"><joint name="ja" type="hinge" axis="0 1 0"/>
  <inertial pos="0.2 0 0" mass="1" diaginertia="0.01 0.01 0.01"/>
  <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.03" contype="0" mass="0"/></body>
 <body name="b" pos="1 0 1"><joint name="jb" type="slide" axis="0 0 1"/>
  <geom type="box" size="0.1 0.1 0.1" contype="0" mass="2"/></body>
</worldbody>
<tendon><fixed name="t" range="-0.3 0.2" {extra}>
 <joint joint="ja" coef="1"/><joint joint="jb" coef="-2"/></fixed></tendon>
<actuator><motor tendon="t" gear="2" ctrlrange="-1 1"/></actuator></mujoco>"""


def test_fixed_tendon_limit_actuator_and_spring():
    """Fixed tendon L = q_a - 2 q_b: its motor applies gear ctrl coef (closed form of a step
    from rest without gravity), its spring -k (L - L0) coef and damper -d Ldot coef (closed
    form), and its range holds L within [-0.3, 0.2] under a motor pushing it out."""
    Ia, mb = 0.01 + 0.2 ** 2, 2.0
    sim = diffgym.Simulator.from_string(TENDON_XML.format(g=0, extra=""))
    dt = sim.dt
    tau = sim.actuation([0.5])
    assert np.allclose(tau, [2 * 0.5 * 1.0, 2 * 0.5 * -2.0])
    q1, v1 = sim.step(sim.q0, np.zeros(2), tau)
    assert np.allclose(v1, dt * tau / [Ia, mb], rtol=1e-12)
    sim = diffgym.Simulator.from_string(TENDON_XML.format(
        g=0, extra='stiffness="3" damping="0.4" springlength="0.05"'))
    q, v = np.array([0.1, -0.02]), np.array([0.3, 0.1])
    L, Ld, c = 0.1 + 0.04, 0.3 - 0.2, np.array([1.0, -2.0])
    f = -3 * (L - 0.05) * c - 0.4 * Ld * c
    q1, v1 = sim.step(q, v, np.zeros(2))
    assert np.allclose(v1, v + dt * f / [Ia, mb], rtol=1e-12)
    sim = diffgym.Simulator.from_string(TENDON_XML.format(g=-9.81, extra=""))
    for ctrl, bound in ((1.0, 0.2), (-1.0, -0.3)):
        q, v = sim.q0.copy(), np.zeros(2)
        hit = False
        for _ in range(400):
            q, v = sim.step(q, v, sim.actuation([ctrl]))
            L = q[0] - 2 * q[1]
            assert -0.3 - 2e-3 < L < 0.2 + 2e-3
            hit |= any(m == "active" for m in sim.last.constraint_modes)
        assert hit and abs(L - bound) < 2e-3


def _jacobian_case(which):
    """(simulator, start, force scale, the element modes the rollout must visit)."""
    if which == "loop":
        sim = diffgym.Simulator.from_string(loop_xml(1e-3))
        return sim, (np.array([0.6, -0.6, 0.6]), np.zeros(3)), 0.3, {"equality"}
    if which == "weld":
        return diffgym.Simulator.from_string(WELD_XML), None, 0.3, {"equality"}
    if which == "couple":
        return diffgym.Simulator.from_string(COUPLE_XML.format(g=-9.81)), None, 0.3, {"equality"}
    if which == "poly":
        sim = diffgym.Simulator.from_string(COUPLE_XML.format(g=-9.81).replace(
            "0 2 0 0 0", "0.1 2 -1.5 0.5 0.3"))
        return sim, None, 0.3, {"equality"}
    if which == "friction":
        sim = diffgym.Simulator.from_string(FRICTION_XML.format(g=-9.81, axis="0 1 0",
                                                                com="0 0 -0.5"))
        return sim, (np.array([0.05]), np.zeros(1)), 0.6, {"sticking", "sliding"}
    if which == "ball":
        sim = diffgym.Simulator.from_string(BALL_XML.format(attrs=""))
        return sim, (sim.q0.copy(), np.array([0.0, 5.0, 2.0])), 0.3, {"active"}
    sim = diffgym.Simulator.from_string(TENDON_XML.format(g=-9.81,
                                                          extra='stiffness="3" damping="0.4"'))
    return sim, (np.array([0.15, 0.0]), np.zeros(2)), 2.0, {"active", "inactive"}


@pytest.mark.parametrize("which", ["loop", "weld", "couple", "poly", "friction", "ball", "tendon"])
def test_step_jacobians(which):
    """Each element's step Jacobians agree with central differences at every state of a
    60-step rollout under random forces that visits the element's modes (friction: sticking
    and sliding; ball and tendon limits: active)."""
    sim, start, scale, want = _jacobian_case(which)
    acts = np.random.default_rng(3).normal(size=(60, sim.nv)) * scale
    q, v = start if start is not None else (sim.q0, np.zeros(sim.nv))
    seen = set()
    for a in acts:
        q, v = sim.step(q, v, a)
        seen |= set(sim.last.constraint_modes)
    assert want <= seen, seen
    sim.reset_warmstart()
    rep = check_step_jacobians(sim, steps=60, actions=acts, start=start)
    assert rep.states == 60
    assert rep.failed == 0, str(rep)


def test_bad_constraint_elements():
    base = '<mujoco><worldbody><body name="a"><joint name="j" type="hinge"/><geom size="0.1"/>' \
           '</body></worldbody>{}</mujoco>'
    with pytest.raises(ModelError, match="unknown body 'nope'"):
        diffgym.Simulator.from_string(base.format(
            '<equality><connect body1="nope" anchor="0 0 0"/></equality>'))
    with pytest.raises(ModelError, match="unknown joint 'k'"):
        diffgym.Simulator.from_string(base.format(
            '<equality><joint joint1="k"/></equality>'))
    with pytest.raises(ModelError, match=r"spatial tendon \[tendon\.spatial\]"):
        diffgym.Simulator.from_string(base.format('<tendon><spatial name="s"/></tendon>'))
    with pytest.raises(ModelError, match="frictionloss"):
        diffgym.Simulator.from_string(base.replace('type="hinge"', 'type="hinge" frictionloss="-1"')
                                      .format(""))
    with pytest.raises(ModelError, match="torquescale"):
        diffgym.Simulator.from_string(base.format(
            '<equality><weld body1="a" torquescale="0.5"/></equality>'))
    with pytest.raises(ModelError, match="missing anchor"):
        diffgym.Simulator.from_string(base.format('<equality><connect body1="a"/></equality>'))
    with pytest.raises(ModelError, match="must be a hinge or slide"):
        diffgym.Simulator.from_string(base.replace('type="hinge"', 'type="ball"').format(
            '<tendon><fixed name="t"><joint joint="j" coef="1"/></fixed></tendon>'))
    with pytest.raises(ModelError, match="ball joint's range"):
        diffgym.Simulator.from_string(
            '<mujoco><worldbody><body name="a"><joint name="j" type="ball" range="10 30"/>'
            '<geom size="0.1"/></body></worldbody></mujoco>')


MIXED_XML = """<mujoco><option timestep="0.002"/><worldbody>
 <geom type="plane" size="5 5 0.1" friction="0.8"/>
 <body name="b1" pos="0 0 0.12"><freejoint name="f1"/><geom type="box" size="0.1 0.1 0.1"/></body>
 <body name="b2" pos="0.3 0 0.12"><freejoint name="f2"/><geom type="sphere" size="0.1"/></body>
 <body name="arm" pos="0 0.5 0.5"><joint name="h" type="hinge" axis="0 1 0" frictionloss="0.3"/>
  <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.03"/></body>
</worldbody>
<equality><connect body1="b1" body2="b2" anchor="0.15 0 0"/></equality></mujoco>"""


def test_with_contacts():
    """The new rows in one problem with frictional contacts: a box and a ball connected by a
    ball-socket fall onto the ground and slide (sticking, sliding and breaking contacts with
    the connect's equality rows and a dry-friction row): every step converges, the anchor
    points stay together, and the step Jacobians agree with central differences."""
    sim = diffgym.Simulator.from_string(MIXED_XML)
    start = (sim.q0.copy(), np.r_[0.5, np.zeros(sim.nv - 2), 3.0])
    acts = np.random.default_rng(0).normal(size=(80, sim.nv)) * 0.5
    q, v = start
    modes = set()
    c = sim.sm.constraint_spec.connects[0]
    data = sim.model.createData()
    for a in acts:
        q, v = sim.step(q, v, a)
        assert sim.last.converged
        modes |= set(sim.last.contact_modes)
        pin.forwardKinematics(sim.model, data, q)
        gap = data.oMi[c.jid1].act(c.anchor1) - data.oMi[c.jid2].act(c.anchor2)
        assert np.linalg.norm(gap) < 5e-6           # measured 6.1e-7 (drift within a step)
    assert {"sticking", "breaking"} <= modes
    sim.reset_warmstart()
    rep = check_step_jacobians(sim, steps=80, actions=acts, start=start, max_states=20)
    assert rep.failed == 0, str(rep)


@pytest.mark.parametrize("which", ["loop", "weld", "ball"])
def test_kinematic_terms_closed_form(which):
    """The rows' closed-form kinematic terms (d(J v1 + b)/dq; d(J^T lam)/dq of the joint-torque
    rows) against central differences of the rows' kinematics (ExtraRows.kinematic_derivatives_fd)
    at the states of a rollout (measured: 1.7e-10, 5.1e-11, 2.6e-10 relative)."""
    sim, start, scale, _ = _jacobian_case(which)
    acts = np.random.default_rng(3).normal(size=(60, sim.nv)) * scale
    q, v = start if start is not None else (sim.q0, np.zeros(sim.nv))
    n = 0
    for a in acts:
        q0 = q
        q, v = sim.step(q, v, a)
        cons, res = sim.cache["cons"], sim.cache["res"]
        xr = getattr(cons, "extra", None) if cons is not None else None
        if xr is None or not xr.m:
            continue
        lam = res.lam[cons.m - xr.m:]
        Da, ca = sim._extra.kinematic_derivatives(q0, v, lam, xr, sim.dt)
        Df, cf = sim._extra.kinematic_derivatives_fd(q0, v, lam, xr, sim.dt)
        assert np.abs(Da - Df).max() <= 1e-8 * max(1.0, np.abs(Df).max())
        if not sim._extra.spatial_rows(xr).any():
            assert np.abs(ca - cf).max() <= 1e-8 * max(1.0, np.abs(cf).max())
        n += 1
    assert n >= 15


def test_weld_in_contact():
    """A box welded to the world while it touches (0.5 mm into) the ground: its contacts can
    move nothing once the weld holds it (their rows vanish from the reduced problem), so they
    break with zero impulse and the box stays exactly where it is; its step Jacobians agree with
    central differences."""
    sim = diffgym.Simulator.from_string(WELD_XML.replace('pos="0.3 0.5 0.5" euler="10 20 30"',
                                                         'pos="0.3 0.5 0.0995"'))
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    iq = sim.model.joints[sim.joint_id("box")].idx_q
    box0 = q[iq:iq + 7].copy()
    for _ in range(100):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.converged and sim.last.num_contacts == 4
        assert np.abs(q[iq:iq + 7] - box0).max() < 1e-12
    assert set(sim.last.contact_modes) == {"breaking"}
    rep = check_step_jacobians(sim, steps=20, max_states=5)
    assert rep.failed == 0, str(rep)


WELD_MJ_XML = """<mujoco><option timestep="0.002"/><worldbody>
 <body name="arm" pos="0 0 1"><joint name="j1" type="hinge" axis="0 1 0"/>
  <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.03" contype="0"/>
  <body name="hand" pos="0.5 0 0" euler="0 30 0"><joint name="j2" type="ball"/>
   <geom type="box" size="0.05 0.02 0.08" pos="0.05 0.03 0" contype="0"/></body></body>
 <body name="free" pos="0.5 0.5 1"><joint name="s" type="slide" axis="1 0 0"/>
  <joint name="h" type="hinge" axis="0 0 1"/><joint name="h2" type="hinge" axis="1 0 0"/>
  <geom type="box" size="0.1 0.05 0.02" contype="0"/></body>
</worldbody><equality><weld body1="hand" body2="arm" {a}/><weld body1="free" anchor="0.1 0 0" {a}/>
</equality></mujoco>"""


@pytest.mark.parametrize("which", ["weld", "joint", "tendon"])
def test_matches_mujoco(which):
    """Against MuJoCo on the same file (its soft constraint stiffened, solref 2 dt), 1 s:
    welds (a ball joint welded shut, a 3-dof body welded to the world) to 2e-4 in q (measured
    5.9e-5); a joint coupling under a motor to 2e-4 (3.9e-5); a fixed tendon driven into its
    range: identical to rounding before the limit, after it within MuJoCo's own overshoot of
    the range (MuJoCo 4.0e-3, diffgym none; measured 4.4e-3 in q) and at the same resting
    length (2e-4; 1.3e-4)."""
    mujoco = pytest.importorskip("mujoco")
    ctrl = None
    if which == "weld":
        xml, xm = WELD_MJ_XML.format(a=""), WELD_MJ_XML.format(a='solref="0.004 1"')
    elif which == "joint":
        xml = COUPLE_XML.format(g=-9.81)
        xm, ctrl = xml.replace("polycoef", 'solref="0.004 1" polycoef'), 0.5
    else:
        xml = TENDON_XML.format(g=-9.81, extra="")
        xm, ctrl = xml.replace('range="-0.3 0.2"', 'range="-0.3 0.2" solreflimit="0.004 1"'), 1.0
    m = mujoco.MjModel.from_xml_string(xm)
    d = mujoco.MjData(m)
    sim = diffgym.Simulator.from_string(xml)
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    if which == "weld":          # (MuJoCo's ball quaternion is w x y z, pinocchio's x y z w)
        q[0], v[0] = 0.3, 1.0
        d.qpos[:] = np.r_[q[0], q[4], q[1:4], q[5:]]
        d.qvel[:] = v
    err, err_before, hit = 0.0, 0.0, False
    for _ in range(500):
        if ctrl is not None:
            d.ctrl[:] = ctrl
        mujoco.mj_step(m, d)
        q, v = sim.step(q, v, sim.actuation([ctrl]) if ctrl is not None else np.zeros(sim.nv))
        qm = d.qpos.copy()
        if which == "weld":
            qm = np.r_[qm[0], qm[2:5], qm[1], qm[5:]]
            qm[1:5] *= np.sign(qm[1:5] @ q[1:5])
        hit |= which == "tendon" and "active" in sim.last.constraint_modes
        e = float(np.abs(qm - q).max())
        err = max(err, e)
        if not hit:
            err_before = max(err_before, e)
    if which == "tendon":
        assert hit and err_before < 1e-12 and err < 6e-3
        assert abs((q[0] - 2 * q[1]) - d.ten_length[0]) < 2e-4
    else:
        assert err < 2e-4


@pytest.mark.parametrize("which", ["loop", "weld", "couple", "poly", "friction", "ball", "tendon",
                                   "mixed"])
def test_mixed_solve_satisfies_the_problem(which):
    """The mixed solve of the new rows (equality_kernels.mixed_solve, its one implementation)
    on each element's rollout under random forces, with the compiled solver and with
    ``SolverSettings(compiled=False)`` (every reduced NCP through NCPSolver.solve, the
    stage-by-stage route): at every step the solution satisfies the problem's conditions, checked from their
    definitions (tests/mixed_oracle.py) on the step's own G and g, and both give the same
    trajectory (the velocity solution is unique)."""
    if which == "mixed":
        sims = [diffgym.Simulator.from_string(MIXED_XML) for _ in range(2)]
        start, scale = (sims[0].q0.copy(), np.r_[0.5, np.zeros(sims[0].nv - 2), 3.0]), 0.5
    else:
        sims = [_jacobian_case(which)[0] for _ in range(2)]
        _, start, scale, _ = _jacobian_case(which)
    sims[1].solver.settings.compiled = False
    acts = np.random.default_rng(3).normal(size=(60, sims[0].nv)) * scale
    out = []
    for sim in sims:
        q, v = start if start is not None else (sim.q0, np.zeros(sim.nv))
        traj, worst, solved = [], 0.0, 0
        for a in acts:
            q, v = sim.step(q, v, a)
            traj.append(np.r_[q, v])
            w = step_conditions(sim)
            if w is None:
                continue
            assert sim.last.converged
            worst = max(worst, w)
            solved += 1
        assert solved >= 15 and worst < 1e-8, (solved, worst)
        out.append(np.array(traj))
    ta, tb = out
    assert np.abs(ta - tb).max() < 1e-9 * max(1.0, np.abs(tb).max())


def test_rows_on_a_scene_stepped_tree_by_tree(data_sizes, monkeypatch):
    """MIXED_XML (two free bodies and an arm: nv 13, more than a tree group) is stepped tree
    by tree; the connect rows' kinematics use the per-tree groups too: loading and stepping
    make no pinocchio Data of the whole model (cubic in nv). (The step Jacobian of these rows,
    on the numpy route, still makes one; its agreement with central differences on this scene
    is test_with_contacts.)"""
    import diffgym.sim.trees as trees_mod
    sizes = data_sizes
    sim = diffgym.Simulator.from_string(MIXED_XML)
    assert sim._trees is not None
    q, v = sim.q0.copy(), np.r_[0.5, np.zeros(sim.nv - 2), 3.0]
    for a in np.random.default_rng(0).normal(size=(30, sim.nv)) * 0.5:
        q, v = sim.step(q, v, a)
        assert sim.last.converged
    monkeypatch.undo()
    assert sizes and max(sizes) <= trees_mod.MAX_GROUP_NV < sim.nv
    # the anchors stay together (the rows are right on this path)
    c = sim.sm.constraint_spec.connects[0]
    data = sim.model.createData()
    pin.forwardKinematics(sim.model, data, q)
    assert np.linalg.norm(data.oMi[c.jid1].act(c.anchor1) - data.oMi[c.jid2].act(c.anchor2)) < 5e-6


def test_frictionloss_on_a_limited_joint_outside_its_range():
    """Gymnasium's ant with joint dry friction: it starts with its ankles outside their ranges,
    so each ankle's limit row (its drift-correction velocity) and friction row share one dof.
    Sticking there makes the limit row's Schur diagonal vanish; the mixed solve used to leave
    the limit out with zero impulse, flip the friction row between sticking and sliding the
    wrong way for 60 rounds and report a non-converged step with a residual of 1e-16 while the
    limit was violated by 10 rad/s. Every step must now be solved, by the independent oracle."""
    import os
    import re
    src = open(os.path.join(os.path.dirname(__import__("gymnasium").__file__), "envs", "mujoco",
                            "assets", "ant.xml")).read()
    src, n = re.subn(r'type="hinge"/>', 'type="hinge" frictionloss="0.05"/>', src)
    assert n == 8
    sim = diffgym.Simulator.from_string(src, ignore_unsupported=("option.integrator",))
    rng = np.random.default_rng(0)
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    for k in range(6):
        q, v = sim.step(q, v, sim.actuation(rng.uniform(-1, 1, len(sim.actuators))))
        assert sim.last.converged, k
        assert step_conditions(sim) < 1e-9, k


LIMIT_UNDER_TENDON = """<mujoco><option timestep="0.002"/><worldbody>
 <body name="a" pos="0 0 1"><joint name="ja" type="hinge" axis="0 1 0" range="-20 20"/>
  <inertial pos="0.2 0 0" mass="1" diaginertia="0.01 0.01 0.01"/></body>
</worldbody>
<tendon><fixed name="t" range="{lo} 0.9"><joint joint="ja" coef="{coef}"/></fixed></tendon></mujoco>"""


@pytest.mark.parametrize("lo, coef, q0", [(-0.4, 1, -0.5), (-0.9, 2, -0.5), (-0.9, -2, 0.5)])
def test_joint_limit_under_a_tendon_limit_on_its_dof(lo, coef, q0):
    """A hinge outside both its own range (-20 deg) and a fixed tendon's range on the same dof,
    its own limit violated more: the tendon's limit row, active as an equality, took the dof;
    the joint limit's Schur diagonal vanished and it was left out with zero impulse. The step
    was reported converged at the tendon's drift velocity (10 rad/s) while the joint limit's is
    15.1 (the oracle's violation 0.34 of the largest |g|). Now the tendon limit is released and
    the joint limit decides: the same step as without the tendon."""
    sim = diffgym.Simulator.from_string(LIMIT_UNDER_TENDON.format(lo=lo, coef=coef))
    ref = diffgym.Simulator.from_string(LIMIT_UNDER_TENDON.format(lo=-9, coef=coef))
    q, v = np.array([q0]), np.zeros(1)
    qr, vr = q.copy(), v.copy()
    for k in range(4):
        q, v = sim.step(q, v, np.zeros(1))
        assert sim.last.converged, k
        c = step_conditions(sim)
        assert c is None or c < 1e-9, (k, c)
        qr, vr = ref.step(qr, vr, np.zeros(1))
        np.testing.assert_allclose(v, vr, rtol=1e-12)
    assert abs(v[0]) > 14.0          # (the joint limit's drift velocity, less gravity)


def test_contact_under_a_ball_limit_on_its_direction():
    """A rod on a ball joint tilted past its cone limit, its tip sphere pressed into a wall whose
    normal's rotation axis is the limit's: the contact needs more than the limit gives. Every
    step solved by the independent oracle (this case was right before the rule above; kept as
    a guard). The limit is violated by only 0.01 rad, so its drift velocity (1 rad/s) stays below
    the wall's push-out, which ``constraint.MAX_DEPENETRATION_SPEED`` caps at 1 m/s at the tip."""
    th, lim, thw, l = 0.36, 0.35, 0.2, 0.5
    yw = l * np.sin(thw) + 0.05
    sim = diffgym.Simulator.from_string(f"""<mujoco><compiler angle="radian"/><worldbody>
 <geom name="wall" type="box" size="0.5 0.1 0.5" pos="0 {yw + 0.1} -0.4"/>
 <body name="rod"><joint name="ball" type="ball" range="0 {lim}"/>
  <geom type="capsule" fromto="0 0 0 0 0 -{l}" size="0.01" contype="0" conaffinity="0"/>
  <geom type="sphere" size="0.05" pos="0 0 -{l}"/></body></worldbody></mujoco>""")
    Q = pin.Quaternion(pin.utils.rpyToMatrix(th, 0, 0))
    q, v = np.array([Q.x, Q.y, Q.z, Q.w]), np.zeros(3)
    for k in range(3):
        q, v = sim.step(q, v, np.zeros(3))
        assert sim.last.converged, k
        c = step_conditions(sim)
        assert c is None or c < 1e-9, (k, c)
    assert v[0] < -1.5           # pushed out of the wall faster than the limit alone (-1.0)
