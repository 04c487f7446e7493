"""The gradient audit (diffgym.check_step_jacobians / diffgym.envs.check_jacobians) on the states
the program visits: every environment over a whole episode of random actions (all frame-skip
sub-steps of every audited step) and a set of scenes (joint limits, frictionless and frictional
contacts, multi-point flush contacts, every collision pair we load). The bar is the issue's: no
disagreement with central differences above 1e-6 relative that a mode switch inside the stencil
does not explain. Also: the audit catches a wrong Jacobian and explains a genuine mode switch,
and torch.autograd.gradcheck passes through the torch bridge from a state with an active limit
or contact."""
import numpy as np
import pinocchio as pin
import pytest

import diffgym
import diffgym.envs  # noqa: F401  (registers the ids)
import gymnasium as gym
from diffgym.gradcheck import GradientReport, JacobianMismatchError, check_step_jacobians
from diffgym.resources import asset_path

# -- every environment over a whole episode of random actions ----------------------------------
# (seed 0; the rollout runs to the end of the episode, truncation or termination; max_states of
# its steps are audited, those with an active limit or a contact changing mode first, the rest
# spread evenly from the first step to the last; every sub-step of an audited step is audited)
EPISODES = {
    "DiffCartPole-v0": dict(max_states=None),    # all 240 steps
    "DiffHopper-v0": dict(max_states=60),
    "DiffGo1-v0": dict(max_states=8),
    "DiffPush-v0": dict(max_states=40),
    "DiffBilliards-v0": dict(max_states=5),
}


@pytest.mark.parametrize("env_id", list(EPISODES))
def test_audit_whole_random_episode(env_id):
    env = gym.make(env_id)
    rep = diffgym.envs.check_jacobians(env, seed=0, **EPISODES[env_id])
    u = env.unwrapped
    assert rep.episodes_ended == 1                       # the whole episode was rolled out
    assert rep.visited == u.episode_steps or u._terminated(u.get_state()), rep.visited
    assert rep.states == min(rep.visited, EPISODES[env_id]["max_states"] or rep.visited)
    assert rep.substeps == rep.states * u.frame_skip     # every sub-step of every audited step
    assert set(rep.blocks) == set(diffgym.gradcheck.ENV_BLOCKS + diffgym.gradcheck.SIM_BLOCKS)
    assert rep.ok, str(rep)


# -- scenes ------------------------------------------------------------------------------------
def audit(sim, **kw):
    kw.setdefault("max_states", None)
    return check_step_jacobians(sim, **kw)


def test_cart_at_rail_stop():
    """DiffCartPole's model driven into its +2.4 m stop and held there, the pole swinging."""
    sim = diffgym.Simulator.from_file(asset_path("cartpole.xml"))
    q0 = np.array([2.3, 2.5])
    taus = np.tile([60.0, 0.0], (25, 1))
    rep = audit(sim, start=(q0, np.array([1.0, 0.0])), actions=taus)
    assert any("limit slider active" in f.modes for f in rep.findings) or rep.ok
    assert rep.ok, str(rep)


def test_hopper_leg_at_limit():
    """The hopper in the air (no contact) with its leg joint pressed into its 0 rad limit."""
    sim = diffgym.Simulator.from_file(asset_path("hopper.xml"))
    q0 = sim.q0
    q0[1] += 1.0                                   # 1 m up: no contact for the whole rollout
    q0[3], q0[4] = -0.3, -0.01                     # thigh bent, leg 0.01 rad from its stop
    taus = np.tile([0, 0, 0, 0.0, 40.0, -5.0], (15, 1))   # leg torque towards its upper bound 0
    rep = audit(sim, start=(q0, np.zeros(6)), actions=taus)
    last = _final_modes(sim, q0, taus)
    assert "leg_joint" in last, last
    assert rep.ok, str(rep)


def _final_modes(sim, q, taus):
    v = np.zeros(sim.nv)
    seen = set()
    sim.reset_warmstart()
    for tau in taus:
        q, v = sim.step(q, v, tau)
        seen |= {j for j, a in zip(sim.last.limit_joints, sim.last.limit_active) if a}
    return seen


