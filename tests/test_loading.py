"""Model loading as MuJoCo reads it, the shipped assets, and clear errors for bad input."""
import glob
import os

import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym.resources import asset_path, assets_dir

# geoms of several bodies, all overlapping near the origin, so that MuJoCo reports a contact for
# every pair its filters let through (see test_collision_filters_match_mujoco)
FILTERS = """<mujoco><option timestep="0.005" gravity="0 0 -3"/>
<default><default class="grippy"><geom friction="0.9"/></default></default>
<worldbody>
<geom name="floor" type="plane" size="5 5 .1" friction="0.3"/>
<geom name="post" type="box" pos="0 0 0.05" size="0.05 0.05 0.05"/>
<body name="a" pos="0 0 0.05"><freejoint/><geom name="ga" type="sphere" size="0.1" friction="0.7"/>
  <body name="a_weld" pos="0.01 0 0"><geom name="gw" type="sphere" size="0.1"/></body>
  <body name="a_child" pos="0 0.01 0"><joint type="hinge" axis="1 0 0"/><geom name="gc" type="sphere" size="0.1"/>
    <body name="a_grandchild" pos="0 0.01 0"><joint type="hinge" axis="1 0 0"/>
      <geom name="ggc" class="grippy" type="sphere" size="0.1"/></body>
  </body>
</body>
<body name="b" pos="0.01 0.01 0.05"><freejoint/><geom name="gb" type="sphere" size="0.1" contype="2" conaffinity="2"/></body>
<body name="c" pos="-0.01 0 0.05"><freejoint/><geom name="gcc" type="capsule" fromto="0 0 -0.04 0 0 0.2" size="0.05" friction="0.2"/></body>
<body name="d" pos="0 -0.01 0.05"><freejoint/><geom name="gd" type="sphere" size="0.1" contype="2" conaffinity="1" friction="1.5"/></body>
<body name="static" pos="0.02 0 0.05"><geom name="gs" type="sphere" size="0.1"/>
  <body name="static_child" pos="0 0 0"><joint type="slide" axis="0 0 1"/><geom name="gsc" type="sphere" size="0.1"/></body>
</body>
</worldbody>
<contact><exclude body1="a" body2="c"/><pair geom1="gb" geom2="floor" friction="0.4"/></contact>
</mujoco>"""


def pair_names(sim):
    return {frozenset((sim.sm.geoms[a].name, sim.sm.geoms[b].name)) for a, b in sim.sm.pairs}


def pair_friction(sim, g1, g2):
    for k, (a, b) in enumerate(sim.sm.pairs):
        if {sim.sm.geoms[a].name, sim.sm.geoms[b].name} == {g1, g2}:
            return float(sim.sm.pair_friction[k])
    raise KeyError((g1, g2))


# -- MJCF reading --------------------------------------------------------------------------------
def test_mjcf_option_friction_filters_and_several_bodies():
    sim = diffgym.Simulator.from_string(FILTERS)
    assert sim.dt == 0.005
    np.testing.assert_allclose(sim.model.gravity.linear, [0, 0, -3])
    assert sim.nv == 4 * 6 + 2 + 1 and sim.nq == 4 * 7 + 2 + 1      # four free bodies in one scene
    pairs = pair_names(sim)
    pair = lambda a, b: frozenset((a, b))  # noqa: E731
    assert pair("floor", "post") not in pairs                          # both on the world body
    assert pair("ga", "gw") not in pairs                               # welded into one body
    assert pair("ga", "gc") not in pairs and pair("gw", "gc") not in pairs   # parent-child
    assert pair("gc", "ggc") not in pairs and pair("ga", "ggc") in pairs     # grandparent: kept
    assert pair("gs", "gsc") in pairs                                  # parent is world-welded
    assert pair("floor", "gs") not in pairs and pair("post", "gs") not in pairs  # static body
    assert pair("ga", "gcc") not in pairs and pair("gc", "gcc") in pairs     # <exclude a c>
    assert pair("floor", "gd") in pairs and pair("gb", "gd") in pairs        # contype/conaffinity
    assert pair("ga", "gb") not in pairs and pair("floor", "gb") in pairs    # only by <pair>
    assert pair_friction(sim, "floor", "ga") == 0.7                    # the larger of the two
    assert pair_friction(sim, "floor", "gcc") == 0.3
    assert pair_friction(sim, "ga", "ggc") == 0.9                      # from the default class
    assert pair_friction(sim, "floor", "gb") == 0.4                    # the <pair>'s own


