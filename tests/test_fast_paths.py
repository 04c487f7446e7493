"""The shortcuts of the forward step give the results of the general code they stand in for:
batched shape-on-plane contacts, the mesh-on-plane broad phase, the lazy ``sim.last`` and the
array warm start."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym.sim.collision_driver import CollisionDriver
from diffgym.sim.frames import tangent_frames
from diffgym.resources import asset_path

SHAPES = """<mujoco><option timestep="0.002"/><worldbody>
<geom name="floor" type="plane" size="5 5 .1"/>
<body name="thin" pos="0 0 0.3"><freejoint/><geom type="box" size="0.1 0.07 0.0004" mass="1"/></body>
<body name="box" pos="1 0 0.3"><freejoint/><geom type="box" size="0.05 0.08 0.1" mass="1"/></body>
<body name="cap" pos="0 1 0.3"><freejoint/><geom type="capsule" size="0.03 0.1" mass="1"/></body>
<body name="cyl" pos="1 1 0.3"><freejoint/><geom type="cylinder" size="0.05 0.1" mass="1"/></body>
<body name="ball" pos="2 1 0.3"><freejoint/><geom type="sphere" size="0.05" mass="1"/></body>
</worldbody></mujoco>"""


def _random_state(sim, rng, height):
    # (pinocchio's generator seeded from rng: unseeded, its draws depended on what the process
    # ran before, so a test's states, and whether they met a pair whose witness point coal
    # chooses by its warm start, changed with the test files run before it)
    pin.seed(int(rng.integers(2**31)))
    q = pin.randomConfiguration(sim.model, -np.ones(sim.nq), np.ones(sim.nq))
    for j in range(1, sim.model.njoints):
        jm = sim.model.joints[j]
        if jm.shortname() == "JointModelTranslation":
            q[jm.idx_q + 2] = rng.uniform(*height)
        if jm.shortname() == "JointModelSpherical" and rng.random() < 0.3:
            q[jm.idx_q:jm.idx_q + 4] = [0, 0, 0, 1]     # flat: several points at one depth
    return q, rng.normal(0.0, 3.0, sim.nv)


@pytest.mark.parametrize("max_points,speeds_from_jacobians", [(1, False), (2, False), (4, False),
                                                               (8, False), (4, True), (1, True)])
def test_compiled_plane_contacts_equal_the_pair_by_pair_ones(max_points, speeds_from_jacobians):
    """The compiled pass (collision_kernels.plane_points) against plane_contacts.shape_points
    pair by pair through the broad phase: the same points, in the same order."""
    sim = diffgym.Simulator.from_string(SHAPES)
    fast = CollisionDriver(sim.sm, max_points=max_points)
    ref = CollisionDriver(sim.sm, max_points=max_points, batch_plane_pairs=False)
    assert len(fast._bp[0]) == 4 and not len(ref._bp[0])     # 2 boxes, capsule, sphere
    # (each its own GeometryData: coal warm-starts GJK from a pair's previous call)
    gdata = pin.GeometryData(sim.geom_model)
    for req in gdata.collisionRequests:
        req.enable_contact = True
    rng = np.random.default_rng(0)
    found = set()
    for _ in range(300):
        q, v = _random_state(sim, rng, (-0.05, 0.15))
        pin.forwardKinematics(sim.model, sim.data, q, v)
        pin.computeJointJacobians(sim.model, sim.data)
        pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, sim.geom_data)
        pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, gdata)
        a = fast.detect(sim.data, sim.geom_data, sim.dt, v if speeds_from_jacobians else None)
        b = ref.detect(sim.data, gdata, sim.dt)
        found.update(sim.sm.geoms[int(g)].kind for g in b.geom2)
        for f in ("pair", "geom1", "geom2", "point", "mu"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
        # the ball against a box: closed form (sphere_box_pairs) here, coal's in the reference
        sb = np.isin(a.pair, fast._sb[0])
        np.testing.assert_array_equal(a.normal[~sb], b.normal[~sb])
        for f, atol in (("normal", 1e-12), ("pos", 1e-12), ("dist", 1e-12), ("pos", 1e-14), ("dist", 1e-14)):
            rows = sb if atol > 1e-13 else ~sb
            np.testing.assert_allclose(getattr(a, f)[rows], getattr(b, f)[rows], rtol=0, atol=atol, err_msg=f)
        if a.frames is not None:           # (None: computed from the normals later)
            np.testing.assert_array_equal(a.frames[~sb], tangent_frames(a.normal[~sb]))
            np.testing.assert_allclose(a.frames[sb], tangent_frames(a.normal[sb]), rtol=0, atol=1e-15)
    assert {"sphere", "capsule", "box", "cylinder"} <= found


def test_mesh_broad_phase_keeps_every_colliding_pair():
    """The convex-hull bound prunes a mesh-plane pair only when coal finds no collision."""
    sim = diffgym.Simulator.from_file(asset_path("ur5.urdf"), floating_base=False)
    cd = sim.collision
    assert cd._hp_mesh
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(200):
        q = rng.uniform(-np.pi, np.pi, sim.nq)
        v = rng.normal(0.0, 2.0, sim.nv)
        pin.forwardKinematics(sim.model, sim.data, q, v)
        pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, sim.geom_data)
        c = cd.detect(sim.data, sim.geom_data, sim.dt)
        found = set(c.pair.tolist())
        margin = cd.base_margin + sim.dt * cd.speed_bounds(sim.data)[cd.pairs].sum(axis=1)
        for k, _, _, _, _ in cd._hp_mesh:
            req = sim.geom_data.collisionRequests[k]
            req.security_margin = float(margin[k])
            if pin.computeCollision(sim.geom_model, sim.geom_data, k):
                hits += 1
                assert k in found, k
    assert hits > 10


def test_lazy_step_info_fields_and_repr():
    sim = diffgym.Simulator.from_file(asset_path("hopper_gymnasium.xml"), ignore_unsupported=("option.integrator",))
    q, v = sim.q0, np.zeros(sim.nv)
    for _ in range(150):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    info = sim.last
    cons, res = sim.cache["cons"], sim.cache["res"]
    assert info.num_contacts == cons.nc > 0
    assert info.contact_modes == [diffgym.sim.forward.MODE_NAMES[m] for m in res.modes]
    np.testing.assert_array_equal(info.contact_points, cons.contacts.pos)
    np.testing.assert_array_equal(info.contact_impulses, res.lam[:3 * cons.nc].reshape(-1, 3))
    np.testing.assert_array_equal(info.contact_impulses_world,
                                  np.einsum("kij,kj->ki", cons.frames, info.contact_impulses))
    assert info.limit_joints == [sim.sm.limits[i].joint for i in cons.limits]
    assert len(info.contacts) == info.num_contacts
    assert "StepInfo(contacts=" in repr(info)
    import pickle
    back = pickle.loads(pickle.dumps(sim.last))
    assert "_src" not in back.__dict__ and back.contact_modes == info.contact_modes
    d = dataclasses.asdict(info)
    assert set(d) == {f.name for f in dataclasses.fields(diffgym.StepInfo)}
    # the arrays are copies: the next step does not change them
    pts = info.contact_points.copy()
    sim.step(q, v, np.zeros(sim.nv))
    np.testing.assert_array_equal(info.contact_points, pts)
    # a field set by the user stays
    q2, v2 = sim.step(q, v, np.zeros(sim.nv))
    info2 = sim.last
    info2.contact_geoms = ["mine"]
    assert info2.contact_geoms == ["mine"] and len(info2.contact_points) == cons.nc
    with pytest.raises(AttributeError):
        info2.no_such_field


def test_warm_start_follows_contacts_by_identity():
    """Contacts found in another order (or a new one) get their own previous impulses."""
    sim = diffgym.Simulator.from_string(SHAPES)
    q, v = sim.q0, np.zeros(sim.nv)
    for _ in range(200):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    cons = sim.cache["cons"]
    prev = {(int(p), int(k)): lam for p, k, lam in zip(cons.contacts.pair, cons.contacts.point,
                                                        sim.last.contact_impulses)}
    c = cons.contacts
    order = np.arange(cons.nc)[::-1]
    shuffled = dataclasses.replace(
        cons, contacts=dataclasses.replace(c, pair=c.pair[order], point=c.point[order],
                                           geom1=c.geom1[order], geom2=c.geom2[order]))
    lam0, modes0 = sim._warm_start(shuffled)
    for i, j in enumerate(order):
        np.testing.assert_array_equal(lam0[3 * i:3 * i + 3], prev[(int(c.pair[j]), int(c.point[j]))])
    sim.reset_warmstart()
    assert sim._warm_start(cons) == (None, None)


def test_compiled_sphere_pairs_equal_coal():
    """Sphere-sphere contacts in closed form (collision_kernels.sphere_pairs) against coal's,
    on billiards balls packed in a rack and scattered at random."""
    sim = diffgym.Simulator.from_file(asset_path("billiards.xml"))
    fast = sim.collision
    ref = CollisionDriver(sim.sm, batch_plane_pairs=False)
    assert len(fast._ss[0]) and not len(ref._ss[0])
    gdata = pin.GeometryData(sim.geom_model)
    for req in gdata.collisionRequests:
        req.enable_contact = True
    rng = np.random.default_rng(3)
    balls = 0
    for trial in range(40):
        q = sim.q0.copy()
        if trial:      # shake the rack: pairs touching, apart and slightly overlapping
            for j in range(1, sim.model.njoints):
                iq = sim.model.joints[j].idx_q
                q[iq:iq + 2] += rng.normal(0.0, 2e-3, 2)
        v = rng.normal(0.0, 0.5, sim.nv)
        pin.forwardKinematics(sim.model, sim.data, q, v)
        pin.computeJointJacobians(sim.model, sim.data)
        pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, sim.geom_data)
        pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, gdata)
        a = fast.detect(sim.data, sim.geom_data, sim.dt, v)
        b = ref.detect(sim.data, gdata, sim.dt)
        for f in ("pair", "geom1", "geom2", "point", "mu"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
        for f in ("pos", "normal", "dist"):
            np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=0, atol=1e-12, err_msg=f)
        frames = a.frames if a.frames is not None else tangent_frames(a.normal)
        np.testing.assert_allclose(frames, tangent_frames(b.normal), rtol=0, atol=1e-12)
        kinds = [(sim.sm.geoms[int(g1)].kind, sim.sm.geoms[int(g2)].kind) for g1, g2 in zip(b.geom1, b.geom2)]
        balls += kinds.count(("sphere", "sphere"))
    assert balls > 100


def test_kernels_run_as_plain_python_with_the_same_results(tmp_path):
    """DIFFGYM_JIT=0 (debugging the kernels with pdb) runs the same loops uncompiled: a hopper
    landing with its step Jacobians gives the compiled results."""
    import json
    import os
    import subprocess
    import sys
    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys, numpy as np, diffgym\n"
        "from diffgym.resources import asset_path\n"
        "sim = diffgym.Simulator.from_file(asset_path('hopper.xml'))\n"
        "q, v = sim.q0, np.zeros(sim.nv)\n"
        "for _ in range(80):\n"
        "    q, v = sim.step(q, v, 0.3 * np.ones(sim.nv))\n"
        "q, v, jac = sim.step(q, v, np.ones(sim.nv), jacobian=True)\n"
        "json.dump([q.tolist(), v.tolist(), jac.state.tolist(), sim.last.num_contacts], sys.stdout)\n")
    out = {}
    for flag in ("0", "1"):
        env = dict(os.environ, DIFFGYM_JIT=flag)
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                           check=True, timeout=600)
        out[flag] = json.loads(r.stdout)
    assert out["1"][3] > 0
    for a, b in zip(out["0"][:3], out["1"][:3]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("model", ["hopper.xml", "go1.urdf", "billiards.xml"])
def test_fused_constrained_step_equals_the_stage_by_stage_one(model):
    """The step's single compiled call for limits, assembly, warm start and solve
    (forward._constrained_velocity) against the stage-by-stage path it stands in for (taken
    for a solver of any other type)."""
    from diffgym.sim.solver import NCPSolver

    class Staged(NCPSolver):
        pass

    sims = [diffgym.Simulator.from_file(asset_path(model), ignore_unsupported=("joint.frictionloss",))
            for _ in range(2)]
    sims[1].solver = Staged(sims[1].solver.settings)
    rng = np.random.default_rng(2)
    states = [(s.q0, np.zeros(s.nv)) for s in sims]
    nv = sims[0].nv
    constrained = 0
    for t in range(150):
        tau = rng.normal(0.0, 5.0, nv) if t % 3 else np.zeros(nv)
        for i, s in enumerate(sims):
            states[i] = s.step(*states[i], tau)
        a, b = (s.last for s in sims)
        assert a.contact_modes == b.contact_modes and a.method == b.method
        np.testing.assert_array_equal(a.limit_active, b.limit_active)
        np.testing.assert_allclose(states[0][1], states[1][1], rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(states[0][0], states[1][0], rtol=1e-9, atol=1e-12)
        constrained += a.num_contacts + int(np.sum(a.limit_active)) > 0
        states[1] = tuple(x.copy() for x in states[0])     # (the same state for both next)
    assert constrained > 50


def _detect_both(sim, fast, ref, gdata, q):
    v = np.zeros(sim.nv)            # margins = base_margin in both drivers
    pin.forwardKinematics(sim.model, sim.data, q, v)
    pin.computeJointJacobians(sim.model, sim.data)
    pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, sim.geom_data)
    pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, gdata)
    return fast.detect(sim.data, sim.geom_data, sim.dt, v), ref.detect(sim.data, gdata, sim.dt)


def _assert_same_contacts(a, b, atol):
    for f in ("pair", "geom1", "geom2", "point", "mu"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    for f in ("pos", "normal", "dist"):
        np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=0, atol=atol, err_msg=f)
    frames = a.frames if a.frames is not None else tangent_frames(a.normal)
    np.testing.assert_allclose(frames, tangent_frames(b.normal), rtol=0, atol=atol)


def test_compiled_sphere_box_pairs_equal_coal_on_billiards():
    """Ball-cushion contacts in closed form (collision_kernels.sphere_box_pairs) against coal's:
    balls pushed against and slightly into the cushions' faces, and lifted onto their top edges."""
    sim = diffgym.Simulator.from_file(asset_path("billiards.xml"))
    fast = sim.collision
    ref = CollisionDriver(sim.sm, batch_plane_pairs=False)
    assert len(fast._sb[0]) == 64 and not len(ref._sb[0])
    gdata = pin.GeometryData(sim.geom_model)
    for req in gdata.collisionRequests:
        req.enable_contact = True
    rng = np.random.default_rng(0)
    r = 0.0286
    cushion = 0
    for trial in range(30):
        q = sim.q0.copy()
        for j in range(1, sim.model.njoints):
            iq = sim.model.joints[j].idx_q
            side, sgn = rng.integers(2), rng.choice([-1.0, 1.0])
            gap = rng.uniform(-3e-4, 5e-4)
            along = rng.uniform(-1.3, 1.3) if side == 0 else rng.uniform(-0.7, 0.7)
            inner = (0.7 if side == 0 else 1.3) * sgn
            if rng.random() < 0.5:         # on the table against the inner face
                across, z = inner - sgn * (r + gap), r
            else:                          # over the top edge or the top face
                across, z = inner + sgn * rng.uniform(-0.03, 0.03), rng.uniform(0.08, 0.14)
            q[iq:iq + 3] = [along, across, z] if side == 0 else [across, along, z]
        a, b = _detect_both(sim, fast, ref, gdata, q)
        _assert_same_contacts(a, b, 1e-12)
        kinds = [(sim.sm.geoms[int(g1)].kind, sim.sm.geoms[int(g2)].kind) for g1, g2 in zip(b.geom1, b.geom2)]
        cushion += kinds.count(("box", "sphere")) + kinds.count(("sphere", "box"))
    assert cushion > 200


