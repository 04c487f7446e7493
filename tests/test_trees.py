"""Per-tree dynamics (diffgym.sim.trees): a scene of many independent trees is stepped with one
small pinocchio Model/Data per group of trees. Oracle: pinocchio on the whole model (the
single-model path) and central differences of the step."""
import warnings

import numpy as np
import pinocchio as pin
import pytest

import diffgym.sim.trees as trees_mod
from diffgym import Simulator
from diffgym.gradcheck import check_step_jacobians
from diffgym.sim.pinviews import gather_placements
from diffgym.sim.trees import TreeGroups, group_ranges

# an arm of two hinges on the world (one tree), a column of two boxes, a box leaning on the
# arm's reach and two balls, one resting against a box (contacts between trees)
SCENE = """<mujoco model="trees"><option timestep="0.005" gravity="0 0 -9.81"/>
<default><geom friction="0.6"/></default>
<worldbody>
  <geom name="floor" type="plane" size="0 0 1"/>
  <body name="arm" pos="0.6 0 0.3"><joint name="h1" type="hinge" axis="0 1 0" damping="0.1"/>
    <geom name="l1" type="capsule" fromto="0 0 0 0 0 -0.2" size="0.03" mass="0.4"/>
    <body name="fore" pos="0 0 -0.2"><joint name="h2" type="hinge" axis="0 1 0"/>
      <geom name="l2" type="capsule" fromto="0 0 0 -0.05 0 -0.05" size="0.03" mass="0.3"/>
    </body>
  </body>
  <body name="b0" pos="0 0 0.05"><freejoint/><geom name="g0" type="box" size="0.05 0.05 0.05" mass="0.5"/></body>
  <body name="b1" pos="0.002 0.001 0.151" euler="0 0 7"><freejoint/><geom name="g1" type="box" size="0.05 0.05 0.05" mass="0.5"/></body>
  <body name="b2" pos="0.45 0 0.06"><freejoint/><geom name="g2" type="box" size="0.06 0.04 0.06" mass="0.7"/></body>
  <body name="s0" pos="0 0.1 0.05"><freejoint/><geom name="s0" type="sphere" size="0.05" mass="0.2"/></body>
  <body name="s1" pos="-0.2 0 0.08"><freejoint/><geom name="s1" type="sphere" size="0.04" mass="0.1"/></body>
</worldbody></mujoco>"""


def _single(monkeypatch):
    """A simulator of SCENE on the single-model path (one whole-model Data)."""
    monkeypatch.setattr(trees_mod, "MAX_GROUP_NV", 10 ** 9)
    sim = Simulator.from_string(SCENE)
    monkeypatch.undo()
    assert sim._trees is None
    return sim


def test_groups_hold_whole_trees():
    sim = Simulator.from_string(SCENE)
    model = sim.model
    assert sim._trees is not None and len(sim._trees) == 3
    spans = [(g.v0, g.v1) for g in sim._trees.groups]
    assert spans == [(0, 8), (8, 20), (20, 32)]       # arm + box, two boxes, two balls
    for g in sim._trees.groups:
        for j in range(g.j0, g.j1):                    # every parent inside the group or world
            assert model.parents[j] == 0 or g.j0 <= model.parents[j] < g.j1
    # one tree (a robot) or a small model: one group, the whole model
    assert len(group_ranges(model, 10 ** 9)) == 1


