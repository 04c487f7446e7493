"""The step Jacobian block by block (``diffgym.sim.derivative_blocks``; memory linear in the
bodies): against the whole-model compiled route on ball racks, box piles and a scene of hinged
trees at their joint limits, against central differences along random rollouts, and the
``jacobian_format`` setting."""
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import diffgym
from diffgym.bench_scaling import balls_mjcf, boxes_mjcf
from diffgym.gradcheck import SIM_BLOCKS, check_step_jacobians
from diffgym.sim import derivative_blocks as DB
from diffgym.sim import derivatives as D

from test_derivative_kernels import rel_diff


class _Dense:
    """A StepJacobian's six blocks as dense arrays."""

    def __init__(self, jac):
        for k in SIM_BLOCKS:
            x = getattr(jac, k)
            setattr(self, k, x.toarray() if sp.issparse(x) else x)


def _rollout(sim, rng, steps, vscale, fscale):
    q, v = sim.q0, vscale * rng.normal(size=sim.nv)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            tau = fscale * rng.normal(size=sim.nv)
            out.append((q, v, tau, sim.warm_start_state()))
            q, v = sim.step(q, v, tau)
    return out


def _hinges_mjcf(n=8):
    """n hinged rods (separate trees, limited to +-0.3 rad) and two free balls on a floor."""
    rods = "".join(
        f'<body name="r{i}" pos="{0.3 * i:.2f} 0 0.5"><joint name="h{i}" type="hinge" '
        f'axis="0 1 0" limited="true" range="-0.3 0.3"/><geom type="capsule" size="0.02" '
        f'fromto="0 0 0 0.15 0 0" mass="0.1"/></body>' for i in range(n))
    balls = "".join(f'<body name="ball{i}" pos="{0.12 * i:.2f} 0.3 0.05"><freejoint/>'
                    '<geom type="sphere" size="0.05" mass="0.2"/></body>' for i in range(2))
    return ('<mujoco><option timestep="0.005"/><worldbody><geom name="floor" type="plane" '
            'size="0 0 1"/>' + rods + balls + '</worldbody></mujoco>')


def _both(sim, q, v, tau, warm):
    """The step's Jacobian by the whole-model route (dense) and by blocks (sparse), of the same
    step."""
    sim.jacobian_format = "dense"
    sim.set_warm_start_state(warm)
    dense = sim.step(q, v, tau, jacobian=True)[2]
    sim.jacobian_format = "sparse"
    return dense, D.step_jacobian(sim)


@pytest.mark.parametrize("scene", ["balls", "boxes", "hinges"])
def test_blocks_equal_the_whole_model_route(scene, monkeypatch):
    """Along a random rollout (a 16-ball rack, 8 boxes in two columns on their faces: rank-
    deficient blocks, 8 hinged rods hitting their limits beside two balls), the block route's
    sparse output equals the whole-model route's dense one, and its dense output too; each
    block in a kernel call of its own (CHUNK_NV = 6), so contacts that break between blocks are
    left out."""
    xml = {"balls": balls_mjcf(16), "boxes": boxes_mjcf(8), "hinges": _hinges_mjcf()}[scene]
    sim = diffgym.Simulator.from_string(xml)
    assert sim.__dict__.get("_trees") is not None
    monkeypatch.setattr(DB, "CHUNK_NV", 6)
    used = []
    blocks = DB.step_jacobian_blocks
    monkeypatch.setattr(DB, "step_jacobian_blocks",
                        lambda *a: used.append(1) or blocks(*a))
    rng = np.random.default_rng(3)
    states = _rollout(sim, rng, 16, 0.05 if scene != "hinges" else 1.0, 0.3)
    limits = contacts = 0
    for q, v, tau, warm in states[::3]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dense, sparse = _both(sim, q, v, tau, warm)
        assert isinstance(dense.dv_dq, np.ndarray)
        assert all(sp.issparse(getattr(sparse, k)) for k in SIM_BLOCKS)
        assert rel_diff(_Dense(sparse), dense) < 1e-9
        assert sp.issparse(sparse.state) and sparse.state.shape == (2 * sim.nv, 2 * sim.nv)
        assert sparse.control.shape == (2 * sim.nv, sim.nv)
        assert np.array_equal(sparse.state.toarray(), np.block(
            [[_Dense(sparse).dq_dq, _Dense(sparse).dq_dv], [_Dense(sparse).dv_dq,
                                                             _Dense(sparse).dv_dv]]))
        # the block route's dense assembly: the same numbers
        assert rel_diff(DB.step_jacobian_blocks(sim, sim.cache, False), dense) < 1e-9
        cons = sim.cache["cons"]
        limits += cons is not None and bool(np.any(sim.cache["res"].limit_active))
        contacts += cons is not None and cons.nc > 0
    assert used and contacts
    if scene == "hinges":
        assert limits                          # a limit row was active at an audited state
    # the sparse blocks hold only entries of bodies that touch: a 16-ball rack at rest, its
    # balls held by the floor only (neighbours' contacts break), has one 6 x 6 block per ball
    if scene == "balls":
        sim.jacobian_format = "sparse"
        sim.reset_warmstart()
        q, v = sim.q0, np.zeros(sim.nv)
        for _ in range(3):
            q, v, jac = sim.step(q, v, np.zeros(sim.nv), jacobian=True)
        assert jac.dv_dq.nnz <= 16 * 36


