"""DiffPush-v0 and DiffBilliards-v0 beyond the generic suite of test_envs.py: the PD layer, a
pushed box reaching its target, step Jacobians through impacts and sliding (where contact
forces are unique by design of the push scene), observation derivatives at rotated bodies,
task sampling and arguments, and a short billiards shot whose exact gradient drives descent."""
import warnings

import gymnasium as gym
import numpy as np
import pinocchio as pin
import pytest

import diffgym  # noqa: F401  (registers the ids)


def _fd_step_errors(e, a, rng, n_dirs=3, eps=1e-6):
    """Max relative error of the step Jacobian (state columns along random tangent directions,
    every action column, and the reward row) against central differences at the current state.
    Leaves the environment stepped once with ``a``."""
    x0 = e.get_state()
    _, _, _, _, _, jac = e.step_with_jacobian(a)
    x1 = e.get_state()

    def run(x, act):
        e.set_state(x)
        _, r, *_ = e.step(act)
        return e.state_difference(x1, e.get_state()), r

    worst = 0.0
    cols = []
    for _ in range(n_dirs):
        d = rng.standard_normal(e.n_x)
        d /= np.linalg.norm(d)
        cols.append((lambda s, d=d: (e.integrate_state(x0, s * d), a), jac.state_state @ d, jac.reward_state @ d))
    for i in range(e.n_a):
        da = np.zeros(e.n_a)
        da[i] = 1.0
        cols.append((lambda s, da=da: (x0, a + s * da), jac.state_action[:, i], jac.reward_action[i]))
    for make, an_x, an_r in cols:
        (xp, rp), (xm, rm) = run(*make(eps)), run(*make(-eps))
        fd_x, fd_r = (xp - xm) / (2 * eps), (rp - rm) / (2 * eps)
        worst = max(worst, np.abs(fd_x - an_x).max() / max(1.0, np.abs(an_x).max()),
                    abs(fd_r - an_r) / max(1.0, abs(an_r)))
    e.set_state(x0)
    e.step(a)
    return worst, e.sim.last


# -- DiffPush-v0 ------------------------------------------------------------------------------------
def _push(**kw):
    env = gym.make("DiffPush-v0", **kw).unwrapped
    env.reset(seed=0)
    return env


def _push_state(e, rod_xy, rod_yaw=0.0, box_xy=(0.0, 0.0), box_quat=(0, 0, 0, 1), target=(0.3, 0.0)):
    x = np.zeros(e.state_size)
    x[0:2] = np.asarray(rod_xy) - e._rod_offset
    x[2] = rod_yaw
    x[3:6] = [box_xy[0], box_xy[1], 0.05]
    x[6:10] = np.asarray(box_quat, float) / np.linalg.norm(box_quat)
    x[e.nq + e.nv:] = target
    return x


def test_push_pd_layer_reaches_pose_and_velocity_targets():
    e = _push()
    e.set_state(_push_state(e, rod_xy=(-0.5, -0.4), rod_yaw=0.3))
    a = np.array([-0.8, -0.6, 0.25])                  # target pose (-0.4, -0.3, pi/4), clear of the box
    for _ in range(30):
        obs, *_ = e.step(a)
    np.testing.assert_allclose(obs[0:2], [-0.4, -0.3], atol=2e-3)
    np.testing.assert_allclose(obs[2:4], [np.cos(np.pi / 4), np.sin(np.pi / 4)], atol=2e-3)
    assert np.abs(obs[8:11]).max() < 1e-2            # settled
    ev = _push(control="velocity")
    ev.set_state(_push_state(ev, rod_xy=(-0.6, -0.5)))
    for _ in range(30):
        obs, *_ = ev.step(np.array([0.5, -0.5, 0.5]))
    np.testing.assert_allclose(obs[8:11], [0.25, -0.25, 1.0], rtol=1e-6)   # damping compensated


