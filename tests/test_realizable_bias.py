"""constraint.realizable_bias (SolverSettings.realizable_bias): the touching rows' drift
correction projected onto the range of their rows of J, against numpy's least squares on J
itself (an independent route: the kernel works on G = J M^-1 J^T)."""
import numpy as np

from diffgym.sim.constraint import realizable_bias


def _problem(rng, nc, nv, dist):
    J = rng.standard_normal((3 * nc, nv))
    A = rng.standard_normal((nv, nv))
    Minv = np.linalg.inv(A @ A.T + nv * np.eye(nv))
    G = J @ Minv @ J.T
    G = 0.5 * (G + G.T)
    b = np.zeros(3 * nc)
    b[2::3] = 0.2 * np.asarray(dist) / 0.01           # erp d / dt, tangent rows 0
    g = J @ rng.standard_normal(nv) + b
    return J, G, b, g


def _call(G, b, g, nc, pair, dist, skin=1e-3):
    isl = np.zeros(nc, dtype=np.int64)
    return realizable_bias(G, b, g, nc, np.asarray(pair, dtype=np.int64), np.asarray(dist, float),
                           skin, np.zeros((2, nc)), np.zeros(0), isl, np.zeros(0, np.int64), 1)


def test_redundant_rows_get_the_least_squares_realizable_offsets():
    rng = np.random.default_rng(0)
    nc, nv = 4, 6                                     # 12 rows on 6 dofs: redundant
    dist = [-1e-4, -2e-5, 3e-6, -7e-5]
    J, G, b, g = _problem(rng, nc, nv, dist)
    b0, g0 = b.copy(), g.copy()
    assert _call(G, b, g, nc, [0, 0, 0, 0], dist) == 1
    P = J @ np.linalg.pinv(J)
    np.testing.assert_allclose(b, P @ b0, atol=1e-12 * np.abs(b0).max())
    np.testing.assert_allclose(g - g0, b - b0, atol=1e-15)     # g = J v_free + b follows
    assert np.abs(b - b0).max() > 1e-3 * np.abs(b0).max()      # (it was not realizable)


def test_realizable_and_independent_offsets_are_left_alone():
    rng = np.random.default_rng(1)
    nc, nv = 4, 6
    J, G, _, g = _problem(rng, nc, nv, [0.0] * nc)
    b = J @ rng.standard_normal(nv) * 1e-4               # realizable
    b_in = b.copy()
    _call(G, b, g, nc, [0] * nc, [-1e-5] * nc)
    np.testing.assert_allclose(b, b_in, rtol=0, atol=1e-15)
    J, G, b, g = _problem(rng, 2, 9, [-1e-4, -2e-4])      # 6 independent rows
    b_in = b.copy()
    assert _call(G, b, g, 2, [0, 0], [-1e-4, -2e-4]) == 0
    assert np.array_equal(b, b_in)


def test_gaps_keep_their_approach_allowance():
    """A pair only within the skin (every point at > 1e-9 m) is a gap: its rows keep their
    offsets (projecting the allowance would push the rows that touch) and are left out of the
    projection of the others."""
    rng = np.random.default_rng(2)
    nc, nv = 4, 4                                      # contacts 0, 1: 6 rows on 4 dofs
    dist = [-1e-4, -2e-5, 5e-4, 5e-4]
    J, G, b, g = _problem(rng, nc, nv, dist)
    b0 = b.copy()
    assert _call(G, b, g, nc, [0, 0, 1, 1], dist) == 1   # contacts 2, 3: another pair, apart
    assert np.array_equal(b[6:], b0[6:])
    S = np.arange(6)
    Js = J[S]
    np.testing.assert_allclose(b[S], Js @ np.linalg.pinv(Js) @ b0[S],
                               atol=1e-12 * np.abs(b0).max())
    assert np.abs(b[S] - b0[S]).max() > 1e-3 * np.abs(b0[S]).max()


# -- the step Jacobian where the step took the realizable offsets ------------------------------
# (derivatives._realizable_terms: d b' = P db + (I - P) dJ v_c + (J^#)^T dJ^T r on the projected
# rows; checked against central differences of the whole step at visited states where the retry
# acted, with and without those terms: the test fails on a Jacobian that leaves them out)
import pinocchio as pin  # noqa: E402
import pytest  # noqa: E402

import diffgym  # noqa: E402
from diffgym.sim import derivatives as D  # noqa: E402

