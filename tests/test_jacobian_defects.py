"""Regression tests of issue 12 ("exact means exact"): step Jacobians at states that seeded
random rollouts visit, against central differences of the whole step.

Each state below was found along a seeded random episode (``scratch``-free: the numbers are
stored here) where the Jacobian was wrong by the same amount at every difference step from
1e-4 to 1e-8 with no mode change inside the stencil. Every block is compared with central
differences at three step sizes (the best of the three, so that neither truncation nor rounding
hides or fakes an error), after checking that the one-sided differences agree (no mode switch
inside the stencil). The compiled route and the numpy reference are compared as well.
"""
import numpy as np
import pinocchio as pin
import pytest
import gymnasium as gym

import diffgym
from diffgym import gradcheck
from diffgym.sim import derivatives as D
from diffgym.envs import ENV_IDS  # noqa: F401  (registers the environments)

BLOCKS = gradcheck.SIM_BLOCKS


def _run(sim, warm, q, v, tau):
    sim.set_warm_start_state(warm)
    return sim.step(q, v, tau)


def fd_step(sim, q, v, tau, eps, tau_scale, warm=None):
    """Central and one-sided differences of the whole step (gradcheck.step_differences)."""
    return gradcheck.step_differences(sim, q, v, tau, eps, warm=warm, tau_scale=tau_scale)


def step_jacobian_errors(sim, q, v, tau, warm=None, tau_scale=100.0,
                         eps_list=(1e-4, 1e-5, 1e-6)):
    """(jac, errors, one_sided) of gradcheck.step_jacobian_errors, after checking that the
    compiled route and the numpy reference give the same Jacobian."""
    _run(sim, warm, q, v, tau)
    jac, ref = D.step_jacobian(sim), D.step_jacobian(sim, compiled=False)
    for k in BLOCKS:
        A, B = getattr(jac, k), getattr(ref, k)
        assert np.allclose(B, A, rtol=1e-9, atol=1e-11 * max(np.abs(A).max(), 1e-12)), \
            f"{k}: compiled and reference routes differ"
    return gradcheck.step_jacobian_errors(sim, q, v, tau, warm=warm, tau_scale=tau_scale, eps=eps_list)


def assert_exact(sim, q, v, tau, rtol=1e-6, warm=None, **kw):
    jac, errors, one_sided = step_jacobian_errors(sim, q, v, tau, warm, **kw)
    # no mode switch inside the stencil: the one-sided differences agree up to truncation
    assert max(one_sided.values()) < 1e-2, one_sided
    bad = {k: f"{e:.2e}" for k, e in errors.items() if not e <= rtol}
    assert not bad, f"Jacobian blocks off against central differences: {bad} ({sim.last})"
    return jac


def _env_sim(env_id):
    return gym.make(env_id).unwrapped.sim


# -- defect 1: any active joint limit ---------------------------------------------------------
# step 90 of a seed-0 random DiffCartPole-v0 episode: the cart against the +2.4 m rail stop
# (relative error 2.7e-1 in dv/dq before the limit impulse entered the ABA derivatives)
CARTPOLE_AT_STOP = dict(q=[2.3992, 0.7179200217520592],
                        v=[2.5502128843497003, -4.625449348502274],
                        tau=[85.48478572491199, 0.0])
# sub-steps 45 and 148 of a seed-0 random DiffHopper-v0 episode: the leg joint at its limit with
# the foot sticking; thigh and leg limits within reach, the leg's loaded, the foot lifting off
HOPPER_LEG_AT_LIMIT = dict(
    q=[-0.007382618783873304, 1.2181707042311831, -0.05073320533301211, -0.0508838757773322,
       -0.0007999999999999999, -0.03010777679727564],
    v=[-0.1967675536659952, -0.3449040620248565, 0.31971806662926083, 0.2755902460503925,
       0.44373606697829693, 0.7713070455720814],
    tau=[0.0, 0.0, 0.0, 88.59533607763268, 10.141728990290355, -75.90324977641774])
HOPPER_TWO_LIMITS = dict(
    q=[-0.04885814508147555, 1.2374754278921278, -0.03304773013212444, -0.0013172867035055984,
       -0.0007712256943944798, 0.18610395839815802],
    v=[0.16714220236853364, 0.34495681614252965, 1.5897668950351114, 1.4534219064999947,
       0.09640321179930988, 2.6944735741221417],
    tau=[0.0, 0.0, 0.0, -188.65385395459157, 87.68790913069613, -193.6033081905712])


def _state(d):
    return tuple(np.array(d[k], dtype=float) for k in ("q", "v", "tau"))