def test_push_ramped_pose_target_pushes_box_onto_target():
    """The rod placed behind the box, its pose target moved at 6 cm/s to the point just behind the
    target and held there, delivers the box within 2 cm (success) inside the episode."""
    target = np.array([0.25, 0.1])
    env = gym.make("DiffPush-v0", target=tuple(target))
    env.reset(seed=0)
    e = env.unwrapped
    u = target / np.linalg.norm(target)
    yaw = np.arctan2(u[1], u[0])                      # the stick across the push direction
    start = -0.12 * u
    e.set_state(_push_state(e, rod_xy=start, rod_yaw=yaw, target=tuple(target)))
    goal = target - 0.07 * u                          # rod centre when the box centre is on target
    for k in range(200):
        g = start + min(1.0, k / 120) * (goal - start)
        obs, r, term, trunc, info = env.step(np.array([g[0] / e.WORKSPACE, g[1] / e.WORKSPACE, yaw / np.pi]))
    assert trunc and not term
    assert info["success"] and info["distance"] < 0.02, info
    assert r == pytest.approx(-info["distance"] ** 2)
    assert abs(e.get_state()[5] - 0.05) < 1e-4        # the box stayed on its feet


def test_push_box_stays_on_its_feet_under_random_actions():
    env = gym.make("DiffPush-v0")
    rng = np.random.default_rng(0)
    for seed in range(2):
        env.reset(seed=seed)
        z = []
        for _ in range(200):
            env.step(rng.uniform(-1, 1, 3))
            x = env.unwrapped.get_state()
            z.append(x[5])
            R = pin.Quaternion(x[9], *x[6:9]).toRotationMatrix()
            assert R[2, 2] > 0.99, "the box tipped"
        assert max(abs(np.array(z) - 0.05)) < 5e-3


@pytest.mark.parametrize("control", ["pose", "velocity"])
def test_push_step_jacobian_through_impacts_and_sliding(control):
    """Every step of the first contacts (rod hitting the box, box sliding on its feet) against
    central differences: the scene is designed so that contact forces are unique."""
    env = gym.make("DiffPush-v0", control=control)
    rng = np.random.default_rng(5)
    modes_seen = set()
    for seed in (0, 2):
        env.reset(seed=seed)
        e = env.unwrapped
        acts = np.random.default_rng(0).uniform(-0.5, 0.5, (8, 3))
        if control == "velocity":                    # drive the rod towards the box
            acts[:, :2] = -np.sign(e.get_state()[:2] + e._rod_offset) * 0.8
        for a in acts:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                err, last = _fd_step_errors(e, a, rng)
            modes_seen.update(last.contact_modes)
            assert err < 2e-4, (seed, err, last)
    assert "sliding" in modes_seen                   # the check covered a sliding box


def test_push_observation_jacobian_at_a_tilted_spinning_box():
    e = _push()
    rng = np.random.default_rng(1)
    x = _push_state(e, rod_xy=(-0.3, 0.2), rod_yaw=1.1, box_xy=(0.05, -0.02),
                    box_quat=rng.standard_normal(4))
    x[e.nq:e.nq + e.nv] = rng.standard_normal(e.nv)
    obs, d = e._observe(x)
    eps = 1e-6
    for i in range(e.n_x):
        dx = np.zeros(e.n_x)
        dx[i] = eps
        fd = (e._observe(e.integrate_state(x, dx))[0] - e._observe(e.integrate_state(x, -dx))[0]) / (2 * eps)
        np.testing.assert_allclose(d[:, i], fd, atol=1e-7, err_msg=f"tangent column {i}")
    # the heading observation is (cos, sin) of the yaw for a flat box
    e2 = _push()
    y = _push_state(e2, rod_xy=(-0.3, 0.2), box_quat=(0, 0, np.sin(0.35), np.cos(0.35)))
    np.testing.assert_allclose(e2._observe(y)[0][6:8], [np.cos(0.7), np.sin(0.7)], atol=1e-12)


