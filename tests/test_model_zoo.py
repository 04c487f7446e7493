"""Models nobody here wrote: loaded right, or refused by name (file, line, element, attribute).

Every Gymnasium MuJoCo asset loads or is refused with the keys listed below, and with those
keys ignored its moving mass is MuJoCo's; every dm_control suite XML but the dog (with ``<include>``)
and example-robot-data robots; one crafted file per construct diffgym used to drop silently.
The simulation comparison over 3 s is the benchmark ``diffgym bench --zoo`` (README)."""
import glob
import os
import warnings

import numpy as np
import pytest

import diffgym
from diffgym.sim.unsupported import KEYS, RULES, UnsupportedIgnoredWarning

mujoco = pytest.importorskip("mujoco")

GYM = os.path.join(os.path.dirname(__import__("gymnasium").__file__), "envs", "mujoco", "assets")
GYM_REFUSED = {                               # what each Gymnasium asset asks for and diffgym lacks
    "ant.xml": {"option.integrator"},
    "half_cheetah.xml": set(),
    "hopper.xml": {"option.integrator"},
    "humanoid.xml": {"option.integrator"},
    "humanoidstandup.xml": {"option.integrator"},
    "inverted_double_pendulum.xml": {"option.integrator"},
    "inverted_pendulum.xml": {"option.integrator"},
    "point.xml": {"option.integrator"},
    "pusher.xml": set(),
    "pusher_v5.xml": set(),
    "reacher.xml": {"option.integrator"},
    "swimmer.xml": {"option.integrator", "option.fluid"},
    "walker2d.xml": {"option.integrator"},
    "walker2d_v5.xml": {"option.integrator"},
}


def load(path_or_text, *, ignore=None, string=False, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsupportedIgnoredWarning)
        if string:
            return diffgym.Simulator.from_string(path_or_text, ignore_unsupported=ignore, **kw)
        return diffgym.Simulator.from_file(path_or_text, ignore_unsupported=ignore, **kw)


def refused_keys(path):
    try:
        load(path)
    except diffgym.ModelError as exc:
        assert getattr(exc, "unsupported", ()), str(exc)       # a refusal, not another error
        return set(exc.unsupported)
    return set()


def moving_mass_mujoco(m):
    return float(sum(m.body_mass[b] for b in range(1, m.nbody) if m.body_weldid[b] != 0))


def moving_mass(sim):
    return float(sum(sim.model.inertias[j].mass for j in range(1, sim.model.njoints)))


# -- the zoo ---------------------------------------------------------------------------------------
def test_every_gymnasium_asset_is_listed():
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(GYM, "*.xml"))) == sorted(GYM_REFUSED)