def test_cartpole_at_rail_stop():
    sim = _env_sim("DiffCartPole-v0")
    q, v, tau = _state(CARTPOLE_AT_STOP)
    assert_exact(sim, q, v, tau)
    assert sim.last.limit_joints == ["slider"] and sim.last.limit_active.all()
    assert sim.last.limit_impulses[0] > 0.1            # the stop carries the cart


@pytest.mark.parametrize("state", ["leg_at_limit", "two_limits"])
def test_hopper_joint_at_limit(state):
    sim = _env_sim("DiffHopper-v0")
    q, v, tau = _state(HOPPER_LEG_AT_LIMIT if state == "leg_at_limit" else HOPPER_TWO_LIMITS)
    assert_exact(sim, q, v, tau)
    assert sim.last.limit_active.any() and sim.last.limit_impulses.max() > 1e-3


def test_limit_impulse_enters_the_aba_derivatives(monkeypatch):
    """The Jacobian at the cart-pole stop is wrong without the limit impulse in the joint
    torques of the ABA derivatives (the test above cannot pass by accident)."""
    sim = _env_sim("DiffCartPole-v0")
    q, v, tau = _state(CARTPOLE_AT_STOP)
    sim.reset_warmstart()
    sim.step(q, v, tau)
    good = D.step_jacobian(sim)
    monkeypatch.setattr(D, "_joint_torques", lambda sim, cons, res: sim.cache["tau_total"])
    bad = D.step_jacobian(sim)
    assert np.abs(good.dv_dq - bad.dv_dq).max() > 1e-2 * np.abs(good.dv_dq).max()


# -- defect 2: frictionless contact at zero slip ----------------------------------------------
BALLS = """<mujoco><option timestep="0.01"/><default><geom friction="0 0 0"/></default><worldbody>
<geom type="plane" size="5 5 .1"/>
<body name="a" pos="0 0 0.1"><freejoint/><geom type="sphere" size="0.1" mass="0.1"/></body>
<body name="b" pos="0.3 0 0.1"><freejoint/><geom type="sphere" size="0.1" mass="0.1"/></body>
</worldbody></mujoco>"""


def _balls_touching():
    """Ball a pushed along x into ball b, which rests on the plane (frictionless everywhere):
    the first step at which the two touch. A seeded, deterministic construction."""
    sim = diffgym.Simulator.from_string(BALLS)
    q, v = sim.q0, np.zeros(sim.nv)
    for _ in range(30):                                  # settle on the plane
        q, v = sim.step(q, v, np.zeros(sim.nv))
    tau = np.zeros(sim.nv)
    tau[0] = 0.5
    for _ in range(200):
        q1, v1 = sim.step(q, v, tau)
        if ("a_geom1", "b_geom2") in sim.last.contact_geoms:
            return sim, q, v, tau
        q, v = q1, v1
    raise AssertionError("the balls never touched")


def test_frictionless_balls_zero_slip_are_sliding():
    sim, q, v, tau = _balls_touching()
    sim.reset_warmstart()
    _, _, jac = sim.step(q, v, tau, jacobian=True)
    # the resting ball b slides with zero slip on its frictionless plane: not bonded
    assert sim.last.num_contacts == 3
    assert sim.last.contact_modes == ["sliding"] * 3, sim.last.contact_modes
    assert np.abs(sim.last.contact_impulses[:, :2]).max() < 1e-12
    assert_exact(sim, q, v, tau, tau_scale=1.0)
    # the push along the plane: both balls move together, dv/dtau = dt / (m_a + m_b) for each;
    # a bonded (sticking) contact would have made ball b roll (2/7 of its mass in the inertia)
    assert jac.dv_dtau[0, 0] == pytest.approx(0.01 / 0.2, rel=1e-9)
    assert jac.dv_dtau[6, 0] == pytest.approx(0.01 / 0.2, rel=1e-9)


def test_frictionless_sticking_is_differentiated_as_a_ray(monkeypatch):
    """Without the relabelling, the same step has the solver's "sticking" label and the
    bonded derivative, which is wrong (so the test above cannot pass by accident)."""
    from diffgym.sim import forward
    sim, q, v, tau = _balls_touching()
    sim.reset_warmstart()
    _, _, good = sim.step(q, v, tau, jacobian=True)
    monkeypatch.setattr(forward, "_label_frictionless", lambda res, mu: (res, None))
    sim.reset_warmstart()
    _, _, bad = sim.step(q, v, tau, jacobian=True)
    assert "sticking" in sim.last.contact_modes
    assert np.abs(bad.dv_dv - good.dv_dv).max() > 0.1 * np.abs(good.dv_dv).max()


