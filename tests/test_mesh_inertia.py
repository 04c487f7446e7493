"""Mesh mass and inertia follow MuJoCo's rules for the same file (``<mesh inertia>``: legacy by
default, convex, exact, shell) and the compiler's ``boundmass``/``boundinertia``; checked against
closed forms (an L-shaped prism, concave) and against MuJoCo's body_mass/body_inertia."""
import os
import warnings

import numpy as np
import pytest

import diffgym
from diffgym.sim.mesh_inertia import mesh_mass_properties

mujoco = pytest.importorskip("mujoco")

H = 0.5           # the prism's height; its profile is a U: a 3 x 1 bar and two unit posts
U_PROFILE = [(0, 0), (3, 0), (3, 2), (2, 2), (2, 1), (1, 1), (1, 2), (0, 2)]
U_CAP = [(0, 1, 4), (0, 4, 5), (1, 2, 3), (1, 3, 4), (0, 5, 6), (0, 6, 7)]   # counter-clockwise


def u_prism():
    """Vertices and outward triangles of the U-shaped prism: concave, and not star-shaped from
    its centre of mass (the posts' inner faces are seen from behind)."""
    n = len(U_PROFILE)
    V = [(x, y, 0.0) for x, y in U_PROFILE] + [(x, y, H) for x, y in U_PROFILE]
    F = []
    for a, b, c in U_CAP:
        F.append((a, c, b))                               # bottom, normal -z
        F.append((n + a, n + b, n + c))                   # top, normal +z
    for i in range(n):
        j = (i + 1) % n
        F += [(i, j, n + j), (i, n + j, n + i)]
    return np.array(V, float), np.array(F)


def write_obj(path, V, F):
    with open(path, "w") as f:
        f.writelines(f"v {float(x)!r} {float(y)!r} {float(z)!r}\n" for x, y, z in V)
        f.writelines(f"f {a + 1} {b + 1} {c + 1}\n" for a, b, c in F)


def body_inertia_mujoco(m, b):
    """(mass, com, full inertia about com) of body b in its frame."""
    R = np.zeros(9)
    mujoco.mju_quat2Mat(R, m.body_iquat[b])
    R = R.reshape(3, 3)
    return m.body_mass[b], m.body_ipos[b], R @ np.diag(m.body_inertia[b]) @ R.T


def body_inertia_diffgym(sim):
    """(mass, com, inertia about com) of the model's one moving body (a free body at the
    origin: its inertia sits on the last joint, whose frame is the body's)."""
    Y = sim.model.inertias[sim.model.njoints - 1]
    return Y.mass, np.asarray(Y.lever), np.asarray(Y.inertia)


