"""Model loading as MuJoCo reads it, and clear errors for bad input."""
import numpy as np
import pytest

import diffgym
from diffgym.resources import asset_path

BALL = """<mujoco><option timestep="0.005" gravity="0 0 -3"/><worldbody>
<geom name="floor" type="plane" size="5 5 .1" friction="0.3"/>
<body name="a" pos="0 0 1"><freejoint/><geom name="ga" type="sphere" size="0.1" friction="0.7"/>
  <body name="a_child" pos="0 0 0.3"><joint type="hinge" axis="1 0 0"/><geom name="gc" type="sphere" size="0.1"/></body>
</body>
<body name="b" pos="1 0 1"><freejoint/><geom name="gb" type="sphere" size="0.1" contype="2" conaffinity="2"/></body>
<body name="c" pos="2 0 1"><freejoint/><geom name="gcc" type="capsule" fromto="0 0 0 0 0 0.2" size="0.05"/></body>
</worldbody><contact><exclude body1="a" body2="c"/></contact></mujoco>"""


def names(sim):
    return {(sim.sm.geoms[a].name, sim.sm.geoms[b].name) for a, b in sim.sm.pairs}


def test_mjcf_option_friction_filters_and_several_bodies():
    sim = diffgym.Simulator.from_string(BALL)
    assert sim.dt == 0.005
    np.testing.assert_allclose(sim.model.gravity.linear, [0, 0, -3])
    assert sim.nq == 7 * 3 + 1
    pairs = names(sim)
    assert ("floor", "ga") in pairs and ("floor", "gc") in pairs and ("floor", "gcc") in pairs
    assert ("ga", "gc") not in pairs                     # parent-child
    assert not any("gb" in p for p in pairs)             # contype 2 meets conaffinity 1: none
    assert ("ga", "gcc") not in pairs and ("gc", "gcc") in pairs   # <exclude body1=a body2=c>
    k = [i for i, (a, b) in enumerate(sim.sm.pairs) if {sim.sm.geoms[a].name, sim.sm.geoms[b].name} == {"floor", "ga"}][0]
    assert sim.sm.pair_friction[k] == 0.7                # the larger of the two
    assert sim.dt == diffgym.Simulator.from_string(BALL, dt=0.001).dt * 5


def test_hopper_masses_match_mujoco():
    mujoco = pytest.importorskip("mujoco")
    path = asset_path("hopper_gymnasium.xml")
    mj = mujoco.MjModel.from_xml_path(path)
    sim = diffgym.Simulator.from_file(path)
    total = sum(I.mass for I in sim.model.inertias)
    assert abs(total - mj.body_mass.sum()) < 1e-9 * total
    assert sim.dt == mj.opt.timestep
    assert len(sim.sm.limits) == 2 * 3                   # three limited hinges


@pytest.mark.parametrize("bad, match", [
    ("<mujoco><worldbody><body><geom type='sphere' size='0.1'", "not valid XML"),
    ("<mujoco><worldbody><geom type='torus' size='1'/></worldbody></mujoco>", "unsupported geom type 'torus'"),
    ("<mujoco><worldbody><geom type='box' size='1 1'/></worldbody></mujoco>", "box needs 3 positive size"),
    ("<mujoco><worldbody><geom class='nope' type='sphere' size='1'/></worldbody></mujoco>", "unknown default class 'nope'"),
    ("<robot/>", "expected <mujoco>"),
])
def test_bad_model_files(bad, match):
    with pytest.raises(diffgym.ModelError, match=match):
        diffgym.Simulator.from_string(bad)


def test_bad_files_and_settings(tmp_path):
    with pytest.raises(FileNotFoundError):
        diffgym.Simulator.from_file(tmp_path / "missing.xml")
    p = tmp_path / "model.obj"
    p.write_text("x")
    with pytest.raises(diffgym.ModelError, match="unknown model format"):
        diffgym.Simulator.from_file(p)
    for dt in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="dt must be"):
            diffgym.Simulator.from_string(BALL, dt=dt)


def test_bad_step_inputs():
    sim = diffgym.Simulator.from_string(BALL)
    q, v, tau = sim.q0, np.zeros(sim.nv), np.zeros(sim.nv)
    with pytest.raises(ValueError, match=r"q must have shape \(22,\)"):
        sim.step(q[:-1], v, tau)
    with pytest.raises(ValueError, match=r"tau must have shape \(19,\)"):
        sim.step(q, v, np.zeros((19, 1)))
    bad = v.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match=r"v contains NaN or inf at index \[3\]"):
        sim.step(q, bad, tau)
    with pytest.raises(TypeError, match="tau must be"):
        sim.step(q, v, ["a"] * sim.nv)
    qq = q.copy()
    qq[3:7] = [0, 0, 0, 2.0]
    with pytest.raises(ValueError, match="unit norm"):
        sim.step(qq, v, tau)