# step 10 of a head-on push in DiffPush-v0 (velocity control 0.4 m/s, seed 0): the rod flush
# against a box face, its two contact points with zero slip on the frictionless face (the
# solver labelled them "sticking"; errors up to 9.9 relative in dv_dq, 1.6 in dv_dv)
# (recorded when the rod was frictionless and the box stood on three feet; replayed on the
# push model with the rod-box pair frictionless, the box on its face at the same height)
PUSH_FLUSH = dict(
    q=[0.27570061141191926, -0.01704864712226692, -2.8841484100105235, -0.09209629409241489,
       -0.03489867567934513, 0.05, 3.385774327896889e-16, -2.1106575232256828e-17,
       -0.9917267407192242, 0.12836694178184896],
    v=[-0.2899472461270455, -0.07633927514705197, -2.935389503022634e-15, -0.28929827398055635,
       -0.07616840936399857, 5.551115123125783e-17, 3.8782454295460124e-16,
       -2.3314683517128287e-15, -3.1086244689504383e-15],
    tau=[-2.902790677820451, -0.7642663940023677, 4.873264584929871e-16, 0.0, 0.0, 0.0, 0.0,
         0.0, 0.0])


def _frictionless_push_sim():
    """DiffPush-v0's model with the rod-box pair frictionless (friction 0 on both geoms; the
    table-box pair keeps the table's 0.3): the scene this regression was recorded in had a
    frictionless rod (and the box on three feet, its centre at the same height)."""
    from diffgym.resources import asset_path
    xml = open(asset_path("push.xml")).read()
    for g in ('name="rod" type="capsule"', 'name="box" type="box"'):
        assert xml.count(g) == 1
        xml = xml.replace(g, g + ' friction="0"')
    return diffgym.Simulator.from_string(xml, margin=gym.make("DiffPush-v0").unwrapped.CONTACT_MARGIN)


def test_push_flush_rod_frictionless_contacts():
    sim = _frictionless_push_sim()
    q, v, tau = _state(PUSH_FLUSH)
    jac, errors, one_sided = step_jacobian_errors(sim, q, v, tau, tau_scale=1.0)
    rod_box = [m for m, g in zip(sim.last.contact_modes, sim.last.contact_geoms) if "rod" in g]
    assert rod_box == ["sliding", "sliding"]
    for k in ("dq_dv", "dq_dtau", "dv_dv", "dv_dtau"):
        assert errors[k] < 1e-6, (k, errors[k])
        assert one_sided[k] < 1e-3
    # The q columns of the rod's and the box's yaw (2 and 8) are smooth too: exactly flush, the
    # two patch points carry their own distances (turning either way deepens one and lifts the
    # other) and the normal is the cross product of the rod's axis with the box's vertical
    # edges it crosses (the rod is longer than the face), so it turns with both bodies. With
    # coal's shared patch depth these columns sat on a kink (one-sided differences 1e-2 apart).
    c, p, m = fd_step(sim, q, v, tau, 1e-6, 1.0)
    _run(sim, None, q, v, tau)
    jac = D.step_jacobian(sim)
    for k in ("dq_dq", "dv_dq"):
        scale = np.abs(c[k]).max()
        kink = np.abs(p[k] - m[k]).max(axis=0) / scale
        assert kink.max() < 1e-3, (k, kink)
        assert np.abs(getattr(jac, k) - c[k]).max() < 1e-6 * scale, (k, np.abs(getattr(jac, k) - c[k]).max(axis=0) / scale)


# -- torch.autograd.gradcheck through the torch bridge at an active limit ---------------------
def _bridge_gradcheck(env_id, q, v, actions, check_limit=True):
    torch = pytest.importorskip("torch")  # torch is in the dev extra
    from diffgym.torch_bridge import TorchVecEnv
    venv = diffgym.make_vec(env_id, num_envs=1, seed=0)
    tenv = TorchVecEnv(venv, dtype=torch.float64)
    tenv.reset(seed=0)
    x = venv.get_state()
    nq = len(q)
    x[0, :nq], x[0, nq:nq + len(v)] = q, v
    venv.set_state(x)
    snap = venv.snapshot()
    limits = []

    def rollout(x0, A):
        venv.restore(snap)
        venv.set_state(x0.detach().numpy())
        venv.envs[0].sim.reset_warmstart()
        tenv.detach()
        tenv.state = x0
        out = []
        for k in range(A.shape[0]):
            obs, r, term, trunc, _ = tenv.step(A[k])
            assert not (term.any() or trunc.any())
            limits.append(bool(np.any(venv.envs[0].sim.last.limit_active)))
            out += [tenv.state.reshape(-1), r.reshape(-1), obs.reshape(-1)]
        return torch.cat(out)

    x0 = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    A = torch.tensor(np.asarray(actions, dtype=float)[:, None, :], requires_grad=True)
    ok = torch.autograd.gradcheck(rollout, (x0, A), eps=1e-6, atol=1e-6, rtol=1e-5,
                                  raise_exception=False)
    if check_limit:
        assert any(limits), "no active limit along the rollout"
    return ok


