"""URDF joint elements (issue 15): ``<dynamics friction>`` as the dry-friction rows of MJCF
``frictionloss``, ``<dynamics damping>`` and ``<mimic>`` as a bilateral joint-coupling row.

Oracles: closed forms of sliders on prismatic joints (no gravity along the axes), central
differences of the step (the gradient audit)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import diffgym
from mixed_oracle import step_conditions
from diffgym.sim.model import ModelError
from diffgym.sim.unsupported import UnsupportedIgnoredWarning

LINK = """<link name="{n}"><inertial><mass value="{m}"/><inertia ixx="0.01" iyy="0.01" izz="0.01"
 ixy="0" ixz="0" iyz="0"/></inertial></link>"""


def _robot(tmp_path, joints: str, links=(("base", 1.0), ("a", 2.0), ("b", 0.5))) -> str:
    text = ('<robot name="r">' + "".join(LINK.format(n=n, m=m) for n, m in links) + joints
            + "</robot>")
    p = tmp_path / "r.urdf"
    p.write_text(text)
    return str(p)


def _slider(name, child, axis, extra="", jtype="prismatic", parent="base"):
    lim = '<limit lower="-10" upper="10" effort="100" velocity="10"/>' if jtype != "continuous" else \
        '<limit effort="100" velocity="10"/>'
    return (f'<joint name="{name}" type="{jtype}"><parent link="{parent}"/><child link="{child}"/>'
            f'<axis xyz="{axis}"/>{lim}{extra}</joint>')


def _sim(path, **kw):
    return diffgym.Simulator.from_file(path, floating_base=False, ground=False, dt=0.01, **kw)


def test_urdf_joint_friction_sticks_below_and_slides_above_the_bound(tmp_path):
    """A 2 kg slider (x, horizontal) with 3 N of dry friction: a 2.5 N push leaves it at rest;
    a 5 N push accelerates it at (5 - 3) / 2 m/s^2; launched at 0.5 m/s with no push it
    decelerates at 3 / 2 m/s^2 and stops exactly (the sticking row holds it)."""
    path = _robot(tmp_path, _slider("x", "a", "1 0 0", '<dynamics friction="3"/>'),
                  links=(("base", 1.0), ("a", 2.0)))
    sim = _sim(path)
    assert sim.sm.constraint_spec.frictionloss == {0: 3.0}
    q, v = sim.q0, np.zeros(1)
    for _ in range(20):
        q, v = sim.step(q, v, np.array([2.5]))
    assert abs(v[0]) < 1e-12 and abs(q[0]) < 1e-12
    q, v = sim.q0, np.zeros(1)
    for k in range(1, 21):
        q, v = sim.step(q, v, np.array([5.0]))
        assert abs(v[0] - k * 0.01 * 1.0) < 1e-10
    q, v = sim.q0, np.array([0.5])
    vs = []
    for _ in range(60):
        q, v = sim.step(q, v, np.zeros(1))
        vs.append(v[0])
    vs = np.array(vs)
    np.testing.assert_allclose(vs[:33], 0.5 - 1.5 * 0.01 * np.arange(1, 34), atol=1e-10)
    assert np.abs(vs[34:]).max() < 1e-12                  # stopped and stays
    # leaving it out is explicit and warned
    with pytest.warns(UnsupportedIgnoredWarning, match=r"friction=3.*joint.frictionloss"):
        off = _sim(path, ignore_unsupported=("joint.frictionloss",))
    assert off._extra is None
    q1, v1 = off.step(off.q0, np.zeros(1), np.array([2.5]))
    assert abs(v1[0] - 0.01 * 1.25) < 1e-12


def test_urdf_mimic_is_a_joint_coupling(tmp_path):
    """Slider b (y, 0.5 kg) mimics slider a (x, 2 kg): q_b = 2 q_a + 0.1. A force F on a moves the
    pair as one body of inertia m_a + 4 m_b: v_a after k steps is k dt F / 4, q_b stays
    2 q_a + 0.1; the step Jacobians pass the audit at visited states."""
    joints = (_slider("ja", "a", "1 0 0")
              + _slider("jb", "b", "0 1 0", '<mimic joint="ja" multiplier="2" offset="0.1"/>'))
    sim = _sim(_robot(tmp_path, joints))
    (c,) = sim.sm.constraint_spec.couplings
    assert (c.joint1, c.joint2) == ("jb", "ja")
    q, v = np.array([0.0, 0.1]), np.zeros(2)
    states = []
    for k in range(1, 31):
        tau = np.array([1.5, 0.0])
        states.append((q.copy(), v.copy(), tau))
        q, v = sim.step(q, v, tau)
        assert abs(v[0] - k * 0.01 * 1.5 / 4.0) < 1e-10
        assert abs(v[1] - 2 * v[0]) < 1e-10 and abs(q[1] - 2 * q[0] - 0.1) < 1e-10
    rep = diffgym.check_step_jacobians(sim, states=states[::7])
    assert rep.ok, str(rep)


def test_urdf_mimic_errors_name_the_joint(tmp_path):
    bad = _slider("ja", "a", "1 0 0") + _slider("jb", "b", "0 1 0", '<mimic joint="nope"/>')
    with pytest.raises(ModelError, match=r"<joint name='jb'> <mimic joint='nope'>: no joint named"):
        _sim(_robot(tmp_path, bad))
    cont = (_slider("ja", "a", "0 0 1", jtype="continuous")
            + _slider("jb", "b", "0 1 0", '<mimic joint="ja"/>'))
    with pytest.raises(ModelError, match=r"joint.mimic_continuous"):
        _sim(_robot(tmp_path, cont))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsupportedIgnoredWarning)
        sim = _sim(_robot(tmp_path, cont), ignore_unsupported=("joint.mimic_continuous",))
    assert not sim.sm.constraint_spec.couplings


# -- implicit joint damping ------------------------------------------------------------------------
@pytest.mark.parametrize("d", [0.5, 400.0])
def test_urdf_damping_is_implicit(tmp_path, d):
    """A 2 kg slider with URDF ``<dynamics damping=d>``, launched at 1 m/s, no force: the implicit
    velocity update gives v_k = (m / (m + dt d))^k exactly; at dt d / m = 2 (d = 400), where the
    explicit update would oscillate without decaying, it decays monotonically. The file's own
    model keeps its armature (0); the stepped model carries dt d."""
    path = _robot(tmp_path, _slider("x", "a", "1 0 0", f'<dynamics damping="{d}"/>'),
                  links=(("base", 1.0), ("a", 2.0)))
    sim = _sim(path)
    assert sim.sm.model.armature[0] == 0.0 and sim.model.armature[0] == pytest.approx(0.01 * d)
    q, v = sim.q0, np.array([1.0])
    r = 2.0 / (2.0 + 0.01 * d)
    for k in range(1, 11):
        q, v = sim.step(q, v, np.zeros(1))
        assert v[0] == pytest.approx(r ** k, rel=1e-12, abs=1e-300)


def test_implicit_damping_step_jacobians():
    """The step Jacobians of a damped, sprung hinge (and of damped hinges in contact: the
    hopper) against central differences at visited states."""
    xml = """<mujoco><option timestep="0.02"/><worldbody>
