"""Restitution (issue 15): Newton's impact law on the normal rows of impacting contacts.

Oracles: closed forms (bounce heights e^2 h0, the velocities after a head-on impact of two
balls), central differences of the step (the gradient audit), the numpy reference of the
derivatives, and the plain-Python run (DIFFGYM_JIT=0) of the compiled kernels."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import diffgym
from diffgym.sim import derivatives as D
from diffgym.sim.model import ModelError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BALL = """<mujoco><option timestep="{dt}"/><worldbody>
<geom name="floor" type="plane" size="2 2 .1" friction="0.5"/>
<body name="ball" pos="0 0 {z}"><joint name="x" type="slide" axis="1 0 0"/>
<joint name="y" type="slide" axis="0 1 0"/><joint name="z" type="slide" axis="0 0 1"/>
<geom name="ball" type="sphere" size="0.1" mass="1" friction="0.5"/></body></worldbody>
<custom><numeric name="diffgym:restitution:ball" data="{e}"/></custom></mujoco>"""

# a spinning free ball (frictional impacts: the contact frame and point move with q)
FREE_BALL = """<mujoco><option timestep="0.01"/><worldbody>
<geom name="floor" type="plane" size="2 2 .1" friction="0.5"/>
<body name="ball" pos="0 0 0.3"><freejoint name="ball"/>
<geom name="ball" type="sphere" size="0.1" mass="1" friction="0.5"/></body></worldbody>
<custom><numeric name="diffgym:restitution:ball" data="0.7"/></custom></mujoco>"""

# two free balls colliding off-centre on a floor (every geom e = 0.8)
TWO_BALLS = """<mujoco><option timestep="0.01"/><worldbody>
<geom name="floor" type="plane" size="2 2 .1" friction="0.3"/>
<body name="a" pos="-0.4 0 0.1"><freejoint name="a"/>
<geom name="a" type="sphere" size="0.1" mass="1" friction="0.3"/></body>
<body name="b" pos="0 0.03 0.25"><freejoint name="b"/>
<geom name="b" type="sphere" size="0.1" mass="1.5" friction="0.3"/></body></worldbody>
<custom><numeric name="diffgym:restitution" data="0.8"/></custom></mujoco>"""

# two balls on a line, no gravity (a head-on impact)
HEAD_ON = """<mujoco><option timestep="0.001" gravity="0 0 0"/><worldbody>
<body name="a" pos="-0.5 0 0"><joint name="ax" type="slide" axis="1 0 0"/>
<geom name="a" type="sphere" size="0.1" mass="1" friction="0"/></body>
<body name="b" pos="0 0 0"><joint name="bx" type="slide" axis="1 0 0"/>
<geom name="b" type="sphere" size="0.1" mass="1" friction="0"/></body></worldbody>
<custom><numeric name="diffgym:restitution" data="{e}"/></custom></mujoco>"""


def _impacts(sim):
    cons = sim.cache["cons"]
    r = None if cons is None else cons.restitution
    return 0 if r is None else int(np.count_nonzero(r))


# -- loading -----------------------------------------------------------------------------------
def test_mjcf_restitution_is_read_and_mujoco_still_loads_the_file():
    xml = TWO_BALLS.replace('data="0.8"/>', 'data="0.8"/><numeric name="diffgym:restitution:a" '
                            'data="0.25"/>')
    sim = diffgym.Simulator.from_string(xml)
    e = {g.name: g.restitution for g in sim.sm.geoms}
    assert e == {"floor": 0.8, "a": 0.25, "b": 0.8}
    # a pair takes the larger coefficient
    names = [g.name for g in sim.sm.geoms]
    pr = {frozenset((names[i], names[k])): float(x)
          for (i, k), x in zip(sim.sm.pairs.tolist(), sim.sm.pair_restitution)}
    assert pr[frozenset(("floor", "a"))] == 0.8 and pr[frozenset(("a", "b"))] == 0.8
    mujoco = pytest.importorskip("mujoco")
    mujoco.MjModel.from_xml_string(xml)
    # without the extension every impact is inelastic, as before
    plain = diffgym.Simulator.from_string(xml.split("<custom>")[0] + "</mujoco>")
    assert not plain.sm.pair_restitution.any()


@pytest.mark.parametrize("numeric, msg", [
    ('<numeric name="diffgym:restitution:ball" data="1.5"/>', "must be in [0, 1]"),
    ('<numeric name="diffgym:restitution:nope" data="0.5"/>', "no geom named 'nope'"),
    ('<numeric name="diffgym:restitution" data="0.5 0.2"/>', "expected 1 numbers"),
])
def test_bad_restitution_names_the_element(numeric, msg):
    xml = BALL.format(dt=0.01, z=0.3, e=0.5).replace(
        '<numeric name="diffgym:restitution:ball" data="0.5"/>', numeric)
    with pytest.raises(ModelError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        diffgym.Simulator.from_string(xml)


def test_urdf_restitution_and_runtime_setting(tmp_path):
    urdf = tmp_path / "ball.urdf"
    urdf.write_text("""<robot name="ball"><link name="ball"><inertial><mass value="1"/>
      <inertia ixx="0.004" iyy="0.004" izz="0.004" ixy="0" ixz="0" iyz="0"/></inertial>
      <collision><geometry><sphere radius="0.1"/></geometry></collision></link></robot>""")
    sim = diffgym.Simulator.from_file(str(urdf), restitution=0.6, dt=0.005)
    assert [g.restitution for g in sim.sm.geoms] == [0.6, 0.0]
    assert sim.sm.pair_restitution.tolist() == [0.6]
    sim.set_restitution("ball_0", 0.9)
    assert sim.constraints.pair_restitution.tolist() == [0.9]
    copy = pickle.loads(pickle.dumps(sim))
    assert copy.constraints.pair_restitution.tolist() == [0.9]
    with pytest.raises(ValueError, match="restitution must be in"):
        sim.set_restitution("ball_0", -0.1)
    with pytest.raises(ValueError, match="restitution_threshold"):
        diffgym.Simulator.from_file(str(urdf), restitution_threshold=-1.0)


# -- closed forms ----------------------------------------------------------------------------
@pytest.mark.parametrize("e", [0.3, 0.5, 0.9])
def test_bounce_height_is_e_squared_h0(e):
    """A ball dropped from rest at height h0 rebounds to e^2 h0, then e^4 h0, sampled at the
    steps (a coarse bound, |apex - e^2 h0| <= 2 V dt + skin, with no tunnelling and no deep
    penetration; test_apex_sequence_is_the_closed_form bounds each flight's apex by 2.5 g dt^2)."""
    dt, h0, g, skin = 1e-3, 1.0, 9.81, 1e-3
    sim = diffgym.Simulator.from_string(BALL.format(dt=dt, z=h0 + 0.1, e=e))
    q, v = sim.q0, np.zeros(3)
    z, vz, impacts = [], [], 0
    for _ in range(int((1 + 2 * e + 2 * e ** 2) * np.sqrt(2 * h0 / g) / dt) + 50):
        q, v = sim.step(q, v, np.zeros(3))
        impacts += _impacts(sim)
        z.append(h0 + q[2])
        vz.append(v[2])
    z, vz = np.array(z), np.array(vz)
    apex = z[np.flatnonzero((vz[:-1] > 0) & (vz[1:] <= 0))]
    V = np.sqrt(2 * g * h0)
    tol = 2 * V * dt + skin
    assert impacts >= 2 and len(apex) >= 2
    assert abs(apex[0] - e ** 2 * h0) <= tol, (apex[0], e ** 2 * h0, tol)
    assert abs(apex[1] - e ** 4 * h0) <= tol + 2 * e * V * dt, (apex[1], e ** 4 * h0)
    assert z.min() > -1e-4                     # no tunnelling, no deep penetration


def _flight_apexes(sim, e, h0, dt, bounces):
    """The apex of each flight after a drop from rest at h0: the semi-implicit step is exact
    for the parabola between impacts when its velocity is read half a step back, so each
    flight's apex is its energy ``g z + (v_z - g dt / 2)^2 / 2`` over g (not a sampled step)."""
    g = 9.81
    q, v = sim.q0, np.zeros(3)
    z, vz = [], []
    n = int(sum(2 * e ** k for k in range(bounces + 1)) * np.sqrt(2 * h0 / g) / dt) + 50
    for _ in range(n):
        q, v = sim.step(q, v, np.zeros(3))
        z.append(h0 + q[2])
        vz.append(v[2])
    z, vz = np.array(z), np.array(vz)
    E = g * z + 0.5 * (vz - g * dt / 2) ** 2
    return E[np.flatnonzero((vz[:-1] > 0) & (vz[1:] <= 0))] / g, z


@pytest.mark.parametrize("dt", [1e-3, 2e-3, 5e-3])
@pytest.mark.parametrize("e", [0.5, 0.9, 1.0])
def test_apex_sequence_is_the_closed_form(e, dt):
    """Gravity in the rebound: the apexes after a drop from h0 = 1 m are e^2n h0 to 2.5 g dt^2
    (0.025 mm at dt = 1 ms). What is left is O(dt^2): the time of impact from the pre-step
    velocity and the post-impact drift at constant velocity. Without the impact law's gravity
    term (b = e u) the first apex at e = 0.9, dt = 1 ms was 7.3 mm short; with it but with the
    impact declared in the skin window above the floor, (1 - e^2) skin off (0.09 mm at e =
    0.5); now 0.0004 mm (sampled) at e = 0.9."""
    g, h0 = 9.81, 1.0
    sim = diffgym.Simulator.from_string(BALL.format(dt=dt, z=h0 + 0.1, e=e))
    apex, z = _flight_apexes(sim, e, h0, dt, 3)
    assert len(apex) >= 2
    n = min(len(apex), 3)
    want = h0 * e ** (2 * np.arange(1, n + 1))
    np.testing.assert_allclose(apex[:n], want, rtol=0, atol=2.5 * g * dt ** 2)
    assert z.min() > -1e-4


def test_elastic_bounces_keep_the_energy():
    """e = 1 at dt = 1 ms: each bounce keeps the flight's energy to 0.5 g dt^2 / h0 = 5e-6
    (relative; measured 2.1e-5 after 9 bounces, the O(dt^2) left); with b = e u it lost 0.9% a
    bounce."""
    dt, h0, g = 1e-3, 1.0, 9.81
    sim = diffgym.Simulator.from_string(BALL.format(dt=dt, z=h0 + 0.1, e=1.0))
    apex, _ = _flight_apexes(sim, 1.0, h0, dt, 10)
    assert len(apex) >= 9
    assert np.all(np.abs(apex - h0) <= 0.5 * g * dt ** 2 * np.arange(1, len(apex) + 1)), apex - h0


@pytest.mark.parametrize("e", [1.0, 0.5])
def test_head_on_impact_of_equal_balls(e):
    """Equal masses, head on: after the impact v_a = (1 - e) V / 2, v_b = (1 + e) V / 2 (e = 1:
    the velocities are exchanged), momentum conserved."""
    sim = diffgym.Simulator.from_string(HEAD_ON.format(e=e))
    V = 2.0
    q, v = sim.q0, np.array([V, 0.0])
    impacts = 0
    for _ in range(300):
        q, v = sim.step(q, v, np.zeros(2))
        impacts += _impacts(sim)
    assert impacts == 1
    np.testing.assert_allclose(v, [(1 - e) * V / 2, (1 + e) * V / 2], atol=1e-9)


def test_resting_and_slow_contacts_do_not_bounce():
    """Below the threshold (default 2 |g| dt) a contact is inelastic: a ball dropped from 1 mm
    with e = 0.9 settles and stays at rest."""
    sim = diffgym.Simulator.from_string(BALL.format(dt=0.01, z=0.101, e=0.9))
    q, v = sim.q0, np.zeros(3)
    for t in range(200):
        q, v = sim.step(q, v, np.zeros(3))
        if t > 20:
            assert _impacts(sim) == 0
    assert np.abs(v).max() < 1e-9 and abs(q[2] + 0.001) < 1e-4     # (resting on the floor)


# -- derivatives ---------------------------------------------------------------------------------
def _rollout_states(sim, v0, steps, seed=0):
    rng = np.random.default_rng(seed)
    acts = rng.normal(0, 0.5, (steps, sim.nv))
    q, v = sim.q0, np.asarray(v0, float)
    states, impact_steps = [], []
    sim.reset_warmstart()
    for t in range(steps):
        states.append((q.copy(), v.copy(), acts[t]))
        q1, v1, jac = sim.step(q, v, acts[t], jacobian=True)
        if _impacts(sim):
            impact_steps.append(t)
            ref = D.step_jacobian(sim, compiled=False)
            for k in ("dq_dq", "dq_dv", "dv_dq", "dv_dv", "dv_dtau"):
                np.testing.assert_allclose(getattr(jac, k), getattr(ref, k), rtol=1e-9, atol=1e-9)
        q, v = q1, v1
    return states, impact_steps


@pytest.mark.parametrize("xml, v0", [
    (FREE_BALL, [0.5, 0.2, -1.0, 1.0, -2.0, 0.5]),
    (TWO_BALLS, [3.0, 0.1, 0, 0, 0, 0, -0.5, 0, 0.5, 0, 3, 0]),
])
def test_step_jacobians_at_impacts(xml, v0):
    """Along a rollout of a spinning ball bouncing on a plane and of two spinning balls
    colliding (and bouncing): the compiled Jacobian equals the numpy reference at every impact
    step, and the audit against central differences passes at the impact steps and around."""
    sim = diffgym.Simulator.from_string(xml)
    states, impacts = _rollout_states(sim, v0, 40)
    assert impacts
    pick = sorted({t for i in impacts for t in (i - 1, i, i + 1) if 0 <= t < len(states)}
                  | {0, 20, 39})
    rep = diffgym.check_step_jacobians(sim, states=[states[t] for t in pick])
    assert rep.ok, str(rep)


def test_rollout_gradient_of_the_two_ball_shot():
    """The two-ball experiment (scripts/two_ball_elastic.py): d p_final / d v0 through an
    elastic impact against central differences of whole rollouts, then Gauss-Newton sends the
    yellow ball to the target (at dt = 1 ms the optimum is within 0.03 m/s of the continuous-time
    answer)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import two_ball_elastic as T
    finally:
        sys.path.pop(0)
    sim = T.make_sim(0.001)
    u = np.array([4.0, -0.6])
    p, Jp = T.final_position(sim, u, 200, jacobian=True)
    h = 1e-6
    fd = np.column_stack([(T.final_position(sim, u + h * e, 200) - T.final_position(sim, u - h * e, 200))
                          / (2 * h) for e in np.eye(2)])
    np.testing.assert_allclose(Jp, fd, rtol=1e-5, atol=1e-7)
    u_gn, p_gn, _ = T.gauss_newton(sim, [4.0, -0.1], 200)
    assert np.linalg.norm(p_gn - T.TARGET) < 1e-9
    assert np.linalg.norm(u_gn - T.event_driven()[0]) < 0.03


def test_plain_python_kernels_give_the_same_bounce():
    """DIFFGYM_JIT=0 (the kernels as plain Python): the same impact and Jacobian as compiled."""
    code = textwrap.dedent(f"""
        import numpy as np, diffgym, sys
        sim = diffgym.Simulator.from_string({FREE_BALL!r})
        q, v = sim.q0, np.array([0.5, 0.2, -1.0, 1.0, -2.0, 0.5])
        for t in range(30):
            q, v, jac = sim.step(q, v, np.zeros(6), jacobian=True)
            if sim.cache["cons"] is not None and sim.cache["cons"].restitution is not None \\
                    and sim.cache["cons"].restitution.any():
                break
        np.save(sys.argv[1], np.concatenate([q, v, jac.dv_dq.ravel(), jac.dv_dv.ravel(), [t]]))
    """)
    outs = []
    for jit in ("0", "1"):
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"diffgym_rest_{os.getpid()}_{jit}.npy")
        env = dict(os.environ, DIFFGYM_JIT=jit, DIFFGYM_QUIET_COMPILE="1")
        subprocess.run([sys.executable, "-c", code, path], check=True, env=env, timeout=600)
        outs.append(np.load(path))
        os.remove(path)
    assert outs[0][-1] < 29                      # the impact happened
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-9, atol=1e-10)


def test_stage_by_stage_path_applies_the_same_law():
    """The fused compiled call (forward._constrained_velocity) and the stage-by-stage path
    (ConstraintBuilder.assemble, taken for any other solver type) give the same bounces."""
    from diffgym.sim.solver import NCPSolver

    class Staged(NCPSolver):
        pass

    sims = [diffgym.Simulator.from_string(TWO_BALLS) for _ in range(2)]
    sims[1].solver = Staged(sims[1].solver.settings)
    state = (sims[0].q0, np.array([3.0, 0.1, 0, 0, 0, 0, -0.5, 0, 0.5, 0, 3, 0]))
    impacts = 0
    for _ in range(40):
        outs = [s.step(*state, np.zeros(12)) for s in sims]
        r = [s.cache["cons"].restitution if s.cache["cons"] is not None else None for s in sims]
        if r[0] is not None:
            np.testing.assert_array_equal(r[0], r[1])
            impacts += int(np.count_nonzero(r[0]))
        np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-9, atol=1e-10)
        state = outs[0]
    assert impacts >= 1


def test_two_ball_shot_at_the_time_of_impact():
    """The paper's setting (dt = 0.01, 20 steps): with the impact resolved at its time inside
    the step (diffgym.sim.impact_time) the continuous-time (event-driven) initial velocity sends the
    yellow ball to the target to rounding, the rollout Jacobian through the impact step agrees
    with central differences of whole rollouts, and Gauss-Newton finds that velocity."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import two_ball_elastic as T
    finally:
        sys.path.pop(0)
    sim = T.make_sim(0.01)
    u_ev, p_ev = T.event_driven()
    assert np.linalg.norm(T.final_position(sim, u_ev, 20) - T.TARGET) < 1e-12
    for u in (np.array([4.0, -0.6]), np.array([3.5, -0.3])):
        p, Jp = T.final_position(sim, u, 20, jacobian=True)
        h = 1e-6
        fd = np.column_stack([(T.final_position(sim, u + h * e, 20) - T.final_position(sim, u - h * e, 20))
                              / (2 * h) for e in np.eye(2)])
        np.testing.assert_allclose(Jp, fd, rtol=1e-6, atol=1e-8)
    u_gn, p_gn, _ = T.gauss_newton(sim, [4.0, -0.1], 20)
    assert np.linalg.norm(p_gn - T.TARGET) < 1e-9
    assert np.linalg.norm(u_gn - u_ev) < 1e-6


# three balls dropped onto each other and the floor: a scene stepped tree by tree (nv 18 > a
# group's 12, diffgym.sim.trees)
THREE_BALLS = """<mujoco model="three"><option timestep="0.01"/><worldbody>
<geom name="floor" type="plane" size="2 2 .1" friction="0.4"/>
<body name="a" pos="0 0 0.3"><freejoint name="a"/><geom name="a" type="sphere" size="0.1" mass="1" friction="0.4"/></body>
<body name="b" pos="0.05 0.02 0.6"><freejoint name="b"/><geom name="b" type="sphere" size="0.1" mass="0.7" friction="0.4"/></body>
<body name="c" pos="0.6 0 0.25"><freejoint name="c"/><geom name="c" type="sphere" size="0.1" mass="0.5" friction="0.4"/></body>
</worldbody><custom><numeric name="diffgym:restitution" data="0.7"/></custom></mujoco>"""


def test_impacts_on_a_scene_stepped_tree_by_tree(data_sizes, monkeypatch):
    """Impacts at their time of impact on a scene of several tree groups: no pinocchio Data of
    the whole model is made (the time-of-impact derivatives use the simulator's per-tree
    groups; a whole-model Data is cubic in nv), and the step Jacobians through the impacts
    agree with central differences."""
    import diffgym.sim.trees as trees_mod
    sizes = data_sizes
    sim = diffgym.Simulator.from_string(THREE_BALLS)
    assert sim._trees is not None
    v0 = np.zeros(sim.nv)
    v0[2], v0[6 + 2], v0[12] = -1.0, -2.0, 0.5
    q, v = sim.q0, v0
    states, interior = [], 0
    for _ in range(40):
        q1, v1, _ = sim.step(q, v, np.zeros(sim.nv), jacobian=True)
        if sim.cache.get("impact_pre") is not None:
            interior += 1
            states.append((q.copy(), v.copy(), np.zeros(sim.nv)))
        q, v = q1, v1
    monkeypatch.undo()
    assert interior >= 2
    assert sizes and max(sizes) <= trees_mod.MAX_GROUP_NV < sim.nv
    sim.reset_warmstart()
    rep = diffgym.check_step_jacobians(sim, states=states[:3])
    assert rep.ok, str(rep)


# a ball with restitution beside a pendulum with joint dry friction (rows of diffgym.sim.equality:
# the step takes the mixed solve)
BALL_AND_FRICTION = """<mujoco><option timestep="0.005"/><worldbody>
<geom name="floor" type="plane" size="2 2 .1" friction="0.5"/>
<body name="ball" pos="0 0 0.4"><joint name="x" type="slide" axis="1 0 0"/>
<joint name="z" type="slide" axis="0 0 1"/>
<geom name="ball" type="sphere" size="0.1" mass="1" friction="0.5"/></body>
<body name="arm" pos="1 0 1"><joint name="h" type="hinge" axis="0 1 0" {fric}/>
<geom name="arm" type="capsule" fromto="0 0 0 0.3 0 0" size="0.02" mass="0.5"/></body>
</worldbody><custom><numeric name="diffgym:restitution:ball" data="0.8"/></custom></mujoco>"""


def test_restitution_with_equality_and_friction_rows():
    """A model with rows of diffgym.sim.equality (here a pendulum's joint dry friction) applies
    Newton's impact law as the others do: the ball bounces as in the same scene without the
    friction row (the pendulum is another tree), at its time of impact, and the step Jacobians
    through the impact agree with central differences."""
    a = diffgym.Simulator.from_string(BALL_AND_FRICTION.format(fric='frictionloss="0.3"'))
    b = diffgym.Simulator.from_string(BALL_AND_FRICTION.format(fric=""))
    assert a._extra is not None and b._extra is None
    qa = qb = a.q0
    va = vb = np.array([0.3, 0.0, 0.0])
    impacts, states = 0, []
    for _ in range(250):
        sa = (qa.copy(), va.copy(), np.zeros(3))
        qa, va = a.step(qa, va, np.zeros(3))
        qb, vb = b.step(qb, vb, np.zeros(3))
        if _impacts(a):
            impacts += 1
            states.append(sa)
        assert a.last.converged
        np.testing.assert_allclose(qa[:2], qb[:2], rtol=0, atol=1e-9)
        np.testing.assert_allclose(va[:2], vb[:2], rtol=0, atol=1e-9)
    assert impacts >= 2 and "frictionloss h" in a.last.constraint_labels
    a.reset_warmstart()
    rep = diffgym.check_step_jacobians(a, states=states[:2])
    assert rep.ok, str(rep)


# a box dropped tilted onto an edge (every geom e = 0.8): impacts of one to four corners, the
# box spinning off the edge
BOX_EDGE = """<mujoco><option timestep="0.01"/><worldbody>
<geom name="floor" type="plane" size="2 2 .1" friction="0.6"/>
<body name="box" pos="0 0 0.35" euler="35 20 0"><freejoint name="box"/>
<geom name="box" type="box" size="0.1 0.07 0.05" mass="1" friction="0.6"/></body></worldbody>
<custom><numeric name="diffgym:restitution" data="0.8"/></custom></mujoco>"""


@pytest.mark.parametrize("xml, v0, seed", [
    (FREE_BALL, [0.5, 0.2, -1.0, 1.0, -2.0, 0.5], 1),
    (BOX_EDGE, [0.3, 0.0, -1.5, 2.0, -1.0, 0.5], 2),
])
def test_jacobians_along_bouncing_rollouts(xml, v0, seed):
    """Every step of a random rollout of a bouncing ball and of a box bouncing on its edges and
    corners, with restitution and random joint forces: the step Jacobians (with the impact
    law's gravity term, its time of impact chained through the impact passes) agree with
    central differences, or one-sided differences show a mode switch inside the stencil."""
    sim = diffgym.Simulator.from_string(xml)
    rng = np.random.default_rng(seed)
    q, v = sim.q0, np.asarray(v0, float)
    states, impacts, passes = [], 0, 0
    for _ in range(60):
        tau = rng.normal(0, 0.3, sim.nv)
        states.append((q.copy(), v.copy(), tau))
        q, v = sim.step(q, v, tau)
        impacts += _impacts(sim)
        passes += sim.cache.get("impact_pre") is not None
    assert impacts >= 2 and passes >= 2, (impacts, passes)
    sim.reset_warmstart()
    rep = diffgym.check_step_jacobians(sim, states=states)
    assert rep.ok, str(rep)


def test_closing_short_of_contact_then_impact():
    """A contact closing fast whose free motion ends the step within the skin but short of
    contact is not an impact yet (b = d / dt: no inelastic stop up to the skin above the
    floor); the impact comes the next step, at its time. Rollouts of a spinning ball dropped
    from random heights: the ball never stops short of the floor, and the Jacobians of the
    closing steps and of the impacts after them agree with central differences."""
    sim = diffgym.Simulator.from_string(FREE_BALL)
    rng = np.random.default_rng(3)
    states = []
    for z0 in rng.uniform(0.2, 0.45, 60):
        q = sim.q0.copy()
        q[2] = z0
        v = np.array([0.5, 0.2, -1.0, 1.0, -2.0, 0.5])
        sim.reset_warmstart()
        for _ in range(40):
            s0 = (q.copy(), v.copy(), np.zeros(6))
            q, v = sim.step(q, v, np.zeros(6))
            c = sim.cache["cons"]
            t = None if c is None else c.restitution_time
            if t is not None and (t < 0).any():
                states.append(s0)
                assert v[2] < -1.0                 # (not stopped: closing at the free speed)
                s1 = (q.copy(), v.copy(), np.zeros(6))
                q, v = sim.step(q, v, np.zeros(6))
                assert _impacts(sim) and v[2] > 1.0
                states.append(s1)
            if v[2] > 0:
                break
    assert len(states) >= 4, len(states)
    sim.reset_warmstart()
    rep = diffgym.check_step_jacobians(sim, states=states)
    assert rep.ok, str(rep)


def _two_ball_script():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import two_ball_elastic as T
    finally:
        sys.path.pop(0)
    return T


def test_two_ball_gradient_descent_reaches_the_target():
    """The paper's protocol (1000 epochs of gradient descent, lr 0.1, from (4, -0.1) at dt =
    0.01; the paper's CCD engine ends 1.56e-3 m from the target, Nimble / Brax / DiffTaichi
    2.5e-2 / 5.0e-2 / 1.6e-2): the loss falls at every epoch (a final position continuous in
    the initial velocity: a jump sends it back up, as the impact declared at a drifted
    configuration short of contact did) and the yellow ball ends far below the paper's error."""
    T = _two_ball_script()
    sim = T.make_sim(0.01)
    u, p, hist = T.gradient_descent(sim, [4.0, -0.1], 20, 1000, 0.1)
    assert np.all(np.diff(hist) <= 0.0), np.flatnonzero(np.diff(hist) > 0.0)
    err = float(np.linalg.norm(p - T.TARGET))
    assert err < 1.56e-3 * 1e-3, err
    assert np.linalg.norm(u - T.event_driven()[0]) < 1e-6


def test_impact_not_reached_in_the_time_left_of_the_step():
    """The first drift's time of impact (d / -u) falls short on a curved pair; when the contact
    is then not reached in what is left of the step (initial velocities found along the
    gradient-descent path at dt = 0.01: the estimate lands 1e-6 s before the step's end, 1.9 mm
    short of contact), the impact comes the next step at its time: the final position is
    continuous across the velocity where the estimate crosses the step's end (it jumped by
    9 mm, the impact declared at the drifted configuration) and its rollout Jacobian agrees
    with central differences there."""
    T = _two_ball_script()
    sim = T.make_sim(0.01)
    ua, ub = np.array([3.91050854, -0.66020887]), np.array([3.91061351, -0.66024756])
    pa, Ja = T.final_position(sim, ua, 20, jacobian=True)
    pb, Jb = T.final_position(sim, ub, 20, jacobian=True)
    np.testing.assert_allclose(pb - pa, Ja @ (ub - ua), atol=1e-8)
    np.testing.assert_allclose(Ja, Jb, atol=1e-4)
    h = 1e-7
    fd = np.column_stack([(T.final_position(sim, ub + h * e, 20) - T.final_position(sim, ub - h * e, 20))
                          / (2 * h) for e in np.eye(2)])
    np.testing.assert_allclose(Jb, fd, rtol=1e-5, atol=1e-7)