def test_gradcheck_cartpole_at_rail_stop():
    s = CARTPOLE_AT_STOP
    assert _bridge_gradcheck("DiffCartPole-v0", s["q"], s["v"], [[0.85], [0.6], [0.9]])


def test_gradcheck_hopper_at_joint_limit():
    s = HOPPER_LEG_AT_LIMIT
    acts = np.random.default_rng(0).uniform(-0.3, 0.3, (3, 3))
    assert _bridge_gradcheck("DiffHopper-v0", s["q"], s["v"], acts)


def test_gradcheck_fails_without_the_limit_torques(monkeypatch):
    """gradcheck is sharp enough to see defect 1 (it failed at the rail stop before the fix)."""
    monkeypatch.setattr(D, "_joint_torques", lambda sim, cons, res: sim.cache["tau_total"])
    s = CARTPOLE_AT_STOP
    assert not _bridge_gradcheck("DiffCartPole-v0", s["q"], s["v"], [[0.85], [0.6], [0.9]])


# DiffPush-v0 at step 2 of the torch gradcheck's rollout (seed-0 contact state, then actions
# default_rng(1).uniform(-.5, .5)): the capsule rod 5.4 mm from a box face, closing within the
# step. With coal's default GJK tolerance (1e-6) the rod/box normal flipped between
# (0.9918, -0.1274, 0) and (0.9925, -0.1220, -0.0055) under perturbations of q by 1e-14, so
# the step was discontinuous at the state (a jump of ~0.09 m/s in the rod's velocity).
PUSH_ROD_NEAR_BOX = dict(
    q=[0.2461673095425376, 0.08781669446109783, 0.20774570709353957, 0.043480048670235666,
       -0.0044808865001945654, 0.05, 9.510287325252918e-17, -1.8112161323205208e-16,
       -0.9979592774000455, -0.06385358761400191],
    v=[1.44903687237822, -0.157438574408561, -8.491945209083198, 0.4553963114166208,
       -0.10198555298942341, -1.6653345369377348e-16, 3.463241674777793e-15,
       -8.412107815880527e-16, 2.992684516783276],
    tau=[7.278030012986127, -11.747326883566108, 1.335009390858102, 0, 0, 0, 0, 0, 0])


def test_push_rod_near_box_collision_output_is_continuous():
    sim = _env_sim("DiffPush-v0")
    q, v, tau = _state(PUSH_ROD_NEAR_BOX)

    from diffgym.sim.collision_derivatives import MARGIN_VERTEX_ID

    def rod_box(dq):
        sim.reset_warmstart()
        sim.step(pin.integrate(sim.model, q, dq), v, tau)
        last = sim.last
        k = [i for i, g in enumerate(last.contact_geoms) if set(g) == {"rod", "box"}]
        # the contact's row, and a margin row of the rod's far part over the face
        # (collision_kernels.poly_margin_rows: the rod turns at 8.5 rad/s, 0.34 rad a step),
        # which shares its normal
        point = sim.cache["cons"].contacts.point
        main = [i for i in k if point[i] < MARGIN_VERTEX_ID]
        assert len(main) == 1 and len(k) <= 2
        for i in k:
            assert np.array_equal(last.contact_normals[i], last.contact_normals[main[0]])
        return last.contact_normals[main[0]], last.contact_distances[main[0]]

    n0, d0 = rod_box(np.zeros(sim.nv))
    assert abs(n0[2]) < 1e-9 and 5e-3 < d0 < 6e-3      # the rod is level with the box face
    rng = np.random.default_rng(0)
    for _ in range(10):
        n, d = rod_box(1e-14 * rng.standard_normal(sim.nv))
        assert np.abs(n - n0).max() < 1e-9 and abs(d - d0) < 1e-11


