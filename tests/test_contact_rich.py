"""Contact-rich scenes: random drops, redundant contacts (a box on its face, a stack), ellipsoid
contact, the checks of a step (independent residual check, errors with context) and the
validation of settings and inertia."""
import warnings

import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym import bench_drops
from diffgym.sim.forward import SimulationError, StabilityWarning
from diffgym.sim.model import ModelError
from diffgym.sim.solver import NCPSolver, SolverResult

# the stages after the active-set Newton that are slow (thousands of iterations in Python or
# pinocchio's ADMM); "prox+newton" is the regularized active-set Newton (a few Newton solves)
SLOW_STAGES = ("pinadmm+newton", "ssn+newton", "admm+newton", "pgs+newton", "admm", "pgs")


def _run_steps(sim, q, v, n, tau=None):
    """n steps; returns (q, v, list of (converged, method, iterations, min distance))."""
    tau = np.zeros(sim.nv) if tau is None else tau
    log = []
    for _ in range(n):
        q, v = sim.step(q, v, tau)
        d = sim.last.contact_distances
        log.append((sim.last.converged, sim.last.method, sim.last.iterations,
                    float(d.min()) if len(d) else np.inf))
    return q, v, log


# -- random drops -------------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["box", "capsule", "sphere"])
def test_random_drops_fail_nothing(shape):
    """Random drops after the single-level contact paper (bench_drops: random size, pose and
    velocity, 10-100 Hz, 1.5 s): no non-converged step, no energy gain, nothing through the
    floor, penetration under 1 mm at >= 30 Hz (1 cm below), no exception."""
    idx = [i for i in range(200) if bench_drops.SHAPES[i % len(bench_drops.SHAPES)] == shape][:8]
    results = [bench_drops.run_scene(bench_drops.make_scene(7, i)) for i in idx]
    failed = [(r.scene.index, r.scene.rate, sorted(r.fails), r.max_pen, r.error)
              for r in results if r.fails]
    assert not failed, failed
    assert {r.scene.rate for r in results} == set(bench_drops.RATES)


def test_random_drops_of_curved_shapes_and_pairs_converge_and_lose_energy():
    """Cylinders, ellipsoids and pairs of primitives: every step converges (and passes the
    independent check), the energy never grows, no exception. (Their penetration is not yet
    within the benchmark's bounds at every rate: an ellipsoid's support point, a cylinder cap's
    lowest rim point and a free capsule's ends on a plane carry the rest of the step's rotation
    (support_drift), but a point sliding across a tumbling body's face, a cylinder's single
    point on a box edge and box-box feature switches still dip; see bench_drops.)"""
    idx = [i for i in range(60) if bench_drops.SHAPES[i % 6] in ("cylinder", "ellipsoid", "pair")][:15]
    for i in idx:
        r = bench_drops.run_scene(bench_drops.make_scene(7, i))
        assert not ({"nonconv", "energy", "exception"} & r.fails), (i, sorted(r.fails), r.error)


# -- redundant contacts -------------------------------------------------------------------
BOX = """<mujoco><option timestep="{dt}"/><worldbody>
<geom name="floor" type="plane" size="5 5 .1" friction="{mu}"/>
{bodies}</worldbody></mujoco>"""


def _box_body(name, z, half, euler="0 0 0", x=0.0):
    return (f'<body name="{name}" pos="{x} 0 {z}" euler="{euler}"><freejoint name="{name}"/>'
            f'<geom name="{name}_g" type="box" size="{half[0]} {half[1]} {half[2]}" '
            f'friction="0.8"/></body>')