@pytest.mark.parametrize("scene", ["balls", "boxes"])
def test_blocks_against_central_differences(scene, monkeypatch):
    """The block route (one kernel call per block; dense output, so that the audit reads it)
    against central differences of the whole step along random rollouts of 4 balls (a 2 x 2
    rack) and a column of 4 boxes, as test_deriv_islands checks the whole-model route: every
    column agrees or a mode switch inside the stencil explains it. (Two columns of 4 boxes are
    not checked: at one rollout state the whole-model route too disagrees with central
    differences by 4e-2 in dq/dv of a top box, one-sided differences agreeing to 2e-6: an
    open question of the pile's derivatives, not of the blocks.)"""
    monkeypatch.setattr(DB, "CHUNK_NV", 6)
    monkeypatch.setattr(DB, "BLOCK_MIN_NV", 0)
    used = []
    blocks = DB.step_jacobian_blocks
    monkeypatch.setattr(DB, "step_jacobian_blocks", lambda *a: used.append(1) or blocks(*a))
    rng = np.random.default_rng(2)
    sim = diffgym.Simulator.from_string(balls_mjcf(4) if scene == "balls" else boxes_mjcf(4))
    acts = 0.5 * rng.normal(size=(8, sim.nv))
    tol = 3e-6 if scene == "boxes" else 1e-6       # (as test_deriv_islands: a kink at 2.5e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = check_step_jacobians(sim, actions=acts, max_states=3, tol=tol,
                                   start=(sim.q0, 0.05 * rng.normal(size=sim.nv)))
    assert rep.states == 3 and rep.checked and used
    assert rep.ok, str(rep)


def test_jacobian_format_setting():
    with pytest.raises(ValueError, match="jacobian_format"):
        diffgym.Simulator.from_string(balls_mjcf(2), jacobian_format="csr")
    sim = diffgym.Simulator.from_string(balls_mjcf(4))
    assert sim.jacobian_format == "auto" and not DB.wants_sparse(sim)     # small: dense
    q1, v1, jac = sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv), jacobian=True)
    assert isinstance(jac.dv_dq, np.ndarray)
    # a single tree (no blocks): sparse output asked for is the whole-model route's, converted
    robot = diffgym.Simulator.from_string(
        '<mujoco><worldbody><body><joint type="hinge" axis="0 1 0"/><geom type="capsule" '
        'size="0.02" fromto="0 0 0 0.2 0 0"/></body></worldbody></mujoco>',
        jacobian_format="sparse")
    jac = robot.step(robot.q0, np.zeros(robot.nv), np.zeros(robot.nv), jacobian=True)[2]
    assert sp.issparse(jac.dv_dq) and jac.dv_dq.shape == (1, 1)
    import pickle
    again = pickle.loads(pickle.dumps(robot))
    assert again.jacobian_format == "sparse"
