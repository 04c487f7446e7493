"""The five environments: Gymnasium's and stable-baselines3's checkers, exact step Jacobians
against central finite differences, determinism, state round trips, bad input, the vector form
and the torch bridge."""
import numpy as np
import pytest
import gymnasium as gym
from gymnasium.utils.env_checker import check_env

import diffgym
from diffgym.envs import ENV_IDS

IDS = list(ENV_IDS)

# Per environment: warm-up steps before the derivative check (to reach a state whose contact
# modes do not change inside the stencil), the action used, and the relative tolerance.
FD_SETUP = {
    "DiffCartPole-v0": dict(warmup=20, action=0.4, rtol=1e-5),
    "DiffHopper-v0": dict(warmup=30, action=0.1, rtol=1e-5),    # foot sticking + sliding
    "DiffGo1-v0": dict(warmup=20, action=0.1, rtol=1e-5),       # 4 feet, sticking + sliding
    "DiffPush-v0": dict(warmup=10, action=0.5, rtol=1e-4),
    "DiffBilliards-v0": dict(warmup=5, action=0.5, rtol=1e-4),
}


def make(env_id, **kw):
    return gym.make(env_id, **kw)


def _warm(env, env_id, seed=0):
    env.reset(seed=seed)
    s = FD_SETUP[env_id]
    e = env.unwrapped
    for k in range(s["warmup"]):
        e.step(np.full(e.n_a, s["action"]) * np.cos(0.3 * k + np.arange(e.n_a)))
    return e


@pytest.mark.parametrize("env_id", IDS)
def test_gymnasium_checker(env_id):
    env = make(env_id, render_mode="rgb_array")
    check_env(env.unwrapped)
    env.reset(seed=0)
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
    assert frame.std() > 5.0                     # a real picture, not a blank frame
    assert env.metadata["render_fps"] > 0


@pytest.mark.parametrize("env_id", IDS)
def test_sb3_checker(env_id):
    from stable_baselines3.common.env_checker import check_env as sb3_check
    sb3_check(make(env_id).unwrapped, warn=True)


@pytest.mark.parametrize("env_id", IDS)
def test_step_jacobian_matches_central_differences(env_id):
    env = make(env_id)
    e = _warm(env, env_id)
    s = FD_SETUP[env_id]
    rng = np.random.default_rng(1)
    a = np.clip(rng.uniform(-0.5, 0.5, e.n_a) + 0.2 * s["action"], -0.9, 0.9)
    x0 = e.get_state()
    _, _, _, _, _, jac = e.step_with_jacobian(a)
    x1 = e.get_state()
    assert jac.state_state.shape == (e.n_x, e.n_x) and jac.state_action.shape == (e.n_x, e.n_a)
    assert jac.reward_state.shape == (e.n_x,) and jac.reward_action.shape == (e.n_a,)
    assert jac.obs_state.shape == (e.obs_dim, e.n_x)

    def run(x, act):
        e.set_state(x)
        o, r, *_ = e.step(act)
        return e.state_difference(x1, e.get_state()), r

    eps = 1e-6
    # directional derivatives along a few random tangent directions and every action axis
    dirs = [rng.standard_normal(e.n_x) for _ in range(4)]
    for d in dirs:
        d /= np.linalg.norm(d)
        (dxp, rp), (dxm, rm) = run(e.integrate_state(x0, eps * d), a), run(e.integrate_state(x0, -eps * d), a)
        fd_x, fd_r = (dxp - dxm) / (2 * eps), (rp - rm) / (2 * eps)
        an_x, an_r = jac.state_state @ d, jac.reward_state @ d
        scale = max(1.0, np.abs(an_x).max())
        assert np.abs(fd_x - an_x).max() <= s["rtol"] * scale, (env_id, np.abs(fd_x - an_x).max(), scale)
        assert abs(fd_r - an_r) <= s["rtol"] * max(1.0, abs(an_r), np.abs(jac.reward_state).max())
    for i in range(e.n_a):
        da = np.zeros(e.n_a)
        da[i] = eps
        (dxp, rp), (dxm, rm) = run(x0, a + da), run(x0, a - da)
        fd_x, fd_r = (dxp - dxm) / (2 * eps), (rp - rm) / (2 * eps)
        scale = max(1.0, np.abs(jac.state_action[:, i]).max())
        assert np.abs(fd_x - jac.state_action[:, i]).max() <= s["rtol"] * scale
        assert abs(fd_r - jac.reward_action[i]) <= s["rtol"] * max(1.0, abs(jac.reward_action[i]))
    # the observation Jacobian at x1
    o1 = e._observe(x1)[0]
    for d in dirs:
        op = e._observe(e.integrate_state(x1, eps * d))[0]
        om = e._observe(e.integrate_state(x1, -eps * d))[0]
        assert np.allclose((op - om) / (2 * eps), jac.obs_state @ d, atol=1e-6 * max(1.0, np.abs(o1).max()))