def test_collision_filters_match_mujoco():
    """Candidate pairs and their friction are the pairs MuJoCo collides (all geoms overlap)."""
    mujoco = pytest.importorskip("mujoco")
    m = mujoco.MjModel.from_xml_string(FILTERS)
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    name = lambda g: mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_GEOM, g)  # noqa: E731
    mj = {}
    for c in d.contact[:d.ncon]:
        mj[frozenset((name(c.geom1), name(c.geom2)))] = float(c.friction[0])
    sim = diffgym.Simulator.from_string(FILTERS)
    assert pair_names(sim) == set(mj)
    for p, mu in mj.items():
        assert pair_friction(sim, *p) == pytest.approx(mu)


def test_timestep_override_and_default():
    assert diffgym.Simulator.from_string(FILTERS, dt=0.001).dt == 0.001
    sim = diffgym.Simulator.from_string("<mujoco><worldbody/></mujoco>")
    assert sim.dt == 0.002                                               # MuJoCo's default
    np.testing.assert_allclose(sim.model.gravity.linear, [0, 0, -9.81])


def test_free_joint_state_reads_as_mujoco():
    """q is MuJoCo's qpos with the quaternion as (x y z w); v is MuJoCo's qvel: the world-frame
    linear velocity of the body origin, then the body-frame angular velocity."""
    mujoco = pytest.importorskip("mujoco")
    xml = """<mujoco><option timestep="0.01" gravity="0 0 0"/><worldbody>
      <body name="b" pos="0.1 0.2 0.3" euler="30 -20 70"><freejoint/>
        <geom type="sphere" size="0.1"/></body></worldbody>KEY</mujoco>"""
    key = '<keyframe><key qpos="1 2 3 0.1 0.7 0.1 0.7"/></keyframe>'
    keyed = diffgym.Simulator.from_string(xml.replace("KEY", key))
    mk = mujoco.MjModel.from_xml_string(xml.replace("KEY", key)).key_qpos[0]
    np.testing.assert_allclose(keyed.q0, [*mk[:3], mk[4], mk[5], mk[6], mk[3]])   # w moved last
    xml = xml.replace("KEY", "")
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    sim = diffgym.Simulator.from_string(xml)
    mq = m.qpos0
    np.testing.assert_allclose(sim.q0[:3], mq[:3], atol=1e-12)
    assert abs(abs(np.dot(sim.q0[3:7], [mq[4], mq[5], mq[6], mq[3]])) - 1) < 1e-12
    d.qpos[:] = mq
    d.qvel[:] = [0.3, -0.2, 0.5, 2.0, -1.0, 3.0]
    q = np.concatenate([mq[:3], [mq[4], mq[5], mq[6], mq[3]]])
    v = d.qvel.copy()
    for _ in range(50):
        mujoco.mj_step(m, d)
        q, v = sim.step(q, v, np.zeros(6))
    np.testing.assert_allclose(q[:3], d.qpos[:3], atol=1e-12)
    assert abs(abs(np.dot(q[3:7], [d.qpos[4], d.qpos[5], d.qpos[6], d.qpos[3]])) - 1) < 1e-12
    np.testing.assert_allclose(v, d.qvel, atol=1e-12)


def test_hopper_inertia_matches_mujoco():
    """Masses, centres of mass and inertias computed from geoms, body by body, as MuJoCo does."""
    mujoco = pytest.importorskip("mujoco")
    path = asset_path("hopper_gymnasium.xml")
    mj = mujoco.MjModel.from_xml_path(path)
    sim = diffgym.Simulator.from_file(path, ignore_unsupported=("option.integrator",))   # RK4
    assert sim.dt == mj.opt.timestep
    assert len(sim.sm.limits) == 2 * 3                   # three limited hinges
    model = sim.model
    for b in range(1, mj.nbody):
        bname = mujoco.mj_id2name(mj, mujoco.mjtObj.mjOBJ_BODY, b)
        frame = model.frames[model.getFrameId(bname)]
        inertia = model.inertias[frame.parentJoint]      # one body per joint in the hopper
        assert inertia.mass == pytest.approx(mj.body_mass[b], rel=1e-6), bname
        # centre of mass and inertia, in the body frame
        com = frame.placement.actInv(inertia.lever)
        np.testing.assert_allclose(com, mj.body_ipos[b], atol=1e-9, err_msg=bname)
        R = frame.placement.rotation
        I_body = R.T @ inertia.inertia @ R
        np.testing.assert_allclose(np.linalg.eigvalsh(I_body), np.sort(mj.body_inertia[b]), rtol=1e-6, err_msg=bname)


