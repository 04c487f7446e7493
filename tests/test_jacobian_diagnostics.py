"""Per-step gradient diagnostics (``jac.diagnostics``, ``sim.last.jacobian_diagnostics``):
the mode the derivative used per contact and limit, the conditioning of the mode system and the
distance to the nearest mode switch."""
import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym.sim import derivatives as D

BOX = """<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1" friction="0.5"/>
<body name="box" pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.15 0.1" friction="0.5"/>
</body></worldbody></mujoco>"""


def _resting_box():
    sim = diffgym.Simulator.from_string(BOX)
    q, v = sim.q0, np.zeros(6)
    for _ in range(20):
        q, v = sim.step(q, v, np.zeros(6))
    return sim, q, v


def _push(sim, q, v, f):
    sim.reset_warmstart()
    _, _, jac = sim.step(q, v, np.r_[f, 0.0, 0.0, 0.0, 0.0, 0.0], jacobian=True)
    return jac.diagnostics


def test_box_on_its_face_is_rank_deficient_min_norm():
    sim, q, v = _resting_box()
    d = _push(sim, q, v, 0.0)
    assert sim.last.num_contacts == 4 and d.kinds == ["contact"] * 4
    assert d.modes == ["sticking"] * 4 == sim.last.contact_modes
    # 12 rows of four coplanar sticking points on a 6-dof body: rank 6
    assert d.rank_deficient and d.solve == "min-norm" and d.rank == 6
    assert d.sigma_min < 1e-12 * d.singular_values[0] and d.condition > 1e12
    assert sim.last.jacobian_diagnostics is d


BALL = """<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1" friction="0.5"/>
<body name="ball" pos="0 0 0.1"><freejoint/><geom type="sphere" size="0.1" friction="0.5"/>
</body></worldbody></mujoco>"""


def test_margin_goes_to_zero_at_the_cone_boundary():
    """A ball on the plane pushed at its centre by a force approaching the largest one under
    which it still rolls without slipping (friction (2/7) f at the contact, so f* = 3.5 mu m g):
    the margin of its sticking contact shrinks linearly to zero and the nearest switch is the
    cone. Just above, the ball slides and the nearest switch is its slip going to zero."""
    sim = diffgym.Simulator.from_string(BALL)
    q, v = sim.q0, np.zeros(6)
    for _ in range(20):
        q, v = sim.step(q, v, np.zeros(6))
    mass = pin.computeTotalMass(sim.model)
    f_star = 3.5 * 0.5 * mass * 9.81
    fractions = np.array([0.5, 0.9, 0.99, 0.999])
    margins = []
    for s in fractions:
        d = _push(sim, q, v, s * f_star)
        assert sim.last.contact_modes == ["sticking"]
        assert d.argmin == 0 and d.argmin_kind == "cone" and d.kinds == ["contact"]
        assert d.min_margin == d.margins.min() and d.margin_kinds == ["cone"]
        margins.append(d.min_margin)
    margins = np.array(margins)
    assert np.all(np.diff(margins) < 0)
    # linear in the distance to the threshold: margin / (1 - s) is the same at every s
    ratio = margins / (1.0 - fractions)
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-4)
    slips = []
    for s in (1.1, 1.01, 1.001):
        d = _push(sim, q, v, s * f_star)
        assert sim.last.contact_modes == ["sliding"] and d.argmin_kind == "slip"
        slips.append(d.min_margin)
    assert slips[0] > slips[1] > slips[2] > 0.0 and slips[2] < 2e-2 * slips[0]
    assert not d.rank_deficient and d.solve == "lu"


def test_breaking_gap_and_limit_margins():
    # a ball falling onto the plane: the speculative contact is breaking while the gap after
    # the step stays open; its margin is that constraint velocity, shrinking as it closes in
    sim = diffgym.Simulator.from_string("""<mujoco><option timestep="0.01"/><worldbody>
      <geom type="plane" size="5 5 .1"/><body name="b" pos="0 0 0.2"><freejoint/>
      <geom type="sphere" size="0.1"/></body></worldbody></mujoco>""", margin=0.05)
    v = np.zeros(6)
    v[2] = -1.0
    seen = []
    for h in (0.12, 0.115, 0.1125):         # gaps 2, 1.5, 1.25 cm; 1.1 cm per step
        q = sim.q0
        q[2] = h
        sim.reset_warmstart()
        _, _, jac = sim.step(q, v, np.zeros(6), jacobian=True)
        d = jac.diagnostics
        assert d.modes == ["breaking"] and d.argmin_kind == "gap"
        np.testing.assert_allclose(d.min_margin, sim.cache["res"].sigma[2], rtol=1e-12)
        seen.append(d.min_margin)
    assert seen[0] > seen[1] > seen[2] > 0.0
    # the cart at its rail stop: an active limit row whose margin is its impulse
    import gymnasium as gym
    from diffgym.envs import ENV_IDS  # noqa: F401
    sim = gym.make("DiffCartPole-v0").unwrapped.sim
    sim.reset_warmstart()
    _, _, jac = sim.step(np.array([2.3992, 0.72]), np.array([2.55, -4.6]), np.array([85.0, 0.0]),
                         jacobian=True)
    d = jac.diagnostics
    assert d.kinds == ["limit"] and d.modes == ["active"] and d.labels == ["slider (upper)"]
    assert d.margin_kinds == ["impulse"]
    G = sim.cache["G"]
    np.testing.assert_allclose(d.margins[0], G[0, 0] * sim.last.limit_impulses[0], rtol=1e-12)
    assert d.solve == "lu" and not d.rank_deficient and d.condition == pytest.approx(1.0)


def test_free_flight_has_no_entries():
    sim = diffgym.Simulator.from_string(BOX)
    q = sim.q0
    q[2] = 1.0
    _, _, jac = sim.step(q, np.zeros(6), np.zeros(6), jacobian=True)
    d = jac.diagnostics
    assert d.kinds == [] and d.min_margin == np.inf and d.argmin == -1 and d.solve == "none"
    assert "entries=0" in repr(d)


def test_diagnostics_match_the_reference_route():
    sim, q, v = _resting_box()
    sim.step(q, v, np.r_[10.0, 0, 0, 0, 0, 0])
    a = D.step_jacobian(sim).diagnostics.as_dict()
    b = D.step_jacobian(sim, compiled=False).diagnostics.as_dict()
    for k in a:
        if isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k])
        else:
            assert a[k] == b[k], k


def test_diagnostics_pickle_without_the_simulator():
    import copy
    import pickle
    sim, q, v = _resting_box()
    _, _, jac = sim.step(q, v, np.zeros(6), jacobian=True)
    d = pickle.loads(pickle.dumps(jac.diagnostics))
    assert "_src" not in d.__dict__ and d.rank_deficient and d.modes == ["sticking"] * 4
    info = copy.deepcopy(sim.last)
    assert info.jacobian_diagnostics.min_margin == jac.diagnostics.min_margin