@pytest.mark.parametrize("dt", [0.01, 0.033])
def test_box_on_its_face_converges_every_step(dt):
    """A box pushed along its face (4 coplanar contact points: impulses not unique) slides
    to rest: every step converges at the stated tolerance and no slow fallback stage runs."""
    sim = diffgym.Simulator.from_string(BOX.format(dt=dt, mu=0.5, bodies=_box_body(
        "b", 0.104, (0.2, 0.15, 0.1), euler="0.5 -0.3 0")))
    q, v = sim.q0, np.zeros(sim.nv)
    v[0], v[1], v[5] = 1.5, -0.5, 2.0         # sliding and spinning on its face
    q, v, log = _run_steps(sim, q, v, int(2.0 / dt))
    assert all(c for c, _, _, _ in log), [m for c, m, _, _ in log if not c]
    assert not [m for _, m, _, _ in log if m in SLOW_STAGES]
    assert max(it for _, _, it, _ in log) < 200
    assert np.abs(v).max() < 1e-6                      # at rest
    assert min(d for *_, d in log) > -1e-3
    assert sim.last.num_contacts == 4 and -sim.last.contact_distances.min() < 1e-4


def test_box_stack_converges_every_step():
    """Four boxes stacked (face on face, 4 coplanar points per pair): every step converges
    without a slow stage, and the stack stands still."""
    h = 0.05
    bodies = "".join(_box_body(f"b{i}", h + 2 * h * i + 1e-4 * (i + 1), (0.15, 0.1, h),
                               x=0.01 * (i % 2)) for i in range(4))
    sim = diffgym.Simulator.from_string(BOX.format(dt=0.01, mu=0.8, bodies=bodies))
    q0 = sim.q0.copy()
    q, v, log = _run_steps(sim, sim.q0, np.zeros(sim.nv), 150)
    assert all(c for c, _, _, _ in log)
    assert not [m for _, m, _, _ in log if m in SLOW_STAGES]
    assert np.abs(v).max() < 1e-6
    assert np.abs(q - q0).max() < 2e-3                 # settled where it was put
    assert min(d for *_, d in log) > -1e-3


def test_tall_stack_converges_from_a_cold_start():
    """14 planks: from a cold start the contacts activate layer by layer (one mode round per
    layer, more than the default 12 rounds); the proximal stage gives them as many rounds as
    constraints, so no slow stage runs."""
    h = 0.02
    bodies = "".join(_box_body(f"p{i}", h + 2 * h * i + 1e-4 * (i + 1), (0.3, 0.1, h),
                               x=0.005 * (i % 3)) for i in range(14))
    sim = diffgym.Simulator.from_string(BOX.format(dt=0.01, mu=0.8, bodies=bodies))
    q, v, log = _run_steps(sim, sim.q0, np.zeros(sim.nv), 15)
    assert all(c for c, _, _, _ in log)
    assert not [m for _, m, _, _ in log if m in SLOW_STAGES], [m for _, m, _, _ in log]
    assert sim.last.num_contacts == 4 * 14


# -- ellipsoid ----------------------------------------------------------------------------
@pytest.mark.parametrize("euler", ["0 0 0", "0 90 0", "90 0 0"])
def test_ellipsoid_resting_penetration(euler):
    """An ellipsoid dropped onto each of its principal sides comes to rest with a penetration
    under 1e-4 m (exact closed-form distance to the plane)."""
    xml = f"""<mujoco><option timestep="0.01"/><worldbody><geom name="floor" type="plane" size="5 5 .1"/>
    <body name="e" pos="0 0 0.25" euler="{euler}"><freejoint name="e"/>
    <geom name="eg" type="ellipsoid" size="0.2 0.12 0.06"/></body></worldbody></mujoco>"""
    sim = diffgym.Simulator.from_string(xml)
    q, v, log = _run_steps(sim, sim.q0, np.zeros(sim.nv), 300)
    assert all(c for c, _, _, _ in log)
    assert max(-d for *_, d in log[150:]) < 1e-4
    assert np.abs(v).max() < 1e-6
    # the lowest point of the ellipsoid, in closed form, is on the floor
    x, y, z, w = q[3:7]
    R = pin.Quaternion(w, x, y, z).toRotationMatrix()
    h = bench_drops._lowest_height("ellipsoid", np.array([0.2, 0.12, 0.06]), R, q[:3])
    assert abs(h) < 1e-4


# -- the checks of a step -----------------------------------------------------------------
SPHERE = """<mujoco model="checked"><option timestep="0.01"/><worldbody>
<geom name="floor" type="plane" size="5 5 .1"/>
<body name="s" pos="0 0 0.099"><freejoint name="s"/><geom name="ball" type="sphere" size="0.1"/></body>
</worldbody></mujoco>"""