BOX_ON_BOX = """<mujoco><option timestep="0.01"/><worldbody>
<geom name="ground" type="box" pos="0 0 -0.1" size="1 1 0.1" friction="0.5"/>
<body name="b" pos="0 0 0.12" euler="20 10 0"><freejoint/>
<geom type="box" size="0.1 0.15 0.05" friction="0.5"/></body></worldbody></mujoco>"""
STACK = """<mujoco><option timestep="0.01"/><worldbody>
<geom name="ground" type="box" pos="0 0 -0.1" size="1 1 0.1" friction="0.8"/>
<body name="a" pos="0 0 0.051" euler="2 1 10"><freejoint/>
<geom type="box" size="0.1 0.1 0.05" friction="0.8"/></body>
<body name="b" pos="0.01 0.005 0.152" euler="-1 2 25"><freejoint/>
<geom type="box" size="0.08 0.08 0.05" friction="0.8"/></body>
<body name="c" pos="0.0 0.01 0.253" euler="1 -2 -15"><freejoint/>
<geom type="box" size="0.06 0.06 0.05" friction="0.8"/></body>
</worldbody></mujoco>"""
BRIDGE = """<mujoco><option timestep="0.01"/><worldbody>
<geom name="l" type="box" pos="-0.3 0 -0.1" size="0.25 0.5 0.1" friction="0.5"/>
<geom name="r" type="box" pos="0.3 0 -0.1" size="0.25 0.5 0.1" friction="0.5"/>
<body name="b" pos="0 0 0.12" euler="{euler}"><freejoint/>
<geom type="box" size="0.2 0.15 0.05" friction="0.5"/></body></worldbody></mujoco>"""
SCENES = {
    # a box bridging two static blocks, started a few mm into both, tilted, at rest and thrown:
    # its two patches lie on two mid planes at different heights while it is tilted, so the
    # drift correction of the two pairs together is not realizable with every point sticking
    # and the retry acts while the box is pushed out (the points of one patch share one plane,
    # collision_derivatives._k_common_plane, so a box on one box no longer needs it:
    # test_box_patches_give_realizable_offsets). (These scenes were the box thrown and dropped
    # from 7 cm: it landed on one edge of a block and turned about it 10 mm into the blocks
    # within one step, a corner without a row; since the margin rows of one- and two-point
    # box contacts, collision_kernels.poly_margin_rows, it lands within the skin and the
    # retry, which projects the offsets of touching pairs only, never acts.)
    "bridge-pressed": (BRIDGE.format(euler="2 3 0").replace('pos="0 0 0.12"', 'pos="0 0 0.046"'),
                       None, 6, 40),
    "bridge-pressed-thrown": (BRIDGE.format(euler="3 4 0").replace('pos="0 0 0.12"',
                                                                   'pos="0 0 0.046"'),
                              [0.1, 0.0, -0.3, 0.5, -0.3, 0.2], 6, 40),
}


def _step_v(sim, q, v, tau):
    sim._warm = None                  # (cold: every evaluation the same pure function)
    return sim.step(q, v, tau)[1]


def _differences_dv_dq(sim, q, v, tau, eps=1e-7):
    """Central differences of dv1/dq and whether the one-sided ones agree (else a mode switch
    or a kink of the contact geometry lies inside the stencil: no derivative to compare)."""
    f0 = _step_v(sim, q, v, tau)
    plus, minus = [], []
    for i in range(sim.nv):
        e = np.zeros(sim.nv)
        e[i] = eps
        plus.append(_step_v(sim, pin.integrate(sim.model, q, e), v, tau))
        minus.append(_step_v(sim, pin.integrate(sim.model, q, -e), v, tau))
    P, M = np.array(plus).T, np.array(minus).T
    fwd, bwd = (P - f0[:, None]) / eps, (f0[:, None] - M) / eps
    # (smooth: the one-sided differences agree to their O(eps) truncation; a kink of the
    # contact geometry inside the stencil shows as ~1e-5 and more, and puts the central
    # difference up to half of that off the one-sided derivatives)
    return (P - M) / (2 * eps), _rel(fwd, bwd) < 1e-6


def _rel(A, B):
    """Largest difference relative to its column's scale (at least 1)."""
    return float((np.abs(A - B) / np.abs(B).max(axis=0).clip(1.0)).max())