# -- shipped assets ------------------------------------------------------------------------------
ASSETS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(str(assets_dir()), "*.xml")))


def test_expected_assets_are_shipped():
    assert {"cartpole.xml", "hopper.xml", "billiards.xml", "push.xml"} <= set(ASSETS)


@pytest.mark.parametrize("name", ASSETS)
def test_asset_loads_in_both_engines_and_runs(name):
    mujoco = pytest.importorskip("mujoco")
    path = asset_path(name)
    mj = mujoco.MjModel.from_xml_path(path)
    sim = diffgym.Simulator.from_file(path)
    assert (sim.nq, sim.nv, len(sim.actuators), sim.dt) == (mj.nq, mj.nv, mj.nu, mj.opt.timestep)
    np.testing.assert_allclose(sim.model.gravity.linear, mj.opt.gravity)
    # masses body by body (bodies welded together share one pinocchio joint)
    model = sim.model
    per_joint = np.zeros(model.njoints)
    for b in range(1, mj.nbody):
        frame = model.frames[model.getFrameId(mujoco.mj_id2name(mj, mujoco.mjtObj.mjOBJ_BODY, b))]
        per_joint[frame.parentJoint] += mj.body_mass[b]
    np.testing.assert_allclose([I.mass for I in model.inertias][1:], per_joint[1:], rtol=1e-9)
    np.testing.assert_allclose(sim.sm.damping, mj.dof_damping)        # same dof order
    np.testing.assert_allclose(sim.sm.model.armature, mj.dof_armature)   # (the file's model)
    limits = {(lim.joint, lim.sign): lim.bound for lim in sim.sm.limits}
    mj_limits = {}
    for j in np.flatnonzero(mj.jnt_limited):
        jname = mujoco.mj_id2name(mj, mujoco.mjtObj.mjOBJ_JOINT, j)
        mj_limits[(jname, 1.0)], mj_limits[(jname, -1.0)] = mj.jnt_range[j]
    assert limits == pytest.approx(mj_limits)
    for a, k in zip(sim.actuators, range(mj.nu)):
        assert a.gear == mj.actuator_gear[k, 0]
        assert a.ctrlrange == tuple(mj.actuator_ctrlrange[k])
    # simulate two seconds under random controls (billiards: a 3 m/s break)
    rng = np.random.default_rng(0)
    q, v = sim.q0, np.zeros(sim.nv)
    if name == "billiards.xml":
        v[0] = 3.0
    worst = 0.0
    for _ in range(int(round(2.0 / sim.dt))):
        tau = sim.actuation(rng.uniform(-1, 1, len(sim.actuators))) if sim.actuators else np.zeros(sim.nv)
        q, v = sim.step(q, v, tau)
        assert np.isfinite(q).all() and np.isfinite(v).all()
        if sim.last.num_contacts:
            worst = max(worst, -float(sim.last.contact_distances.min()))
            assert sim.last.converged
    assert worst < 1e-3


def test_asset_specifics():
    cart = diffgym.Simulator.from_file(asset_path("cartpole.xml"))
    assert len(cart.sm.limits) == 2 and len(cart.sm.pairs) == 0          # hard rail, no contacts
    assert {lim.joint for lim in cart.sm.limits} == {"slider"}
    hop = diffgym.Simulator.from_file(asset_path("hopper.xml"))
    assert set(hop.sm.friction) == {0.9} and hop.dt == 0.002
    assert [a.gear for a in hop.actuators] == [200.0] * 3
    bil = diffgym.Simulator.from_file(asset_path("billiards.xml"))
    assert bil.nq == 16 * 7 and bil.dt == 0.04
    assert {bil.sm.geoms[i].kind for i in range(len(bil.sm.geoms))} == {"plane", "box", "sphere"}
    push = diffgym.Simulator.from_file(asset_path("push.xml"))
    assert push.dt == 0.04 and len(push.actuators) == 3
    # the box on its face touches the table and the rod; the rod never touches the table
    assert pair_names(push) == {frozenset(("table", "box")), frozenset(("rod", "box"))}


