"""What Gymnasium users expect of the environments: the registered episode length and exact
truncation through gym.make and env.unwrapped, step_with_jacobian through wrappers, human
rendering, and pickling / deep copies (Simulator and environments) with the trajectory
continuing bit for bit, including spawn-based AsyncVectorEnv."""
import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest

import diffgym
from diffgym.envs import ENV_IDS

IDS = list(ENV_IDS)


def _actions(env, n, seed=3):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, env.action_space.shape) for _ in range(n)]


def test_registered_episode_length_and_exact_truncation():
    for env_id in IDS:
        env = gym.make(env_id)
        assert env.spec.max_episode_steps == env.unwrapped.episode_steps > 0, env_id
    # the TimeLimit and the environment truncate at the same step, through either route, and
    # gym.make's own max_episode_steps shortens the episode (its TimeLimit fires first)
    for kwargs, n in (({}, 240), ({"episode_steps": 7}, 7), ({"episode_steps": 300}, 300),
                      ({"max_episode_steps": 9}, 9)):
        env = gym.make("DiffCartPole-v0", **kwargs)
        assert env.spec.max_episode_steps == n
        routes = ("make", "unwrapped") if "max_episode_steps" not in kwargs else ("make",)
        for route in routes:
            e = env if route == "make" else env.unwrapped
            e.reset(seed=0)
            flags = [e.step(np.zeros(1))[3] for _ in range(n)]
            assert flags == [False] * (n - 1) + [True], (kwargs, route)
            e.reset(seed=0)                             # a new episode counts from zero again
            assert not any(e.step(np.zeros(1))[3] for _ in range(n - 1))
    # a wrapper stack that Gymnasium rebuilds from the spec keeps the length
    env = gym.make(gym.make("DiffCartPole-v0", episode_steps=11).spec)
    assert env.spec.max_episode_steps == env.unwrapped.episode_steps == 11
    env = gym.make("DiffCartPole-v0", max_episode_steps=-1)   # (no extra TimeLimit)
    env.reset(seed=0)
    assert [env.step(np.zeros(1))[3] for _ in range(240)][-1]


@pytest.mark.parametrize("wrap", ["NormalizeObservation", "RecordEpisodeStatistics", "TimeLimit",
                                  "ClipAction"])
def test_step_with_jacobian_through_wrappers(wrap):
    env = gym.make("DiffCartPole-v0")
    env = getattr(gym.wrappers, wrap)(env, **({"max_episode_steps": 50} if wrap == "TimeLimit" else {}))
    ref = gym.make("DiffCartPole-v0").unwrapped
    env.reset(seed=1)
    ref.reset(seed=1)
    for a in _actions(ref, 3):
        out = env.get_wrapper_attr("step_with_jacobian")(a)
        exp = ref.step_with_jacobian(a)
        np.testing.assert_array_equal(out[0], exp[0])     # the unwrapped env's obs and Jacobians
        np.testing.assert_array_equal(out[5].state_state, exp[5].state_state)
        np.testing.assert_array_equal(out[5].reward_action, exp[5].reward_action)


def test_human_render_mode():
    pytest.importorskip("pygame", reason="pygame is in the 'human' extra (installed by make test)")
    import os
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")     # no display on CI: SDL's off-screen driver
    env = gym.make("DiffCartPole-v0", render_mode="human", width=64, height=48)
    assert env.unwrapped.render_mode == "human"          # native, not Gymnasium's HumanRendering
    env.reset(seed=0)
    env.step(np.zeros(1))
    import pygame
    assert pygame.display.get_surface().get_size() == (64, 48)
    env.close()
    assert not pygame.display.get_init()


def test_human_render_mode_without_pygame(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_pygame(name, *a, **k):
        if name == "pygame":
            raise ImportError("no pygame")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_pygame)
    with pytest.raises(gym.error.DependencyNotInstalled, match=r"pip install 'diffgym\[human\]'"):
        gym.make("DiffCartPole-v0", render_mode="human")


def _rollout(env, actions, jac=False):
    out = []
    for a in actions:
        if jac:
            o, r, te, tr, _, J = env.step_with_jacobian(a)
            out.append((o, r, te, tr, J.state_state, J.state_action))
        else:
            o, r, te, tr, _ = env.step(a)
            out.append((o, r, te, tr))
        if te or tr:
            env.reset()
            out.append((env.get_state(),))
    return out


