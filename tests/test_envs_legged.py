"""DiffHopper-v0 and DiffGo1-v0 specifics: reward terms against hand computation, the
termination rules, the Go1 PD layer and the observation/reward derivatives at rotated bases
(tangent coordinates through quaternions) against central differences."""
import numpy as np
import pinocchio as pin
import pytest
import gymnasium as gym

import diffgym  # noqa: F401  (registers the ids)


def _hopper():
    env = gym.make("DiffHopper-v0").unwrapped
    env.reset(seed=0)
    return env


def _go1(**kw):
    env = gym.make("DiffGo1-v0", **kw).unwrapped
    env.reset(seed=0)
    return env


def _fd_check(env, fn, x, n_out, eps=1e-6, atol=1e-7):
    """Central differences of fn along every tangent axis of x against fn's analytic Jacobian."""
    _, J = fn(x)
    J = np.atleast_2d(J).reshape(n_out, env.n_x)
    for i in range(env.n_x):
        d = np.zeros(env.n_x)
        d[i] = eps
        fp = np.atleast_1d(fn(env.integrate_state(x, d))[0])
        fm = np.atleast_1d(fn(env.integrate_state(x, -d))[0])
        fd = (fp - fm) / (2 * eps)
        np.testing.assert_allclose(fd, J[:, i], atol=atol * max(1.0, np.abs(J).max()),
                                   err_msg=f"tangent axis {i}")


# -- hopper -------------------------------------------------------------------------------------

def _hopper_height_by_hand(z):
    h = min(max(z - 1.25 + 0.3, -1.0), 0.3)
    return h if h >= 0 else -200.0 * h * h


@pytest.mark.parametrize("z", [1.6, 1.3, 1.0, 0.9, 0.2, -0.5])
def test_hopper_reward_terms_by_hand(z):
    env = _hopper()
    x = np.zeros(12)
    x[:6] = [0.3, z, 0.2, -0.4, -0.3, 0.1]
    x[6:] = [1.7, -0.2, 0.5, 1.0, -2.0, 0.3]
    a = np.array([0.5, -0.8, 0.2])
    r, terms, dr_dx, dr_da = env._reward(x, a)
    assert terms["reward_forward"] == pytest.approx(1.7)
    assert terms["reward_height"] == pytest.approx(_hopper_height_by_hand(z))
    assert terms["reward_angle"] == pytest.approx(1.0 - (0.2 / (np.pi / 6)) ** 2)
    assert terms["reward_ctrl"] == pytest.approx(-0.1 * (0.25 + 0.64 + 0.04))
    assert r == pytest.approx(sum(v for k, v in terms.items() if k.startswith("reward_")))
    # derivatives, including the clipped regions (z = 1.6 and z = -0.5: derivative 0)
    _fd_check(env, lambda y: env._reward(y, a)[::2], x, 1)
    expected_dz = {1.6: 0.0, 1.3: 0.0, 1.0: 1.0, 0.9: -400.0 * (0.9 - 0.95), 0.2: -400.0 * (0.2 - 0.95),
                   -0.5: 0.0}[z]
    assert dr_dx[1] == pytest.approx(expected_dz)
    np.testing.assert_allclose(dr_da, -0.2 * a)


def test_hopper_step_reports_terms_of_the_next_state():
    env = _hopper()
    for _ in range(20):
        obs, r, term, trunc, info = env.step(np.array([0.3, -0.2, 0.1]))
    x = env.get_state()
    np.testing.assert_array_equal(obs, x[1:])              # Gymnasium's qpos[1:], qvel, unclipped
    assert info["reward_height"] == pytest.approx(_hopper_height_by_hand(x[1]))
    assert info["reward_forward"] == pytest.approx(x[6])
    assert r == pytest.approx(info["reward_forward"] + info["reward_height"] + info["reward_angle"]
                              + info["reward_ctrl"])