def test_billiards_break_at_paper_time_step():
    """The cue ball at 3 m/s into the rack, 4 s at dt = 0.04: nothing sinks, flies or overlaps."""
    sim = diffgym.Simulator.from_file(asset_path("billiards.xml"))
    r = sim.sm.geoms[sim.geom_id("cue")].size[0]
    q, v = sim.q0, np.zeros(sim.nv)
    v[0] = 3.0
    for _ in range(100):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.converged
    P = q.reshape(16, 7)[:, :3]
    assert np.abs(P[:, 2] - r).max() < 1e-6                              # on the table
    gaps = np.linalg.norm(P[:, None] - P[None], axis=-1) + np.eye(16) - 2 * r
    assert gaps.min() > -1e-6                                            # no overlap
    assert np.abs(P[:, 0]).max() < 1.3 and np.abs(P[:, 1]).max() < 0.7  # inside the cushions
    assert np.linalg.norm(P[1:, :2] - sim.q0.reshape(16, 7)[1:, :2], axis=1).max() > 0.05  # a break


def test_push_rod_moves_the_box():
    sim = diffgym.Simulator.from_file(asset_path("push.xml"))
    q, v = sim.q0, np.zeros(sim.nv)
    box = sim.model.joints[sim.joint_id("box")].idx_q
    x0 = q[box]
    for _ in range(25):                                                  # 1 s pushing along +x
        q, v = sim.step(q, v, sim.actuation([1.0, 0.0, 0.0]))
    assert q[box] > x0 + 0.1 and abs(q[box + 2] - 0.05) < 1e-6


# -- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    ("<mujoco><worldbody><body><geom type='sphere' size='0.1'", "not valid XML"),
    ("<mujoco><worldbody><geom type='torus' size='1'/></worldbody></mujoco>", "unsupported geom type 'torus'"),
    ("<mujoco><worldbody><geom type='hfield' size='1'/></worldbody></mujoco>", r"type='hfield': height-field geom \[geom.hfield\]"),
    ("<mujoco><worldbody><geom type='box' size='1 1'/></worldbody></mujoco>", "box needs 3 positive size"),
    ("<mujoco><worldbody><geom type='sphere' size='-1'/></worldbody></mujoco>", "sphere needs 1 positive size"),
    ("<mujoco><worldbody><geom class='nope' type='sphere' size='1'/></worldbody></mujoco>", "unknown default class 'nope'"),
    ("<mujoco><worldbody><body childclass='nope'><joint type='hinge'/><geom size='1'/></body></worldbody></mujoco>",
     "unknown default class 'nope'"),
    ("<mujoco><worldbody><body><joint type='screw'/><geom size='1'/></body></worldbody></mujoco>", "unsupported type 'screw'"),
    ("<mujoco><worldbody><geom type='sphere' size='abc'/></worldbody></mujoco>", "expected numbers"),
    ("<mujoco><worldbody><body><joint type='hinge' range='1 0'/><geom size='1'/></body></worldbody></mujoco>", "range lower"),
    ("<mujoco><worldbody><geom size='1'/></worldbody><contact><exclude body1='x' body2='world'/></contact></mujoco>",
     "unknown body 'x'"),
    ("<mujoco><worldbody/><actuator><motor joint='nope'/></actuator></mujoco>", "unknown joint 'nope'"),
    ("<mujoco><option gravity='0 -9.81'/><worldbody/></mujoco>", "expected 3 numbers"),
    ("<robot/>", "expected <mujoco>"),
])
def test_bad_model_strings(bad, match):
    with pytest.raises(diffgym.ModelError, match=match):
        diffgym.Simulator.from_string(bad)


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        diffgym.Simulator.from_file(tmp_path / "missing.xml")
    with pytest.raises(FileNotFoundError):
        diffgym.Simulator.from_file(tmp_path / "missing.urdf")
    broken = tmp_path / "broken.xml"
    broken.write_text("<mujoco><worldbody><body></mujoco>")
    with pytest.raises(diffgym.ModelError, match=r"broken\.xml: not valid XML"):
        diffgym.Simulator.from_file(broken)
    other = tmp_path / "model.obj"
    other.write_text("x")
    with pytest.raises(diffgym.ModelError, match="unknown model format"):
        diffgym.Simulator.from_file(other)
    mesh = tmp_path / "mesh.xml"
    mesh.write_text("<mujoco><asset><mesh name='m' file='nope.stl'/></asset><worldbody>"
                    "<body><freejoint/><geom type='mesh' mesh='m'/></body></worldbody></mujoco>")
    with pytest.raises(diffgym.ModelError, match="not found"):
        diffgym.Simulator.from_file(mesh)
    with pytest.raises(TypeError, match="str"):
        diffgym.Simulator.from_string(b"<mujoco/>")


