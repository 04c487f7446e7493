"""The swept broad phase (collision_kernels.sweep_and_prune, placements_and_bounds) against
the all-pairs broad phase it replaced: every registered pair bounded one by one with numpy
(the bounding-sphere gap, raised by a box's oriented bounds, below the pair's margin + the
slack), and the sphere-sphere and sphere-box closed forms tried on every such pair. The
candidate sets (and their margins) and the closed-form rows must be equal, on random piles
of mixed primitives (some interpenetrating, some moving fast, static geoms among them),
racks of balls, the environments' robots and Gymnasium's models, at random and visited
states."""
from __future__ import annotations

import glob
import os
import warnings

import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym.resources import asset_path
from diffgym.sim import collision_kernels as ck
from diffgym.sim.unsupported import UnsupportedIgnoredWarning


def _state(sim, q, v):
    """Joint placements and joint speeds at (q, v), as the step computes them (tree by tree on
    split scenes, whose whole-model Data would be large; speeds from the joint Jacobians)."""
    cd = sim.collision
    trees = sim.__dict__.get("_trees")
    if trees is not None:
        data = trees.kinematics(q, v)
    else:
        data = sim.model.createData()
        pin.forwardKinematics(sim.model, data, q, v)
        pin.computeJointJacobians(sim.model, data)
    oM = cd._placements(data).copy()
    if not cd._mj:
        return oM, np.zeros(0), np.zeros(0)
    Jw = np.array(data.J).reshape(6, sim.nv)
    origins = np.ascontiguousarray(oM[cd._mj_arr, 9:12])
    lin, ang = ck.joint_speeds(Jw, v, cd._support, origins)
    return oM, lin, ang


def all_pairs(cd, W, speed, base):
    """The old broad phase: every pair bounded, vectorized over all of them."""
    p = cd.pairs
    a, b = p[:, 0], p[:, 1]
    margin = base + cd._dt * (speed[a] + speed[b])
    gap = np.full(len(p), np.inf)
    hp_m, hp_gap = ck.plane_bounds(W, speed, p, base, cd._dt, cd._hp, cd._hp_pl, cd._hp_ot,
                                   cd._hp_ext_vec, cd._hp_ext_const, cd._hp_use_rot, *cd._mesh)
    gap[cd._hp] = hp_gap
    assert np.array_equal(hp_m, margin[cd._hp])
    d = W[a, :3, 3] - W[b, :3, 3]
    sph = np.sqrt(d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1] + d[:, 2] * d[:, 2]) - (cd._rad[a] + cd._rad[b])
    one = cd._pcat == 1
    gap[one] = sph[one]
    for bx, ot in ((a, b), (b, a)):
        loc = np.einsum("kij,ki->kj", W[bx, :3, :3], W[ot, :3, 3] - W[bx, :3, 3])
        out = np.maximum(np.abs(loc) - cd._g_boxhalf[bx], 0.0)
        lb = np.sqrt((out * out).sum(axis=1)) - cd._rad[ot]
        sel = one & cd._g_isbox[bx]
        gap[sel] = np.maximum(gap[sel], lb[sel])
    cand = np.flatnonzero(gap < margin + ck.BROAD_SLACK)
    ss = np.flatnonzero(cd._pcat == 2)
    sb = np.flatnonzero((cd._pcat == 3) | (cd._pcat == 4))
    return cand, margin, ss, sb


def check_scene(sim, states):
    """Swept and all-pairs broad phases agree at each (q, v); returns the candidates seen."""
    cd = sim.collision
    cd._dt = sim.dt
    base = cd.base_margin + sim.dt * sim.dt * cd._gravity
    seen = 0
    for q, v in states:
        oM, lin, ang = _state(sim, q, v)
        W, speed, cand, cm, ss, ssm, sb, sbm = ck.placements_and_bounds(
            oM, cd._mj_arr, lin, ang, cd._gslot, cd._W0, cd._reach, cd.pairs, cd._perm,
            cd._pcat, cd._rad, cd._sap_g, base, sim.dt, cd._hp, cd._hp_pl, cd._hp_ot,
            cd._hp_ext_vec, cd._hp_ext_const, cd._hp_use_rot, *cd._mesh, cd._g_boxhalf,
            cd._g_isbox)
        ref, margin, ss_all, sb_all = all_pairs(cd, W, speed, base)
        assert np.array_equal(cand, ref)
        assert np.array_equal(cm, margin[ref])
        # the closed forms: the rows of every sphere pair equal those of the swept subset
        assert np.isin(ss, ss_all).all() and np.isin(sb, sb_all).all()
        assert np.array_equal(ssm, margin[ss]) and np.array_equal(sbm, margin[sb])
        for rows, rows_ref in (
                (ck.sphere_pairs(W, ssm, cd.pairs, cd._friction, ss, cd._g_ssr),
                 ck.sphere_pairs(W, margin[ss_all], cd.pairs, cd._friction, ss_all, cd._g_ssr)),
                (ck.sphere_box_pairs(W, sbm, cd.pairs, cd._friction, sb, cd._pcat, cd._g_half,
                                     cd._g_sphere_r),
                 ck.sphere_box_pairs(W, margin[sb_all], cd.pairs, cd._friction, sb_all,
                                     cd._pcat, cd._g_half, cd._g_sphere_r))):
            for x, y in zip(rows, rows_ref):
                assert np.array_equal(x, y)
            seen += len(rows[0])
        seen += len(cand)
    return seen