<body name="p"><joint name="hinge" type="hinge" axis="0 1 0" stiffness="2" damping="3"/>
<geom name="rod" type="capsule" fromto="0 0 0 0 0 -0.5" size="0.02" mass="1"/>
<body name="p2" pos="0 0 -0.5"><joint name="h2" type="hinge" axis="0 1 0" damping="0.5"/>
<geom name="rod2" type="capsule" fromto="0 0 0 0 0 -0.5" size="0.02" mass="0.5"/></body></body>
</worldbody></mujoco>"""
    sim = diffgym.Simulator.from_string(xml)
    q, v = np.array([0.4, -0.3]), np.array([1.0, 2.0])
    states = []
    for t in range(12):
        tau = np.array([0.3, -0.1])
        states.append((q.copy(), v.copy(), tau))
        q, v = sim.step(q, v, tau)
    rep = diffgym.check_step_jacobians(sim, states=states[::4])
    assert rep.ok, str(rep)


def test_mjcf_frictionloss_can_be_left_out_by_name():
    """``ignore_unsupported=("joint.frictionloss",)`` drops MJCF frictionloss too (warned, with
    the file and line), as it drops URDF <dynamics friction>."""
    xml = """<mujoco><option timestep="0.01" gravity="0 0 0"/><worldbody>
