"""Issue 15: ``<connect site1 site2>`` and ``<weld site1 site2>`` (MuJoCo's site form: the sites'
positions, or frames, coincide), against the closed form and MuJoCo; malformed site equalities
and mocap bodies refused by name with their line."""
import re
import warnings

import numpy as np
import pytest

import diffgym
from test_constraints import _parallelogram_theta, loop_xml


def site_loop_xml(dt=1e-3, connect_attrs="", sc="0 0 -0.5"):
    """The parallelogram four-bar of test_constraints, closed by sites: ``sb`` on body b at
    (1, 0, 0) in its frame, ``sc`` on body c (the same world point at qpos0 when ``sc`` is
    0 0 -0.5)."""
    xml = loop_xml(dt).replace('<connect body1="b" body2="c" anchor="1 0 0" />',
                               f'<connect site1="sb" site2="sc" {connect_attrs}/>')
    xml = xml.replace('mass="0"/></body></body>', 'mass="0"/><site name="sb" pos="1 0 0"/>'
                      '</body></body>', 1)
    xml = xml.replace('mass="0"/></body></worldbody>', f'mass="0"/><site name="sc" pos="{sc}"/>'
                      '</body></worldbody>', 1)
    assert xml.count("<site") == 2 and "site1" in xml
    return xml


def run(xml, dt, q0, T=1.0):
    sim = diffgym.Simulator.from_string(xml)
    q, v = np.array(q0, float), np.zeros(3)
    qs = [q]
    for _ in range(int(round(T / dt))):
        q, v = sim.step(q, v, np.zeros(3))
        assert sim.last.converged
        qs.append(q)
    return np.array(qs)


def test_connect_sites_closed_form():
    """The site-closed loop is the anchor-closed loop: constraint kept to rounding, the 1-dof
    closed form followed with the step's first-order error (1.44e-3 rad at dt 1 ms)."""
    qs = run(site_loop_xml(), 1e-3, [0.6, -0.6, 0.6])
    viol = np.abs(qs[:, 0] + qs[:, 1]).max() + np.abs(qs[:, 2] - qs[:, 0]).max()
    assert viol < 1e-9
    assert np.abs(qs[:, 0] - _parallelogram_theta(0.6, 1.0, 1e-3)).max() < 3e-3


def test_connect_sites_pull_together_like_mujoco():
    """Sites apart at qpos0: the constraint is that their positions coincide (MuJoCo's site
    semantics), not that site1's initial point stays put in body2. Against MuJoCo on the same
    file with a stiff connect (solref 2 dt): joint angles agree to 1e-2 rad over 1 s (measured
    5.2e-3: the two engines' pull from 4 cm apart differs, then the phase), and both bring the
    sites together (1.1e-6 m left in diffgym, the velocity-level row's drift on this curved
    path; 1.6e-6 m in MuJoCo)."""
    mujoco = pytest.importorskip("mujoco")
    xml = site_loop_xml(1e-3, sc="0 0 -0.45")
    m = mujoco.MjModel.from_xml_string(site_loop_xml(1e-3, 'solref="0.002 1"', sc="0 0 -0.45"))
    d = mujoco.MjData(m)
    d.qpos[:] = [0.6, -0.6, 0.6]
    sim = diffgym.Simulator.from_string(xml)
    q, v = np.array([0.6, -0.6, 0.6]), np.zeros(3)
    data = sim.model.createData()
    import pinocchio as pin

    def gap(q):       # |sb - sc| in the world, from diffgym's kinematics
        pin.forwardKinematics(sim.model, data, q)
        pb = data.oMi[2].act(np.array([1.0, 0, 0]))
        pc = data.oMi[3].act(np.array([0, 0, -0.45]))
        return float(np.linalg.norm(pb - pc))

    assert gap(q) > 0.04
    err = 0.0
    for _ in range(1000):
        mujoco.mj_step(m, d)
        q, v = sim.step(q, v, np.zeros(3))
        err = max(err, float(np.abs(d.qpos - q).max()))
    assert gap(q) < 1e-5
    mujoco.mj_kinematics(m, d)
    assert np.linalg.norm(d.site_xpos[0] - d.site_xpos[1]) < 1e-5
    assert err < 1e-2, err


WELD_SITES = """<mujoco><option timestep="0.002"/><worldbody>
 <site name="w" pos="0.35 0.45 0.55" euler="0 0 TURN"/>
 <body name="box" pos="0.3 0.5 0.5"><freejoint name="box"/>
  <geom type="box" size="0.1 0.1 0.1"/><site name="s" pos="0.05 -0.05 0.05"/></body>
</worldbody>
<equality><weld site1="s" site2="w"/></equality></mujoco>"""


