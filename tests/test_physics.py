"""Forward physics against closed-form answers (the simulator-core acceptance list).

Every scene is small and hard-contact: the expected numbers are exact consequences of
semi-implicit Euler with Coulomb friction, so most checks are to round-off or to 0.5 %.
Velocities are compared in the world frame (``world_twist``), whatever convention the free
joint's velocity coordinates use.
"""
import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym.resources import asset_path

G = 9.81
FLOOR = '<geom name="floor" type="plane" size="5 5 .1"/>'


def scene(body: str, dt: float | None = 0.002, floor: str = FLOOR, gravity: str = f"0 0 -{G}") -> diffgym.Simulator:
    step = "" if dt is None else f' timestep="{dt}"'
    return diffgym.Simulator.from_string(
        f'<mujoco><option{step} gravity="{gravity}"/><worldbody>{floor}{body}</worldbody></mujoco>')


def world_twist(sim, q, v, body: str = "b"):
    """(linear velocity of the body origin, angular velocity), both in world axes."""
    fid = sim.model.getFrameId(body)
    pin.forwardKinematics(sim.model, sim.data, q, v)
    pin.updateFramePlacements(sim.model, sim.data)
    tw = pin.getFrameVelocity(sim.model, sim.data, fid, pin.LOCAL_WORLD_ALIGNED)
    return np.array(tw.linear), np.array(tw.angular)


def body_position(sim, q, body: str = "b"):
    pin.framesForwardKinematics(sim.model, sim.data, q)
    return np.array(sim.data.oMf[sim.model.getFrameId(body)].translation)


def min_distance(sim) -> float:
    d = sim.last.contact_distances
    return float(d.min()) if len(d) else np.inf


# 1 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spin", [(0.0, 0.0, 0.0), (3.0, 1.0, -2.0)], ids=["still", "spinning"])
def test_free_fall_is_exact_symplectic_euler(spin):
    """v_{k+1} = v_k + g dt, x_{k+1} = x_k + dt v_{k+1}, also for a tumbling asymmetric box."""
    sim = scene('<body name="b" pos="0 0 5"><freejoint/><geom type="box" size="0.1 0.2 0.3"/></body>')
    q, v = sim.q0, np.array([0.5, -0.2, 1.0, *spin])
    p, pv = q[:3].copy(), v[:3].copy()
    for _ in range(400):
        q, v = sim.step(q, v, np.zeros(6))
        assert sim.last.num_contacts == 0
        pv[2] -= G * sim.dt
        p += sim.dt * pv
    lin, _ = world_twist(sim, q, v)
    np.testing.assert_allclose(lin, pv, rtol=0, atol=1e-12)
    np.testing.assert_allclose(body_position(sim, q), p, rtol=0, atol=1e-12)
    assert body_position(sim, q)[2] > 0.5          # still in the air: 400 steps = 0.8 s


def test_torque_free_spinning_ball_keeps_its_momentum():
    """A ball spinning at rolling speed (70 rad/s, 2 m/s) in zero gravity: constant velocity.

    (Regression: with pinocchio's body-frame free flyer the step rotated the linear velocity
    explicitly each step and the speed grew as (1 + (w dt)^2)^(k/2): 2 -> 14 m/s in 0.4 s.)
    """
    sim = scene('<body name="b"><freejoint/><geom type="sphere" size="0.0286" mass="0.17"/></body>',
                floor="", gravity="0 0 0")
    q, v = sim.q0, np.array([2.0, 0, 0, 0, 70.0, 0])
    for _ in range(1000):
        q, v = sim.step(q, v, np.zeros(6))
    lin, ang = world_twist(sim, q, v)
    np.testing.assert_allclose(lin, [2.0, 0, 0], atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(ang), 70.0, rtol=1e-12)
    np.testing.assert_allclose(body_position(sim, q), [2.0 * 1000 * sim.dt, 0, 0], atol=1e-10)


# 2 -------------------------------------------------------------------------------------------
def test_sliding_box_decelerates_at_mu_g_then_stops():
    mu, v0 = 0.16, 2.0
    sim = scene(f'<body name="b" pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.1 0.1" friction="{mu}"/></body>',
                floor=f'<geom type="plane" size="5 5 .1" friction="{mu}"/>')
    q, v = sim.q0, np.array([v0, 0, 0, 0, 0, 0])
    decel = mu * G * sim.dt
    speed = v0
    stopped_at = None
    for i in range(800):
        q, v = sim.step(q, v, np.zeros(6))
        lin, ang = world_twist(sim, q, v)
        if stopped_at is None:
            if lin[0] > 1e-12:
                assert abs((speed - lin[0]) / decel - 1) < 5e-3, (i, speed - lin[0], decel)
                assert set(sim.last.contact_modes) == {"sliding"}
            else:
                stopped_at = i
        else:                                       # stays stopped
            assert max(np.abs(lin).max(), np.abs(ang).max()) < 1e-9, (i, lin, ang)
        speed = lin[0]
        assert abs(lin[1]) < 1e-12 and abs(lin[2]) < 1e-9
    assert stopped_at is not None
    # the last sliding step may remove less than mu g dt: it stops within one step of v0 / (mu g)
    assert abs((stopped_at + 1) * sim.dt - v0 / (mu * G)) <= sim.dt
    assert abs(body_position(sim, q)[2] - 0.1) < 1e-6