@pytest.mark.parametrize("name", sorted(GYM_REFUSED))
def test_gymnasium_asset_loads_or_is_refused_by_name(name):
    path = os.path.join(GYM, name)
    keys = refused_keys(path)
    assert keys == GYM_REFUSED[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = diffgym.Simulator.from_file(path, ignore_unsupported=tuple(keys))
    said = [str(w.message) for w in caught if issubclass(w.category, UnsupportedIgnoredWarning)]
    assert bool(said) == bool(keys) and all(f"[{k}]" in said[0] for k in keys)
    m = mujoco.MjModel.from_xml_path(path)
    assert (sim.nq, sim.nv) == (m.nq, m.nv)
    assert moving_mass(sim) == pytest.approx(moving_mass_mujoco(m), rel=1e-9)
    assert sim.dt == m.opt.timestep


SUITE = pytest.importorskip("dm_control.suite") and os.path.dirname(
    __import__("dm_control.suite", fromlist=["x"]).__file__)


def test_dm_control_pendulum_with_includes_follows_mujoco():
    """The suite's pendulum (three <include>s of ./common/*.xml, <flag contact="disable">):
    kicked and simulated 1 s, the same trajectory as MuJoCo to rounding (no constraint acts:
    both take the same semi-implicit Euler step with the joint damping implicit)."""
    path = os.path.join(SUITE, "pendulum.xml")
    sim = load(path)
    m = mujoco.MjModel.from_xml_path(path)
    # (MuJoCo's default eulerdamp: joint damping implicit, as diffgym's)
    d = mujoco.MjData(m)
    q, v = m.qpos0.copy(), np.array([2.0])
    d.qvel[:] = v
    assert len(sim.sm.pairs) == 0
    for _ in range(int(1.0 / sim.dt)):
        q, v = sim.step(q, v, np.zeros(1))
        mujoco.mj_step(m, d)
    np.testing.assert_allclose(q, d.qpos, atol=1e-9)
    np.testing.assert_allclose(v, d.qvel, atol=1e-9)


SUITE_REFUSED = {                           # every suite XML: what it asks for and diffgym lacks
    "acrobot.xml": {"option.integrator"},
    "ball_in_cup.xml": {"tendon.spatial"},
    "cartpole.xml": {"option.integrator"},
    "cheetah.xml": set(),                       # <compiler settotalmass> is followed
    "finger.xml": set(),                        # joint frictionloss is simulated
    "fish.xml": {"option.fluid", "actuator.position"},
    "hopper.xml": set(),
    "humanoid.xml": set(),
    "humanoid_CMU.xml": set(),
    "lqr.xml": set(),
    "manipulator.xml": {"equality.tendon"},
    "pendulum.xml": set(),
    "point_mass.xml": set(),
    "quadruped.xml": {"geom.hfield", "equality.tendon", "actuator.dyntype", "actuator.biastype",
                      "geom.condim"},
    "reacher.xml": set(),
    "stacker.xml": {"equality.tendon"},
    "swimmer.xml": {"option.fluid"},
    "walker.xml": set(),
    # dog.xml ({"joint.springdamper", "actuator.dyntype", "geom.condim"}): its 162 mesh geoms
    # take minutes to load here; `diffgym bench --zoo` loads it (README's zoo table)
}


def test_every_dm_control_suite_xml_is_listed():
    found = sorted(os.path.basename(p) for p in glob.glob(os.path.join(SUITE, "*.xml")))
    assert [f for f in found if f != "dog.xml"] == sorted(SUITE_REFUSED)


@pytest.mark.parametrize("name", sorted(SUITE_REFUSED))
def test_dm_control_domains(name):
    keys = SUITE_REFUSED[name]
    path = os.path.join(SUITE, name)
    assert refused_keys(path) == keys
    sim = load(path, ignore=tuple(keys) or None)
    m = mujoco.MjModel.from_xml_path(path)
    assert moving_mass(sim) == pytest.approx(moving_mass_mujoco(m), rel=1e-9)


def test_robots():
    from diffgym.resources import example_robot_data_dir
    r = os.path.join(example_robot_data_dir(), "robots")
    solo = load(os.path.join(r, "solo_description/robots/solo12.urdf"))
    assert solo.nv == 18
    # the finger mimic is a coupling row, Talos's <dynamics friction> dry-friction rows
    panda = load(os.path.join(r, "panda_description/urdf/panda.urdf"))
    assert [(c.joint1, c.joint2) for c in panda.sm.constraint_spec.couplings] == [
        ("panda_finger_joint2", "panda_finger_joint1")]
    talos = load(os.path.join(r, "talos_data/robots/talos_reduced.urdf"))
    fl = talos.sm.constraint_spec.frictionloss
    assert fl[talos.model.joints[talos.joint_id("torso_1_joint")].idx_v] == 1.0
    # ANYmal C's URDF gives a camera link an inertia no rigid body has (MuJoCo refuses it too)
    with pytest.raises(diffgym.ModelError, match=r"anymal\.urdf:\d+: <link name='depth_camera_front_camera'> "
                                                 r"<inertial> <inertia>: violates the triangle inequality"):
        load(os.path.join(r, "anymal_c_simple_description/urdf/anymal.urdf"))


# -- crafted files: every construct diffgym used to drop silently ------------------------------------
def doc(body: str, head: str = "", tail: str = "") -> str:
    return f"""<mujoco>
{head}
<worldbody>
<geom name="floor" type="plane" size="5 5 .1"/>
<body name="a" pos="0 0 1">
  <joint name="ha" type="hinge" axis="0 1 0"/>
  <geom name="ga" type="capsule" fromto="0 0 0 0.3 0 0" size="0.05"/>
  <body name="b" pos="0.3 0 0">
    <joint name="hb" type="hinge" axis="0 1 0"/>
    <geom name="gb" type="capsule" fromto="0 0 0 0.3 0 0" size="0.05"/>
  </body>
</body>
{body}
</worldbody>
{tail}
</mujoco>"""


CRAFTED = [
    # (name, document, text on the offending element's line, expected text (regex) in the message)
    ("tendon spatial", doc('<site name="s0" pos="0 0 2"/>', tail='<tendon>\n<spatial name="sp" range="0 1">'
                           '<site site="s0"/><site site="s0"/></spatial>\n</tendon>'),
     '<spatial', r"<spatial name='sp'>: spatial tendon \[tendon\.spatial\]"),
    ("integrator RK4", doc("", head='<option timestep="0.002"\n integrator="RK4"/>'),
     '<option', r"<option> integrator='RK4': integrator other than semi-implicit Euler \[option\.integrator\]"),
    ("implicit integrator", doc("", head='<option integrator="implicitfast"/>'),
     '<option', r"integrator='implicitfast'.*\[option\.integrator\]"),
    ("pyramidal cone", doc("", head='<option cone="pyramidal"/>'),
     '<option', r"<option> cone='pyramidal': pyramidal friction cone .*\[option\.cone\]"),
    ("impratio", doc("", head='<option cone="elliptic" impratio="10"/>'),
     '<option', r"<option> impratio='10': .*\[option\.impratio\]"),
    ("fluid", doc("", head='<option viscosity="0.1"/>'),
     '<option', r"<option> viscosity='0\.1': fluid forces .*\[option\.fluid\]"),
    ("gravcomp", doc('<body name="c" pos="1 0 1" gravcomp="1">\n<freejoint/>\n<geom type="sphere" size="0.1"/></body>'),
     'name="c"', r"<body name='c'> gravcomp='1': gravity compensation \[body\.gravcomp\]"),
    ("torsional friction", doc('<body name="c" pos="1 0 0.1">\n<freejoint/>\n'
                               '<geom name="gc" type="sphere" size="0.1" condim="4"/></body>'),
     'name="gc"', r"<geom name='gc'> condim='4': torsional or rolling friction .*\[geom\.condim\]"),
    ("position actuator", doc("", tail='<actuator>\n<position name="p" joint="ha" kp="10"/>\n</actuator>'),
     '<position', r"<position name='p'>: position actuator .*\[actuator\.position\]"),
    ("actuator dynamics", doc("", tail='<actuator>\n<general name="g" joint="ha" dyntype="filter" dynprm="0.1"/>\n</actuator>'),
     '<general', r"<general name='g'> dyntype='filter': actuator activation dynamics \[actuator\.dyntype\]"),
    ("actuator bias", doc("", tail='<actuator>\n<general name="g" joint="ha" biastype="affine" biasprm="0 -1 0"/>\n</actuator>'),
     '<general', r"<general name='g'> biastype='affine': actuator bias force .*\[actuator\.biastype\]"),
    ("replicate", doc('<replicate count="3" offset="0.5 0 0">\n<body name="r" pos="2 0 1"><freejoint/>'
                      '<geom type="sphere" size="0.1"/></body></replicate>'),
     '<replicate', r"<replicate>: replicated bodies .*\[replicate\]"),
    ("attach", doc('<attach model="m" body="b" prefix="p"/>', head='<asset><model name="m" file="x.xml"/></asset>'),
     '<attach', r"<attach>: attached sub-model .*\[attach\]"),
    ("flexcomp in the worldbody", doc('<flexcomp name="f" type="grid" count="2 2 1" spacing="0.1 0.1 0.1" dim="2"/>'),
     '<flexcomp', r"<flexcomp name='f'>: deformable object \[flex\]"),
    ("height field", doc('<geom name="hf"\n type="hfield" hfield="terrain"/>',
                         head='<asset><hfield name="terrain" nrow="2" ncol="2" size="1 1 1 1"/></asset>'),
     'name="hf"', r"<geom name='hf'> type='hfield': height-field geom \[geom\.hfield\]"),
]


# constructs the loader used to drop silently and that are now simulated (diffgym.sim.equality):
# they load without a refusal or a warning and step
SIMULATED = [
    ("equality connect", doc("", tail='<equality>\n<connect body1="a" body2="b" anchor="0 0 0"/>\n</equality>'),
     '<connect', r"<connect>: equality constraint \(ball-joint loop closure\) \[equality\.connect\]"),
    ("equality weld", doc("", tail='<equality>\n<weld name="w" body1="a" body2="b"/>\n</equality>'),
     '<weld', r"<weld name='w'>: equality constraint \(weld\) \[equality\.weld\]"),
    ("equality joint", doc("", tail='<equality>\n<joint joint1="ha" joint2="hb"/>\n</equality>'),
     '<joint joint1', r"<joint>: equality constraint \(joint coupling\) \[equality\.joint\]"),
    ("tendon fixed", doc("", tail='<tendon>\n<fixed name="t"><joint joint="ha" coef="1"/></fixed>\n</tendon>'),
     '<fixed', r"<fixed name='t'>: fixed tendon .*\[tendon\.fixed\]"),
    ("frictionloss", doc('<body name="c" pos="1 0 1">\n<joint name="hc" type="slide" frictionloss="0.3"/>'
                         '\n<geom type="sphere" size="0.1"/></body>'),
     'name="hc"', r"<joint name='hc'> frictionloss='0.3': joint dry friction \[joint\.frictionloss\]"),
    ("frictionloss from a default class", doc(
        '<body name="c" pos="1 0 1">\n<joint name="hc" class="rough" type="slide"/>\n'
        '<geom type="sphere" size="0.1"/></body>',
        head='<default><default class="rough"><joint frictionloss="0.3"/></default></default>'),
     'name="hc"', r"<joint name='hc'> frictionloss='0.3'"),
    ("limited ball joint", doc('<body name="c" pos="1 0 1">\n<joint name="bc" type="ball" range="0 30"/>'
                               '\n<geom type="sphere" size="0.1"/></body>'),
     'name="bc"', r"<joint name='bc'> range='0 30': limit on a ball joint \[joint\.ball_range\]"),
    ("tendon transmission", doc("", tail='<tendon>\n<fixed name="t"><joint joint="ha" coef="1"/></fixed>\n'
                                '</tendon>\n<actuator>\n<motor name="m" tendon="t"/>\n</actuator>'),
     '<motor', r"<motor name='m'> tendon='t': actuator transmission other than a joint \[actuator\.transmission\]"),
    ("mocap body", doc('<body name="c" mocap="true" pos="0 0 0.5">\n<geom type="box" size="0.1 0.1 0.1"/>'
                       '</body>'), 'name="c"', r"mocap body"),
    ("balanceinertia", doc('<body name="c" pos="1 0 1">\n<freejoint/><geom type="sphere" size="0.1"/>'
                           '<inertial mass="1" diaginertia="1 1 3"/></body>',
                           head='<compiler balanceinertia="true"/>'), "balanceinertia",
     r"inertias rebalanced"),
]


@pytest.mark.parametrize("name, text, marker, message", SIMULATED, ids=[c[0] for c in SIMULATED])
def test_once_ignored_constructs_are_simulated(name, text, marker, message):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsupportedIgnoredWarning)
        sim = diffgym.Simulator.from_string(text)
    q, v = sim.q0, np.zeros(sim.nv)
    for _ in range(5):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    assert np.isfinite(q).all() and sim.last.converged


