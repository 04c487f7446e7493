"""Per-island constraint storage (diffgym/sim/island_step.py, constraint.assemble_blocks) and
the renderer's per-tree kinematics (issue 16: memory linear in bodies).

The storage path is compared with the dense path (``forward._constrained_step``) it replaces on
large split scenes, from the same states the simulator visits (random torques on piles whose
stage 1 sometimes fails and takes the later stages): the rows, offsets, ``G``, the impulses
and the step Jacobian are the same bits; ``v1`` too where every island's stage 1 succeeds (a
failed island's ``v1`` sums ``M^-1 J^T lam`` row by row instead of BLAS's order: rounding)."""
from __future__ import annotations

import warnings

import numpy as np
import pinocchio as pin
import pytest

from diffgym.bench_scaling import balls_mjcf, boxes_mjcf
from diffgym.sim import island_step, trees as trees_mod
from diffgym.sim.forward import Simulator


def _pair_of_steps(xml, steps, seed=0, scale=0.1, jac_at=None):
    """Yield (dense sim, storage sim, v1 dense, v1 storage) for ``steps`` states of the dense
    path's own trajectory, each stepped from that state by both paths (cold warm start)."""
    A, B = Simulator.from_string(xml), Simulator.from_string(xml)
    q, v = A.q0.copy(), np.zeros(A.nv)
    rng = np.random.default_rng(seed)
    mp = pytest.MonkeyPatch()
    try:
        for i in range(steps):
            tau = rng.normal(scale=scale, size=A.nv)
            jac = jac_at == i
            out = []
            for sim, thr in ((A, float("inf")), (B, 0.0)):
                mp.setattr(island_step, "BLOCK_MIN_BYTES", thr)
                sim.reset_warmstart()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out.append(sim.step(q, v, tau, jacobian=jac))
            yield A, B, out[0], out[1]
            q, v = out[0][0], out[0][1]
    finally:
        mp.undo()


@pytest.mark.parametrize("scene, n", [("boxes", 16), ("balls", 16), ("balls", 36)])
def test_storage_path_equals_dense_path(scene, n):
    xml = (boxes_mjcf if scene == "boxes" else balls_mjcf)(n)
    stage1_ok = later = 0
    # (36 balls: one island of 288 rows, solved through the bodies: island_body_blocks)
    for A, B, a, b in _pair_of_steps(xml, 5, jac_at=4 if (scene, n) == ("balls", 16) else None):
        ca, cb = A.cache, B.cache
        assert type(cb).__name__ == "BlockCache" and type(ca) is dict
        assert isinstance(cb["cons"], island_step.BlockConstraints)
        assert A.last.method == B.last.method and A.last.num_contacts == B.last.num_contacts > 0
        np.testing.assert_array_equal(ca["res"].lam, cb["res"].lam)
        np.testing.assert_array_equal(ca["g"], cb["g"])
        np.testing.assert_array_equal(ca["cons"].b, cb["cons"].b)
        np.testing.assert_array_equal(ca["cons"].J, cb["cons"].J)      # (made dense on read)
        np.testing.assert_array_equal(ca["G"], cb["G"])
        np.testing.assert_array_equal(ca["Minv"], cb["Minv"])
        if A.last.method in ("newton", "prox+newton"):
            stage1_ok += 1
            np.testing.assert_array_equal(a[1], b[1])
            np.testing.assert_array_equal(a[0], b[0])
        else:                             # (a failed island's later stages: rounding)
            later += 1
            np.testing.assert_allclose(a[1], b[1], rtol=0, atol=1e-13)
        if len(a) == 3:
            for k, x in vars(a[2]).items():
                if isinstance(x, np.ndarray):
                    np.testing.assert_array_equal(x, getattr(b[2], k), err_msg=k)
    assert stage1_ok + later == 5
    if scene == "balls":
        assert stage1_ok == 5 if n == 16 else stage1_ok > 0
        if n == 36:
            from diffgym.sim.solver_kernels import BODY_MIN_ROWS
            assert B.cache["cons"].m >= BODY_MIN_ROWS and int(B.cache["cons"].storage[9]) == 1
    else:       # (the pile under random torques: every step in stage 1-1c since issue 16's
        assert stage1_ok == 5       # stage 1c; before it, some of these steps reached stage 2)


def test_storage_grows_with_rows_not_rows_times_dofs():
    """On a pile of 64 boxes the per-island storage of a step holds no (m, nv) or (m, m)
    array: its bytes are a small fraction of the dense path's J, M^-1 J^T and G."""
    sim = Simulator.from_string(boxes_mjcf(64))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(island_step, "BLOCK_MIN_BYTES", 0.0)
        sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))
    cons = sim.cache["cons"]
    assert isinstance(cons, island_step.BlockConstraints) and cons._dense is None
    m, nv = cons.m, sim.nv
    stored = sum(x.nbytes for x in cons.storage if isinstance(x, np.ndarray))
    dense = 8 * (m * m + 2 * m * nv)
    assert m >= 3 * 64 * 4 and stored < dense / 10, (m, nv, stored, dense)
    # the islands' blocks of G: columns of four boxes, 16 islands
    assert int(cons.storage[9]) == 16