<body name="a"><joint name="x" type="slide" axis="1 0 0" frictionloss="3"/>
<geom type="sphere" size="0.1" mass="2"/></body></worldbody></mujoco>"""
    assert diffgym.Simulator.from_string(xml).sm.constraint_spec.frictionloss == {0: 3.0}
    with pytest.warns(UnsupportedIgnoredWarning, match=r"<string>:2: <joint name='x'> frictionloss='3'"):
        sim = diffgym.Simulator.from_string(xml, ignore_unsupported=("joint.frictionloss",))
    assert sim._extra is None
    with pytest.raises(ValueError, match="unknown name 'joint.friction'"):
        diffgym.Simulator.from_string(xml, ignore_unsupported=("joint.friction",))


def test_go1_with_its_joint_friction_has_exact_step_jacobians():
    """The Go1 URDF with its 0.2 N m joint friction simulated (DiffGo1-v0's
    ``sim_options={"ignore_unsupported": ()}``), held by a PD while it lands: the step Jacobians
    against central differences at visited states (sliding and sticking friction rows,
    contacts)."""
    from diffgym.resources import asset_path
    sim = diffgym.Simulator.from_file(asset_path("go1.urdf"), dt=0.005)
    assert len(sim.sm.constraint_spec.frictionloss) == 12
    q, v = sim.q0, np.zeros(sim.nv)
    q[2] += 0.02
    states = []
    for t in range(40):
        tau = np.zeros(sim.nv)
        tau[6:] = 20.0 * (sim.q0[7:] - q[7:]) - 0.5 * v[6:]
        if t in (10, 39):
            states.append((q.copy(), v.copy(), tau.copy()))
        q, v = sim.step(q, v, tau)
    rep = diffgym.check_step_jacobians(sim, states=states)
    assert rep.ok, str(rep)


@pytest.mark.parametrize("prox", [True, False])
def test_go1_joint_friction_mixed_solve_satisfies_the_problem(monkeypatch, prox):
    """The mixed solve of the friction rows (diffgym.sim.equality_kernels, its one
    implementation) on the Go1 with its URDF joint friction landing under a PD with random
    torques: every step's solution satisfies the problem's conditions checked from their
    definitions (tests/mixed_oracle.py), the rows stick and slide, some rounds' reduced problems
    defeat stage 1 (then the mixed proximal solve, ``mixed_prox``, solves the step; with it
    failing, ``prox`` False, the later solver stages do: the kernel's resume path), the run with
    ``SolverSettings(compiled=False)`` (reduced NCPs through NCPSolver.solve) gives the same
    trajectory, and the step Jacobians agree at visited states."""
    from diffgym.sim import equality_kernels as ek
    from diffgym.sim.equality import ExtraRows
    from diffgym.resources import asset_path
    if not prox:
        def failing(G, g, nc, nl, mu, kind, bound, xmode, *a):
            m = G.shape[0]
            return (False, np.zeros(m), np.zeros(m), np.zeros(nc, np.int64),
                    np.zeros(nl, bool), xmode, 0, np.inf)
        monkeypatch.setattr(ek, "mixed_prox", failing)
    resumed = []
    proxed = []
    orig = ExtraRows._solve_reduced

    def counted(*a, **k):
        resumed.append(1)
        return orig(*a, **k)
    sims = [diffgym.Simulator.from_file(asset_path("go1.urdf"), dt=0.005) for _ in range(2)]
    sims[1].solver.settings.compiled = False
    rng = np.random.default_rng(3)
    q0, v0 = sims[0].q0, np.zeros(sims[0].nv)
    q0[2] += 0.02
    traj = [[], []]
    modes = set()
    taus = []
    for t in range(60):
        tau = np.zeros(18)
        tau[6:] = 20.0 * (sims[0].q0[7:] - q0[7:]) - 0.5 * v0[6:] + rng.normal(0.0, 2.0, 12)
        taus.append(tau)
        traj[0].append((q0.copy(), v0.copy()))
        with monkeypatch.context() as mp:
            mp.setattr(ExtraRows, "_solve_reduced", staticmethod(counted))
            q0, v0 = sims[0].step(q0, v0, tau)
        modes.update(sims[0].last.constraint_modes)
        proxed.append(sims[0].last.method == "mixedprox+rows")
        assert sims[0].last.converged and step_conditions(sims[0]) < 1e-9
    q1, v1 = traj[0][0]
    for t in range(60):
        traj[1].append((q1.copy(), v1.copy()))
        q1, v1 = sims[1].step(q1, v1, taus[t])
        assert sims[1].last.converged and step_conditions(sims[1]) < 1e-9
    for (qa, va), (qb, vb) in zip(traj[0], traj[1]):
        assert np.allclose(qa, qb, rtol=0, atol=1e-9) and np.allclose(va, vb, rtol=0, atol=1e-7)
    assert {"sticking", "sliding"} <= modes
    assert (any(proxed) and not resumed) if prox else (resumed and not any(proxed))
    for t in (15, 45):
        q, v = traj[0][t]
        ja = sims[0].step(q, v, taus[t], jacobian=True)[2]
        jb = sims[1].step(q, v, taus[t], jacobian=True)[2]
        for name in ("dq_dq", "dq_dv", "dv_dq", "dv_dv", "dv_dtau"):
            A, B = getattr(ja, name), getattr(jb, name)
            assert np.allclose(A, B, rtol=1e-6, atol=1e-6 * max(1.0, np.abs(B).max())), name


def test_go1_joint_friction_rollout_converges_every_step():
    """250 steps of the Go1 with its URDF joint friction landing under a PD with random torques
    (dt 5 ms): every step's mixed solve converges and satisfies the problem's conditions. (At
    t = 244 the previous step's friction modes led the rounds into a cycle: 59 rounds, not
    converged, before the rounds restarted once from the cold modes.)"""
    from diffgym.resources import asset_path
    sim = diffgym.Simulator.from_file(asset_path("go1.urdf"), dt=0.005)
    rng = np.random.default_rng(0)
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    q[2] += 0.02
    worst = 0.0
    for t in range(250):
        tau = np.zeros(18)
        tau[6:] = 20.0 * (sim.q0[7:] - q[7:]) - 0.5 * v[6:] + rng.normal(0.0, 2.0, 12)
        q, v = sim.step(q, v, tau)
        assert sim.last.converged, (t, sim.last.method)
        worst = max(worst, step_conditions(sim))
    assert worst < 1e-9
