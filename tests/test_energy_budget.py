"""The trajectory energy check (forward.Simulator._energy_budget), the depenetration speed cap
(SolverSettings.max_depenetration_speed, default constraint.MAX_DEPENETRATION_SPEED) and the
finiteness check before LAPACK (issue 16)."""
import warnings

import numpy as np
import pytest

import diffgym
from diffgym.sim.constraint import MAX_DEPENETRATION_SPEED
from diffgym.sim.forward import SimulationError

SPIN = """<mujoco><option timestep="{dt}" gravity="0 0 0"/><worldbody>
<body name="e" pos="0 0 1"><freejoint name="e"/><geom name="eg" type="ellipsoid" size="0.2 0.1 0.02"/></body>
</worldbody></mujoco>"""


def _spin(dt, steps):
    sim = diffgym.Simulator.from_string(SPIN.format(dt=dt))
    q, v = sim.q0, np.zeros(sim.nv)
    v[3:6] = [6.0, 0.5, 6.0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(steps):
            q, v = sim.step(q, v, np.zeros(sim.nv))
            assert sim.last.converged, k          # (the one-step 1.5x check never fires)
    return sim


def test_slow_energy_growth_of_a_free_spin_raises():
    """A flat ellipsoid spinning about a non-principal axis at dt = 0.03 s: the explicit
    gyroscopic term pumps energy in a few percent a step, below the one-step check's 1.5x jump
    (every step converged=True). The trajectory's check sees the energy double with no work
    done and raises SimulationError naming the trajectory."""
    with pytest.raises(SimulationError, match="mechanical energy grew") as exc:
        _spin(0.03, 200)
    assert "no contact" in str(exc.value) and "since step 1" in str(exc.value)


def test_energy_check_is_quiet_where_the_spin_is_resolved():
    """The same spin at 1 ms (the energy drifts down by a few percent) and a box dropped on the
    floor (contact stabilization, gravity work) raise nothing."""
    _spin(0.001, 300)
    sim = diffgym.Simulator.from_string(
        '<mujoco><option timestep="0.01"/><worldbody><geom name="floor" type="plane" size="5 5 0.1"/>'
        '<body name="b" pos="0 0 0.3" euler="10 20 30"><freejoint name="b"/>'
        '<geom name="bg" type="box" size="0.1 0.05 0.02"/></body></worldbody></mujoco>')
    q, v = sim.q0, np.zeros(sim.nv)
    v[:3] = [0.5, 0.0, 0.0]
    for _ in range(150):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    assert np.linalg.norm(v) < 1e-3


def test_a_new_trajectory_restarts_the_budget():
    """A state that is not the last step's output (a reset) starts a new budget: energy put in
    by the caller between steps is not growth."""
    sim = diffgym.Simulator.from_string(SPIN.format(dt=0.01))
    q, v = sim.q0, np.zeros(sim.nv)
    v[3:6] = [1.0, 0.0, 0.5]
    for k in range(40):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        v = v * 1.1 if k % 5 == 4 else v          # (the caller kicks it: new trajectories)
    assert sim._ebudget["n0"] == 36 and sim._ebudget["n"] == 5   # (kicked after step 35)
    for _ in range(3):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    assert sim._ebudget["n0"] == 41 and sim._ebudget["n"] == 3   # (kicked after step 40)


def test_lapack_never_sees_a_non_finite_problem(capfd):
    """A contact problem with an inf entry: the later stages refuse it with LinAlgError (the
    step turns it into SimulationError) before LAPACK, which printed "DLASCL parameter number
    4 had an illegal value" to stderr first."""
    from diffgym.sim.solver import NCPSolver
    G = np.eye(6)
    G[0, 1] = G[1, 0] = 0.1
    G[2, 2] = np.inf
    g = np.array([0.1, 0.0, -1.0, 0.0, 0.2, -0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(np.linalg.LinAlgError, match="non-finite"):
            NCPSolver()._solve(G, g, 2, np.array([0.5, 0.5]), None, None, stage1=False)
    assert "DLASCL" not in capfd.readouterr().err


def test_talos_deep_start_comes_out_at_a_bounded_speed():
    """example-robot-data's talos_reduced at zero torque from its reference pose + 5 cm, which
    puts the feet about 1 m into the ground: the Baumgarte push-out (0.2 * 1 m / 2 ms = 100 m/s
    a contact) launched it at 606 m/s on its first step, then its free flight diverged. With
    the depenetration cap it rises out of the ground at about MAX_DEPENETRATION_SPEED."""
    from diffgym.resources import example_robot_data_dir
    path = example_robot_data_dir() + "/robots/talos_data/robots/talos_reduced.urdf"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = diffgym.Simulator.from_file(path, ignore_unsupported=("joint.frictionloss",))
        q, v = sim.q0.copy(), np.zeros(sim.nv)
        q[2] += 0.05
        for _ in range(3):
            q, v = sim.step(q, v, np.zeros(sim.nv))
            assert sim.last.converged
            assert -np.min(sim.last.contact_distances) > 0.9      # (still deep in the ground)
            assert np.linalg.norm(v) < 2.0 * MAX_DEPENETRATION_SPEED, np.linalg.norm(v)
            assert 0.5 * MAX_DEPENETRATION_SPEED < v[2] <= 1.01 * MAX_DEPENETRATION_SPEED, v[2]


def test_capped_push_out_jacobian_matches_central_differences():
    """A tilted box 2 cm deep in the floor at 2 ms: every corner's push-out ``erp d / dt`` (2 to
    2.6 m/s) is capped at MAX_DEPENETRATION_SPEED, so the offsets do not depend on the depth
    (gain 0 in both Jacobian routes). The step Jacobian matches central differences (with the
    Baumgarte gain ``erp / dt`` it would not: dv/dq off by 100 / s), and the two routes agree."""
    from diffgym.sim import derivatives as D
    from test_gradients import assert_jacobian_matches
    sim = diffgym.Simulator.from_string(
        '<mujoco><option timestep="0.002"/><worldbody><geom type="plane" size="5 5 .1" friction="0.5"/>'
        '<body name="box" pos="0 0 0.08" euler="2 1.5 0"><freejoint/>'
        '<geom type="box" size="0.1 0.15 0.1" friction="0.5"/></body></worldbody></mujoco>')
    q, v, tau = sim.q0, np.zeros(sim.nv), np.zeros(sim.nv)
    jac = assert_jacobian_matches(sim, q, v, tau)
    d = sim.last.contact_distances
    assert len(d) == 4 and np.all(0.2 * d / sim.dt < -MAX_DEPENETRATION_SPEED), d
    assert abs(sim.cache["v1"][2] - MAX_DEPENETRATION_SPEED) < 0.05
    ref = D.step_jacobian(sim, compiled=False)
    for k in ("dv_dq", "dv_dv", "dq_dq"):
        assert np.abs(getattr(jac, k) - getattr(ref, k)).max() <= 1e-9 * (1 + np.abs(getattr(ref, k)).max())


DEEP_BOX = ('<mujoco><option timestep="0.002"/><worldbody><geom type="plane" size="5 5 .1" '
            'friction="0.5"/><body name="box" pos="0 0 0.08" euler="2 1.5 0"><freejoint/>'
            '<geom type="box" size="0.1 0.15 0.1" friction="0.5"/></body></worldbody></mujoco>')


@pytest.mark.parametrize("cap, capped", [(0.5, True), (3.0, False), (float("inf"), False)])
def test_depenetration_speed_is_a_per_simulator_setting(cap, capped):
    """The tilted box 1.2 to 2.8 cm deep at 2 ms (push-outs 1.2 to 2.8 m/s) with the cap set on one
    simulator's settings: capped at 0.5 m/s it rises at 0.5 m/s; at 3 m/s or with no cap the
    Baumgarte offsets act uncapped (their gain erp / dt in the Jacobian, which central
    differences confirm, in both routes). The compiled and stage-by-stage steps agree, and a
    second simulator keeps the default."""
    from diffgym.sim import derivatives as D
    from test_gradients import assert_jacobian_matches
    sim = diffgym.Simulator.from_string(DEEP_BOX)
    other = diffgym.Simulator.from_string(DEEP_BOX)
    sim.solver.settings.max_depenetration_speed = cap
    q, v, tau = sim.q0, np.zeros(sim.nv), np.zeros(sim.nv)
    jac = assert_jacobian_matches(sim, q, v, tau)
    v1 = sim.cache["v1"].copy()
    d = sim.last.contact_distances
    assert len(d) == 4 and np.all(0.2 * d / sim.dt < -1.1), d
    if capped:
        assert abs(v1[2] - cap) < 0.05 * cap, v1
    else:
        assert v1[2] > 1.1, v1
    ref = D.step_jacobian(sim, compiled=False)
    for k in ("dv_dq", "dv_dv", "dq_dq"):
        assert np.abs(getattr(jac, k) - getattr(ref, k)).max() <= 1e-9 * (1 + np.abs(getattr(ref, k)).max())
    gain = np.abs(jac.dv_dq[2, 2])            # d v_z / d z: ~0 capped, erp / dt-like uncapped
    assert (gain < 1.0) if capped else (gain > 10.0), gain
    sim.solver.settings.compiled = False
    assert np.abs(sim.step(q, v, tau)[1] - v1).max() < 1e-9
    q1, v2 = other.step(q, v, tau)
    assert abs(v2[2] - MAX_DEPENETRATION_SPEED) < 0.05
    assert other.solver.settings.max_depenetration_speed == MAX_DEPENETRATION_SPEED


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), "1", True, None])
def test_a_bad_depenetration_speed_is_refused_by_name(bad):
    from diffgym.sim.solver import SolverSettings
    with pytest.raises(ValueError, match=r"max_depenetration_speed .*got " + repr(bad)[:3]):
        SolverSettings(max_depenetration_speed=bad)
    sim = diffgym.Simulator.from_string(DEEP_BOX)
    with pytest.raises(ValueError, match="max_depenetration_speed"):
        sim.solver.settings.max_depenetration_speed = bad
    assert sim.solver.settings.max_depenetration_speed == MAX_DEPENETRATION_SPEED