def line_of(text: str, marker: str) -> int:
    return 1 + next(i for i, ln in enumerate(text.splitlines()) if marker in ln)


@pytest.mark.parametrize("name, text, marker, message", CRAFTED, ids=[c[0] for c in CRAFTED])
def test_refused_by_name_with_line(name, text, marker, message):
    line = line_of(text, marker)
    with pytest.raises(diffgym.ModelError) as info:
        diffgym.Simulator.from_string(text)
    msg = str(info.value)
    assert f"<string>:{line}: " in msg, msg
    assert __import__("re").search(message, msg), msg
    key = message.rsplit("[", 1)[1].rstrip("]").replace("\\", "") if "[" in message else None
    if key:
        assert key in info.value.unsupported and repr(info.value.unsupported) in msg
        # loads when the user accepts the difference, saying what was left out
        with pytest.warns(UnsupportedIgnoredWarning, match=f"<string>:{line}: "):
            sim = diffgym.Simulator.from_string(text, ignore_unsupported=info.value.unsupported)
        sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))


def test_file_line_of_included_file(tmp_path):
    """A refusal inside an included file names that file and its line."""
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "eq.xml").write_text('<mujoco>\n\n<actuator>\n<position joint="ha" kp="1"/>\n</actuator>\n</mujoco>')
    main = tmp_path / "main.xml"
    main.write_text(doc("", tail='<include file="parts/eq.xml"/>'))
    with pytest.raises(diffgym.ModelError, match=r"parts[/\\]eq\.xml:4: <position>: .*\[actuator\.position\]"):
        diffgym.Simulator.from_file(main)