def random_states(sim, rng, n, spread=0.3, speed=3.0):
    """Configurations about q0 (free bodies moved and turned, joints turned) and velocities."""
    out = []
    for _ in range(n):
        dq = rng.normal(scale=spread, size=sim.nv)
        q = pin.integrate(sim.model, sim.q0, dq)
        out.append((q, rng.normal(scale=speed, size=sim.nv)))
    return out


def visited_states(sim, rng, steps, torque=0.5):
    q, v = sim.q0.copy(), np.zeros(sim.nv)
    out = [(q, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            q, v = sim.step(q, v, rng.normal(scale=torque, size=sim.nv))
            out.append((q, v))
    return out


def pile_mjcf(rng, n, static=3):
    """n free bodies of random primitives packed in a small box (overlaps allowed), a few
    static primitives among them, a plane, one explicit <pair>, contype bits that exclude some
    pairs."""
    kinds = ["sphere", "box", "capsule", "cylinder", "ellipsoid"]
    geoms = []
    for i in range(n + static):
        k = kinds[rng.integers(len(kinds))]
        size = {"sphere": "0.05", "box": "0.05 0.03 0.04", "capsule": "0.03 0.05",
                "cylinder": "0.04 0.03", "ellipsoid": "0.05 0.03 0.04"}[k]
        pos = rng.uniform([-0.3, -0.3, 0.0], [0.3, 0.3, 0.5])
        quat = rng.normal(size=4)
        quat /= np.linalg.norm(quat)
        ct = "" if rng.random() < 0.8 else ' contype="2" conaffinity="2"'
        g = (f'<geom name="g{i}" type="{k}" size="{size}"{ct} '
             f'quat="{quat[0]:.5f} {quat[1]:.5f} {quat[2]:.5f} {quat[3]:.5f}"')
        if i < n:
            geoms.append(f'<body name="b{i}" pos="{pos[0]:.4f} {pos[1]:.4f} {pos[2]:.4f}">'
                         f'<freejoint/>{g} mass="0.1"/></body>')
        else:
            geoms.append(f'{g} pos="{pos[0]:.4f} {pos[1]:.4f} {pos[2]:.4f}"/>')
    return ('<mujoco><option timestep="0.01"/><worldbody><geom name="floor" type="plane" '
            'size="0 0 1"/>' + "".join(geoms) + '</worldbody><contact><exclude body1="b0" '
            'body2="b1"/><pair geom1="g1" geom2="g0"/></contact></mujoco>')


@pytest.mark.parametrize("seed", range(6))
def test_random_piles_equal_all_pairs(seed):
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = diffgym.Simulator.from_string(pile_mjcf(rng, 24 + 8 * seed))
    # the explicit <pair> (g1, g0) comes last: the lookup goes through the sorting permutation
    assert len(sim.collision._perm)
    states = random_states(sim, rng, 12, spread=0.2, speed=4.0) \
        + random_states(sim, rng, 4, spread=0.05, speed=40.0)
    assert check_scene(sim, states) > 0


@pytest.mark.parametrize("scene,n", [("balls", 64), ("boxes", 64), ("balls", 144)])
def test_racks_and_piles_equal_all_pairs(scene, n):
    from diffgym.bench_scaling import SCENES
    rng = np.random.default_rng(n)
    sim = diffgym.Simulator.from_string(SCENES[scene](n))
    assert not len(sim.collision._perm)          # MJCF's sorted pairs: looked up directly
    states = visited_states(sim, rng, 2, torque=0.0) \
        + random_states(sim, rng, 4, spread=0.02, speed=1.0)
    assert check_scene(sim, states) > 0


ROBOTS = [("hopper.xml", {}), ("billiards.xml", {}), ("push.xml", {}),
          ("go1.urdf", {"ignore_unsupported": ("joint.frictionloss",)}),
          ("ur5.urdf", {"floating_base": False})]


@pytest.mark.parametrize("name,kw", ROBOTS, ids=[r[0] for r in ROBOTS])
def test_robots_equal_all_pairs(name, kw):
    rng = np.random.default_rng(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = diffgym.Simulator.from_file(asset_path(name), **kw)
    states = visited_states(sim, rng, 4) + random_states(sim, rng, 8, spread=0.5)
    check_scene(sim, states)


GYM = os.path.join(os.path.dirname(__import__("gymnasium").__file__), "envs", "mujoco", "assets")


def test_gymnasium_models_equal_all_pairs():
    from diffgym.sim.unsupported import KEYS
    rng = np.random.default_rng(3)
    done = 0
    for path in sorted(glob.glob(os.path.join(GYM, "*.xml"))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnsupportedIgnoredWarning)
            warnings.simplefilter("ignore")
            try:
                sim = diffgym.Simulator.from_file(path, ignore_unsupported=tuple(KEYS))
            except diffgym.ModelError:
                continue
        check_scene(sim, random_states(sim, rng, 6, spread=0.6))
        done += 1
    assert done >= 10