TWO_BALLS = """<mujoco><option timestep="0.01"/><worldbody>
<geom type="plane" size="5 5 .1" friction="0"/>
<body name="a" pos="0 0 0.1"><freejoint/><geom name="a" type="sphere" size="0.1" mass="1" friction="0"/></body>
<body name="b" pos="0.25 0 0.1"><freejoint/><geom name="b" type="sphere" size="0.1" mass="1" friction="0"/></body>
</worldbody></mujoco>"""


def test_frictionless_balls_on_frictionless_plane():
    """Two frictionless balls on a frictionless plane: b at rest, a rolling into it (contacts at
    zero slip must not be differentiated as sticking)."""
    sim = diffgym.Simulator.from_string(TWO_BALLS)
    v0 = np.zeros(12)
    v0[0] = 1.0
    rep = audit(sim, start=(sim.q0, v0), actions=np.zeros((12, 12)))
    assert rep.ok, str(rep)


BOX = """<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1" friction="0.5"/>
<body name="box" pos="0 0 0.1" {euler}><freejoint/><geom name="box" type="box" size="0.1 0.15 0.1" friction="0.5"/>
</body></worldbody></mujoco>"""


def _on_ground(sim, q, gap=-2e-5, pair=0):
    """q moved vertically so that collision pair `pair` is `gap` apart."""
    q = q.copy()
    for _ in range(3):
        pin.forwardKinematics(sim.model, sim.data, q)
        pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, sim.geom_data)
        pin.computeDistance(sim.geom_model, sim.geom_data, pair)
        q[2] -= sim.geom_data.distanceResults[pair].min_distance - gap
    return q


@pytest.mark.parametrize("euler, v0, tau, steps", [
    ("", [0, 0, 0, 0, 0, 0], [0.1, 0.2, 0.3, 0.01, 0.02, 0.03], 25),      # resting (sticking)
    ("", [1.0, 0.3, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], 25),                 # sliding to a stop
    # on an edge (two points), sliding and spinning; after ~10 steps it falls onto a face, where
    # four coplanar sliding and spinning points split the normal force non-uniquely (README:
    # "Indeterminate contact sets"), so the rollout stops before
    ('euler="20 0 0"', [1.0, 0.5, 0, 0, 0, 2.0], [0, 0, 0, 0, 0, 0], 8),
], ids=["resting", "sliding", "edge-spinning"])
def test_frictional_box(euler, v0, tau, steps):
    sim = diffgym.Simulator.from_string(BOX.format(euler=euler))
    q0 = _on_ground(sim, sim.q0)
    rep = audit(sim, start=(q0, np.array(v0, float)), actions=np.tile(tau, (steps, 1)))
    assert rep.ok, str(rep)


FEET = """<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1" friction="0.5"/>
<body name="box" pos="0 0 0.1"><freejoint/><geom name="box" type="box" size="0.1 0.1 0.05" mass="1" contype="2" conaffinity="2"/>
<geom name="f1" type="sphere" pos="0.09 0 -0.05" size="0.01" mass="0.01"/>
<geom name="f2" type="sphere" pos="-0.045 0.078 -0.05" size="0.01" mass="0.01"/>
<geom name="f3" type="sphere" pos="-0.045 -0.078 -0.05" size="0.01" mass="0.01"/>
</body></worldbody></mujoco>"""


def test_box_on_three_feet_sliding_and_spinning():
    """A box on three feet (statically determinate), thrown sliding and spinning until it
    stops: sliding, spinning, sticking and the transitions between them."""
    sim = diffgym.Simulator.from_string(FEET)
    q0 = _on_ground(sim, sim.q0, pair=1)
    rep = audit(sim, start=(q0, np.array([0.8, 0.3, 0, 0, 0, 6.0])), actions=np.zeros((30, 6)))
    assert rep.ok, str(rep)