def test_hopper_reset_noise_and_termination():
    env = gym.make("DiffHopper-v0").unwrapped
    x = env.reset(seed=5)[0]
    s = env.get_state()
    nominal = np.array([0.0, 1.25, 0.0, 0.0, 0.0, 0.0])
    assert np.all(np.abs(s[:6] - nominal) <= 0.005) and np.all(np.abs(s[6:]) <= 0.005)
    assert np.abs(s - np.r_[nominal, np.zeros(6)]).max() > 1e-4        # noise is there
    assert x.shape == (11,)
    # the rule itself: torso more than 0.45 m below the start height
    y = s.copy()
    y[1] = 0.8 + 1e-9
    assert not env._terminated(y)
    y[1] = 0.8 - 1e-9
    assert env._terminated(y)
    y[1], y[2] = 1.2, 2.0                                  # a large torso angle alone does not end it
    assert not env._terminated(y)
    # with zero torques the hopper topples over and the episode ends on the height rule
    env.reset(seed=0)
    for k in range(400):
        obs, r, term, trunc, info = env.step(np.zeros(3))
        if term:
            break
    assert term and not info["diverged"] and obs[0] < 0.8 and 50 < k < 400


# -- go1 ----------------------------------------------------------------------------------------

def _go1_state(env, rpy=(0.0, 0.0, 0.0), z=0.3, seed=0):
    """A state with the given base orientation and random joints, velocities and extras."""
    rng = np.random.default_rng(seed)
    x = np.zeros(env.state_size)
    q = env.sim.q0.copy()
    q[:3] = [0.4, -0.2, z]
    quat = pin.Quaternion(pin.rpy.rpyToMatrix(np.asarray(rpy, float)))
    q[3:7] = [quat.x, quat.y, quat.z, quat.w]
    q[7:] += rng.uniform(-0.3, 0.3, 12)
    x[:19] = q
    x[19:37] = rng.uniform(-1.0, 1.0, 18)
    x[37:49] = rng.uniform(-1.0, 1.0, 12)
    x[49] = 0.7
    return x


def test_go1_pd_layer_by_hand_and_derivatives():
    env = _go1()
    x = _go1_state(env)
    a = np.linspace(-0.9, 0.9, 12)
    tau, dtau_dx, dtau_da = env._forces(x, a)
    q, v = x[7:19], x[25:37]
    q_stand = env.sim.q0[7:]
    by_hand = 40.0 * (q_stand + 0.25 * a - q) - 1.0 * v
    limit = np.tile([23.7, 23.7, 35.55], 4)
    np.testing.assert_array_equal(tau[:6], 0.0)                       # base unactuated
    np.testing.assert_allclose(tau[6:], np.clip(by_hand, -limit, limit))
    # saturate one joint: its torque sits at the effort limit and its derivatives vanish
    xs = x.copy()
    xs[7 + 4] = q_stand[4] + 1.5                                      # FR thigh far from target
    tau_s, dtx_s, dta_s = env._forces(xs, a)
    assert tau_s[6 + 4] == pytest.approx(-23.7)
    assert not dtx_s[6 + 4].any() and not dta_s[6 + 4].any()
    for state in (x, xs):
        _fd_check(env, lambda y: (env._forces(y, a)[0], env._forces(y, a)[1]), state, 18)
        t0, _, dta = env._forces(state, a)
        for i in range(12):
            da = np.zeros(12)
            da[i] = 1e-6
            fd = (env._forces(state, a + da)[0] - env._forces(state, a - da)[0]) / 2e-6
            np.testing.assert_allclose(fd, dta[:, i], atol=1e-6)
    # the step applies exactly these torques on every substep, and the Jacobian's action block
    # for the previous-action extras is the identity (0 for clipped components)
    env.set_state(x)
    act = np.array([0.2] * 11 + [1.7])
    *_, jac = env.step_with_jacobian(act)
    np.testing.assert_allclose(env.get_state()[37:49], np.clip(act, -1, 1))
    np.testing.assert_allclose(jac.state_action[36:48], np.diag([1.0] * 11 + [0.0]))
    assert not jac.state_action[:, 11].any()


def test_go1_pd_torque_is_what_the_simulator_gets():
    env = _go1()
    x0 = env.get_state()
    a = np.full(12, 0.3)
    env.frame_skip = 1
    env.step(a)
    x1 = env.get_state()
    env.sim.reset_warmstart()                     # as at the reset before env.step
    q1, v1 = env.sim.step(x0[:19], x0[19:37], env._forces(x0, a)[0])
    np.testing.assert_array_equal(x1[:19], q1)
    np.testing.assert_array_equal(x1[19:37], v1)