@pytest.mark.parametrize("scene", list(SCENES))
def test_step_jacobian_with_realizable_offsets_matches_central_differences(scene, tmp_path,
                                                                           monkeypatch):
    xml, v0, first, last = SCENES[scene]
    (tmp_path / "s.xml").write_text(xml)
    sim = diffgym.Simulator.from_file(str(tmp_path / "s.xml"))
    sim.solver.settings.realizable_bias = True
    q, v, tau = sim.q0.copy(), np.zeros(sim.nv) if v0 is None else np.array(v0), np.zeros(sim.nv)
    checked, without = [], []
    for k in range(last):
        sim._warm = None
        if k >= first and len(checked) < 3:
            q1, v1, jac = sim.step(q, v, tau, jacobian=True)
            if sim.last.method == "newton" and D.realizable_islands(sim, sim.cache["cons"]):
                ref = D.step_jacobian(sim, compiled=False)          # the numpy route
                with monkeypatch.context() as mp:                    # the terms left out
                    mp.setattr(D, "_realizable_terms", lambda *a, **kw: None)
                    bare = D.step_jacobian(sim)
                fd, smooth = _differences_dv_dq(sim, q, v, tau)
                if smooth:
                    checked.append((k, _rel(jac.dv_dq, fd), _rel(ref.dv_dq, fd)))
                    without.append(_rel(bare.dv_dq, fd))
        else:
            q1, v1 = sim.step(q, v, tau)
        q, v = q1, v1
    assert len(checked) == 3, f"{scene}: the retry acted on {len(checked)} checked states"
    for k, err, err_ref in checked:
        assert err < 1e-6 and err_ref < 1e-6, (scene, k, err, err_ref)
    assert max(without) > 1e-6, (scene, without)      # (the projection's derivative matters)


def _unrealizable(sim):
    """The largest part of the step's raw drift offsets on its projectable rows
    (``_bias_row_ok``) that no generalized velocity realizes, |(I - J_S J_S^+) b_S|."""
    from diffgym.sim.constraint import _NO_REST, _bias_row_ok, _pairs_in_contact
    cons = sim.cache.get("cons")
    if cons is None or cons.nc == 0:
        return 0.0
    dist = np.asarray(cons.dist, float)
    touch = _pairs_in_contact(np.asarray(cons.contacts.pair, np.int64), dist)
    lim = np.asarray(cons.limit_dist, float)
    S = [r for r in range(cons.m) if _bias_row_ok(r, cons.nc, touch, dist, 1e-3, _NO_REST, lim)]
    if not S:
        return 0.0
    J, b = cons.J[S], cons.b[S]
    return float(np.abs(b - J @ np.linalg.lstsq(J, b, rcond=1e-10)[0]).max())


CAPSULE_ON_BOX = BOX_ON_BOX.replace('<geom type="box" size="0.1 0.15 0.05" friction="0.5"/>',
                                    '<geom type="capsule" fromto="-0.15 0 0 0.15 0 0" '
                                    'size="0.04" friction="0.5"/>')


@pytest.mark.parametrize("scene", ["box-on-box", "3-box stack", "capsule-on-box"])
def test_box_patches_give_realizable_offsets(scene, tmp_path):
    """The points of a box-box (box-capsule) patch share one mid plane normal to the axis, so
    the raw drift correction of a pair's touching rows is realizable at every visited step
    (a tilted box settling on a box, thrown or in a stack): no retry is needed. With each point
    at its own midpoint this was 1.9e-5 (box-on-box), 3.3e-5 (stack), 1.3e-5 (capsule) m/s."""
    # (the capsule thrown twice, the second time down at 1 m/s: since the margin rows of
    # collision_kernels.poly_margin_rows the first throw alone has 3 tilted steps)
    throw = [0.6, 0.3, -0.5, 0.5, -0.3, 1.5]
    xml, v0s = {"box-on-box": (BOX_ON_BOX, [throw]),
                "3-box stack": (STACK, [None]),
                "capsule-on-box": (CAPSULE_ON_BOX, [throw, [0.6, 0.3, -1.0, 0.5, -0.3, 1.5]])}[scene]
    (tmp_path / "s.xml").write_text(xml)
    sim = diffgym.Simulator.from_file(str(tmp_path / "s.xml"))
    sim.solver.settings.realizable_bias = False          # (the raw offsets)
    worst, tilted = 0.0, 0
    for v0 in v0s:
        q, v, tau = sim.q0.copy(), np.zeros(sim.nv) if v0 is None else np.array(v0), np.zeros(sim.nv)
        sim.reset_warmstart()
        for _ in range(40):
            q, v = sim.step(q, v, tau)
            worst = max(worst, _unrealizable(sim))
            cons = sim.cache.get("cons")
            if cons is not None and cons.nc > 1:
                d = np.asarray(cons.dist)
                tilted += int(d.max() - d.min() > 1e-4)       # depths differ across a patch
    assert tilted >= 5, tilted
    assert worst < 1e-12, worst