def _flush_push_state(env):
    """DiffPush-v0 with the rod flat against the box's -x face (its axis along y), at rest."""
    u = env.unwrapped
    env.reset(seed=0)
    x = u.get_state()
    nq, nv = u.nq, u.nv
    x[nq:nq + nv] = 0.0
    b, r = u._box_q, u._box_rq
    x[b:b + 2] = [0.0, 0.0]
    x[r:r + 4] = [0, 0, 0, 1]
    rod_world_x = -0.05 - 0.02 - 1e-4              # box face - rod radius - 0.1 mm
    x[0] = rod_world_x - u._rod_offset[0]
    x[1] = -u._rod_offset[1]
    x[2] = 0.0                                       # the capsule's axis is along y: flush
    return x


def test_flush_rod_pushing_box_face():
    """DiffPush-v0's rod pushed head-on and flat against the box face: two-point contact with
    friction, the box sliding on its face without spin."""
    env = gym.make("DiffPush-v0", target=(0.3, 0.0))
    x = _flush_push_state(env)
    actions = np.tile([0.6, 0.0, 0.0], (20, 1))
    rep = diffgym.envs.check_jacobians(env, start=x, actions=actions, max_states=None)
    # the scene does what it says: two rod-box contact points at some visited sub-step
    u = env.unwrapped
    u.set_state(x)
    pts = 0
    for a in actions[:8]:
        u.step(a)
        pts = max(pts, sum(1 for g in u.sim.last.contact_geoms if set(g) == {"rod", "box"}
                           and u.sim.last.contact_modes[u.sim.last.contact_geoms.index(g)] != "breaking"))
    assert pts >= 1
    assert rep.ok, str(rep)


# every collision pair we load: one free body thrown onto (or against) another shape
MESH_OBJ = ("".join(f"v {x} {y} {z}\n" for x in (-0.1, 0.1) for y in (-0.15, 0.15) for z in (-0.2, 0.2))
            + "f 1 2 4\nf 1 4 3\nf 5 7 8\nf 5 8 6\nf 1 5 6\nf 1 6 2\nf 3 4 8\nf 3 8 7\nf 1 3 7\n"
              "f 1 7 5\nf 2 6 8\nf 2 8 4\n")
PAIR = """<mujoco><option timestep="0.01"/>{asset}<worldbody>{ground}
<body name="b" pos="{pos}" euler="{euler}"><freejoint/>{geom}</body></worldbody></mujoco>"""
PLANE = '<geom name="ground" type="plane" size="5 5 .1" friction="0.5"/>'
TABLE = '<geom name="ground" type="box" pos="0 0 -0.1" size="1 1 0.1" friction="0.5"/>'
PAIRS = {
    # shape on a plane (closed form)
    "sphere-plane": (PLANE, '<geom type="sphere" size="0.1" friction="0.5"/>', "0 0 0.12", "0 0 0"),
    "capsule-plane": (PLANE, '<geom type="capsule" size="0.05 0.2" friction="0.5"/>', "0 0 0.3", "30 20 0"),
    "box-plane": (PLANE, '<geom type="box" size="0.1 0.15 0.2" friction="0.5"/>', "0 0 0.35", "30 20 0"),
    "cylinder-plane": (PLANE, '<geom type="cylinder" size="0.1 0.2" friction="0.5"/>', "0 0 0.3", "30 0 0"),
    "ellipsoid-plane": (PLANE, '<geom type="ellipsoid" size="0.1 0.15 0.2" friction="0.5"/>', "0 0 0.3", "30 20 0"),
    "mesh-plane": (PLANE, '<geom type="mesh" mesh="cube" mass="2" friction="0.5"/>', "0 0 0.35", "30 20 0"),
    # shape on a static box (a table)
    "sphere-box": (TABLE, '<geom type="sphere" size="0.1" friction="0.5"/>', "0 0 0.12", "0 0 0"),
    "box-box": (TABLE, '<geom type="box" size="0.1 0.15 0.05" friction="0.5"/>', "0 0 0.12", "20 10 0"),
    "capsule-box": (TABLE, '<geom type="capsule" size="0.05 0.2" friction="0.5"/>', "0 0 0.3", "30 20 0"),
    "cylinder-box": (TABLE, '<geom type="cylinder" size="0.1 0.2" friction="0.5"/>', "0 0 0.3", "30 0 0"),
    "mesh-box": (TABLE, '<geom type="mesh" mesh="cube" mass="2" friction="0.5"/>', "0 0 0.35", "30 20 0"),
    # on a static capsule lying across the x axis
    "capsule-capsule": ('<geom name="ground" type="capsule" fromto="-1 0 0.05 1 0 0.05" size="0.05" friction="0.5"/>',
                        '<geom type="capsule" fromto="0.1 0.1732 0 -0.1 -0.1732 0" size="0.04" friction="0.5"/>',
                        "0 0 0.15", "0 0 0"),
    "sphere-capsule": ('<geom name="ground" type="capsule" fromto="-1 0 0.05 1 0 0.05" size="0.05" friction="0.5"/>',
                       '<geom type="sphere" size="0.05" friction="0.5"/>', "0.01 0 0.16", "0 0 0"),
}