def test_sliding_ball_starts_rolling_at_five_sevenths():
    """A ball launched without spin: friction mu m g until v = w r at t = 2 v0 / (7 mu g),
    then it rolls on at 5/7 v0 (angular momentum about the contact point is conserved)."""
    mu, v0, r = 0.2, 2.0, 0.0286
    sim = scene(f'<body name="b" pos="0 0 {r}"><freejoint/><geom type="sphere" size="{r}" mass="0.17" friction="{mu}"/></body>',
                floor=f'<geom type="plane" size="5 5 .1" friction="{mu}"/>')
    q, v = sim.q0, np.array([v0, 0, 0, 0, 0, 0])
    rolling_at = None
    for i in range(400):
        q, v = sim.step(q, v, np.zeros(6))
        lin, ang = world_twist(sim, q, v)
        if rolling_at is None and sim.last.contact_modes == ["sticking"]:
            rolling_at = i
        if rolling_at is None:
            assert sim.last.contact_modes == ["sliding"]
            np.testing.assert_allclose(lin[0], v0 - mu * G * sim.dt * (i + 1), rtol=1e-9)
            np.testing.assert_allclose(ang[1], 2.5 * mu * G / r * sim.dt * (i + 1), rtol=1e-9)
        assert abs(body_position(sim, q)[2] - r) < 1e-9         # neither sinks nor hops
    assert rolling_at is not None
    assert abs((rolling_at + 1) * sim.dt - 2 * v0 / (7 * mu * G)) <= sim.dt
    np.testing.assert_allclose(lin, [5 / 7 * v0, 0, 0], atol=1e-9)
    np.testing.assert_allclose(ang, [0, 5 / 7 * v0 / r, 0], atol=1e-7)


# 3 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("geom, half_height", [
    ('type="box" size="0.1 0.2 0.05"', 0.05),
    ('type="sphere" size="0.1"', 0.1),
], ids=["box", "sphere"])
def test_resting_contact_no_drift(geom, half_height):
    """Resting on a plane for 1000 steps: no drift above 1e-6 m, penetration below 1e-4 m
    (hard contacts with Baumgarte correction: in practice it stays at round-off), no rocking."""
    sim = scene(f'<body name="b" pos="0.3 -0.2 {half_height}" euler="0 0 30"><freejoint/><geom {geom}/></body>')
    q0 = sim.q0
    q, v = q0.copy(), np.zeros(6)
    worst = 0.0
    for _ in range(1000):
        q, v = sim.step(q, v, np.zeros(6))
        assert sim.last.num_contacts >= 1
        worst = max(worst, abs(min_distance(sim)))
        lin, ang = world_twist(sim, q, v)
        assert np.abs(ang).max() < 1e-9          # no rocking
        assert np.abs(lin).max() < 1e-6
    assert np.abs(pin.difference(sim.model, q0, q)).max() < 1e-6
    assert worst < 1e-4                           # |min contact distance|, every step


# 4 -------------------------------------------------------------------------------------------
def test_stack_of_four_boxes_stands_for_two_seconds():
    h = 0.05
    bodies = "".join(f'<body name="b{i}" pos="0 0 {h + 2 * h * i}"><freejoint/>'
                     f'<geom type="box" size="0.1 0.1 {h}" friction="0.8"/></body>' for i in range(4))
    sim = scene(bodies, floor='<geom type="plane" size="5 5 .1" friction="0.8"/>')
    q, v = sim.q0, np.zeros(sim.nv)
    q0 = q.copy()
    worst_pen = 0.0
    for _ in range(1000):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        worst_pen = max(worst_pen, -min_distance(sim))
    assert sim.last.converged
    assert worst_pen < 1e-4
    for i in range(4):
        name = f"b{i}"
        assert np.linalg.norm(body_position(sim, q, name) - body_position(sim, q0, name)) < 1e-3
        R = sim.data.oMf[sim.model.getFrameId(name)].rotation
        assert R[2, 2] > 1 - 1e-9                  # still upright: no tipping
        lin, ang = world_twist(sim, q, v, name)
        assert np.abs(lin).max() < 1e-6 and np.abs(ang).max() < 1e-6