def test_group_dynamics_equal_the_whole_model():
    """Kinematics, geometry placements, ABA, M^-1, ABA derivatives: bit for bit pinocchio's
    on the whole model, at a random state."""
    sim = Simulator.from_string(SCENE)
    model = sim.model
    data = model.createData()
    tg = TreeGroups(model)
    rng = np.random.default_rng(3)
    q = pin.integrate(model, sim.q0, rng.normal(size=model.nv))
    v, tau = rng.normal(size=model.nv), rng.normal(size=model.nv)
    pin.forwardKinematics(model, data, q, v)
    pin.computeJointJacobians(model, data)
    kin = tg.kinematics(q, v)
    assert np.array_equal(kin.J, data.J)
    assert np.array_equal(kin.oM, gather_placements(data, np.empty((model.njoints, 12))))
    g1, g2 = pin.GeometryData(sim.geom_model), pin.GeometryData(sim.geom_model)
    pin.updateGeometryPlacements(model, data, sim.geom_model, g1)
    tg.geometry_placements(sim.geom_model, g2)
    for a, b in zip(g1.oMg, g2.oMg):
        assert np.allclose(a.homogeneous, b.homogeneous, rtol=0, atol=1e-15)
    assert np.array_equal(tg.aba(q, v, tau), pin.aba(model, data, q, v, tau))
    Minv = pin.computeMinverse(model, data, q).copy()
    assert np.array_equal(np.triu(tg.minverse(q)), np.triu(Minv))
    fext = rng.normal(size=(model.njoints, 6))
    fext[0] = 0.0
    fv = pin.StdVec_Force()
    for f in fext:
        fv.append(pin.Force(f))
    ref = [x.copy() for x in pin.computeABADerivatives(model, data, q, v, tau, fv)]
    got = tg.aba_derivatives(q, v, tau, fext)
    for a, b in zip(ref[:2], got[:2]):
        assert np.array_equal(a, b)
    assert np.array_equal(np.triu(ref[2]), np.triu(got[2]))
    pin.computeForwardKinematicsDerivatives(model, data, q, v, tau)
    kin = tg.kinematics_derivatives(q, v, tau)
    assert np.array_equal(kin.ov, np.array([data.ov[j].vector for j in range(model.njoints)]))


def test_trajectory_and_jacobians_equal_single_model(monkeypatch):
    """The tree-by-tree step gives the single-model step's trajectory and Jacobians."""
    one = _single(monkeypatch)
    many = Simulator.from_string(SCENE)
    rng = np.random.default_rng(0)
    q = q1 = many.q0.copy()
    v = v1 = np.zeros(many.nv)
    contacts = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for k in range(30):
            tau = 0.3 * rng.normal(size=many.nv)
            q, v, ja = one.step(q, v, tau, jacobian=True)
            q1, v1, jb = many.step(q1, v1, tau, jacobian=True)
            contacts += many.last.num_contacts
            assert np.array_equal(q, q1) and np.array_equal(v, v1), k
            for name in ("dq_dq", "dq_dv", "dq_dtau", "dv_dq", "dv_dv", "dv_dtau"):
                a, b = getattr(ja, name), getattr(jb, name)
                assert np.allclose(a, b, rtol=1e-12, atol=1e-12), (k, name)
    assert contacts > 30 * 4                      # the bodies touch the floor and each other
    assert "_data" not in many.__dict__           # no whole-model pinocchio Data was made


# balls against balls and an arm, on a floor (pairs whose contact derivatives are closed forms)
BALLS = """<mujoco model="balls"><option timestep="0.005" gravity="0 0 -9.81"/>
<default><geom friction="0.6"/></default>
<worldbody>
  <geom name="floor" type="plane" size="0 0 1"/>
  <body name="arm" pos="0.2 0 0.3"><joint name="h1" type="hinge" axis="0 1 0"/>
    <geom name="l1" type="capsule" fromto="0 0 0 0 0 -0.2" size="0.03" mass="0.4"/>
  </body>
  <body name="s0" pos="0 0 0.05"><freejoint/><geom name="s0" type="sphere" size="0.05" mass="0.2"/></body>
  <body name="s1" pos="0.1 0.0 0.05"><freejoint/><geom name="s1" type="sphere" size="0.05" mass="0.2"/></body>
  <body name="s2" pos="0 0.1 0.05"><freejoint/><geom name="s2" type="sphere" size="0.05" mass="0.3"/></body>
</worldbody></mujoco>"""