# (the cylinder-box pair was a strict xfail until issue 12: coal gave one contact point for a
# cylinder flat on a box and its geometry derivative was a finite difference; now a box face gives
# closed-form points and derivatives, tests/test_cylinder_contacts.py)
@pytest.mark.parametrize("pair", list(PAIRS))
def test_collision_pair(pair, tmp_path):
    ground, geom, pos, euler = PAIRS[pair]
    asset = '<asset><mesh name="cube" file="cube.obj"/></asset>' if "mesh" in geom else ""
    (tmp_path / "cube.obj").write_text(MESH_OBJ)
    (tmp_path / "scene.xml").write_text(PAIR.format(asset=asset, ground=ground, geom=geom, pos=pos,
                                                    euler=euler))
    sim = diffgym.Simulator.from_file(str(tmp_path / "scene.xml"))
    # thrown sideways and spinning, so the rollout visits impact, sliding and (mostly) rest
    v0 = np.array([0.6, 0.3, -0.5, 0.5, -0.3, 1.5])
    rep = audit(sim, start=(sim.q0, v0), actions=np.zeros((40, 6)), max_states=20, name=pair)
    hit = _contacts_seen(sim, sim.q0, v0, 40)
    assert hit, f"{pair}: the body never touched the other shape"
    assert rep.ok, str(rep)
    # the only states without a derivative to check are the indeterminate ones (README:
    # "Indeterminate contact sets"): a face sliding and spinning on four coplanar points (the
    # box landing flat on the table), where the split of normal impulse changes the friction
    # torque and the solver's pick depends on its warm start
    for f in rep.findings:
        if f.status == "indeterminate":
            assert f.modes.count("sliding") >= 4 and "sticking" not in f.modes, str(f)


def test_indeterminate_velocity_is_classified_only_where_the_split_moves_it():
    """The audit's "indeterminate" verdict (gradcheck.velocity_indeterminacy) at a face on a
    plane: resting (four sticking points) and sliding without spin are determinate (the
    redundant normal impulses do not move the velocity), sliding while spinning is not."""
    from diffgym.gradcheck import velocity_indeterminacy
    sim = diffgym.Simulator.from_string(BOX.format(euler=""))
    verdicts = []
    for v0 in ([0, 0, 0, 0, 0, 0], [1.0, 0.3, 0, 0, 0, 0], [1.0, 0.3, 0, 0, 0, 1.0]):
        q, v = _on_ground(sim, sim.q0), np.array(v0, float)
        sim.reset_warmstart()
        for _ in range(3):
            q, v = sim.step(q, v, np.zeros(6))[:2]
        sim.step(q, v, np.zeros(6))
        assert sim.last.num_contacts == 4
        verdicts.append((sorted(set(sim.last.contact_modes)), velocity_indeterminacy(sim)))
    assert verdicts[0] == (["sticking"], "")
    assert verdicts[1] == (["sliding"], "")
    assert verdicts[2][0] == ["sliding"] and "null direction" in verdicts[2][1]