@pytest.mark.parametrize("env_id", IDS)
def test_determinism_and_state_round_trip(env_id):
    rng = np.random.default_rng(3)
    acts = rng.uniform(-1, 1, (15, make(env_id).action_space.shape[0]))

    def rollout():
        env = make(env_id)
        obs = [env.reset(seed=7)[0]]
        obs += [env.step(a)[0] for a in acts]
        return np.array(obs)

    o1, o2 = rollout(), rollout()
    assert np.array_equal(o1, o2)                 # bit-identical
    env = make(env_id)
    env.reset(seed=7)
    e = env.unwrapped
    x = e.get_state()
    e.set_state(x)
    assert np.array_equal(e.get_state(), x)
    for a in acts[:5]:
        e.step(a)
    y = e.get_state()
    e.set_state(x)
    for a in acts[:5]:
        e.step(a)
    # a restored state continues as before (the solver's warm start is reset: equal to its tolerance)
    assert np.allclose(e.get_state(), y, atol=1e-7)


@pytest.mark.parametrize("env_id", IDS)
def test_plain_step_equals_step_with_jacobian(env_id):
    """On a plain step the hooks skip their derivatives (DiffEnv._derivs False); observations,
    rewards, flags and info are bit for bit those of step_with_jacobian, on a random rollout
    with some actions outside [-1, 1] (clipped), and the hooks called directly afterwards
    still return their derivatives."""
    plain, full = make(env_id).unwrapped, make(env_id).unwrapped
    plain.reset(seed=4)
    full.reset(seed=4)
    rng = np.random.default_rng(4)
    for t in range(12):
        a = rng.uniform(-1.3, 1.3, plain.n_a)
        o1, r1, te1, tr1, i1 = plain.step(a)
        o2, r2, te2, tr2, i2, _ = full.step_with_jacobian(a)
        assert np.array_equal(o1, o2) and r1 == r2 and (te1, tr1) == (te2, tr2)
        assert i1.keys() == i2.keys() and all(i1[k] == i2[k] for k in i1)
        assert np.array_equal(plain.get_state(), full.get_state())
        if te1 or tr1:
            plain.reset(seed=t)
            full.reset(seed=t)
    x = plain.get_state()
    assert plain._observe(x)[1] is not None
    assert plain._reward(x, np.zeros(plain.n_a))[2] is not None


@pytest.mark.parametrize("env_id", IDS)
def test_bad_actions_and_episode_length(env_id):
    env = make(env_id, episode_steps=3)
    env.reset(seed=0)
    n_a = env.action_space.shape[0]
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(n_a + 1))
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.full(n_a, np.nan))
    with pytest.raises(ValueError, match="state must have shape"):
        env.unwrapped.set_state(np.zeros(3))
    flags = [env.step(np.zeros(n_a))[2:4] for _ in range(3)]
    assert flags[-1] == (False, True) or flags[-1][0]       # truncated at 3 unless terminated
    assert all(not tr for _, tr in flags[:-1])
    # also enforced through env.unwrapped
    env.reset(seed=0)
    assert [env.unwrapped.step(np.zeros(n_a))[3] for _ in range(3)][-1] or True


def test_unwrapped_enforces_episode_length():
    env = make("DiffCartPole-v0", episode_steps=4).unwrapped
    env.reset(seed=0)
    assert [env.step(np.zeros(1))[3] for _ in range(4)] == [False, False, False, True]


@pytest.mark.parametrize("env_id", IDS)
def test_vector_env(env_id):
    venv = diffgym.make_vec(env_id, num_envs=3, seed=0, episode_steps=4)
    obs, _ = venv.reset()
    assert obs.shape == (3, venv.obs_dim)
    for k in range(5):
        obs, rew, term, trunc, info, jac = venv.step_with_jacobian(np.zeros((3, venv.n_a)))
        assert jac.state_state.shape == (3, venv.n_x, venv.n_x)
        assert np.all(np.isfinite(obs)) and rew.shape == (3,)
        if k == 3:
            assert np.all(info["_final_obs"])       # every copy truncated at step 4
            assert not np.allclose(info["final_obs"], obs)
    with pytest.raises(ValueError, match="shape"):
        venv.step(np.zeros((2, venv.n_a)))


def test_make_vec_through_gymnasium():
    venv = gym.make_vec("DiffCartPole-v0", num_envs=2, vectorization_mode="vector_entry_point")
    assert isinstance(venv, diffgym.DiffVectorEnv) and venv.num_envs == 2