CREEP_XML = """<mujoco><option timestep="0.01" gravity="0 0 -9.81"/>
<worldbody><geom name="floor" type="plane" size="5 5 0.1" friction="0.5"/>
<body name="box" pos="0 0 0.1"><freejoint name="box"/>
<geom name="b" type="box" size="0.1 0.1 0.1" mass="10000" friction="0.5"/></body></worldbody></mujoco>"""


def _creeping_box():
    """A 10 t block settled on its face (50 steps), pushed with a force 1e-8 above the friction
    limit: its four corners creep at a slip of 5e-10 m/s under normal impulses of 245 N s each,
    so mu lam_N / |slip| ~ 2.5e11 in the slip-direction rows of the mode system."""
    sim = diffgym.Simulator.from_string(CREEP_XML)
    q, v = sim.q0, np.zeros(sim.nv)
    for _ in range(50):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    tau = np.zeros(sim.nv)
    tau[0] = 0.5 * 9.81 * 10000.0 * (1.0 + 1e-8)
    warm = sim.warm_start_state()
    _run(sim, warm, q, v, tau)
    sig = sim.cache["res"].sigma.reshape(-1, 3)
    slip = np.hypot(sig[:, 0], sig[:, 1])
    assert sim.last.contact_modes == ["sliding"] * 4, sim.last.contact_modes
    assert np.all((slip > 2e-10) & (slip < 1e-9)), slip
    return sim, (q, v, tau, warm)


def _unequilibrated(orig):
    """The mode system with a sliding contact's slip-direction rows NOT divided by
    1 + mu lam_N / |slip| (the equivalent system before the equilibration)."""
    def mode_system(res, G, nc, mu):
        A, W = orig(res, G, nc, mu)
        for i in range(nc):
            st = res.sigma[3 * i:3 * i + 2]
            nst = float(np.linalg.norm(st))
            if res.modes[i] not in (D.BREAKING, D.STICKING) and mu[i] > 0 and nst >= 1e-14:
                f = mu[i] * res.lam[3 * i + 2] / nst
                A[3 * i:3 * i + 2] *= 1.0 + f
                W[3 * i:3 * i + 2] *= 1.0 + f
        return A, W
    return mode_system


def test_creeping_box_sliding_rows():
    """The step Jacobian of the creeping block (every block, compiled route and numpy
    reference) against central differences (the gradient audit: the stencil stays sliding).
    Unscaled, the slip-direction rows of the four corners are ~1e11 times the others, the
    least-squares rank cut-off of the rank-deficient mode system (four coplanar corners)
    discards genuine directions: every dv_dtau column fails (next test)."""
    from diffgym.gradcheck import check_step_jacobians
    sim, state = _creeping_box()
    rep = check_step_jacobians(sim, states=[state], name="creeping block")
    # The tau columns are the ones differences can check here: tau moves the slip by 1e-6 m/s
    # per N, so the audit's steps (1e-7 to 1e-4 N) stay inside the smooth piece. Its steps in v
    # and q (>= 1e-7) reverse or turn the 5e-10 m/s slip: those columns see a kink (explained
    # where the analytic column matches one side; in v_y the slip direction turns by ~90
    # degrees on either side, so neither side's secant is the tangent). The state is
    # determinate: it translates (the audit's velocity_indeterminacy finds no null direction
    # that moves the velocity).
    assert rep.indeterminate == 0, str(rep)
    for k in ("dq_dtau", "dv_dtau"):
        assert rep.blocks[k].agreeing == rep.blocks[k].checked == 6, str(rep)
    _run(sim, state[3], *state[:3])
    good, ref = D.step_jacobian(sim), D.step_jacobian(sim, compiled=False)
    for k in BLOCKS:
        A, B = getattr(good, k), getattr(ref, k)
        assert np.abs(A - B).max() <= 1e-8 * np.abs(B).max() + 1e-14, k


def test_creeping_box_fails_without_the_equilibration(monkeypatch):
    """The same state with the mode system's slip rows unscaled (numpy reference route): the
    audit fails (so the test above cannot pass by accident)."""
    from diffgym.gradcheck import check_step_jacobians
    sim, state = _creeping_box()
    monkeypatch.setattr(D, "COMPILED", False)
    monkeypatch.setattr(D, "_mode_system", _unequilibrated(D._mode_system))
    rep = check_step_jacobians(sim, states=[state], name="creeping block, unscaled")
    assert not rep.ok, str(rep)
    # every dv_dtau column (the ones the test above certifies) fails, and the v columns by 100%
    assert rep.blocks["dv_dtau"].failed == 6, str(rep)
    assert max(f.error for f in rep.failures) > 0.5, str(rep)
