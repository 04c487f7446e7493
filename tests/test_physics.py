"""Forward physics against closed-form answers (simulator-core validation list)."""
import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym.resources import asset_path

G = 9.81


def scene(body: str, dt: float = 0.002, floor: str = '<geom type="plane" size="5 5 .1"/>') -> diffgym.Simulator:
    return diffgym.Simulator.from_string(
        f'<mujoco><option timestep="{dt}" gravity="0 0 -{G}"/><worldbody>{floor}{body}</worldbody></mujoco>')


def test_free_fall_is_exact_symplectic_euler():
    sim = scene('<body name="b" pos="0 0 5"><freejoint/><geom type="sphere" size="0.1"/></body>')
    # pinocchio's free flyer integrates on SE(3) (a screw motion), so the exact symplectic-Euler
    # parabola of the centre holds for a non-spinning body; a spinning sphere keeps its spin.
    q, v = sim.q0, np.array([0.5, -0.2, 1.0, 0.0, 0.0, 0.0])
    p, pv = q[:3].copy(), v[:3].copy()
    for _ in range(300):
        q, v = sim.step(q, v, np.zeros(6))
        pv[2] -= G * sim.dt
        p += sim.dt * pv
        assert sim.last.num_contacts == 0
    np.testing.assert_allclose(v[:3], pv, atol=1e-12)
    np.testing.assert_allclose(q[:3], p, atol=1e-10)
    q, v = sim.q0, np.array([0.0, 0.0, 0.0, 0.3, 0.1, -0.2])
    for _ in range(100):
        q, v = sim.step(q, v, np.zeros(6))
    np.testing.assert_allclose(v[3:], [0.3, 0.1, -0.2], atol=1e-12)   # torque-free sphere


def test_sliding_box_decelerates_at_mu_g_then_stops():
    mu = 0.16
    sim = scene(f'<body name="b" pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.1 0.1" friction="{mu}"/></body>',
                floor=f'<geom type="plane" size="5 5 .1" friction="{mu}"/>')
    q, v = sim.q0, np.array([2.0, 0, 0, 0, 0, 0])
    decel = mu * G * sim.dt
    stopped_at = None
    for i in range(800):
        q1, v1 = sim.step(q, v, np.zeros(6))
        if stopped_at is None:
            dv = v[0] - v1[0]
            if v1[0] > 1e-12:
                assert abs(dv / decel - 1) < 5e-3, (i, dv, decel)
                assert set(sim.last.contact_modes) == {"sliding"}
            else:
                stopped_at = i
        else:
            assert np.abs(v1).max() < 1e-9, (i, v1)
        q, v = q1, v1
    assert stopped_at is not None
    assert abs(stopped_at * sim.dt - 2.0 / (mu * G)) < 2 * sim.dt


@pytest.mark.parametrize("geom", ['type="box" size="0.1 0.2 0.05"', 'type="sphere" size="0.1"'])
def test_resting_contact_no_drift(geom):
    size = 0.05 if "box" in geom else 0.1
    sim = scene(f'<body name="b" pos="0.3 -0.2 {size}"><freejoint/><geom {geom}/></body>')
    q0 = sim.q0
    q, v = q0.copy(), np.zeros(6)
    worst_pen = 0.0
    for _ in range(1000):
        q, v = sim.step(q, v, np.zeros(6))
        worst_pen = max(worst_pen, -float(sim.last.contact_distances.min()))
        assert np.abs(v[3:]).max() < 1e-9        # no rocking
    assert np.abs(pin.difference(sim.model, q0, q)).max() < 1e-6
    assert worst_pen < 1e-4