def test_tree_jacobians_match_central_differences():
    sim = Simulator.from_string(BALLS)
    assert sim._trees is not None and len(sim._trees) == 2
    rng = np.random.default_rng(1)
    acts = 0.5 * rng.normal(size=(10, sim.nv))
    rep = check_step_jacobians(sim, steps=10, actions=acts, max_states=2)
    assert rep.checked > 0 and rep.failed == 0, rep.table() if hasattr(rep, "table") else rep


def test_no_whole_model_data_for_a_pile(data_sizes):
    """Loading, stepping and differentiating a pile of 12 boxes never makes a pinocchio Data
    larger than a group (a whole-model Data is cubic in nv)."""
    from diffgym.bench_scaling import boxes_mjcf
    sizes = data_sizes
    sim = Simulator.from_string(boxes_mjcf(12))
    q, v = sim.q0, np.zeros(sim.nv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(3):
            q, v, _ = sim.step(q, v, np.zeros(sim.nv), jacobian=True)
    assert sim.last.num_contacts > 0
    assert sizes and max(sizes) <= trees_mod.MAX_GROUP_NV < sim.nv


def test_narrow_phase_tables_equal_pinocchio():
    """diffgym.sim.pair_tables does what pinocchio.computeCollision / computeContactPatch do with a
    GeometryData's per-pair objects: the same points, normals and depths, bit for bit."""
    from diffgym.bench_scaling import boxes_mjcf
    from diffgym.sim.collision_driver import GJK_TOLERANCE, tighten_requests
    from diffgym.sim.pair_tables import NarrowPhase
    sim = Simulator.from_string(boxes_mjcf(8))
    m, gm = sim.model, sim.geom_model
    d, gd = m.createData(), pin.GeometryData(gm)
    tighten_requests(gd.collisionRequests)
    nph = NarrowPhase(gm, sim.sm.pairs, GJK_TOLERANCE)
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(8):
        q = pin.integrate(m, sim.q0, 0.05 * rng.normal(size=m.nv))
        pin.forwardKinematics(m, d, q)
        pin.updateGeometryPlacements(m, d, gm, gd)
        nph.new_placements()
        for k in range(len(sim.sm.pairs)):
            gd.collisionRequests[k].enable_contact = True
            gd.collisionRequests[k].security_margin = 0.01
            req, res, pres = nph.slot(k)
            req.security_margin = 0.01
            hit = pin.computeCollision(gm, gd, k)
            assert nph.collide(k, gd) == hit
            if not hit:
                continue
            hits += 1
            pin.computeContactPatch(gm, gd, k)
            nph.patch(k, gd)
            a, b = gd.contactPatchResults[k], pres
            assert a.numContactPatches() == b.numContactPatches()
            if a.numContactPatches():
                pa, pb = a.getContactPatch(0), b.getContactPatch(0)
                assert pa.size() == pb.size()
                assert np.array_equal(pa.getNormal(), pb.getNormal())
                for i in range(pa.size()):
                    assert np.array_equal(pa.getPointShape1(i), pb.getPointShape1(i))
            ca, cb = gd.collisionResults[k].getContact(0), res.getContact(0)
            assert np.array_equal(ca.normal, cb.normal)
            assert ca.penetration_depth == cb.penetration_depth
    assert hits > 20
    # a scene of more candidate pairs than REGISTER_PAIRS_MAX keeps them out of the
    # GeometryModel (its GeometryData then has no per-pair tables) and still collides
    from diffgym.sim.pair_tables import REGISTER_PAIRS_MAX
    big = Simulator.from_string(boxes_mjcf(64))
    assert len(big.sm.pairs) > REGISTER_PAIRS_MAX and len(big.geom_model.collisionPairs) == 0
    big.step(big.q0, np.zeros(big.nv), np.zeros(big.nv))
    assert big.last.num_contacts >= 4 * 64 and big.last.converged