@pytest.mark.parametrize("snippet, marker, message", [
    ('<body name="c" pos="1 0 1">\n<freejoint/>\n<geom name="gc" type="sphere" size="0.1" friction="-0.5"/></body>',
     'friction=', r"<geom name='gc'>: friction must be >= 0, got friction='-0.5'"),
    ('<body name="c" pos="1 0 1">\n<freejoint/>\n<geom type="sphere" size="0.1"/>\n'
     '<inertial pos="0 0 0" mass="1" diaginertia="1 1 3"/></body>',
     '<inertial', r"<body name='c'> <inertial>: diaginertia='1 1 3' violates the triangle inequality"),
    ('<body name="c" pos="1 0 1">\n<freejoint/>\n<geom type="sphere" size="0.1"/>\n'
     '<inertial pos="0 0 0" mass="1" diaginertia="0 1 1"/></body>',
     '<inertial', r"<body name='c'> <inertial>: diaginertia='0 1 1' is not positive definite"),
    ('<body name="c" pos="1 0 1">\n<freejoint/>\n<geom name="gc" type="sphere" pos="0 nan 0" size="0.1"/></body>',
     'nan', r"<geom name='gc'>: pos='0 nan 0' is not finite"),
    ('<body name="c" pos="1 0 1">\n<freejoint/>\n<geom name="gc" type="box" size="0.1 inf 0.1"/></body>',
     'inf', r"<geom name='gc'>: size='0.1 inf 0.1' is not finite"),
    ('<body name="c" pos="1 0 1" quat="1 0 nan 0">\n<freejoint/>\n<geom type="sphere" size="0.1"/></body>',
     'nan', r"<body name='c'>: quat='1 0 nan 0' is not finite"),
    ('<body name="c" pos="1 0 1">\n<joint name="sc" type="slide"\n range="1 -1"/>\n<geom type="sphere" size="0.1"/></body>',
     'name="sc"', r"<joint name='sc'>: range lower 1.0 >= upper -1.0"),
    ('<body name="c" pos="1 0 1">\n<joint name="sc" type="slide"/>\n<geom type="sphere" size="0.1" density="0"/></body>',
     'name="sc"', r"<body name='c'>.*joint 'sc' .* has a zero diagonal"),
    ('<body name="c" pos="1 0 1">\n<freejoint/>\n<geom name="gc" type="sphere" size="0.1" mass="-1"/></body>',
     'mass=', r"<geom name='gc'>: mass must be finite and >= 0"),
    ('<body name="c" pos="1 0 1">\n<joint name="sc" type="slide"\n damping="-1"/>\n<geom type="sphere" size="0.1"/></body>',
     'name="sc"', r"<joint name='sc'>: damping must be finite and >= 0, got damping='-1'"),
    ('<body name="c" pos="1 0 1">\n<joint name="sc" type="hinge" stiffness="-3"/>\n<geom type="sphere" size="0.1"/></body>',
     'name="sc"', r"<joint name='sc'>: stiffness must be finite and >= 0"),
    ('<body name="c" pos="1 0 1">\n<joint name="sc" type="hinge" armature="-0.1"/>\n<geom type="sphere" size="0.1"/></body>',
     'name="sc"', r"<joint name='sc'>: armature must be finite and >= 0"),
    ('<body name="c" pos="1 0 1">\n<joint name="sc" type="hinge" frictionloss="-1"/>\n<geom type="sphere" size="0.1"/></body>',
     'name="sc"', r"<joint name='sc'>: frictionloss must be finite and >= 0"),
    ('<body name="c" pos="1 0 1">\n<joint name="bc" type="ball" range="0 -30"/>\n<geom type="sphere" size="0.1"/></body>',
     'name="bc"', r"<joint name='bc'>: a ball joint's range must be '0 max'"),
])
def test_bad_values_named_with_line(snippet, marker, message):
    line = line_of(doc(snippet), marker)
    with pytest.raises(diffgym.ModelError) as info:
        diffgym.Simulator.from_string(doc(snippet))
    msg = str(info.value)
    assert f"<string>:{line}: " in msg and __import__("re").search(message, msg), msg
    assert not getattr(info.value, "unsupported", ())          # bad input: not ignorable