@pytest.mark.parametrize("dt", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_time_step(dt):
    with pytest.raises(ValueError, match="dt must be"):
        diffgym.Simulator.from_string(FILTERS, dt=dt)
    if np.isfinite(dt):                                    # the same from the file's <option>
        with pytest.raises(ValueError, match="dt must be"):
            diffgym.Simulator.from_string(f"<mujoco><option timestep='{dt}'/><worldbody/></mujoco>")


@pytest.mark.filterwarnings("ignore:Casting complex values")   # numpy's, before the TypeError
def test_bad_step_inputs():
    sim = diffgym.Simulator.from_string("""<mujoco><worldbody><geom type="plane" size="5 5 .1"/>
      <body name="a" pos="0 0 0.1"><freejoint/><geom type="sphere" size="0.1"/>
        <body name="arm"><joint type="hinge" axis="1 0 0"/><geom type="capsule" fromto="0 0 0 0 0 .3" size=".02"/></body></body>
      <body name="b" pos="1 0 0.1"><freejoint/><geom type="box" size="0.1 0.1 0.1"/></body></worldbody></mujoco>""")
    nq, nv = sim.nq, sim.nv
    q, v, tau = sim.q0, np.zeros(nv), np.zeros(nv)
    sim.step(list(q), [0] * nv, np.zeros(nv, dtype=np.int64))          # lists and ints are fine
    with pytest.raises(ValueError, match=rf"q must have shape \({nq},\)"):
        sim.step(q[:-1], v, tau)
    with pytest.raises(ValueError, match=rf"v must have shape \({nv},\)"):
        sim.step(q, np.zeros(nv + 1), tau)
    with pytest.raises(ValueError, match=rf"tau must have shape \({nv},\)"):
        sim.step(q, v, np.zeros((nv, 1)))
    with pytest.raises(ValueError, match=r"tau must have shape"):
        sim.step(q, v, 0.0)
    with pytest.raises(TypeError, match="tau must be"):
        sim.step(q, v, ["a"] * nv)
    with pytest.raises(TypeError, match="v must be real"):
        sim.step(q, v + 1j, tau)
    with pytest.raises((TypeError, ValueError), match="q must"):
        sim.step(None, v, tau)
    for which, arr in (("q", q), ("v", v), ("tau", tau)):
        for bad_value in (np.nan, np.inf, -np.inf):
            bad = arr.copy()
            bad[2] = bad_value
            args = {"q": q, "v": v, "tau": tau, which: bad}
            with pytest.raises(ValueError, match=rf"{which} contains NaN or inf at index \[2\]"):
                sim.step(args["q"], args["v"], args["tau"])
    qq = q.copy()
    qq[3:7] = [0, 0, 0, 2.0]
    with pytest.raises(ValueError, match="unit norm"):
        sim.step(qq, v, tau)
    q1, v1 = sim.step(q, v, tau)                                         # still usable
    assert np.isfinite(q1).all() and np.isfinite(v1).all()


def test_bad_urdf_settings():
    with pytest.raises(TypeError, match="URDF files only"):
        diffgym.Simulator.from_file(asset_path("cartpole.xml"), floating_base=False)