def test_sphere_sphere_both_moving():
    sim = diffgym.Simulator.from_string(TWO_BALLS.replace('friction="0"', 'friction="0.5"'))
    v0 = np.zeros(12)
    v0[0], v0[5] = 1.5, 3.0
    rep = audit(sim, start=(sim.q0, v0), actions=np.zeros((20, 12)), name="sphere-sphere")
    assert rep.ok, str(rep)


def _contacts_seen(sim, q, v, steps):
    sim.reset_warmstart()
    seen = False
    for _ in range(steps):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        seen |= any("ground" in g for g in sim.last.contact_geoms for g in g) and any(
            m != "breaking" for m in sim.last.contact_modes)
    return seen


# -- the audit itself ----------------------------------------------------------------------------
def test_audit_catches_a_wrong_jacobian():
    """A Jacobian off by 1e-4 (relative) in one entry must fail and name the block and column."""
    sim = diffgym.Simulator.from_string(BOX.format(euler=""))
    q0 = _on_ground(sim, sim.q0)
    v0 = np.array([1.0, 0.3, 0, 0, 0, 0])
    good = audit(sim, start=(q0, v0), actions=np.zeros((5, 6)))
    assert good.ok and good.checked == 5 * 36, str(good)
    real = sim.step

    def wrong(q, v, tau, jacobian=False):
        out = real(q, v, tau, jacobian=jacobian)
        if jacobian:                        # 1e-4 of the column's largest entry, in one entry
            col = out[2].dv_dq[:, 4]
            col[1] += 1e-4 * np.abs(col).max()
        return out

    sim.step = wrong
    bad = audit(sim, start=(q0, v0), actions=np.zeros((5, 6)))
    assert not bad.ok and bad.failed >= 1
    assert {f.block for f in bad.failures} == {"dv_dq"}
    assert {f.column for f in bad.failures} == {4}
    assert all(f.status == "failed" and 5e-5 < f.error < 2e-4 for f in bad.failures), str(bad)
    assert "dv_dq column 4" in str(bad) and "sliding" in str(bad)
    with pytest.raises(JacobianMismatchError, match="dv_dq column 4"):
        audit(sim, start=(q0, v0), actions=np.zeros((5, 6)), raise_on_failure=True)


def test_env_audit_catches_a_wrong_reward_derivative():
    env = gym.make("DiffPush-v0")
    u = env.unwrapped
    real = u._reward

    def reward(x, a):
        r, terms, dr, dra = real(x, a)
        dr = dr.copy()
        dr[u._box_v] *= 1.01
        return r, terms, dr, dra

    u._reward = reward
    # (the rod held in a far corner, the box resting on its face: steps whose velocity is
    # unique; where the rod strikes the box it mostly slides while it spins, and a disagreement
    # there is indeterminate, see envs/push.py)
    env.reset(seed=0)
    x = u.get_state()
    x[0:2] = np.array([-0.5, -0.5]) - u._rod_offset
    acts = np.tile([-1.0, -1.0, 0.0], (5, 1))
    rep = diffgym.envs.check_jacobians(env, seed=0, start=x, actions=acts, max_states=3)
    assert not rep.ok and rep.indeterminate == 0
    # the wrong d r / d x_next reaches the reward blocks only (through the state Jacobians)
    assert {f.block for f in rep.failures} <= {"reward_state", "reward_action"}, str(rep)
    assert u._box_v in {f.column for f in rep.failures if f.block == "reward_state"}
    assert rep.blocks["state_state"].failed == 0 and rep.blocks["obs_state"].failed == 0