def test_push_reward_success_and_arguments():
    e = _push(target=(0.2, -0.1))
    x = e.get_state()
    np.testing.assert_allclose(x[-2:], [0.2, -0.1])
    assert np.allclose(e._observe(x)[0][14:16], [0.2, -0.1])
    r, terms, dr, _ = e._reward(_push_state(e, (-0.4, 0.4), box_xy=(0.2, -0.1 + 0.015), target=(0.2, -0.1)), None)
    assert terms["success"] and r == pytest.approx(-0.015 ** 2) and terms["reward_distance"] == r
    r, terms, _, _ = e._reward(_push_state(e, (-0.4, 0.4), box_xy=(0.2, -0.1 + 0.025), target=(0.2, -0.1)), None)
    assert not terms["success"] and terms["distance"] == pytest.approx(0.025)
    # sampled targets: 0.15 to 0.35 m from the box
    env = _push()
    for seed in range(5):
        env.reset(seed=seed)
        x = env.get_state()
        assert 0.15 <= np.linalg.norm(x[-2:] - x[3:5]) <= 0.35
    with pytest.raises(ValueError, match="control"):
        gym.make("DiffPush-v0", control="torque")
    with pytest.raises(ValueError, match="target"):
        gym.make("DiffPush-v0", target=(0.1, np.nan))
    assert set(e.camera) == {"lookat", "distance", "azimuth", "elevation", "fovy"}


# -- DiffBilliards-v0 ---------------------------------------------------------------------------------
def _billiards(**kw):
    env = gym.make("DiffBilliards-v0", **kw).unwrapped
    env.reset(seed=0)
    return env


def test_billiards_step_jacobian_during_the_break():
    e = _billiards(target_balls=(1, 5), spots=((0.8, 0.3), (0.9, -0.3)))
    x = e.get_state()
    x[0:2] = [0.05, 0.01]                  # close to the rack: the impact comes at the 4th step
    x[e.nq] = 2.5
    e.set_state(x)
    rng = np.random.default_rng(0)
    pairs = set()
    for k in range(6):
        err, last = _fd_step_errors(e, np.array([0.2, 0.1]), rng, n_dirs=2)
        pairs.update(tuple(sorted(g)) for g, m in zip(last.contact_geoms, last.contact_modes) if m != "breaking")
        assert err < 1e-5, (k, err, last)
    assert ("ball1", "cue") in pairs                 # the check went through the impact


def _shot(e, p, horizon, ball, spot, gradient=True):
    """Final squared distance of ``ball`` from ``spot`` after a shot p = (x0, y0, vx0, vy0) and its
    gradient by chaining the step Jacobians forward."""
    x = e.get_state()
    x[0:2], x[e.nq:e.nq + 2] = p[:2], p[2:]
    e.set_state(x)
    S = np.zeros((e.n_x, 4))
    S[0, 0] = S[1, 1] = S[e.nv, 2] = S[e.nv + 1, 3] = 1.0
    for _ in range(horizon):
        if gradient:
            S = e.step_with_jacobian(np.zeros(2))[5].state_state @ S
        else:
            e.step(np.zeros(2))
    xf = e.get_state()
    d = xf[7 * ball:7 * ball + 2] - spot
    return float(d @ d), (2 * d @ S[6 * ball:6 * ball + 2] if gradient else None)


def test_billiards_shot_gradient_matches_differences_and_descends():
    """A tiny version of scripts/billiards_shot.py: 12 steps, the cue ball hits ball 1."""
    e = _billiards(target_balls=(1, 2), spots=((0.6, 0.15), (0.0, 0.0)))
    x_rest = e.get_state()
    spot, H = np.array([0.6, 0.15]), 12

    def L(p, gradient=True):
        e.set_state(x_rest)
        return _shot(e, p, H, 1, spot, gradient)

    p = np.array([0.1, 0.01, 2.0, 0.1])
    loss, g = L(p)
    eps = 1e-6
    g_fd = np.array([(L(p + eps * np.eye(4)[i], False)[0] - L(p - eps * np.eye(4)[i], False)[0]) / (2 * eps)
                     for i in range(4)])
    assert np.abs(g).max() > 1e-3                     # the contact carries a gradient
    np.testing.assert_allclose(g, g_fd, rtol=1e-5, atol=1e-8)
    # the gradient is a descent direction: an Armijo step along -g exists among a few lengths
    gn = np.linalg.norm(g)
    trials = [(h, L(p - h * g / gn, False)[0]) for h in (0.02, 0.01, 0.005)]
    assert any(lh < loss - 0.5 * h * gn for h, lh in trials), (loss, gn, trials)