SPHERE_BOX_BODIES = ('<body name="box" pos="0 0 0"><freejoint/><geom type="box" size="0.1 0.15 0.2" friction="0.3"/></body>',
                     '<body name="ball" pos="1 0 0"><freejoint/><geom type="sphere" size="{r}" friction="0.4"/></body>')


@pytest.mark.parametrize("ball_first", [False, True], ids=["box-ball", "ball-box"])
@pytest.mark.parametrize("region", ["face", "edge", "corner", "inside"])
def test_compiled_sphere_box_pairs_equal_coal_on_free_bodies(region, ball_first):
    """A free box and a free sphere in random relative poses, the sphere's closest box point on
    a face, an edge or a corner (outside, touching and slightly penetrating), or the sphere's
    centre just inside the box (a small sphere), against coal."""
    r = 0.002 if region == "inside" else 0.05
    bodies = (SPHERE_BOX_BODIES[0], SPHERE_BOX_BODIES[1].format(r=r))
    sim = diffgym.Simulator.from_string('<mujoco><option timestep="0.01" gravity="0 0 0"/><worldbody>'
                                        + "".join(bodies[::-1] if ball_first else bodies)
                                        + "</worldbody></mujoco>")
    ib, ibl = (7, 0) if ball_first else (0, 7)
    fast = sim.collision
    ref = CollisionDriver(sim.sm, batch_plane_pairs=False)
    assert len(fast._sb[0]) == 1
    gdata = pin.GeometryData(sim.geom_model)
    for req in gdata.collisionRequests:
        req.enable_contact = True
    half = np.array([0.1, 0.15, 0.2])
    rng = np.random.default_rng(["face", "edge", "corner", "inside"].index(region))
    hits = 0
    worst = 0.0
    for trial in range(40):
        # the sphere centre in the box frame
        clamped = {"face": 1, "edge": 2, "corner": 3, "inside": 1}[region]
        axes = rng.permutation(3)[:clamped]
        sgn = rng.choice([-1.0, 1.0], 3)
        p = rng.uniform(-0.9, 0.9, 3) * half
        p[axes] = sgn[axes] * half[axes]
        n = np.zeros(3)
        n[axes] = sgn[axes] * rng.uniform(0.3, 1.0, clamped)
        n /= np.linalg.norm(n)
        if region == "inside":
            depth = rng.uniform(1e-4, 1e-3)
            x = p - depth * n
        else:
            gap = [rng.uniform(1e-5, 5e-4), 0.0, -rng.uniform(1e-5, 3e-4)][trial % 3]
            x = p + (r + gap) * n
        Rb = pin.Quaternion(*rng.normal(size=4)).normalized().toRotationMatrix()
        tb = rng.uniform(-1, 1, 3)
        q = sim.q0.copy()
        q[ib:ib + 3], q[ib + 3:ib + 7] = tb, pin.Quaternion(Rb).coeffs()
        q[ibl:ibl + 3] = tb + Rb @ x
        q[ibl + 3:ibl + 7] = pin.Quaternion(*rng.normal(size=4)).normalized().coeffs()
        a, b = _detect_both(sim, fast, ref, gdata, q)
        assert len(b.pair) == 1
        _assert_same_contacts(a, b, 1e-12)
        worst = max(worst, max(np.abs(getattr(a, f) - getattr(b, f)).max() for f in ("pos", "normal", "dist")))
        hits += 1
    assert hits == 40, worst