def test_env_audit_classifies_indeterminate_steps(monkeypatch):
    """An environment step's state and reward blocks take the simulator's verdict on its
    sub-steps (gradcheck.velocity_indeterminacy, the one test for both): a disagreement at a
    step one of whose sub-steps has a non-unique velocity is indeterminate, naming the
    sub-step; elsewhere it fails. (A wrong Jacobian stands in for the disagreement and a stub
    verdict for a non-unique sub-step: the cart-pole has one sub-step per step.)"""
    import diffgym.gradcheck as gc
    env = gym.make("DiffCartPole-v0")
    u = env.unwrapped
    real = u.step_with_jacobian

    def wrong(action):
        *out, jac = real(action)
        jac.state_state[0, 0] += 1e-3 * np.abs(jac.state_state).max()
        return (*out, jac)

    u.step_with_jacobian = wrong
    rep = diffgym.envs.check_jacobians(env, steps=2, max_states=2)
    assert rep.failed >= 1 and rep.indeterminate == 0
    assert {f.block for f in rep.failures} == {"state_state"}, str(rep)
    monkeypatch.setattr(gc, "velocity_indeterminacy", lambda sim: "stub: null direction")
    rep = diffgym.envs.check_jacobians(env, steps=2, max_states=2)
    assert rep.ok and rep.failed == 0 and rep.indeterminate >= 1, str(rep)
    ind = [f for f in rep.findings if f.status == "indeterminate"]
    assert {f.block for f in ind} == {"state_state"}
    assert all(f.indeterminate == "sub-step 0: stub: null direction" for f in ind), ind[0].indeterminate


def _contact_threshold_height(sim, vz):
    """The height at which a falling ball's contact impulse just becomes positive within the
    step (bisection to 1e-13 m): a contact making/breaking inside any stencil around it."""
    def lam(z):
        q = sim.q0
        q[2] = z
        sim.reset_warmstart()
        sim.step(q, np.array([0, 0, vz, 0, 0, 0.0]), np.zeros(6))
        imp = sim.last.contact_impulses
        return float(imp[:, 2].sum()) if len(imp) else 0.0

    lo, hi = 0.1, 0.1 + 0.02               # lo: touching (impulse > 0), hi: clear
    assert lam(lo) > 0 and lam(hi) == 0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if lam(mid) > 0:
            lo = mid
        else:
            hi = mid
    return lo, hi


def test_audit_explains_a_contact_making_inside_the_stencil():
    # (a 2 cm margin: the contact is seen before it closes, so it closes inside the smooth map)
    sim = diffgym.Simulator.from_string(PAIR.format(asset="", ground=PLANE, pos="0 0 0.2", euler="0 0 0",
                                                    geom='<geom type="sphere" size="0.1" friction="0.5"/>'),
                                        margin=0.02)
    vz = -0.5
    lo, hi = _contact_threshold_height(sim, vz)
    # just clear (1e-13 m above the switch) and just touching (3e-8 m below: a normal impulse
    # large enough for the friction cone to hold the stencil's tangential perturbations)
    for z in (hi, lo - 3e-8):
        q = sim.q0
        q[2] = z
        rep = audit(sim, states=[(q, np.array([0, 0, vz, 0, 0, 0.0]), np.zeros(6))])
        assert rep.ok, str(rep)
        assert rep.explained >= 1, str(rep)
        expl = [f for f in rep.findings if f.status == "explained"]
        # the stencil in z crosses the switch: dv_dq's z column, explained by the one-sided side
        assert any(f.block == "dv_dq" and f.column == 2 and f.mode_change for f in expl), str(rep)
        assert all(f.jump > 1e-3 for f in expl)


def test_report_table_and_counts():
    rep = GradientReport()
    sim = diffgym.Simulator.from_string(BOX.format(euler=""))
    audit(sim, start=(_on_ground(sim, sim.q0), np.zeros(6)), actions=np.zeros((2, 6)), report=rep)
    assert rep.states == 2 and rep.checked == 2 * 36 == rep.agreeing + rep.explained + rep.failed
    text = str(rep)
    for block in diffgym.gradcheck.SIM_BLOCKS:
        assert block in text
    with pytest.raises(TypeError, match="Simulator or a DiffEnv"):
        check_step_jacobians(object())
    with pytest.raises(ValueError, match="eps"):
        check_step_jacobians(sim, eps=(0.0,))