def test_stack_of_four_boxes_stands_for_two_seconds():
    h = 0.05
    bodies = "".join(f'<body name="b{i}" pos="0 0 {h + 2 * h * i}"><freejoint/>'
                     f'<geom type="box" size="0.1 0.1 {h}" friction="0.8"/></body>' for i in range(4))
    sim = scene(bodies, floor='<geom type="plane" size="5 5 .1" friction="0.8"/>')
    q, v = sim.q0, np.zeros(sim.nv)
    q0 = q.copy()
    for _ in range(1000):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    assert sim.last.converged
    for i in range(4):
        assert np.linalg.norm(q[7 * i:7 * i + 3] - q0[7 * i:7 * i + 3]) < 1e-3
        assert abs(abs(q[7 * i + 6]) - 1.0) < 1e-6      # still upright (quaternion w)


@pytest.mark.parametrize("angle_deg", [10.0, 25.0])
def test_box_on_incline(angle_deg):
    mu = 0.3
    th = np.radians(angle_deg)
    # tilt gravity instead of the plane: the same physics in the plane's frame
    sim = diffgym.Simulator.from_string(f"""<mujoco><option timestep="0.002" gravity="{G * np.sin(th)} 0 {-G * np.cos(th)}"/>
      <worldbody><geom type="plane" size="5 5 .1" friction="{mu}"/>
      <body name="b" pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.1 0.1" friction="{mu}"/></body>
      </worldbody></mujoco>""")
    q, v = sim.q0, np.zeros(6)
    vs = []
    for _ in range(300):
        q, v = sim.step(q, v, np.zeros(6))
        vs.append(v[0])
    if np.tan(th) < mu:
        assert np.abs(vs).max() < 1e-9
        assert set(sim.last.contact_modes) == {"sticking"}
    else:
        a = np.diff(vs[50:]) / sim.dt
        expected = G * (np.sin(th) - mu * np.cos(th))
        assert np.abs(a / expected - 1).max() < 5e-3


def test_pendulum_stops_at_joint_limit():
    sim = diffgym.Simulator.from_string("""<mujoco><option timestep="0.002"/><worldbody>
      <body name="p" pos="0 0 1"><joint name="h" type="hinge" axis="0 1 0" range="-90 20"/>
      <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.03"/></body></worldbody></mujoco>""")
    q, v = np.array([-1.0]), np.zeros(1)       # gravity swings it towards +angle
    hit = False
    for _ in range(1500):
        q, v = sim.step(q, v, np.zeros(1))
        assert q[0] <= np.radians(20) + 1e-4
        hit |= bool(sim.last.limit_active.any() and sim.last.limit_impulses.max() > 0)
    assert hit
    assert abs(q[0] - np.radians(20)) < 1e-6 and abs(v[0]) < 1e-6


@pytest.mark.parametrize("name", ["hopper_gymnasium.xml", "go1.urdf"])
def test_robots_drop_for_five_seconds(name):
    sim = diffgym.Simulator.from_file(asset_path(name))
    q, v = sim.q0, np.zeros(sim.nv)
    if name == "go1.urdf":
        q[2] += 0.05
    worst = 0.0
    for _ in range(int(5.0 / sim.dt)):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert np.isfinite(q).all() and np.isfinite(v).all()
        if sim.last.num_contacts:
            worst = max(worst, -float(sim.last.contact_distances.min()))
    assert worst < 1e-3


def test_fast_ball_does_not_tunnel_through_thin_wall():
    sim = diffgym.Simulator.from_string("""<mujoco><option timestep="0.002" gravity="0 0 0"/><worldbody>
      <geom name="wall" type="box" pos="1 0 0" size="0.01 1 1"/>
      <body name="ball" pos="0 0 0"><freejoint/><geom type="sphere" size="0.005"/></body>
      </worldbody></mujoco>""")
    q, v = sim.q0, np.array([10.0, 0, 0, 0, 0, 0])
    for _ in range(500):
        q, v = sim.step(q, v, np.zeros(6))
        assert q[0] < 1.0 - 0.01 - 0.005 + 1e-4
    assert v[0] <= 1e-9        # stopped at (plastic impact) or bounced off the wall