# -- <include> ---------------------------------------------------------------------------------------
def test_include_relative_to_including_file(tmp_path):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "robot.xml").write_text(
        '<mujoco><worldbody><body name="r" pos="0 0 1"><freejoint/>'
        '<geom type="sphere" size="0.1" material="m"/></body></worldbody>'
        '<include file="deeper/mat.xml"/></mujoco>')
    (tmp_path / "sub" / "deeper" / "mat.xml").write_text(
        '<mujoco><asset><material name="m" rgba="1 0 0 1"/></asset>'
        '<default><geom friction="0.3"/></default></mujoco>')
    main = tmp_path / "scene.xml"
    main.write_text('<mujoco><include file="sub/robot.xml"/><worldbody>'
                    '<geom type="plane" size="1 1 .1"/></worldbody></mujoco>')
    sim = diffgym.Simulator.from_file(main)
    assert sim.nq == 7 and sim.sm.friction.tolist() == [0.3, 0.3]
    text = main.read_text()
    assert diffgym.Simulator.from_string(text, str(tmp_path)).nq == 7
    m = mujoco.MjModel.from_xml_path(str(main))        # MuJoCo reads the same (from the main dir)
    assert m.nq == 7


def test_include_errors(tmp_path):
    main = tmp_path / "main.xml"
    main.write_text('<mujoco>\n<worldbody/>\n<include file="nope.xml"/>\n</mujoco>')
    with pytest.raises(diffgym.ModelError, match=r"main\.xml:3: <include file='nope\.xml'>: file not found"):
        diffgym.Simulator.from_file(main)
    (tmp_path / "a.xml").write_text('<mujoco><include file="b.xml"/></mujoco>')
    (tmp_path / "b.xml").write_text('<mujoco><include file="a.xml"/></mujoco>')
    main.write_text('<mujoco><worldbody/><include file="a.xml"/></mujoco>')
    with pytest.raises(diffgym.ModelError, match=r"include cycle .*a\.xml -> .*b\.xml -> .*a\.xml"):
        diffgym.Simulator.from_file(main)
    main.write_text('<mujoco><worldbody/><include file="main.xml"/></mujoco>')
    with pytest.raises(diffgym.ModelError, match="include cycle"):
        diffgym.Simulator.from_file(main)
    (tmp_path / "robot.xml").write_text('<robot name="x"/>')
    main.write_text('<mujoco><worldbody/><include file="robot.xml"/></mujoco>')
    with pytest.raises(diffgym.ModelError, match=r"robot\.xml: included file's root element is <robot>"):
        diffgym.Simulator.from_file(main)
    evil = '<?xml version="1.0"?><!DOCTYPE m [<!ENTITY a "aaaa">]><mujoco><worldbody/></mujoco>'
    with pytest.raises(diffgym.ModelError, match="document type declarations"):
        diffgym.Simulator.from_string(evil)