def test_linalg_error_in_a_step_becomes_simulation_error_with_context(monkeypatch):
    sim = diffgym.Simulator.from_string(SPHERE)
    q, v = sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))

    def broken(*a, **k):
        raise np.linalg.LinAlgError("Singular matrix")
    monkeypatch.setattr(pin, "computeMinverse", broken)
    # (a warm start is there: the step is tried again from a cold start, said, then refused)
    with pytest.warns(diffgym.SolverWarning, match="cold start"), \
            pytest.raises(SimulationError) as info:
        sim.step(q, v, np.zeros(sim.nv))
    msg = str(info.value)
    assert "checked" in msg and "step 2" in msg and "floor/ball" in msg and "Singular" in msg
    assert isinstance(info.value.__cause__, np.linalg.LinAlgError)


def test_linalg_error_in_the_solver_becomes_simulation_error(monkeypatch):
    sim = diffgym.Simulator.from_string(SPHERE)

    def broken(self, *a, **k):
        raise np.linalg.LinAlgError("SVD did not converge")
    monkeypatch.setattr(NCPSolver, "solve", broken)
    monkeypatch.setattr(NCPSolver, "_solve", broken)
    sim.solver.settings.compiled = False              # (the stage-by-stage path)
    with pytest.raises(SimulationError, match="SVD did not converge.*|.*contact"):
        sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))


def _numba_svd_failure_once(monkeypatch, times):
    """Make the compiled constrained step raise numba's LAPACK convergence ValueError (what its
    SVD raises when dgesdd/dgelsd do not converge) on its next ``times`` calls."""
    from diffgym.sim import forward
    real, calls = forward._constrained_step, []

    def failing(*a):
        calls.append(1)
        if len(calls) <= times:
            raise ValueError("Internal algorithm failed to converge.")
        return real(*a)
    monkeypatch.setattr(forward, "_constrained_step", failing)
    return calls


def test_lapack_failure_from_the_warm_start_is_solved_again_cold(monkeypatch):
    """Billiards (issue 13, session 9) met numba's SVD failing to converge at a step whose
    warm start led the solver to a bad problem; the same state steps fine from a cold start.
    The step retries once from a cold start, says so (SolverWarning), and gives the cold step."""
    sim = diffgym.Simulator.from_string(SPHERE)
    z = np.zeros(sim.nv)
    q, v = sim.step(sim.q0, z, z)
    assert sim.warm_start_state() is not None
    ref = diffgym.Simulator.from_string(SPHERE)
    q_ref, v_ref = ref.step(q, v, z)              # (a cold start: a new simulator)
    calls = _numba_svd_failure_once(monkeypatch, 1)
    with pytest.warns(diffgym.SolverWarning, match="cold start"):
        q1, v1 = sim.step(q, v, z)
    assert len(calls) >= 2
    np.testing.assert_array_equal(q1, q_ref)
    np.testing.assert_array_equal(v1, v_ref)


def test_lapack_failure_that_persists_becomes_simulation_error(monkeypatch):
    sim = diffgym.Simulator.from_string(SPHERE)
    z = np.zeros(sim.nv)
    q, v = sim.step(sim.q0, z, z)
    _numba_svd_failure_once(monkeypatch, 10 ** 6)
    with pytest.warns(diffgym.SolverWarning), pytest.raises(SimulationError) as info:
        sim.step(q, v, z)
    msg = str(info.value)
    assert "step 2" in msg and "floor/ball" in msg and "failed to converge" in msg
    cold = diffgym.Simulator.from_string(SPHERE)    # no warm start: no retry, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", diffgym.SolverWarning)
        with pytest.raises(SimulationError, match="failed to converge"):
            cold.step(q, v, z)


def test_a_bad_argument_value_error_is_not_taken_for_lapack(monkeypatch):
    from diffgym.sim import forward

    def bad(*a):
        raise ValueError("operands could not be broadcast")
    sim = diffgym.Simulator.from_string(SPHERE)
    z = np.zeros(sim.nv)
    q, v = sim.step(sim.q0, z, z)
    monkeypatch.setattr(forward, "_constrained_step", bad)
    with pytest.raises(ValueError, match="broadcast"):
        sim.step(q, v, z)