# 5 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("angle_deg", [10.0, 25.0])
@pytest.mark.parametrize("tilt", ["plane", "gravity"])
def test_box_on_incline(angle_deg, tilt):
    """tan(angle) < mu: it sticks. Otherwise it slides down at g (sin - mu cos)."""
    mu = 0.3
    th = np.radians(angle_deg)
    body = f'<geom type="box" size="0.1 0.1 0.1" friction="{mu}"/>'
    if tilt == "plane":
        R = pin.utils.rpyToMatrix(0.0, th, 0.0)           # rotation about +y, as euler="0 a 0"
        c = R @ np.array([0.0, 0.0, 0.1])
        sim = scene(f'<body name="b" pos="{c[0]:.17g} {c[1]:.17g} {c[2]:.17g}" euler="0 {angle_deg} 0"><freejoint/>{body}</body>',
                    floor=f'<geom type="plane" size="5 5 .1" euler="0 {angle_deg} 0" friction="{mu}"/>')
        down = R @ np.array([1.0, 0, 0])
        gvec = np.array([0, 0, -G])
    else:                                                   # a flat plane, gravity tilted
        gvec = np.array([G * np.sin(th), 0, -G * np.cos(th)])
        sim = scene(f'<body name="b" pos="0 0 0.1"><freejoint/>{body}</body>',
                    floor=f'<geom type="plane" size="5 5 .1" friction="{mu}"/>',
                    gravity=" ".join(f"{x:.17g}" for x in gvec))
        down = np.array([1.0, 0, 0])
    np.testing.assert_allclose(sim.model.gravity.linear, gvec, atol=1e-12)
    q, v = sim.q0, np.zeros(6)
    speeds = [0.0]
    for _ in range(300):
        q, v = sim.step(q, v, np.zeros(6))
        lin, ang = world_twist(sim, q, v)
        speeds.append(float(lin @ down))
        assert np.abs(ang).max() < 1e-9                      # slides flat, does not tip
        assert min_distance(sim) > -1e-6
    if np.tan(th) < mu:
        assert np.abs(lin).max() < 1e-9
        assert set(sim.last.contact_modes) == {"sticking"}
    else:
        a = np.diff(speeds) / sim.dt
        expected = G * (np.sin(th) - mu * np.cos(th))
        assert np.abs(a / expected - 1).max() < 5e-3
        assert set(sim.last.contact_modes) == {"sliding"}


# 6 -------------------------------------------------------------------------------------------
def test_pendulum_stops_at_joint_limit():
    """Released at -1 rad, gravity swings it onto its 20 degree stop, where it stays; at rest the
    limit impulse is the gravity torque m g c cos(20 deg) times dt."""
    sim = diffgym.Simulator.from_string("""<mujoco><option timestep="0.002"/><worldbody>
      <body name="p" pos="0 0 1"><joint name="h" type="hinge" axis="0 1 0" range="-90 20"/>
      <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.03"/></body></worldbody></mujoco>""")
    top = np.radians(20)
    q, v = np.array([-1.0]), np.zeros(1)
    hit = False
    for _ in range(1500):
        q, v = sim.step(q, v, np.zeros(1))
        assert q[0] <= top + 1e-4
        hit |= bool(sim.last.limit_active.any() and sim.last.limit_impulses.max() > 0)
    assert hit
    assert abs(q[0] - top) < 1e-6 and abs(v[0]) < 1e-6
    assert sim.last.limit_joints == ["h"] and sim.last.limit_active.tolist() == [True]
    inertia = sim.model.inertias[1]
    expected = inertia.mass * G * inertia.lever[0] * np.cos(top) * sim.dt
    np.testing.assert_allclose(sim.last.limit_impulses, [expected], rtol=1e-6)


# 7 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hopper_gymnasium.xml", "go1.urdf"])
def test_robots_drop_for_five_seconds(name):
    """Zero torque for 5 s from a drop: finite, and contacts never penetrate beyond 1 mm.
    (2500 steps each; a few seconds at the time of writing.)"""
    sim = diffgym.Simulator.from_file(asset_path(name), ignore_unsupported=("option.integrator", "joint.frictionloss"))
    q, v = sim.q0, np.zeros(sim.nv)
    if name == "go1.urdf":
        q[2] += 0.05                              # the SRDF standing pose, 5 cm up
    worst = 0.0
    touched = False
    for _ in range(int(round(5.0 / sim.dt))):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert np.isfinite(q).all() and np.isfinite(v).all()
        assert sim.last.converged, (sim.last.residual, sim.last.method)
        if sim.last.num_contacts:
            touched = True
            worst = max(worst, -min_distance(sim))
    assert touched
    assert worst < 1e-3, worst
    assert np.abs(v).max() < 1.0                  # it has landed and is (nearly) at rest