def test_weld_sites_hold_the_frames_together():
    """A free box whose site is welded to a world site that coincides with it at qpos0: held
    still under gravity. The world site turned 20 degrees about z: the box turns until the
    site frames coincide (the site weld's target is their coincidence, not the qpos0 offset),
    and stays there under gravity."""
    import pinocchio as pin
    sim = diffgym.Simulator.from_string(WELD_SITES.replace("TURN", "0"))
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    q0 = q.copy()
    for _ in range(200):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.converged
    np.testing.assert_allclose(q, q0, atol=1e-12)
    sim = diffgym.Simulator.from_string(WELD_SITES.replace("TURN", "20"))
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    data = sim.model.createData()
    for _ in range(1000):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.converged
    pin.forwardKinematics(sim.model, data, q)
    P = data.oMi[sim.model.njoints - 1] * pin.SE3(np.eye(3), np.array([0.05, -0.05, 0.05]))
    np.testing.assert_allclose(P.translation, [0.35, 0.45, 0.55], atol=1e-6)
    np.testing.assert_allclose(P.rotation, pin.utils.rpyToMatrix(0, 0, np.radians(20)), atol=1e-6)
    assert np.abs(v).max() < 1e-6
    # MuJoCo's semantics for the same file: its (soft) weld brings the site frames together too,
    # up to its sag under gravity (measured 2e-4 m, 7.5e-3 rad)
    mujoco = pytest.importorskip("mujoco")
    m = mujoco.MjModel.from_xml_string(WELD_SITES.replace("TURN", "20"))
    d = mujoco.MjData(m)
    for _ in range(3000):
        mujoco.mj_step(m, d)
    assert np.linalg.norm(d.site_xpos[0] - d.site_xpos[1]) < 1e-3
    Rrel = d.site_xmat[0].reshape(3, 3) @ d.site_xmat[1].reshape(3, 3).T
    assert np.arccos(np.clip((np.trace(Rrel) - 1) / 2, -1, 1)) < 1e-2


BAD = [
    ("only site1", '<connect site1="sb"/>', r"site1 and site2 go together \(missing site2\)"),
    ("unknown site", '<connect site1="sb" site2="nope"/>', r"unknown site site2='nope'"),
    ("sites and bodies", '<connect site1="sb" site2="sc" body1="b"/>',
     r"site1/site2 with body1 \(give either sites or bodies\)"),
    ("weld torquescale", '<weld site1="sb" site2="sc" torquescale="2"/>',
     r"torquescale='2' is not supported"),
]


@pytest.mark.parametrize("name, element, message", BAD, ids=[b[0] for b in BAD])
def test_bad_site_equality_named_with_line(name, element, message):
    xml = site_loop_xml().replace('<connect site1="sb" site2="sc" />', "\n" + element + "\n")
    line = 1 + next(i for i, ln in enumerate(xml.splitlines()) if element in ln)
    with pytest.raises(diffgym.ModelError, match=f"<string>:{line}: <equality><" + message[:0]) \
            as info:
        diffgym.Simulator.from_string(xml)
    assert re.search(message, str(info.value)), str(info.value)


MOCAP = """<mujoco><worldbody>
<geom name="floor" type="plane" size="5 5 .1"/>
<body name="target" mocap="true" pos="0 0 0.5"><geom type="box" size="0.1 0.1 0.1"/></body>
<body name="ball" pos="0 0 1"><freejoint/><geom type="sphere" size="0.1"/></body>
</worldbody></mujoco>"""


def test_mocap_body_left_in_place_holds_the_ball():
    """A mocap body whose pose is never set stays where the file puts it (MuJoCo's behaviour
    while mocap_pos is never written): the ball lands on it. The old key ``body.mocap`` is still
    accepted by ignore_unsupported (it ignores nothing now: mocap bodies are simulated,
    tests/test_mocap.py)."""
    for kw in ({}, {"ignore_unsupported": ("body.mocap",)}):
        sim = diffgym.Simulator.from_string(MOCAP, **kw)
        assert sim.mocap_names == ("target",)
        q, v = sim.q0.copy(), np.zeros(sim.nv)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(600):
                q, v = sim.step(q, v, np.zeros(sim.nv))
        assert q[2] == pytest.approx(0.7, abs=2e-3)      # resting on the box top (0.6) + radius