def test_wrong_solution_reported_converged_is_caught():
    """A solver that reports convergence on a wrong solution (here: a normal impulse twice too
    large, which would launch the ball) is caught by the check of the final velocity: the step
    is marked not converged and warns."""
    class Liar(NCPSolver):
        def solve(self, G, g, nc, mu, lam0=None, modes0=None):
            res = NCPSolver.solve(self, G, g, nc, mu, lam0, modes0)
            lam = 2.0 * res.lam
            return SolverResult(lam, G @ lam + g, res.modes, res.limit_active, res.iterations,
                                0.0, True, res.method)
    sim = diffgym.Simulator.from_string(SPHERE)
    sim.solver = Liar(sim.solver.settings)
    with pytest.warns(diffgym.SolverWarning):
        sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))
    assert not sim.last.converged and sim.last.method.endswith("+unverified")
    assert sim.last.residual > 1e-3
    # the honest solver passes the same check
    sim2 = diffgym.Simulator.from_string(SPHERE)
    sim2.step(sim2.q0, np.zeros(sim2.nv), np.zeros(sim2.nv))
    assert sim2.last.converged and sim2.last.num_contacts == 1


# -- settings -----------------------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    (dict(tol=0.0), "tol"), (dict(tol=-1e-9), "tol"), (dict(tol=float("nan")), "tol"),
    (dict(tol=float("inf")), "tol"), (dict(margin=-1e-3), "margin"),
    (dict(margin=float("nan")), "margin"), (dict(max_contact_points=0), "max_contact_points"),
    (dict(max_contact_points=2.5), "max_contact_points"), (dict(max_iter=0), "max_iter"),
])
def test_nonsense_settings_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        diffgym.Simulator.from_string(SPHERE, **kw)


def test_sensible_settings_are_accepted():
    sim = diffgym.Simulator.from_string(SPHERE, tol=1e-6, margin=0.0, max_contact_points=1)
    sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))


SPRING = """<mujoco><option timestep="{dt}"/><worldbody>
<body name="p"><joint name="hinge" type="hinge" axis="0 1 0" stiffness="{k}" damping="{c}"/>
<geom name="rod" type="capsule" fromto="0 0 0 0 0 -0.5" size="0.02" mass="{m}"/></body>
</worldbody></mujoco>"""