def _same(a, b):
    """Observations, rewards, flags and states bit for bit; the Jacobians (the last two entries of
    a step with jac=True) to rounding: coal starts each GJK query from the previous query's answer,
    which a copy does not have, and at GJK's 1e-10 tolerance that moves contact normals in the
    last bits (seen: 1e-19 absolute in DiffPush-v0's state_state, trajectories still identical)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        jac_from = 4 if len(x) == 6 else len(x)
        for i, (u, v) in enumerate(zip(x, y)):
            if i < jac_from:
                np.testing.assert_array_equal(u, v)
            else:
                scale = max(1.0, float(np.abs(v).max()))
                np.testing.assert_allclose(u, v, rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("env_id", IDS)
def test_pickle_and_deepcopy_continue_bit_for_bit(env_id):
    """Mid-episode (contacts warm-started), near the end of an episode (the clock), then a reset
    (the RNG): the copies continue exactly as the original."""
    kw = {"episode_steps": 12} if env_id != "DiffBilliards-v0" else {"episode_steps": 12, "force_scale": 2.0}
    env = gym.make(env_id, **kw).unwrapped
    env.reset(seed=5)
    acts = _actions(env, 16)
    for a in acts[:8]:
        env.step(a)
    if env_id in ("DiffHopper-v0", "DiffGo1-v0"):
        assert env.sim.warm_start_state() is not None or env_id == "DiffHopper-v0"
    blob = pickle.dumps(env)
    clone = pickle.loads(blob)
    twin = copy.deepcopy(env)
    assert clone.sim is not env.sim and clone.sim.geom_data is not env.sim.geom_data
    ref = _rollout(env, acts[8:], jac=True)
    _same(_rollout(clone, acts[8:], jac=True), ref)
    _same(_rollout(twin, acts[8:], jac=True), ref)


def test_simulator_pickle_keeps_settings_and_warm_start():
    from diffgym.resources import asset_path
    sim = diffgym.Simulator.from_file(asset_path("hopper.xml"), dt=0.003, tol=1e-10)
    q, v = sim.q0, np.zeros(sim.nv)
    for _ in range(60):
        q, v = sim.step(q, v, np.zeros(sim.nv))
    assert sim.last.num_contacts > 0 and sim.warm_start_state() is not None
    s2 = pickle.loads(pickle.dumps(sim))
    assert s2.dt == 0.003 and s2.solver.settings.tol == 1e-10
    assert s2.last.num_contacts == sim.last.num_contacts
    for a, b in zip(s2.warm_start_state(), sim.warm_start_state()):
        np.testing.assert_array_equal(a, b)
    for _ in range(20):
        tau = 0.3 * np.ones(sim.nv)
        q1, v1, j1 = sim.step(q, v, tau, jacobian=True)
        q2, v2, j2 = s2.step(q, v, tau, jacobian=True)
        np.testing.assert_array_equal(q1, q2)
        np.testing.assert_array_equal(v1, v2)
        np.testing.assert_array_equal(j1.dv_dq, j2.dv_dq)
        q, v = q1, v1
    s3 = copy.deepcopy(diffgym.Simulator.from_string(open(asset_path("cartpole.xml")).read()))
    assert s3.nv == 2
    raw = diffgym.Simulator(sim.sm)
    with pytest.raises(TypeError, match="from_file or from_string"):
        pickle.dumps(raw)


def test_async_vector_env_spawn():
    # a spawned worker starts a fresh interpreter: "diffgym:ID" makes gym.make import diffgym
    # (a user's script that imports diffgym at the top needs no prefix: the worker re-imports it)
    import functools
    make = functools.partial(gym.make, "diffgym:DiffCartPole-v0", episode_steps=5)
    envs = gym.vector.AsyncVectorEnv([make] * 2, context="spawn")
    try:
        obs, _ = envs.reset(seed=[0, 1])
        ref = [gym.make("DiffCartPole-v0", episode_steps=5) for _ in range(2)]
        exp = np.stack([r.reset(seed=s)[0] for r, s in zip(ref, (0, 1))])
        np.testing.assert_array_equal(obs, exp)
        a = np.full((2, 1), 0.3)
        for _ in range(4):
            obs, r, te, tr, _ = envs.step(a)
            exp = np.stack([e.step(a[0])[0] for e in ref])
            np.testing.assert_array_equal(obs, exp)
        obs, r, te, tr, _ = envs.step(a)
        assert tr.all()
    finally:
        envs.close()
