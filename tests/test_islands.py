"""Islands: each step's constraint problem split into independent problems (connected
components of kinematic trees through contacts and limits), solved one by one."""
import numpy as np
import pytest

import diffgym
from diffgym.bench_scaling import balls_mjcf, boxes_mjcf
from diffgym.sim.constraint import island_rows, row_islands
from diffgym.sim.solver import NCPSolver, SolverSettings

from test_gradients import assert_jacobian_matches


def _stack(x, y, n, name, h=0.05):
    return "".join(
        f'<body name="{name}{k}" pos="{x} {y} {h + 2 * h * k}"><freejoint/>'
        f'<geom name="{name}g{k}" type="box" size="{h} {h} {h}" mass="0.5"/></body>'
        for k in range(n))


def _scene(bodies):
    return ('<mujoco><option timestep="0.005"/><default><geom friction="0.5"/></default>'
            '<worldbody><geom name="floor" type="plane" size="0 0 1"/>' + bodies
            + "</worldbody></mujoco>")


def _run(sim, q, v, steps, tau=None):
    tau = np.zeros(sim.nv) if tau is None else tau
    out, islands = [], []
    for _ in range(steps):
        q, v = sim.step(q, v, tau)
        out.append(np.r_[q, v])
        islands.append(sim.last.islands)
    return np.array(out), islands


def test_row_islands_union_of_trees():
    # trees named by their first dof; joints 0 (world), 1-2 tree 0, 3 tree 6, 4 tree 9, 5 tree 12
    joint_tree = np.array([-1, 0, 0, 6, 9, 12])
    j1 = np.array([0, 1, 0, 3, 5])
    j2 = np.array([2, 3, 4, 0, 0])      # contacts: world-tree0, tree0-tree6, world-9, 6-world, 12
    tree_lo = np.repeat([0, 6, 9, 12, 15], [6, 3, 3, 3, 3])
    lim_idx = np.array([0, 1])
    lim_v = np.array([16, 10])          # limit rows on trees 15 and 9
    isl_c, isl_l, n = row_islands(j1, j2, joint_tree, lim_idx, lim_v, tree_lo)
    assert n == 4
    assert isl_c.tolist() == [0, 0, 1, 0, 2] and isl_l.tolist() == [3, 1]
    ptr, rows, cptr, cs, lptr, ls = island_rows(isl_c, isl_l, n)
    assert rows[ptr[0]:ptr[1]].tolist() == [0, 1, 2, 3, 4, 5, 9, 10, 11]
    assert rows[ptr[1]:ptr[2]].tolist() == [6, 7, 8, 3 * 5 + 1]
    assert rows[ptr[3]:ptr[4]].tolist() == [3 * 5 + 0]


def test_islands_match_the_monolithic_reference():
    """Two columns of boxes, a rack of touching balls struck by one of them and a lone rolling
    ball: the island by island compiled step follows the same trajectory as the monolithic
    stage-by-stage solve (``SolverSettings(compiled=False)``: the whole problem assembled in
    Python, one NCPSolver.solve). (No box slides on a face: four sliding corners split their
    normal impulse in a way that is not unique, and neither is the friction torque; see the
    README.)"""
    xml = _scene(_stack(0, 0, 3, "a") + _stack(0.5, 0, 2, "b")
                 + "".join(f'<body name="s{i}" pos="{1 + 0.1 * i} 0 0.05"><freejoint/>'
                           f'<geom name="sg{i}" type="sphere" size="0.05" mass="0.2"/></body>'
                           for i in range(3))
                 + '<body name="lone" pos="2 0 0.05"><freejoint/>'
                   '<geom name="lg" type="sphere" size="0.05" mass="0.2"/></body>')
    sim = diffgym.Simulator.from_string(xml)
    ref = diffgym.Simulator.from_string(xml)
    ref.solver = NCPSolver(SolverSettings(compiled=False))
    v = np.zeros(sim.nv)
    v[6 * 5] = 0.4                      # the first ball pushes into the others
    v[6 * 8 + 1] = -0.3                 # the lone ball rolls
    a, isl = _run(sim, sim.q0, v, 60)
    b, _ = _run(ref, sim.q0, v, 60)
    assert isl[0] == 4 and min(isl) >= 4      # (5 once a struck ball leaves the rack)
    assert sim.last.converged and ref.last.converged
    np.testing.assert_allclose(a, b, atol=1e-9, rtol=0)