def test_time_step_beyond_stability_warns():
    # I = m L^2 / 3 (about the hinge) ~ 0.0833 for m = 1: omega = sqrt(k / I)
    with pytest.warns(StabilityWarning, match="stiffness"):
        diffgym.Simulator.from_string(SPRING.format(dt=0.05, k=1000.0, c=0.0, m=1.0))
    with warnings.catch_warnings():         # joint damping is implicit: stable at any step
        warnings.simplefilter("error", StabilityWarning)
        diffgym.Simulator.from_string(SPRING.format(dt=0.05, k=0.0, c=10.0, m=1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", StabilityWarning)
        diffgym.Simulator.from_string(SPRING.format(dt=0.001, k=1000.0, c=10.0, m=1.0))


# -- inertia and sizes at load ------------------------------------------------------------
FREE = """<mujoco><worldbody><geom name="floor" type="plane" size="5 5 .1"/>
<body name="thing" pos="0 0 1"><freejoint name="thing"/>{inner}</body></worldbody></mujoco>"""


@pytest.mark.parametrize("inner, words", [
    ('<geom name="g" type="box" size="0.1 nan 0.1"/>', ["g", "size"]),
    ('<geom name="g" type="sphere" size="inf"/>', ["g", "size"]),
    ('<geom name="g" type="box" size="0.1 0.1 0.1" mass="-1"/>', ["g", "mass"]),
    ('<geom name="g" type="box" size="0.1 0.1 0.1" mass="nan"/>', ["g", "mass"]),
    ('<geom name="g" type="box" size="0.1 0.1 0.1" density="-1000"/>', ["g", "density"]),
    ('<geom name="g" type="box" size="0.1 0.1 0.1" density="nan"/>', ["g", "density"]),
    ('<inertial mass="0" diaginertia="1 1 1"/>', ["thing", "mass"]),
    ('<inertial mass="nan" diaginertia="1 1 1"/>', ["thing", "mass"]),
    ('<inertial mass="1" diaginertia="0 1 1"/>', ["thing", "diaginertia"]),
    ('<inertial mass="1" diaginertia="1 1 nan"/>', ["thing", "diaginertia"]),
    ('<inertial mass="1" diaginertia="1 1 3"/>', ["thing", "triangle"]),
    ('<inertial mass="1" fullinertia="1 1 1 2 0 0"/>', ["thing", "fullinertia"]),
    ('<geom name="g" type="box" size="0.1 0.1 0.1" mass="0"/>', ["thing", "mass"]),
])
def test_bad_inertia_or_size_is_an_error_naming_it(inner, words):
    with pytest.raises(ModelError) as info:
        diffgym.Simulator.from_string(FREE.format(inner=inner))
    msg = str(info.value)
    for w in words:
        assert w in msg, msg


def test_talos_drop_ends_in_no_raw_numpy_error():
    """example-robot-data's talos_reduced dropped at zero torque from its reference pose (which
    starts in deep ground contact): the push-out launches it and its free flight diverges after
    about 1 s. Whatever happens, a step either succeeds or raises SimulationError naming the
    model and the step, never a raw numpy/LAPACK error. (Since the depenetration cap it rises
    out of the ground at 1 m/s instead of being launched; 30 steps, the fast ones: later steps
    with 67 deep contacts take the slow fallback stages, tests/test_energy_budget.py.)"""
    from diffgym.resources import example_robot_data_dir
    path = example_robot_data_dir() + "/robots/talos_data/robots/talos_reduced.urdf"
    sim = diffgym.Simulator.from_file(path, ignore_unsupported=("joint.frictionloss",))
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    q[2] += 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for _ in range(30):
                q, v = sim.step(q, v, np.zeros(sim.nv))
        except SimulationError as exc:
            msg = str(exc)
            assert "talos" in msg and "step" in msg and "contact" in msg, msg
            return
    assert np.isfinite(q).all() and np.isfinite(v).all()


SPIN = """<mujoco><option timestep="{dt}" gravity="0 0 0"/><worldbody>
<body name="e" pos="0 0 1"><freejoint name="e"/><geom name="eg" type="ellipsoid" size="0.2 0.1 0.02"/></body>
</worldbody></mujoco>"""


def test_exploding_free_spin_is_flagged():
    """A flat ellipsoid spinning about a non-principal axis at 10 Hz: the explicit step of the
    gyroscopic term pumps energy in (no contact, no force does work), which the step's energy
    check flags (converged False, method ending in +energy, a SolverWarning); the same spin at
    1 kHz is not flagged."""
    sim = diffgym.Simulator.from_string(SPIN.format(dt=0.1))
    q, v = sim.q0, np.zeros(sim.nv)
    v[3:6] = [6.0, 0.5, 6.0]
    flagged = False
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(40):
            try:
                q, v = sim.step(q, v, np.zeros(sim.nv))
            except SimulationError as exc:
                # (the trajectory's energy check, every 8 steps, may see it first)
                flagged = "mechanical energy grew" in str(exc)
                break
            if not sim.last.converged:
                assert sim.last.method.endswith("+energy")
                flagged = True
                break
    assert flagged
    assert any(issubclass(w.category, diffgym.SolverWarning) for w in rec)
    sim = diffgym.Simulator.from_string(SPIN.format(dt=0.001))
    q, v = sim.q0, np.zeros(sim.nv)
    v[3:6] = [6.0, 0.5, 6.0]
    q, v, log = _run_steps(sim, q, v, 400)
    assert all(c for c, _, _, _ in log)


def test_drop_benchmark_from_the_command_line(capsys):
    from diffgym.cli import main
    assert main(["bench", "--drops", "--n", "6", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    for word in ("shape", "rate (Hz)", "nonconv", "energy", "through", "pen", "exception"):
        assert word in out
    assert out.count("\n6 runs") == 1 or "6 runs," in out