# -- ignore_unsupported --------------------------------------------------------------------------------
def test_ignore_unsupported_names():
    text = doc("", head='<option integrator="RK4"/>',
               tail='<actuator><position joint="ha" kp="1"/><velocity joint="hb" kv="1"/></actuator>')
    with pytest.raises(diffgym.ModelError) as info:
        diffgym.Simulator.from_string(text, ignore_unsupported=("actuator",))   # a prefix: both kinds
    assert info.value.unsupported == ("option.integrator",)
    with pytest.warns(UnsupportedIgnoredWarning, match=r"\[actuator\.position\](.|\n)*\[actuator\.velocity\]"):
        sim = diffgym.Simulator.from_string(text, ignore_unsupported=("actuator", "option.integrator"))
    assert sim.nv == 2
    with pytest.raises(ValueError, match="unknown name 'tendons'"):
        diffgym.Simulator.from_string(text, ignore_unsupported=("tendons",))
    import copy
    assert copy.deepcopy(sim).nv == 2                     # the setting is part of the recipe
    assert len(KEYS) == len(set(r.key for r in RULES))


def test_flags_and_condim_follow_mujoco():
    """<flag contact/gravity disable> are followed; a condim-1 pair is frictionless; a geom of
    higher priority gives the pair its friction (as MuJoCo's contacts report them)."""
    xml = """<mujoco><worldbody><geom name="floor" type="plane" size="5 5 .1" friction="0.8"/>
      <body name="a" pos="0 0 0.09"><freejoint/><geom name="ga" type="sphere" size="0.1" condim="1" friction="0.5"/></body>
      <body name="b" pos="1 0 0.09"><freejoint/><geom name="gb" type="sphere" size="0.1" priority="1" friction="0.3"/></body>
      <body name="c" pos="2 0 0.09"><freejoint/><geom name="gc" type="sphere" size="0.1" friction="0.6"/></body>
      <body name="e" pos="0 0.15 0.09"><freejoint/><geom name="ge" type="sphere" size="0.1" condim="1" friction="0.9"/></body>
      </worldbody><contact><pair geom1="gc" geom2="floor" condim="1"/></contact></mujoco>"""
    sim = diffgym.Simulator.from_string(xml)
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    mj = {}
    for c in d.contact[:d.ncon]:
        names = frozenset(mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_GEOM, g) for g in (c.geom1, c.geom2))
        mj[names] = 0.0 if c.dim == 1 else float(c.friction[0])
    ours = {frozenset((sim.sm.geoms[a].name, sim.sm.geoms[b].name)): float(sim.sm.pair_friction[k])
            for k, (a, b) in enumerate(sim.sm.pairs)}
    assert len(mj) == 5 and {p: ours[p] for p in mj} == mj
    assert ours[frozenset(("ga", "ge"))] == 0.0           # both condim 1: frictionless
    assert ours[frozenset(("floor", "ga"))] == 0.8        # condim max(1, 3) = 3, friction max
    assert ours[frozenset(("floor", "gb"))] == 0.3        # priority: gb's own
    assert ours[frozenset(("floor", "gc"))] == 0.0        # the <pair>'s condim 1
    off = xml.replace("<worldbody>", '<option><flag contact="disable" gravity="disable"/></option><worldbody>', 1)
    sim = diffgym.Simulator.from_string(off)
    assert len(sim.sm.pairs) == 0 and np.all(sim.model.gravity.linear == 0)