def test_billiards_force_action_moves_only_the_cue_ball():
    e = _billiards(target_balls=(3, 4), spots=((0.0, 0.3), (0.0, -0.3)))
    obs, r, *_, jac = e.step_with_jacobian(np.array([1.0, -0.5]))
    x1 = e.get_state()
    dv = x1[e.nq:e.nq + e.nv].reshape(16, 6)
    assert dv[0, 0] > 0 and dv[0, 1] < 0 and abs(dv[0, 0] + 2 * dv[0, 1]) < 1e-9 * abs(dv[0, 0]) + 1e-12
    assert np.abs(dv[1:]).max() < 1e-12                # nothing touches the others yet
    # the action Jacobian is non-zero only for the cue ball's dofs
    assert np.abs(jac.state_action[6:e.nv]).max() < 1e-12
    assert np.abs(jac.state_action[e.nv + 6:]).max() < 1e-12
    assert np.abs(jac.state_action[e.nv:e.nv + 2]).max() > 0
    np.testing.assert_allclose(obs[32:34], dv[0, :2])


def test_billiards_task_sampling_reward_and_arguments():
    env = gym.make("DiffBilliards-v0").unwrapped
    seen = set()
    for seed in range(6):
        env.reset(seed=seed)
        x = env.get_state()
        i, j = x[-6:-4]
        assert i != j and 1 <= min(i, j) and max(i, j) <= 15 and i == int(i)
        assert np.all(np.abs(x[-4:].reshape(2, 2)[:, 0]) <= 1.0) and np.all(np.abs(x[-4:].reshape(2, 2)[:, 1]) <= 0.55)
        seen.add((i, j))
    assert len(seen) > 1
    e = _billiards(target_balls=(2, 7), spots=((0.5, 0.2), (-0.2, -0.3)), success_radius=0.05)
    x = e.get_state()
    x[7 * 2:7 * 2 + 2] = [0.5, 0.2 + 0.03]
    x[7 * 7:7 * 7 + 2] = [-0.2 + 0.04, -0.3]
    r, terms, dr, _ = e._reward(x, None)
    assert r == pytest.approx(-(0.03 ** 2 + 0.04 ** 2)) and terms["success"]
    assert terms["reward_ball_1"] == pytest.approx(-0.03 ** 2)
    obs, _ = e._observe(x)
    np.testing.assert_allclose(obs[96:100], [0.5, 0.2, -0.2, -0.3])
    np.testing.assert_allclose(obs[104:108], [0, -0.03, -0.04, 0], atol=1e-12)
    x[7 * 7] = -0.2 + 0.06
    assert not e._reward(x, None)[1]["success"]
    bad = e.get_state()
    bad[e.nq + e.nv] = 0.0                                      # the cue ball cannot be a target
    with pytest.raises(ValueError, match="ball numbers"):
        e.set_state(bad)
    for kw, match in [(dict(target_balls=(3, 3)), "target_balls"), (dict(target_balls=(0, 3)), "target_balls"),
                      (dict(spots=(0.1, 0.2)), "spots"), (dict(force_scale=-1.0), "force_scale")]:
        with pytest.raises(ValueError, match=match):
            gym.make("DiffBilliards-v0", **kw)
    assert set(e.camera) == {"lookat", "distance", "azimuth", "elevation", "fovy"}


def test_billiards_observation_jacobian_with_spinning_balls():
    e = _billiards()
    rng = np.random.default_rng(2)
    x = e.get_state()
    Q = x[:e.nq].reshape(16, 7)
    Q[:, 3:] = rng.standard_normal((16, 4))
    Q[:, 3:] /= np.linalg.norm(Q[:, 3:], axis=1, keepdims=True)
    x[:e.nq] = Q.reshape(-1)
    x[e.nq:e.nq + e.nv] = rng.standard_normal(e.nv)
    obs, d = e._observe(x)
    eps = 1e-6
    for _ in range(6):
        dx = rng.standard_normal(e.n_x)
        fd = (e._observe(e.integrate_state(x, eps * dx))[0] - e._observe(e.integrate_state(x, -eps * dx))[0]) / (2 * eps)
        np.testing.assert_allclose(d @ dx, fd, atol=1e-7)