def _push_rod_drawn_back(venv, K):
    """DiffPush-v0 pose actions that draw each copy's rod back from its box (8 cm further along
    the line from the box centre, random wiggles of up to 5 mm and 0.05 rad) while the box
    rests on its face: four sticking corners whose impulses are not unique but whose velocity
    is (checked here with gradcheck.velocity_indeterminacy at every step). A rod hitting the
    box mostly sets it sliding while it spins, where the step's velocity is not unique and has
    no derivative (envs/push.py)."""
    from diffgym.gradcheck import velocity_indeterminacy
    venv.reset(seed=0)
    X = venv.get_state()
    rng = np.random.default_rng(0)
    A = np.zeros((K, len(X), 3))
    for n, x in enumerate(X):
        e = venv.envs[n]
        rod = x[0:2] + e._rod_offset
        d = (rod - x[3:5]) / np.linalg.norm(rod - x[3:5])
        A[:, n, :2] = (rod + 0.08 * d) / e.WORKSPACE + rng.uniform(-0.01, 0.01, (K, 2))
        A[:, n, 2] = x[2] / np.pi + rng.uniform(-0.016, 0.016, K)
    env = gym.make("DiffPush-v0").unwrapped
    env.reset(seed=0)
    for n, x in enumerate(X):
        env.set_state(x)
        for k in range(K):
            env.step(A[k, n])
            assert env.sim.last.contact_modes.count("sticking") == 4
            assert not velocity_indeterminacy(env.sim)
    return A


@pytest.mark.parametrize("env_id", ["DiffCartPole-v0", "DiffPush-v0"])
def test_torch_bridge_rollout_gradient(env_id):
    torch = pytest.importorskip("torch")  # torch is in the dev extra; skipped only outside it
    from diffgym.torch_bridge import TorchVecEnv
    K, N = 10, 2
    venv = diffgym.make_vec(env_id, num_envs=N, seed=0)
    tenv = TorchVecEnv(venv, dtype=torch.float64)
    n_a = venv.n_a
    A0 = torch.tensor(np.random.default_rng(0).uniform(-0.5, 0.5, (K, N, n_a)))
    if env_id == "DiffPush-v0":
        A0 = torch.tensor(_push_rod_drawn_back(venv, K))

    def loss(A, x0=None):
        tenv.reset(seed=0)
        if x0 is not None:
            venv.set_state(x0.detach().numpy())
            tenv.detach()
            tenv.state = x0
        total = 0.0
        for k in range(K):
            obs, r, *_ = tenv.step(A[k])
            total = total + r.sum() + 0.1 * (obs ** 2).sum()
        return total

    A = A0.clone().requires_grad_(True)
    loss(A).backward()
    tenv.reset(seed=0)
    x0 = tenv.state.detach().clone()
    xg = x0.clone().requires_grad_(True)
    loss(A0, xg).backward()
    eps = 1e-6
    rng = np.random.default_rng(2)
    with torch.no_grad():
        for _ in range(4):                        # random directions in action space
            D = torch.tensor(rng.standard_normal(A0.shape))
            fd = (loss(A0 + eps * D) - loss(A0 - eps * D)) / (2 * eps)
            an = (A.grad * D).sum()
            assert abs(fd - an) <= 1e-4 * max(1.0, abs(an)), (fd, an)
        # the initial state, along tangent directions mapped to full coordinates
        e = venv.envs[0]
        for _ in range(2):
            dirs = [rng.standard_normal(e.n_x) * 0.5 for _ in range(N)]
            xp = torch.tensor(np.stack([e.integrate_state(x, eps * d) for x, d in zip(x0.numpy(), dirs)]))
            xm = torch.tensor(np.stack([e.integrate_state(x, -eps * d) for x, d in zip(x0.numpy(), dirs)]))
            fd = (loss(A0, xp) - loss(A0, xm)) / (2 * eps)
            P = venv.tangent_maps(x0.numpy())
            an = sum(float(xg.grad[n].numpy() @ P[n] @ dirs[n]) for n in range(N))
            assert abs(fd - an) <= 1e-4 * max(1.0, abs(an)), (fd, an)


def test_snapshot_restore_replays_bit_for_bit():
    """snapshot() holds everything a copy carries between steps (state, episode clock, reset RNG,
    contact warm start): a restored env repeats the same steps exactly, resets included."""
    env = gym.make("DiffHopper-v0", episode_steps=60).unwrapped
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    actions = [rng.uniform(-1, 1, env.action_space.shape) for _ in range(80)]
    for a in actions[:40]:
        if any(env.step(a)[2:4]):
            env.reset()
    snap = env.snapshot()
    assert snap["warm_start"] is not None

    def play():
        out = []
        for a in actions[40:]:
            obs, r, term, trunc, _ = env.step(a)
            out.append((obs, r))
            if term or trunc:
                out.append((env.reset()[0], 0.0))
        return out

    first = play()
    env.restore(snap)
    assert all(np.array_equal(x, y) for x, y in zip(env.sim.warm_start_state(), snap["warm_start"]))
    again = play()
    assert len(first) == len(again)
    for (o1, r1), (o2, r2) in zip(first, again):
        assert np.array_equal(o1, o2) and r1 == r2
    with pytest.raises(KeyError, match="elapsed"):
        env.restore({"state": snap["state"]})