def test_pooled_g_blocks_are_reused_only_when_nothing_holds_them():
    """``island_step.g_buffer``: a large island's blocks of G go into arrays kept on the
    simulator, reused from step to step (no fresh pages to fault in), but never while anything
    holds an earlier step's blocks. On a rack of 16 balls with the pool forced on: the same
    trajectory and Jacobians bit for bit as without the pool; the first step (no size known
    yet) allocates its own; constraints kept from earlier steps still hold their own G after
    many more steps; and with nothing kept the pool settles (the last step's array, held by
    ``sim.last``, and the one being filled)."""
    xml = balls_mjcf(16)
    P, F = Simulator.from_string(xml), Simulator.from_string(xml)
    rng = np.random.default_rng(3)
    kept, snaps = [], []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(island_step, "BLOCK_MIN_BYTES", 0.0)
        qs = [(P.q0.copy(), np.zeros(P.nv)), (F.q0.copy(), np.zeros(F.nv))]
        for i in range(20):
            tau = rng.normal(scale=0.5, size=P.nv)
            jac = i % 7 == 6
            outs = []
            for k, (sim, thr) in enumerate(((P, 0.0), (F, float("inf")))):
                mp.setattr(island_step, "G_POOL_MIN_BYTES", thr)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    outs.append(sim.step(*qs[k], tau, jacobian=jac))
                qs[k] = outs[-1][:2]
            assert isinstance(P.cache["cons"], island_step.BlockConstraints)
            for a, b in zip(outs[0][:2], outs[1][:2]):
                np.testing.assert_array_equal(a, b)
            if jac:
                for name, x in vars(outs[0][2]).items():
                    if isinstance(x, np.ndarray):
                        np.testing.assert_array_equal(x, getattr(outs[1][2], name), err_msg=name)
            Gb = P.cache["cons"].storage[17]
            assert P._g_need >= len(Gb) > 0           # (the largest need so far)
            # pooled memory from the second step, until the kept steps hold every array
            pooled = any(np.shares_memory(Gb, b) for b in P.__dict__.get("_g_pool", []))
            assert pooled == (1 <= i <= island_step.G_POOL_SIZE), i
            if i <= island_step.G_POOL_SIZE:    # (kept: their arrays must not be reused)
                kept.append(P.cache["cons"])
                snaps.append(Gb.copy())
            del outs
        for cons, snap in zip(kept, snaps):
            np.testing.assert_array_equal(cons.storage[17], snap)
        assert len(P._g_pool) == island_step.G_POOL_SIZE
        del kept, cons
        for _ in range(6):
            P.step(*qs[0], np.zeros(P.nv))
        ids = {id(b) for b in P._g_pool}
        for _ in range(4):
            P.step(*qs[0], np.zeros(P.nv))
        assert {id(b) for b in P._g_pool} == ids and len(ids) <= island_step.G_POOL_SIZE


def test_renderer_makes_no_whole_model_data(monkeypatch, data_sizes):
    """The renderer places a split scene tree by tree (a whole-model Data is cubic in nv) and
    finds the same geom placements as pinocchio's whole-model kinematics."""
    from diffgym.render import Renderer, _placements, scene_bounds
    sim = Simulator.from_string(boxes_mjcf(24))
    q = sim.q0.copy()
    q[0] += 0.3
    sizes = data_sizes
    r = Renderer(sim, width=32, height=24, track="b3")
    img = r.render(q)
    assert img.shape[:2] == (24, 32) and np.ptp(img) > 0
    lo, hi = scene_bounds(sim, q)
    gd = _placements(sim, q)
    assert not sizes or max(sizes) <= trees_mod.MAX_GROUP_NV < sim.nv
    monkeypatch.undo()
    d, ref = sim.model.createData(), pin.GeometryData(sim.geom_model)
    pin.forwardKinematics(sim.model, d, q)
    pin.updateGeometryPlacements(sim.model, d, sim.geom_model, ref)
    for k in range(len(sim.geom_model.geometryObjects)):
        np.testing.assert_allclose(gd.oMg[k].homogeneous, ref.oMg[k].homogeneous, atol=1e-14)
    pin.updateFramePlacements(sim.model, d)
    np.testing.assert_allclose(r._track_position(q),
                               d.oMf[sim.model.getFrameId("b3")].translation, atol=1e-14)
    assert np.all(hi > lo)


FILTER_SCENE = """<mujoco><worldbody><geom name="floor" type="plane" size="0 0 1"/>
<geom name="wall" type="box" size="1 1 1" pos="5 0 0" contype="2" conaffinity="2"/>
<body name="a" pos="0 0 1"><freejoint/><geom name="a1" type="sphere" size="0.1" priority="1"/>
  <body name="a2" pos="0 0 0.3"><joint type="hinge"/><geom name="a2" type="capsule" size="0.05 0.1"/></body></body>
<body name="b" pos="1 0 1"><freejoint/><geom name="b1" type="box" size="0.1 0.1 0.1" contype="2" conaffinity="1"/></body>
<body name="c" pos="2 0 1"><freejoint/><geom name="c1" type="box" size="0.1 0.1 0.1" contype="0" conaffinity="0"/>
  <geom name="c2" type="sphere" size="0.1" contype="4" conaffinity="2"/></body>
</worldbody><contact><exclude body1="a" body2="b"/><pair geom1="c1" geom2="a1"/><pair geom1="wall" geom2="floor"/></contact></mujoco>"""


def test_candidate_pairs_filters():
    """MJCF's candidate pairs (pair_tables.candidate_pairs), worked out by hand from MuJoCo's
    rules: not within a weld, contype/conaffinity bits, not two planes, not a body and its
    parent, not an excluded body pair; explicit <pair>s appended in their order."""
    from diffgym.sim.mjcf import load_mjcf
    sm = load_mjcf(FILTER_SCENE)
    names = [g.name for g in sm.geoms]
    got = [(names[a], names[b]) for a, b in sm.pairs.tolist()]
    assert got == [("floor", "a1"), ("floor", "a2"), ("floor", "b1"),   # world x bodies, bits 1
                   ("wall", "b1"), ("wall", "c2"),                      # bits 2 either way
                   ("a2", "b1"), ("b1", "c2"),
                   ("c1", "a1"), ("wall", "floor")]                     # the <pair>s