@pytest.mark.parametrize("model", ["hopper.xml", "go1.urdf"])
def test_packed_constrained_step_returns_the_arrays_of_the_solve(model):
    """``forward._constrained_step`` returns its small arrays packed (five arrays instead of thirteen,
    which numba would box one by one); ``_unpack_step``'s views must be, bit for bit, the
    arrays ``_constrained_velocity`` computes from the same arguments, and a step's arrays must
    stay what they were after later steps (each step packs into arrays of its own)."""
    from diffgym.sim import forward as fw

    sim = diffgym.Simulator.from_file(asset_path(model), ignore_unsupported=("joint.frictionloss",))
    calls = []
    orig = fw._constrained_step

    def spy(*a):
        r = orig(*a)
        calls.append((a, r))
        return r
    rng = np.random.default_rng(4)
    q, v = sim.q0, np.zeros(sim.nv)
    kept = []
    fw._constrained_step = spy
    try:
        for t in range(120):
            q, v = sim.step(q, v, rng.normal(0.0, 5.0, sim.nv) if t % 2 else np.zeros(sim.nv))
            res = sim.cache["res"]
            if res is not None and t % 10 == 0:
                cons = sim.cache["cons"]
                kept.append((res, res.lam.copy(), cons, cons.J.copy()))
    finally:
        fw._constrained_step = orig
    checked = limits = 0
    for a, r in calls:
        all_ok, nl, F, ints, lim_act = r[0], r[2], r[8], r[9], r[10]
        nc, nv = a[0].shape[0], a[9].shape[1]
        packed = fw._unpack_step(F, ints, r[11], r[12], nc, nl, nv)
        ref = fw._constrained_velocity(*a)
        # (lim_idx, lim_dist, J, b, G, g, lam, sigma, modes, v1, restitution) in ref's order
        for x, y in zip(packed, (ref[3], ref[4], ref[5], ref[6], ref[7], ref[8], ref[9], ref[10],
                                 ref[11], ref[15], ref[17])):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(lim_act, ref[12])
        # the record of the realizable projection (per row its island or -1, the raw offsets)
        rec, proj, braw = packed[11], ref[19], ref[20]
        if rec is None:
            assert proj.size == 0 or proj.max() < 0
        else:
            np.testing.assert_array_equal(rec[0], proj)
            np.testing.assert_array_equal(rec[1], braw)
        assert all_ok == bool(ref[0].all())
        checked += 1
        limits += nl > 0
    assert checked > 30 and (limits > 0 or model == "go1.urdf")
    assert kept
    for res, lam, cons, J in kept:
        np.testing.assert_array_equal(res.lam, lam)
        np.testing.assert_array_equal(cons.J, J)