# -- URDF ------------------------------------------------------------------------------------------------
URDF = """<?xml version="1.0"?>
<robot name="r">
  <link name="base">
    <inertial><origin xyz="0 0 0"/><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><geometry><box size="0.1 0.1 0.1"/></geometry></collision>
  </link>
  <link name="arm">
    <inertial><origin xyz="0 0 0.1"/><mass value="MASS"/><inertia ixx="IXX" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><origin xyz="ORIGIN"/><geometry><sphere radius="0.05"/></geometry></collision>
  </link>
  <joint name="j" type="revolute">
    <parent link="base"/><child link="arm"/><axis xyz="0 1 0"/>
    <limit lower="LO" upper="1" effort="1" velocity="1"/>EXTRA
  </joint>
</robot>"""


@pytest.mark.parametrize("subs, message", [
    ({"MASS": "-1"}, r"r\.urdf:8: <link name='arm'> <inertial> <mass>: value must be >= 0"),
    ({"IXX": "0.05"}, r"r\.urdf:8: <link name='arm'> <inertial> <inertia>: violates the triangle inequality"),
    ({"ORIGIN": "0 nan 0"}, r"r\.urdf:9: <collision> <origin>: xyz='0 nan 0' is not finite"),
    ({"LO": "2"}, r"r\.urdf:13: <joint name='j'> <limit>: lower 2.0 > upper 1.0"),
    ({"EXTRA": '\n<dynamics damping="0.1" friction="-0.5"/>'},
     r"r\.urdf:14: <joint name='j'> <dynamics>: friction must be >= 0, got '-0.5'"),
    ({"EXTRA": '\n<mimic joint="j"/>'}, r"r\.urdf:14: <joint name='j'> <mimic joint='j'>: a joint cannot mimic itself"),
])
def test_urdf_checks(tmp_path, subs, message):
    text = URDF
    for k, v in {"MASS": "0.5", "IXX": "0.01", "ORIGIN": "0 0 0.1", "LO": "-1", "EXTRA": "", **subs}.items():
        text = text.replace(k, v)
    path = tmp_path / "r.urdf"
    path.write_text(text)
    with pytest.raises(diffgym.ModelError, match=message):
        diffgym.Simulator.from_file(path)
    ok = URDF
    for k, v in {"MASS": "0.5", "IXX": "0.01", "ORIGIN": "0 0 0.1", "LO": "-1", "EXTRA": ""}.items():
        ok = ok.replace(k, v)
    path.write_text(ok)
    assert diffgym.Simulator.from_file(path).nv == 7
    with pytest.raises(diffgym.ModelError, match="friction must be finite and >= 0"):
        diffgym.Simulator.from_file(path, friction=-1.0)