def test_separate_stacks_behave_as_each_alone():
    """A stack next to a second one (out of reach) moves exactly as when simulated alone."""
    alone = diffgym.Simulator.from_string(_scene(_stack(0, 0, 3, "a")))
    both = diffgym.Simulator.from_string(_scene(_stack(0, 0, 3, "a") + _stack(0.6, 0.2, 4, "b")))
    va = np.zeros(alone.nv)
    va[12] = 0.2                         # the top box of a slides
    vb = np.zeros(both.nv)
    vb[:alone.nv] = va
    vb[alone.nv + 18] = -0.3             # b's top box slides the other way
    xa, _ = _run(alone, alone.q0, va, 80)
    xb, isl = _run(both, both.q0, vb, 80)
    nqa = alone.nq
    assert set(isl) == {2}
    # the same problem, solved to the same tolerance (1e-9 m/s): rounding apart, the same motion
    np.testing.assert_allclose(xb[:, :nqa], xa[:, :nqa], atol=1e-11, rtol=0)
    np.testing.assert_allclose(xb[:, both.nq:both.nq + alone.nv], xa[:, nqa:], atol=1e-9, rtol=0)
    assert xa[-1, 14] - xa[0, 14] > 1e-3            # (a's top box did slide: x of body 2)


def test_scaling_scenes_islands():
    """The benchmark's scenes: the rack is one island, the pile one per column of four."""
    for xml, want in ((balls_mjcf(9), 1), (boxes_mjcf(12), 3)):
        sim = diffgym.Simulator.from_string(xml)
        q, v = sim.q0, np.zeros(sim.nv)
        for _ in range(3):
            q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.islands == want and sim.last.converged


def test_jacobian_of_a_multi_island_scene():
    """Three islands (two pairs of touching spheres and a box resting alone), each in another
    mode: the step Jacobian against central differences of the whole step."""
    sim = diffgym.Simulator.from_string("""<mujoco><option timestep="0.01"/><worldbody>
      <geom type="plane" size="5 5 .1" friction="0.5"/>
      <body name="a" pos="0 0 0.1"><freejoint/><geom type="sphere" size="0.1"/></body>
      <body name="b" pos="0.19 0.03 0.1"><freejoint/><geom type="sphere" size="0.1"/></body>
      <body name="c" pos="1 1 0.1"><freejoint/><geom type="sphere" size="0.1"/></body>
      <body name="d" pos="1.19 0.97 0.1"><freejoint/><geom type="sphere" size="0.1"/></body>
      <body name="box" pos="-1 0 0.1"><freejoint/><geom type="box" size="0.1 0.15 0.1" friction="0.5"/></body>
      </worldbody></mujoco>""")
    v = np.r_[0.5, 0, 0, 0, 0, 0, -0.2, 0.1, 0, 0, 0, 0.3,
              -0.3, 0.2, 0, 0, 0, -0.2, 0.4, 0, 0, 0, 0.5, 0,
              0, 0, 0, 0, 0, 0]
    tau = np.zeros(sim.nv)
    tau[24:30] = [0.1, 0.2, 0.3, 0.01, 0.02, 0.03]
    assert_jacobian_matches(sim, sim.q0, v, tau)
    assert sim.last.islands == 3
    assert sim.last.num_contacts == 3 + 3 + 4


def test_islands_whose_stage1_fails_take_the_later_stages_alone():
    """With no Newton budget stage 1 fails on every island; each island then goes through the
    Python fallback stages on its own rows, and the step matches the monolithic reference
    taking the same stages on the whole problem (to the solver's tolerance)."""
    xml = _scene(_stack(0, 0, 2, "a")
                 + "".join(f'<body name="s{i}" pos="{1 + 0.1 * i} 0 0.05"><freejoint/>'
                           f'<geom name="sg{i}" type="sphere" size="0.05" mass="0.2"/></body>'
                           for i in range(2)))
    settings = dict(newton_budget=0)
    sim = diffgym.Simulator.from_string(xml)
    sim.solver = NCPSolver(SolverSettings(**settings))
    ref = diffgym.Simulator.from_string(xml)
    ref.solver = NCPSolver(SolverSettings(compiled=False, **settings))
    v = np.zeros(sim.nv)
    v[6 * 2] = 0.4                      # the first ball pushes the second
    tau = np.zeros(sim.nv)
    q, qr, vr = sim.q0, sim.q0, v.copy()
    for _ in range(5):
        q, v = sim.step(q, v, tau)
        assert sim.last.islands == 2 and sim.last.method != "newton" and sim.last.converged
        qr, vr = ref.step(qr, vr, tau)
        assert ref.last.converged
        np.testing.assert_allclose(v, vr, atol=1e-8, rtol=0)
        np.testing.assert_allclose(q, qr, atol=1e-10, rtol=0)


def test_one_island_whose_stage1_fails_reports_the_fallback_residual():
    sim = diffgym.Simulator.from_string(_scene(_stack(0, 0, 2, "a")))
    sim.solver = NCPSolver(SolverSettings(newton_budget=0))
    q, v = sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))
    last = sim.last
    assert last.islands == 1 and last.method != "newton" and last.converged
    assert np.isfinite(last.residual) and last.residual <= 1e-9