# -- torch.autograd.gradcheck through the torch bridge ------------------------------------------
def _velocity_unique_along(env_id, x0, actions):
    """Whether every step of the rollout from x0 with these actions has a unique velocity
    (gradcheck.velocity_indeterminacy): where it has not, the step is no function of the
    state and there is no derivative for gradcheck to compare with (DiffPush-v0's box
    sliding while it spins on its face; see envs/push.py)."""
    from diffgym.gradcheck import velocity_indeterminacy
    env = gym.make(env_id)
    env.reset(seed=0)
    env.unwrapped.set_state(x0)
    for a in actions:
        env.step(a)
        if velocity_indeterminacy(env.unwrapped.sim):
            return False
    return True


def _state_with_limit_or_contact(env_id, actions=None):
    """A visited state of seed 0 with an active joint limit (cart-pole, hopper) or a contact
    carrying impulse (the others), found along a random-action rollout; with ``actions``, one
    from which the rollout with them has a unique velocity at every step."""
    env = gym.make(env_id)
    u = env.unwrapped
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    want_limit = env_id in ("DiffCartPole-v0", "DiffHopper-v0")
    for t in range(u.episode_steps):
        x = u.get_state()
        if env_id == "DiffCartPole-v0":
            a = np.array([1.0 if t < 60 else -0.2])        # drive the cart into its stop
        else:
            a = rng.uniform(-1, 1, u.n_a)
        _, _, term, trunc, _ = env.step(a)
        last = u.sim.last
        hit = (np.any(last.limit_active) if want_limit else
               any(m != "breaking" for m in last.contact_modes))
        if hit and t > 2 and (actions is None or _velocity_unique_along(env_id, x, actions)):
            return x
        if term or trunc:
            env.reset(seed=t + 1)
    raise AssertionError(f"{env_id}: no state with an active limit or contact found")


@pytest.mark.parametrize("env_id", list(EPISODES))
def test_torch_gradcheck_three_steps_from_limit_or_contact(env_id):
    torch = pytest.importorskip("torch")
    from diffgym.torch_bridge import TorchVecEnv
    venv = diffgym.make_vec(env_id, num_envs=1, seed=0)
    tenv = TorchVecEnv(venv, dtype=torch.float64)
    e = venv.envs[0]
    rng = np.random.default_rng(1)
    A0 = torch.tensor(rng.uniform(-0.5, 0.5, (3, 1, e.n_a)), dtype=torch.float64)
    # (DiffPush-v0: from a state whose 3 steps have a unique velocity; the box resting on its
    # face is such a state, with redundant impulses)
    x0 = _state_with_limit_or_contact(env_id, A0[:, 0].numpy() if env_id == "DiffPush-v0" else None)
    P = torch.tensor(e.tangent_map(x0))
    # the initial state moves in a random subspace of at most 12 tangent directions (all of
    # them for the smaller models), mapped to full coordinates: x0 + P D z
    k = min(e.n_x, 12)
    D = torch.tensor(np.linalg.qr(rng.standard_normal((e.n_x, k)))[0]) if k < e.n_x else torch.eye(e.n_x, dtype=torch.float64)

    def rollout(z, A):
        tenv.reset(seed=0)
        venv.set_state(x0[None])
        tenv.detach()
        x = torch.tensor(x0)[None] + (P @ (D @ z))[None]
        venv.set_state(x.detach().numpy())
        tenv.state = x
        total = torch.zeros((), dtype=torch.float64)
        for k in range(3):
            obs, r, *_ = tenv.step(A[k])
            total = total + r.sum() + 0.1 * (obs ** 2).sum()
        return total

    z = torch.zeros(k, dtype=torch.float64, requires_grad=True)
    A = A0.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(rollout, (z, A), eps=1e-6, atol=1e-5, rtol=1e-4)