def _detect_stage_by_stage(a):
    """The closed-form detect pass as separate kernel calls, in the layout it had before the
    outputs were packed: (cand, cand_margin, rows)."""
    from diffgym.sim import collision_kernels as ck

    (oM, mj, Jw, v, support, lin, ang, from_jacobian, gslot, W0, reach, pairs, perm, pcat, rad,
     sap_g, base_margin, dt, hp_k, hp_pl, hp_ot, ext_vec, ext_const, use_rot, mesh_i, mesh_pl,
     mesh_ot, mesh_sw, hull_off, hull_pts, g_boxhalf, g_isbox, friction, max_points, bp_pair,
     bp_kind, bp_geom, bp_n, bp_off, bp_N, bp_frames, bp_size, g_ssr, g_sbhalf, g_sbr) = a
    if from_jacobian:
        lin, ang = ck.joint_speeds(Jw, v, support, oM[mj, 9:12].copy())
    W, speed, cand, cm, ss, ssm, sb, sbm = ck.placements_and_bounds(
        oM, mj, lin, ang, gslot, W0, reach, pairs, perm, pcat, rad, sap_g, base_margin, dt,
        hp_k, hp_pl, hp_ot, ext_vec, ext_const, use_rot, mesh_i, mesh_pl, mesh_ot, mesh_sw,
        hull_off, hull_pts, g_boxhalf, g_isbox)
    bpm = np.array([ck.pair_margin(speed, pairs, base_margin, dt, k) for k in bp_pair])
    bpr = np.array([ck.pair_margin(speed, pairs, 0.0, dt, k) for k in bp_pair])
    rows = ck.plane_points(W, bpm.reshape(-1), pairs, friction, max_points, bp_pair, bp_kind,
                           bp_geom, bp_n, bp_off, bp_N, bp_frames, bp_size, bpr.reshape(-1))
    if ss.shape[0]:
        rows = ck.merge_rows(rows, ck.sphere_pairs(W, ssm, pairs, friction, ss, g_ssr))
    if sb.shape[0]:
        rows = ck.merge_rows(rows, ck.sphere_box_pairs(W, sbm, pairs, friction, sb, pcat,
                                                       g_sbhalf, g_sbr))
    return cand, cm, rows