def test_the_step_records_what_it_projected_on_both_paths(tmp_path):
    """The compiled step and the stage-by-stage one (``SolverSettings.compiled = False``)
    record the same projected rows and raw offsets (``Constraints.projected``), the raw
    offsets are the assembly's (``erp d / dt`` on the normal rows, 0 on the tangent rows), and
    the projected offsets are the projection of the raw ones onto the range of those rows of J."""
    xml, v0, first, last = SCENES["bridge-pressed-thrown"]
    (tmp_path / "s.xml").write_text(xml)
    sim = diffgym.Simulator.from_file(str(tmp_path / "s.xml"))
    q, v, tau = sim.q0.copy(), np.array(v0), np.zeros(sim.nv)
    for k in range(last):
        sim._warm = None
        q1, v1 = sim.step(q, v, tau)
        cons = sim.cache["cons"]
        if k >= first and cons is not None and cons.projected is not None:
            break
        q, v = q1, v1
    else:
        pytest.fail("the retry never acted")
    proj, braw = (np.array(x) for x in cons.projected)
    S = np.flatnonzero(proj >= 0)
    nc = cons.nc
    normal = S[(S < 3 * nc) & (S % 3 == 2)]
    np.testing.assert_array_equal(braw[normal], 0.2 * cons.dist[normal // 3] / sim.dt)
    assert not np.any(braw[S[(S < 3 * nc) & (S % 3 != 2)]])
    JS = cons.J[S]
    np.testing.assert_allclose(cons.b[S], JS @ np.linalg.lstsq(JS, braw[S], rcond=1e-10)[0],
                               atol=1e-12 * np.abs(braw[S]).max())
    sim.solver.settings.compiled = False
    sim._warm = None
    _, v2 = sim.step(q, v, tau)
    rec = sim.cache["cons"].projected
    assert rec is not None
    np.testing.assert_array_equal(rec[0] >= 0, proj >= 0)
    np.testing.assert_allclose(rec[1], braw, rtol=0, atol=1e-15)
    assert np.abs(v2 - v1).max() < 1e-9


EDGE_ON_BOX = """<mujoco><option timestep="0.01"/><worldbody>
<geom name="ground" type="box" pos="0 0 -0.1" size="1 1 0.1" friction="0.5"/>
<body name="b" pos="0 0 {z}" euler="{euler}"><freejoint/>
<geom type="box" size="0.1 0.15 0.05" friction="0.5"/></body></worldbody></mujoco>"""


@pytest.mark.parametrize("euler, z, w", [("0 2 0", 0.05196, [0.0, -2.0, 0.0]),
                                         ("1.5 2 0", 0.05587, [1.0, -2.0, 0.0])],
                         ids=["edge", "corner"])
def test_margin_rows_keep_the_offsets_realizable(euler, z, w, tmp_path):
    """A box standing on an edge (corner) pressed 1-2 mm into a box's face and turning down
    onto it: its far corners within reach get margin rows (collision_kernels.poly_margin_rows:
    the contact's normal, on its mid plane, the distance along the normal to the face's plane).
    With one or two contact points they make at most three points of one pair on one plane,
    so the raw drift correction of the touching pair stays realizable (the margin rows of an
    earlier attempt had the face's normal and the corner's own height: 0.015 m/s unrealizable
    on a 3-box stack)."""
    from diffgym.sim.collision_derivatives import MARGIN_VERTEX_ID
    from diffgym.sim.constraint import _pairs_in_contact
    (tmp_path / "s.xml").write_text(EDGE_ON_BOX.format(euler=euler, z=z))
    sim = diffgym.Simulator.from_file(str(tmp_path / "s.xml"))
    sim.solver.settings.realizable_bias = False          # (the raw offsets)
    q, v, tau = sim.q0.copy(), np.r_[0.0, 0.0, -0.2, w], np.zeros(sim.nv)
    seen, worst = 0, 0.0
    for _ in range(10):
        q, v = sim.step(q, v, tau)
        cons = sim.cache["cons"]
        c = cons.contacts
        spec = np.asarray(c.point) >= MARGIN_VERTEX_ID
        touch = _pairs_in_contact(np.asarray(c.pair, np.int64), np.asarray(c.dist, float))
        if (spec & touch).any():
            seen += 1
            assert len(c.pair) <= 3 and np.ptp(np.asarray(c.dist)) > 5e-4
            worst = max(worst, _unrealizable(sim))
    assert seen >= 1, seen
    assert worst < 1e-12, worst