def load_both(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = diffgym.Simulator.from_file(str(path))
    return sim, mujoco.MjModel.from_xml_path(str(path))


def test_u_prism_closed_form():
    V, F = u_prism()
    vol, com, I = mesh_mass_properties(V, F, "exact")
    assert vol == pytest.approx(5 * H, rel=1e-14)
    np.testing.assert_allclose(com, [1.5, 0.9, H / 2], atol=1e-14)
    # three box prisms about the common centre of mass (parallel axes)
    Iref = np.zeros((3, 3))
    for (cx, cy), (a, b) in (((1.5, 0.5), (3, 1)), ((0.5, 1.5), (1, 1)), ((2.5, 1.5), (1, 1))):
        m = a * b * H
        Ic = m / 12 * np.diag([b * b + H * H, a * a + H * H, a * a + b * b])
        d = np.array([cx, cy, H / 2]) - com
        Iref += Ic + m * (d @ d * np.eye(3) - np.outer(d, d))
    np.testing.assert_allclose(I, Iref, atol=1e-13)
    # legacy counts the faces seen from behind positively: more than the mesh (5H here)
    assert mesh_mass_properties(V, F, "legacy")[0] > 5 * H * (1 + 1e-3)


DOG = os.path.join(os.path.dirname(__import__("dm_control").__file__), "suite", "dog_assets") \
    if __import__("importlib").util.find_spec("dm_control") else None


@pytest.mark.parametrize("mode", ["default", "legacy", "exact", "convex", "shell"])
@pytest.mark.parametrize("mesh", ["u_prism", "dog_vertebra"])
def test_mesh_body_follows_mujoco(tmp_path, mesh, mode):
    if mesh == "u_prism":
        write_obj(tmp_path / "u.obj", *u_prism())
        file, meshdir, scale = "u.obj", str(tmp_path), "-0.2 0.3 0.25"   # (mirrored)
    else:
        if DOG is None:
            pytest.skip("dm_control is not installed")
        file, meshdir, scale = "BONEC_1.stl", DOG, "1 1 1"     # a non-convex bone
    inertia = "" if mode == "default" else f' inertia="{mode}"'
    (tmp_path / "m.xml").write_text(f"""<mujoco>
  <compiler meshdir="{meshdir}"/>
  <asset><mesh name="m" file="{file}" scale="{scale}"{inertia}/></asset>
  <worldbody><body name="b"><freejoint/>
    <geom type="mesh" mesh="m" density="1100" pos="0.1 -0.2 0.05" euler="20 -35 50"/>
    <geom type="sphere" size="0.01" pos="0.3 0 0"/>
  </body></worldbody>
</mujoco>""")
    sim, m = load_both(tmp_path / "m.xml")
    mass, com, I = body_inertia_diffgym(sim)
    mass_mj, com_mj, I_mj = body_inertia_mujoco(m, 1)
    assert mass == pytest.approx(mass_mj, rel=1e-9)
    np.testing.assert_allclose(com, com_mj, atol=1e-9 * np.linalg.norm(com_mj) + 1e-12)
    np.testing.assert_allclose(I, I_mj, atol=1e-8 * np.abs(I_mj).max())


def test_legacy_differs_from_the_hull_on_a_concave_mesh(tmp_path):
    """The rule matters: MuJoCo's default (legacy) mass of the concave prism is neither the
    mesh's nor its hull's, and diffgym now gives MuJoCo's."""
    write_obj(tmp_path / "u.obj", *u_prism())
    masses = {}
    for mode in ("legacy", "exact", "convex"):
        (tmp_path / "m.xml").write_text(f"""<mujoco><asset><mesh name="m" file="u.obj"
          inertia="{mode}"/></asset><worldbody><body><freejoint/><geom type="mesh" mesh="m"
          density="1"/></body></worldbody></mujoco>""")
        sim, m = load_both(tmp_path / "m.xml")
        masses[mode] = body_inertia_diffgym(sim)[0]
        assert masses[mode] == pytest.approx(m.body_mass[1], rel=1e-12)
    assert masses["exact"] == pytest.approx(5 * H, rel=1e-12)
    assert masses["convex"] == pytest.approx(6 * H, rel=1e-12)       # hull: the 3 x 2 block
    assert abs(masses["legacy"] - masses["exact"]) > 1e-3 and \
        abs(masses["legacy"] - masses["convex"]) > 1e-3


def test_bad_mesh_inertia_named_with_line(tmp_path):
    write_obj(tmp_path / "u.obj", *u_prism())
    (tmp_path / "m.xml").write_text("""<mujoco>
  <asset>
    <mesh name="m" file="u.obj" inertia="solid"/>
  </asset><worldbody/></mujoco>""")
    with pytest.raises(diffgym.ModelError, match=r"m\.xml:3: <mesh name='m'>: inertia='solid'"):
        diffgym.Simulator.from_file(str(tmp_path / "m.xml"))
    # a mesh whose faces are inside out: MuJoCo refuses 'exact'; so does diffgym, by name
    V, F = u_prism()
    write_obj(tmp_path / "u.obj", V, F[:, [0, 2, 1]])
    (tmp_path / "m.xml").write_text("""<mujoco>
  <asset>
    <mesh name="m" file="u.obj" inertia="exact"/>
  </asset><worldbody><body><freejoint/><geom type="mesh" mesh="m"/></body></worldbody></mujoco>""")
    with pytest.raises(ValueError):
        mujoco.MjModel.from_xml_path(str(tmp_path / "m.xml"))
    with pytest.raises(diffgym.ModelError, match=r"m\.xml:3: <mesh name='m'> inertia='exact': "
                       r"mesh volume is negative"):
        diffgym.Simulator.from_file(str(tmp_path / "m.xml"))


def test_boundmass_boundinertia_follow_mujoco(tmp_path, monkeypatch):
    """A massless link, a light thin rod and an explicit <inertial> under the compiler's bounds,
    with settotalmass after them, as MuJoCo compiles them."""
    monkeypatch.chdir(tmp_path)        # (MuJoCo logs settotalmass's deprecation to the cwd)
    xml = """<mujoco>
  <compiler boundmass="0.05" boundinertia="0.002" settotalmass="3"/>
  <worldbody><body name="a"><joint type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.01"/>
      <body name="b" pos="0.1 0 -0.5" euler="10 0 0"><joint type="hinge" axis="1 0 0"/>
        <body name="c" pos="0 0.1 0" euler="0 0 30"><joint type="slide" axis="0 0 1"/>
          <inertial pos="0.01 0 0" mass="2" diaginertia="0.001 0.2 0.2"/>
        </body></body></body></worldbody>
</mujoco>"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = diffgym.Simulator.from_string(xml)
    m = mujoco.MjModel.from_xml_string(xml)
    for j, b in ((1, 1), (2, 2), (3, 3)):          # one joint per body here
        Y = sim.model.inertias[j]
        mass, com, I = body_inertia_mujoco(m, b)
        assert Y.mass == pytest.approx(mass, rel=1e-12)
        np.testing.assert_allclose(Y.lever, com, atol=1e-12)
        np.testing.assert_allclose(Y.inertia, I, atol=1e-12)
    assert m.body_mass[2] > 0 and np.any(m.body_ipos[2] != 0) and m.body_mass.sum() == \
        pytest.approx(3)
    # (the massless link got the bound, scaled by settotalmass; MuJoCo places it at the body's
    # own pos, read in its frame: followed, so the same file gives the same model)


def test_boundmass_without_boundinertia_on_a_massless_body_refused():
    xml = """<mujoco><compiler boundmass="0.05"/><worldbody>
<body name="a"><joint type="hinge" axis="0 1 0"/><geom type="sphere" size=".1"/>
  <body name="b" pos="0 0 -0.5"><joint type="hinge" axis="1 0 0"/></body></body>
</worldbody></mujoco>"""
    with pytest.raises(ValueError):
        mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(diffgym.ModelError, match=r"<string>:3: <body name='b'>: no mass of its "
                       r"own: <compiler boundmass> gives it a mass but no inertia"):
        diffgym.Simulator.from_string(xml)


@pytest.mark.parametrize("ref", ['refpos="1 0.2 0.3"', 'refquat="0.8 0.2 0.4 0.4"',
                                 'refpos="1 0.2 0.3" refquat="0.8 0.2 0.4 0.4"'])
def test_mesh_refpos_refquat_follow_mujoco(tmp_path, ref):
    """``<mesh refpos refquat>``: the mesh's vertices are read in its reference frame, S R^-1 (v -
    refpos) with the (non-uniform) scale S applied last, as MuJoCo does: the body's mass, centre
    of mass and inertia, and where the collision shape sits in the world, agree with MuJoCo."""
    import pinocchio as pin
    write_obj(tmp_path / "u.obj", *u_prism())
    (tmp_path / "m.xml").write_text(f"""<mujoco>
  <asset><mesh name="m" file="u.obj" scale="1.5 0.5 1" {ref}/></asset>
  <worldbody><body name="b" pos="0.1 0.2 0.3" euler="10 20 30"><freejoint/>
    <geom name="g" type="mesh" mesh="m" pos="0.3 0 0" euler="0 40 0" density="900"/>
  </body></worldbody></mujoco>""")
    sim, m = load_both(tmp_path / "m.xml")
    mass, com, I = body_inertia_diffgym(sim)
    mass_mj, com_mj, I_mj = body_inertia_mujoco(m, 1)
    assert mass == pytest.approx(mass_mj, rel=1e-9)
    np.testing.assert_allclose(com, com_mj, atol=1e-9)
    np.testing.assert_allclose(I, I_mj, atol=1e-8 * np.abs(I_mj).max())
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    a, n = m.mesh_vertadr[0], m.mesh_vertnum[0]
    V_mj = d.geom_xpos[0] + m.mesh_vert[a:a + n] @ d.geom_xmat[0].reshape(3, 3).T
    data = sim.model.createData()
    pin.forwardKinematics(sim.model, data, sim.q0)
    gdata = pin.GeometryData(sim.geom_model)
    pin.updateGeometryPlacements(sim.model, data, sim.geom_model, gdata)
    hull = sim.geom_model.geometryObjects[0].geometry
    P = np.asarray(hull.points(), dtype=float).reshape(-1, 3)
    V = gdata.oMg[0].translation + P @ gdata.oMg[0].rotation.T
    # (MuJoCo stores the vertices in float32)
    np.testing.assert_allclose(V.min(axis=0), V_mj.min(axis=0), atol=1e-6)
    np.testing.assert_allclose(V.max(axis=0), V_mj.max(axis=0), atol=1e-6)
    plain = (tmp_path / "m.xml").read_text().replace(ref, "")
    (tmp_path / "p.xml").write_text(plain)
    assert abs(body_inertia_diffgym(load_both(tmp_path / "p.xml")[0])[1] - com).max() > 0.1


def test_exactmeshinertia_reads_as_exact(tmp_path):
    """``<compiler exactmeshinertia="true">`` (MuJoCo before 3.2; MuJoCo 4 no longer parses it):
    every mesh without its own ``inertia`` takes the exact rule, which MuJoCo gives for
    ``inertia="exact"``; "false" is the legacy default; another value is refused with its line."""
    write_obj(tmp_path / "u.obj", *u_prism())

    def doc(compiler, inertia=""):
        return f"""<mujoco><compiler {compiler}/>
  <asset><mesh name="m" file="u.obj"{inertia}/></asset><worldbody><body><freejoint/>
  <geom type="mesh" mesh="m" density="1"/></body></worldbody></mujoco>"""

    (tmp_path / "mj.xml").write_text(doc("", ' inertia="exact"'))
    exact_mj = mujoco.MjModel.from_xml_path(str(tmp_path / "mj.xml")).body_mass[1]
    masses = {}
    for key, compiler, inertia in (("exact", 'exactmeshinertia="true"', ""),
                                   ("legacy", 'exactmeshinertia="false"', ""),
                                   ("own", 'exactmeshinertia="true"', ' inertia="convex"')):
        (tmp_path / "m.xml").write_text(doc(compiler, inertia))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            masses[key] = body_inertia_diffgym(diffgym.Simulator.from_file(
                str(tmp_path / "m.xml")))[0]
    assert masses["exact"] == pytest.approx(exact_mj, rel=1e-12) == pytest.approx(5 * H)
    assert masses["legacy"] > 5 * H * (1 + 1e-3)
    assert masses["own"] == pytest.approx(6 * H, rel=1e-12)
    (tmp_path / "m.xml").write_text(doc('exactmeshinertia="yes"'))
    with pytest.raises(diffgym.ModelError, match=r"m\.xml:1: <compiler exactmeshinertia='yes'>"):
        diffgym.Simulator.from_file(str(tmp_path / "m.xml"))


@pytest.mark.parametrize("inertia", ['diaginertia="1 1 3"', 'fullinertia="1 1 3 0.2 0 0"',
                                     'diaginertia="1 2 2.5"'])
def test_balanceinertia_follows_mujoco(inertia):
    """``<compiler balanceinertia="true">``: principal moments breaking A + B >= C become their
    mean, as MuJoCo's body_inertia; without it such a body is refused with its line, naming the
    option; a valid inertia is left as it is."""
    xml = ('<mujoco><compiler balanceinertia="{}"/><worldbody><body><freejoint/>\n'
           f'<inertial pos="0 0 0" mass="1" {inertia}/></body></worldbody></mujoco>')
    m = mujoco.MjModel.from_xml_string(xml.format("true"))
    sim = diffgym.Simulator.from_string(xml.format("true"))
    I_mj = body_inertia_mujoco(m, 1)[2]
    np.testing.assert_allclose(body_inertia_diffgym(sim)[2], I_mj, atol=1e-12)
    if "2.5" in inertia:
        diffgym.Simulator.from_string(xml.format("false"))
        return
    with pytest.raises(diffgym.ModelError, match=r"<string>:2: .*triangle inequality.*"
                       r"balanceinertia"):
        diffgym.Simulator.from_string(xml.format("false"))


@pytest.mark.parametrize("rng", ["0 2", "3 3", "0 5"])
def test_inertiagrouprange_follows_mujoco(rng):
    """``<compiler inertiagrouprange>``: only geoms whose group is in the range give a body its
    mass and inertia (MuJoCo's body_mass / body_inertia on the same file); the others still
    collide. A range that leaves a body without mass is refused like any massless body."""
    xml = (f'<mujoco><compiler inertiagrouprange="{rng}"/><worldbody>\n'
           '<body pos="0 0 1"><freejoint/><geom type="box" size="0.1 0.2 0.05" pos="0.1 0 0"/>\n'
           '<geom type="sphere" size="0.1" pos="-0.2 0.1 0" group="3" density="3000"/>\n'
           '<geom type="capsule" size="0.03 0.1" group="1" euler="30 0 0"/></body>\n'
           '</worldbody></mujoco>')
    m = mujoco.MjModel.from_xml_string(xml)
    sim = diffgym.Simulator.from_string(xml)
    mass, com, I = body_inertia_diffgym(sim)
    mass_mj, com_mj, I_mj = body_inertia_mujoco(m, 1)
    assert mass == pytest.approx(mass_mj, rel=1e-12)
    np.testing.assert_allclose(com, com_mj, atol=1e-12)
    np.testing.assert_allclose(I, I_mj, atol=1e-12)
    assert len(sim.geom_model.geometryObjects) == 3          # (every geom collides)


def test_inertiagrouprange_bad_values_refused():
    for bad in ("2 1", "0", "0.5 3", "a b"):
        xml = (f'<mujoco><compiler inertiagrouprange="{bad}"/><worldbody><body><freejoint/>'
               '<geom size="0.1"/></body></worldbody></mujoco>')
        with pytest.raises(diffgym.ModelError, match="inertiagrouprange"):
            diffgym.Simulator.from_string(xml)
    xml = ('<mujoco><compiler inertiagrouprange="1 2"/><worldbody><body><freejoint/>'
           '<geom size="0.1"/></body></worldbody></mujoco>')
    with pytest.raises(diffgym.ModelError, match="mass"):
        diffgym.Simulator.from_string(xml)