STACK = """<mujoco><option timestep="0.002"/><worldbody>
<geom name="floor" type="plane" size="5 5 .1"/>
<body pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.1 0.1" mass="1"/></body>
<body pos="0.02 0 0.3"><freejoint/><geom type="box" size="0.1 0.08 0.1" mass="1"/></body>
<body pos="0.15 0 0.1"><freejoint/><geom type="capsule" size="0.05 0.1" mass="1"/></body>
</worldbody></mujoco>"""


@pytest.mark.parametrize("model", ["hopper.xml", "go1.urdf", "billiards.xml", "stack"])
def test_packed_detect_returns_the_arrays_of_the_closed_forms(model):
    """``collision_kernels.detect_closed_form`` returns its outputs packed in one float64 and
    one int64 array (instead of eleven arrays numba would box one by one);
    ``collision_driver._unpack_detect``'s views must be, bit for bit, the arrays the kernels it
    chains return when called one by one, and a step's contacts must stay what they were after
    later steps (each pass packs into arrays of its own)."""
    from diffgym.sim import collision_driver as cd

    sim = (diffgym.Simulator.from_string(STACK) if model == "stack" else
           diffgym.Simulator.from_file(asset_path(model), ignore_unsupported=("joint.frictionloss",)))
    calls = []
    orig = cd.detect_closed_form

    def spy(*a):
        r = orig(*a)
        # (copies: the driver refills some arguments, as the placements, in place each pass)
        calls.append((tuple(x.copy() if isinstance(x, np.ndarray) else x for x in a), r))
        return r
    kept = []
    drv = sim.collision
    orig_detect = drv.detect

    def keep(*a, **k):
        c = orig_detect(*a, **k)
        kept.append((c, copy.deepcopy(c)))
        return c
    rng = np.random.default_rng(5)
    q, v = sim.q0, rng.normal(0.0, 1.0, sim.nv)
    cd.detect_closed_form, drv.detect = spy, keep
    try:
        for t in range(60):
            q, v = sim.step(q, v, rng.normal(0.0, 5.0, sim.nv) if t % 2 else np.zeros(sim.nv))
    finally:
        cd.detect_closed_form = orig
        del drv.detect
    rows_seen = cand_seen = 0
    for a, (nc, n, F, I) in calls:
        cand, cm, rows = cd._unpack_detect(F, I, nc, n)
        rcand, rcm, rrows = _detect_stage_by_stage(a)
        for x, y in zip((cand, cm) + rows, (rcand, rcm) + tuple(rrows)):
            assert x.dtype == y.dtype and x.shape == y.shape and x.flags.c_contiguous
            np.testing.assert_array_equal(x, y)
        rows_seen += n
        cand_seen += nc
    assert rows_seen > 50 and (cand_seen > 50 or model != "stack")   # (stack: box-box, box-capsule)
    assert len(kept) >= 60
    fields = [f.name for f in dataclasses.fields(cd.Contacts)]
    for c, c0 in kept:
        for f in fields:
            x, y = getattr(c, f), getattr(c0, f)
            assert (x is None) == (y is None)
            if x is not None:
                np.testing.assert_array_equal(x, y, err_msg=f)