@pytest.mark.parametrize("rpy", [(0.0, 0.0, 0.0), (0.4, -0.3, 1.2), (2.8, 0.5, -2.0)])
def test_go1_observation_and_reward_derivatives_at_rotated_bases(rpy):
    env = _go1()
    x = _go1_state(env, rpy=rpy, seed=1)
    a = np.linspace(-0.5, 0.6, 12)
    _fd_check(env, env._observe, x, env.obs_dim)
    _fd_check(env, lambda y: env._reward(y, a)[::2], x, 1)
    _, _, _, dr_da = env._reward(x, a)
    for i in range(12):
        da = np.zeros(12)
        da[i] = 1e-6
        fd = (env._reward(x, a + da)[0] - env._reward(x, a - da)[0]) / 2e-6
        assert fd == pytest.approx(dr_da[i], abs=1e-7)


def test_go1_observation_and_reward_terms_by_hand():
    env = _go1()
    pitch = 0.3
    x = _go1_state(env, rpy=(0.0, pitch, 0.0), z=0.27)
    obs, _ = env._observe(x)
    assert obs.shape == (47,)
    assert obs[0] == pytest.approx(0.27)
    np.testing.assert_allclose(obs[1:4], [np.sin(pitch), 0.0, -np.cos(pitch)], atol=1e-12)
    np.testing.assert_allclose(obs[4:10], x[19:25])
    np.testing.assert_allclose(obs[10:22], x[7:19] - env.sim.q0[7:])
    np.testing.assert_allclose(obs[22:34], x[25:37])
    np.testing.assert_allclose(obs[34:46], x[37:49])
    assert obs[46] == 0.7
    a = np.full(12, 0.1)
    r, terms, *_ = env._reward(x, a)
    vx, vy, wz = x[19], x[20], x[24]
    limit = np.tile([23.7, 23.7, 35.55], 4)
    tau = np.clip(40.0 * (env.sim.q0[7:] + 0.025 - x[7:19]) - x[25:37], -limit, limit)
    assert terms["reward_tracking"] == pytest.approx(np.exp(-((vx - 0.7) ** 2 + vy ** 2) / 0.25))
    assert terms["reward_yaw"] == pytest.approx(0.5 * np.exp(-wz ** 2 / 0.25))
    assert terms["reward_upright"] == pytest.approx(0.5 * np.cos(pitch))
    assert terms["reward_height"] == pytest.approx(-20.0 * (0.27 - 0.25) ** 2)
    assert terms["reward_torque"] == pytest.approx(-1e-4 * tau @ tau)
    assert terms["reward_joint_velocity"] == pytest.approx(-5e-4 * x[25:37] @ x[25:37])
    assert r == pytest.approx(sum(v for k, v in terms.items() if k.startswith("reward_")))


def test_go1_termination_rules():
    env = _go1()
    x = _go1_state(env, z=0.3)
    assert not env._terminated(x)
    low = x.copy()
    low[2] = 0.149
    assert env._terminated(low)
    assert env._terminated(_go1_state(env, rpy=(np.pi, 0.0, 0.0), z=0.3))           # flipped
    assert env._terminated(_go1_state(env, rpy=(0.0, 1.1, 0.0), z=0.3))             # 63 deg
    assert not env._terminated(_go1_state(env, rpy=(0.0, 1.0, 0.0), z=0.3))         # 57 deg
    # through step: a base placed upside down ends the episode
    env.set_state(_go1_state(env, rpy=(np.pi, 0.0, 0.0), z=0.5))
    assert env.step(np.zeros(12))[2]