# 8 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [None, 0.04], ids=["default-dt", "dt=0.04"])
def test_fast_ball_does_not_tunnel_through_thin_wall(dt):
    """10 m/s at a 2 cm wall (a step of 2 cm at the default 0.002 s, 40 cm at 0.04 s)."""
    sim = scene('<geom name="wall" type="box" pos="1 0 0" size="0.01 1 1"/>'
                '<body name="b"><freejoint/><geom type="sphere" size="0.005"/></body>',
                dt=dt, floor="", gravity="0 0 0")
    if dt is None:
        assert sim.dt == 0.002                     # MuJoCo's default
    face = 1.0 - 0.01 - 0.005
    q, v = sim.q0, np.array([10.0, 0, 0, 0, 0, 0])
    for _ in range(int(round(0.5 / sim.dt))):
        q, v = sim.step(q, v, np.zeros(6))
        assert body_position(sim, q)[0] < face + 1e-6
    assert body_position(sim, q)[0] > face - 1e-3  # it got there and stopped at the wall
    assert world_twist(sim, q, v)[0][0] < 1e-3


# convex meshes --------------------------------------------------------------------------------
CUBE_OBJ = "".join(f"v {x} {y} {z}\n" for x in (-0.1, 0.1) for y in (-0.1, 0.1) for z in (-0.1, 0.1)) + (
    "f 1 2 4\nf 1 4 3\nf 5 7 8\nf 5 8 6\nf 1 5 6\nf 1 6 2\nf 3 4 8\nf 3 8 7\nf 1 3 7\nf 1 7 5\n"
    "f 2 6 8\nf 2 8 4\n")


def test_convex_mesh_cube_slides_and_rests_like_the_box(tmp_path):
    """A cube given as a convex mesh (coal's convex hull) and the same cube as a box primitive,
    side by side with the same mass and inertia: sliding at 2 m/s with mu = 0.16 both lose
    mu*g*dt per step, stop, and rest without drift; their trajectories agree."""
    mu, v0 = 0.16, 2.0
    (tmp_path / "cube.obj").write_text(CUBE_OBJ)
    inertial = '<inertial pos="0 0 0" mass="8" diaginertia="0.05333333 0.05333333 0.05333333"/>'
    xml = (f'<mujoco><option timestep="0.002"/><asset><mesh name="cube" file="cube.obj"/></asset>'
           f'<worldbody><geom type="plane" size="5 5 .1" friction="{mu}"/>'
           f'<body name="m" pos="0 0 0.1"><freejoint/>{inertial}<geom type="mesh" mesh="cube" friction="{mu}"/></body>'
           f'<body name="b" pos="0 3 0.1"><freejoint/>{inertial}<geom type="box" size="0.1 0.1 0.1" friction="{mu}"/></body>'
           '</worldbody></mujoco>')
    (tmp_path / "scene.xml").write_text(xml)
    sim = diffgym.Simulator.from_file(str(tmp_path / "scene.xml"))
    q, v = sim.q0, np.zeros(sim.nv)
    v[0] = v[6] = v0                               # both bodies: x velocity (world axes)
    decel = mu * G * sim.dt
    speed = v0
    for i in range(1200):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.converged
        mesh_lin, mesh_ang = world_twist(sim, q, v, "m")
        box_lin, box_ang = world_twist(sim, q, v, "b")
        # (mesh vertices are read in single precision: -0.1 becomes -0.1000000015, a 1.5e-9 m
        # deeper corner that the Baumgarte term lifts at 1.5e-7 m/s)
        np.testing.assert_allclose(mesh_lin, box_lin, atol=1e-6)
        np.testing.assert_allclose(mesh_ang, box_ang, atol=1e-6)
        if speed > decel:
            assert abs((speed - mesh_lin[0]) / decel - 1) < 5e-3, (i, speed - mesh_lin[0], decel)
        speed = mesh_lin[0]
    assert max(np.abs(mesh_lin).max(), np.abs(mesh_ang).max()) < 1e-6        # stopped, at rest
    z = body_position(sim, q, "m")[2]
    assert abs(z - 0.1) < 1e-4                     # penetration bound of the resting tests
    assert np.sum(sim.last.contact_points[:, 1] < 1.5) == 4     # the mesh rests on a 4-point face patch
    for _ in range(500):                           # resting: no drift
        q, v = sim.step(q, v, np.zeros(sim.nv))
    assert np.linalg.norm(body_position(sim, q, "m") - body_position(sim, sim.q0, "m")
                          - [v0**2 / (2 * mu * G), 0, 0]) < 5e-3
    assert abs(body_position(sim, q, "m")[2] - z) < 1e-6