def test_setting_max_points_reaches_the_compiled_detection():
    """``detect`` builds the compiled pass's load-fixed arguments once; setting ``max_points``
    afterwards must change the points found as a driver built with that value finds them."""
    sim = diffgym.Simulator.from_string(SHAPES)
    drv = CollisionDriver(sim.sm, max_points=4)
    ref = {k: CollisionDriver(sim.sm, max_points=k) for k in (1, 4)}
    rng = np.random.default_rng(2)
    fewer = 0
    for _ in range(40):
        q, v = _random_state(sim, rng, (-0.05, 0.15))
        pin.forwardKinematics(sim.model, sim.data, q, v)
        pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, sim.geom_data)
        found = {}
        for k in (4, 1, 4):
            drv.max_points = k
            a, b = drv.detect(sim.data, sim.geom_data, sim.dt), ref[k].detect(sim.data, sim.geom_data, sim.dt)
            for f in ("pair", "geom1", "geom2", "point", "mu"):
                np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
            for f in ("pos", "normal", "dist"):      # (coal warm-starts GJK from earlier calls)
                np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=0, atol=1e-12)
            found[k] = len(a)
        fewer += found[1] < found[4]
    assert fewer


@pytest.mark.parametrize("model,additive", [("hopper.xml", True), ("cartpole.xml", True),
                                            ("go1.urdf", False)])