def test_go1_reset_command_and_standing():
    env = gym.make("DiffGo1-v0", command=0.6).unwrapped
    obs, _ = env.reset(seed=3)
    x = env.get_state()
    assert obs[46] == 0.6 and x[49] == 0.6 and not x[37:49].any()
    assert env._lowest_foot(x[:19]) == pytest.approx(1e-3, abs=1e-12)   # feet just above ground
    np.testing.assert_allclose(obs[1:4], [0, 0, -1], atol=0.04)
    cmds = []
    for s in range(5):
        e = gym.make("DiffGo1-v0", command_range=(0.3, 0.5)).unwrapped
        e.reset(seed=s)
        cmds.append(e.get_state()[49])
    assert all(0.3 <= c <= 0.5 for c in cmds) and len(set(cmds)) == 5
    with pytest.raises(ValueError, match="command_range"):
        gym.make("DiffGo1-v0", command_range=(1.0, 0.2))
    with pytest.raises(ValueError, match="command"):
        gym.make("DiffGo1-v0", command=float("nan"))
    # with a = 0 the PD layer holds the robot up: 1 s of standing, no termination
    for _ in range(50):
        obs, r, term, trunc, info = env.step(np.zeros(12))
        assert not term
    assert 0.2 < obs[0] < 0.26 and obs[3] < -0.99 and info["command"] == 0.6


# -- torch bridge through contacts and quaternions ----------------------------------------------

@pytest.mark.parametrize("env_id,warmup", [("DiffHopper-v0", 30), ("DiffGo1-v0", 10)])
def test_torch_bridge_rollout_gradient_on_the_ground(env_id, warmup):
    torch = pytest.importorskip("torch")
    from diffgym.torch_bridge import TorchVecEnv
    K, N = 8, 2
    venv = diffgym.make_vec(env_id, num_envs=N, seed=0)
    tenv = TorchVecEnv(venv, dtype=torch.float64)
    tenv.reset(seed=0)
    for k in range(warmup):                       # land: the rollout runs with feet in contact
        venv.step(np.full((N, venv.n_a), 0.1 * np.cos(0.3 * k)))
    x0 = venv.get_state()
    A0 = torch.tensor(np.random.default_rng(0).uniform(-0.4, 0.4, (K, N, venv.n_a)))

    def loss(A, x=None):
        venv.set_state(x0 if x is None else x.detach().numpy())
        tenv.detach()
        if x is not None:
            tenv.state = x
        total = 0.0
        for k in range(K):
            obs, r, term, trunc, _ = tenv.step(A[k])
            assert not (term.any() or trunc.any())
            total = total + r.sum() + 0.01 * (obs ** 2).sum()
        return total

    A = A0.clone().requires_grad_(True)
    loss(A).backward()
    xg = torch.tensor(x0).requires_grad_(True)
    loss(A0, xg).backward()
    rng = np.random.default_rng(2)
    eps = 1e-6
    e = venv.envs[0]
    P = venv.tangent_maps(x0)
    with torch.no_grad():
        for _ in range(3):
            D = torch.tensor(rng.standard_normal(A0.shape))
            fd = (loss(A0 + eps * D) - loss(A0 - eps * D)) / (2 * eps)
            an = (A.grad * D).sum()
            assert abs(fd - an) <= 1e-4 * max(1.0, abs(an)), (fd, an)
        for _ in range(2):
            dirs = [rng.standard_normal(e.n_x) * 0.5 for _ in range(N)]
            xp = torch.tensor(np.stack([e.integrate_state(x, eps * d) for x, d in zip(x0, dirs)]))
            xm = torch.tensor(np.stack([e.integrate_state(x, -eps * d) for x, d in zip(x0, dirs)]))
            fd = (loss(A0, xp) - loss(A0, xm)) / (2 * eps)
            an = sum(float(xg.grad[n].numpy() @ P[n] @ dirs[n]) for n in range(N))
            assert abs(fd - an) <= 1e-4 * max(1.0, abs(an)), (fd, an)


# -- rendering: the camera follows the robot ----------------------------------------------------

@pytest.mark.parametrize("env_id", ["DiffHopper-v0", "DiffGo1-v0"])
def test_render_follows_the_robot(env_id):
    env = gym.make(env_id, render_mode="rgb_array", width=96, height=72)
    env.reset(seed=0)
    e = env.unwrapped
    x = e.get_state()
    f0 = env.render().astype(float)
    x[0] += 10.0                                   # 10 m forward (a whole number of checker squares)
    e.set_state(x)
    f1 = env.render().astype(float)
    assert f0.std() > 5.0
    changed = np.abs(f1 - f0).max(axis=-1) > 20.0
    assert changed.mean() < 0.002                  # the same picture: the camera moved along