def test_vector_space_models_integrate_by_sum(model, additive):
    """Where every joint is a vector space the step's ``q1`` is ``q + dt v1`` by numpy instead
    of pinocchio's ``integrate``: the same bits, on the states a random-torque rollout visits."""
    sim = diffgym.Simulator.from_file(asset_path(model), ignore_unsupported=("joint.frictionloss",
                                                                            "option.integrator"))
    assert sim._additive_q is additive
    rng = np.random.default_rng(5)
    q, v = sim.q0, np.zeros(sim.nv)
    for t in range(150):
        q, v = sim.step(q, v, rng.normal(0.0, 20.0, sim.nv) if t % 3 else np.zeros(sim.nv))
        c = sim.cache           # (c["q"]: the step's q, its quaternions normalized)
        if c.get("impact_times") is None:
            ref = pin.integrate(sim.model, c["q"], sim.dt * c["v1"])
            assert ref.tobytes() == q.tobytes(), t


def _same(a, b, what):
    if a is None or b is None:
        assert a is None and b is None, what
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, what
        np.testing.assert_array_equal(a, b, err_msg=what)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{what}[{i}]")
    else:
        assert a == b, what


@pytest.mark.parametrize("model", ["hopper.xml", "go1.urdf", "hopper_gymnasium.xml"])
def test_fused_step_equals_the_separate_calls(model):
    """A small robot's step in one compiled call (``forward._fused_step``, its results built
    when read) against the separate calls it stands in for (``sim._fused = False``), bit for
    bit: the state, ``sim.last``, every ``sim.cache`` entry (constraints and solver result
    field by field), the warm start, and the step Jacobian computed afterwards from the cache
    (``derivatives.step_jacobian``), along random-torque rollouts that touch the ground."""
    from diffgym.sim import forward as fw
    from diffgym.sim.derivatives import step_jacobian

    kw = {"ignore_unsupported": ("joint.frictionloss",)} if model == "go1.urdf" else (
        {"ignore_unsupported": ("option.integrator",)} if model == "hopper_gymnasium.xml" else {})
    sims = [diffgym.Simulator.from_file(asset_path(model), **kw) for _ in range(2)]
    sims[1]._fused = False
    statuses = []
    orig = fw._fused_step

    def spy(*a):
        out = orig(*a)
        statuses.append(out[0])
        return out
    rng = np.random.default_rng(7)
    q, v = sims[0].q0, np.zeros(sims[0].nv)
    fw._fused_step = spy
    try:
        for t in range(160):
            tau = rng.normal(0.0, 8.0, sims[0].nv) if t % 4 else np.zeros(sims[0].nv)
            outs = [s.step(q, v, tau) for s in sims]
            _same(outs[0], outs[1], "q1, v1")
            a, b = sims[0].last, sims[1].last
            assert a.num_contacts == b.num_contacts
            for f in ("iterations", "residual", "converged", "method", "islands",
                      "contact_points", "contact_normals", "contact_distances", "contact_impulses",
                      "contact_impulses_world", "contact_modes", "contact_geoms", "limit_joints",
                      "limit_impulses", "limit_active"):
                _same(getattr(a, f), getattr(b, f), f"last.{f}")
            _same(sims[0].warm_start_state(), sims[1].warm_start_state(), "warm start")
            ca, cb = sims[0].cache, sims[1].cache
            for k in ("q", "v", "tau", "tau_total", "a_free", "v_free", "Minv", "G", "g", "v1",
                      "q1", "impact_times", "support_drift"):
                assert (k in ca) == (k in cb), k
                _same(ca.get(k), cb.get(k), f"cache[{k!r}]")
            for k, cls in (("cons", fw.Constraints), ("res", fw.SolverResult)):
                x, y = ca[k], cb[k]
                if x is None or y is None:
                    assert x is None and y is None, k
                    continue
                for f in dataclasses.fields(cls):
                    if f.name != "contacts":
                        _same(getattr(x, f.name), getattr(y, f.name), f"{k}.{f.name}")
                for f in dataclasses.fields(x.contacts) if k == "cons" else ():
                    _same(getattr(x.contacts, f.name), getattr(y.contacts, f.name),
                          f"contacts.{f.name}")
            if t % 10 == 5:
                ja, jb = step_jacobian(sims[0]), step_jacobian(sims[1])
                for f in ("dq_dq", "dq_dv", "dq_dtau", "dv_dq", "dv_dv", "dv_dtau"):
                    _same(getattr(ja, f), getattr(jb, f), f"jac.{f}")
            q, v = outs[0]
    finally:
        fw._fused_step = orig
    assert sum(s == 2 for s in statuses) > 60 and len(statuses) >= 150    # (contacts, fused)
