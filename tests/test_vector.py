"""The vector env's worker processes (same results with any number of workers, errors, shutdown)
and the torch bridge (its gradient against a plain numpy chain of the step Jacobians, and
torch.autograd.gradcheck)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest

import diffgym
from diffgym import vector
from diffgym.vector import VectorEnvError


def _rollout(venv, seed, K, snap_at=None):
    """Everything a vector env returns over K random steps (half of them with Jacobians)."""
    rng = np.random.default_rng(seed)
    obs, _ = venv.reset(seed=seed)
    out, snap = [obs, venv.get_state()], None
    for k in range(K):
        a = rng.uniform(-1, 1, (venv.num_envs, venv.n_a))
        if k == snap_at:
            snap = venv.snapshot()
        if k % 2:
            o, r, te, tr, info, jac = venv.step_with_jacobian(a)
            out += [getattr(jac, f) for f in vector._JAC_FIELDS]
        else:
            o, r, te, tr, info = venv.step(a)
        out += [o, r, te, tr, venv.get_state()] + [info[key] for key in sorted(info)]
    return out, snap


def _same(xs, ys):
    assert len(xs) == len(ys)
    for i, (x, y) in enumerate(zip(xs, ys)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype, i
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), i     # bit for bit


@pytest.mark.parametrize("env_id,N,episode_steps", [("DiffHopper-v0", 5, 9), ("DiffCartPole-v0", 5, 6)])
def test_workers_give_bit_identical_results(env_id, N, episode_steps):
    """1 and 2 workers (and 3: uneven blocks) over episodes that end inside the rollout
    (autoreset), with snapshot/restore across worker counts."""
    K = 16
    v1 = diffgym.make_vec(env_id, N, num_workers=1, episode_steps=episode_steps)
    v2 = diffgym.make_vec(env_id, N, num_workers=2, episode_steps=episode_steps)
    v3 = diffgym.make_vec(env_id, N, num_workers=3, episode_steps=episode_steps)
    try:
        assert v2._pool is not None and len(v2._pool.procs) == 1 and v3._pool.bounds == [0, 2, 4, 5]
        r1, s1 = _rollout(v1, 7, K, snap_at=K // 2)
        r2, s2 = _rollout(v2, 7, K, snap_at=K // 2)
        r3, _ = _rollout(v3, 7, K)
        dones = sum(int(np.sum(x)) for x in r1 if np.asarray(x).dtype == bool)
        assert dones > 0, "no episode ended: autoreset untested"
        _same(r1, r2)
        _same(r1, r3)
        # a snapshot taken with one worker count replays identically under another
        rng = np.random.default_rng(1)
        acts = rng.uniform(-1, 1, (6, N, v1.n_a))
        tails = []
        for v, snap in ((v1, s2), (v2, s1), (v3, s1)):
            v.restore(snap)
            tail = [v.get_state()]
            for a in acts:
                o, r, te, tr, info, jac = v.step_with_jacobian(a)
                tail += [o, r, te, tr, info["final_state"], jac.state_state, jac.state_action]
            tails.append(tail)
        _same(tails[0], tails[1])
        _same(tails[0], tails[2])
        # set_state, observe, get_attr and call go to the right copies
        X = v1.get_state()
        v2.set_state(X)
        np.testing.assert_array_equal(v2.get_state(), X)
        np.testing.assert_array_equal(v2.observe(), v1.observe())
        assert v2.get_attr("_elapsed") == v1.get_attr("_elapsed")
        _same(v2.call("tangent_map"), v1.call("tangent_map"))
    finally:
        for v in (v1, v2, v3):
            v.close()


def test_default_worker_rule(monkeypatch):
    """One block per core (affinity mask), at least 8 copies per block, 1 in a daemonic
    process; never dependent on the machine's momentary load."""
    monkeypatch.delenv("DIFFGYM_NUM_WORKERS", raising=False)
    monkeypatch.setattr(vector, "available_cores", lambda: 1)
    assert vector.default_num_workers(64) == 1
    monkeypatch.setattr(vector, "available_cores", lambda: 2)
    assert [vector.default_num_workers(n) for n in (1, 8, 15, 16, 64)] == [1, 1, 1, 2, 2]
    monkeypatch.setattr(vector, "available_cores", lambda: 8)
    assert [vector.default_num_workers(n) for n in (16, 40, 64, 256)] == [2, 5, 8, 8]
    monkeypatch.setattr(vector.os, "getloadavg", lambda: (50.0, 50.0, 50.0))
    assert vector.default_num_workers(64) == 8
    monkeypatch.setenv("DIFFGYM_NUM_WORKERS", "3")                  # as diffgym sweep sets it to 1
    assert [vector.default_num_workers(n) for n in (2, 64)] == [2, 3]
    monkeypatch.setenv("DIFFGYM_NUM_WORKERS", "many")
    with pytest.raises(ValueError, match="DIFFGYM_NUM_WORKERS.*'many'"):
        vector.default_num_workers(64)
    monkeypatch.delenv("DIFFGYM_NUM_WORKERS")
    monkeypatch.setattr(vector.mp, "current_process", lambda: type("P", (), {"daemon": True})())
    assert vector.default_num_workers(64) == 1
    monkeypatch.undo()
    with pytest.raises(ValueError, match="num_workers"):
        diffgym.make_vec("DiffCartPole-v0", 2, num_workers=0)


def test_worker_error_names_the_copy_and_workers_shut_down():
    v = diffgym.make_vec("DiffCartPole-v0", 4, seed=0, num_workers=2)
    procs = list(v._pool.procs)
    v.reset()
    # copy 3 (in the worker process) gets a frame skip that breaks its step
    v.set_attr("frame_skip", [1, 1, 1, "two"])
    with pytest.raises(VectorEnvError, match=r"copy 3 \(worker 1") as err:
        v.step(np.zeros((4, 1)))
    assert err.value.env_index == 3 and isinstance(err.value.__cause__, TypeError)
    assert "Traceback" in err.value.remote_traceback
    # ... and copy 1 (in this process's block)
    v.set_attr("frame_skip", [1, "two", 1, 1])
    with pytest.raises(VectorEnvError, match=r"copy 1 \(worker 0") as err:
        v.step(np.zeros((4, 1)))
    assert err.value.env_index == 1
    # the pipes stayed in step: the env works again once repaired
    v.set_attr("frame_skip", 1)
    v.reset(seed=0)
    assert v.step(np.zeros((4, 1)))[0].shape == (4, 5)
    with pytest.raises(ValueError, match=r"rows \[2\]"):
        v.step(np.array([[0.0], [0.0], [np.nan], [0.0]]))
    with pytest.raises(AttributeError, match="worker processes"):
        v.envs
    v.close()
    assert not any(p.is_alive() for p in procs)
    with pytest.raises(RuntimeError, match="closed"):
        v.step(np.zeros((4, 1)))
    with diffgym.make_vec("DiffCartPole-v0", 4, seed=0, num_workers=2) as v:
        procs = list(v._pool.procs)
        v.reset()
    assert not any(p.is_alive() for p in procs)


def test_in_process_error_names_the_copy():
    v = diffgym.make_vec("DiffCartPole-v0", 3, seed=0, num_workers=1)
    v.reset()
    v.envs[2].frame_skip = "two"
    with pytest.raises(TypeError) as err:
        v.step(np.zeros((3, 1)))
    assert "copy 2" in "".join(getattr(err.value, "__notes__", []))


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" in f.read()          # a zombie has exited
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("ending", ["exit", "kill"])
def test_workers_end_with_their_parent(ending):
    """At interpreter exit without close() (atexit), and when the parent is SIGKILLed."""
    code = textwrap.dedent(f"""
        import os, signal, sys, diffgym
        v = diffgym.make_vec("DiffCartPole-v0", 4, seed=0, num_workers=2)
        v.reset()
        print(*[p.pid for p in v._pool.procs], flush=True)
        if {ending!r} == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    pids = [int(p) for p in r.stdout.split()]
    assert pids, r.stderr
    deadline = time.time() + 20.0
    while time.time() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.2)
    assert all(_gone(p) for p in pids)


# ---------------------------------------------------------------------------------------------
# The torch bridge
# ---------------------------------------------------------------------------------------------
def _numpy_chain(env_id, N, seed, A, w_r, w_o, w_f, **kw):
    """The loss sum_k [w_r r_k + w_o . obs_k + w_f . final_obs_k] of a rollout of N separate
    environments, and its gradient by a plain reverse chain of their step Jacobians in tangent
    coordinates (cut where an episode ends), mapped to full coordinates with the pseudo-inverse
    of the tangent map at the start."""
    envs = [gym.make(env_id, **kw).unwrapped for _ in range(N)]
    for i, e in enumerate(envs):
        e.reset(seed=seed + i)
    x0 = np.stack([e.get_state() for e in envs])
    K = len(A)
    jacs, done = [], np.zeros((K, N), dtype=bool)
    loss = 0.0
    for k in range(K):
        row = []
        for i, e in enumerate(envs):
            o, r, te, tr, _, j = e.step_with_jacobian(A[k, i])
            row.append(j)
            loss += w_r[k, i] * r + w_f[k, i] @ o
            done[k, i] = te or tr
            if te or tr:
                o, _ = e.reset()
            loss += w_o[k, i] @ o
        jacs.append(row)
    gA = np.zeros_like(A)
    g0 = []
    for i in range(N):
        g = np.zeros(envs[i].n_x)
        for k in reversed(range(K)):
            j = jacs[k][i]
            if done[k, i]:
                g = np.zeros_like(g)            # the next state is a reset: no history
            else:
                g = g + j.obs_state.T @ w_o[k, i]
            g = g + j.obs_state.T @ w_f[k, i]
            gA[k, i] = j.state_action.T @ g + w_r[k, i] * j.reward_action
            g = j.state_state.T @ g + w_r[k, i] * j.reward_state
        P = envs[i].tangent_map(x0[i])
        g0.append(np.linalg.pinv(P).T @ g)
    return loss, gA, np.stack(g0)


@pytest.mark.parametrize("env_id,workers", [("DiffCartPole-v0", 1), ("DiffCartPole-v0", 2),
                                            ("DiffPush-v0", 1)])
def test_bridge_gradient_equals_the_numpy_jacobian_chain(env_id, workers):
    """Exact (to rounding) against the chain of step Jacobians, with an episode ending inside the
    window (DiffCartPole-v0), through quaternions (DiffPush-v0), in-process and with workers."""
    torch = pytest.importorskip("torch")
    from diffgym.torch_bridge import TorchVecEnv
    N, K, seed = 3, 7, 4
    kw = {"episode_steps": 4} if env_id == "DiffCartPole-v0" else {}
    rng = np.random.default_rng(0)
    venv = diffgym.make_vec(env_id, N, num_workers=workers, **kw)
    A = rng.uniform(-0.8, 0.8, (K, N, venv.n_a))
    w_r = rng.standard_normal((K, N))
    w_o, w_f = rng.standard_normal((2, K, N, venv.obs_dim))
    loss_np, gA_np, g0_np = _numpy_chain(env_id, N, seed, A, w_r, w_o, w_f, **kw)
    tenv = TorchVecEnv(venv, dtype=torch.float64)
    tenv.reset(seed=seed)
    At = torch.tensor(A, requires_grad=True)
    loss = 0.0
    for k in range(K):
        obs, r, term, trunc, info = tenv.step(At[k])
        loss = loss + (torch.tensor(w_r[k]) * r).sum() + (torch.tensor(w_o[k]) * obs).sum() \
            + (torch.tensor(w_f[k]) * info["final_obs"]).sum()
    loss.backward()
    venv.close()
    assert float(loss.detach()) == pytest.approx(loss_np, rel=1e-13, abs=1e-12)
    np.testing.assert_allclose(At.grad.numpy(), gA_np, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(tenv.initial_state.grad.numpy(), g0_np, rtol=1e-11, atol=1e-12)
    if env_id == "DiffCartPole-v0":
        assert np.any(np.abs(gA_np) > 0) and np.any(np.all(A != 0, axis=2))


@pytest.mark.parametrize("env_id", ["DiffCartPole-v0", "DiffHopper-v0"])
def test_bridge_gradcheck(env_id):
    """torch.autograd.gradcheck (float64, central differences of the whole rollout, including
    the undefined-output-gradient path) on a short rollout from the initial state and actions;
    the hopper starts 10 cm higher than its reset (in the air, and away from the kink of its
    clipped height reward, which the reset height sits on) with its joints off their limits."""
    torch = pytest.importorskip("torch")
    from diffgym.torch_bridge import TorchVecEnv
    N, K = 2, 3
    venv = diffgym.make_vec(env_id, N, seed=0, num_workers=1)
    tenv = TorchVecEnv(venv, dtype=torch.float64)
    tenv.reset(seed=0)
    x0 = tenv.state.detach().clone()
    if env_id == "DiffHopper-v0":
        x0[:, 1] += 0.1          # see the doc string
        x0[:, 3:5] -= 0.2        # thigh and leg off their upper limits (0), which the reset sits on
    x0.requires_grad_(True)
    A = torch.tensor(np.random.default_rng(1).uniform(-0.5, 0.5, (K, N, venv.n_a)), requires_grad=True)

    def rollout(x, acts):
        venv.set_state(x.detach().numpy())
        tenv.detach()
        tenv.state = x
        outs = []
        for k in range(K):
            obs, r, *_ = tenv.step(acts[k])
            outs += [r, obs.reshape(-1)]
        return torch.cat(outs)

    assert torch.autograd.gradcheck(rollout, (x0, A), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["gym-async", "sb3-subproc"])
def test_third_party_process_vector_envs_match_make_vec(kind):
    """Gymnasium's AsyncVectorEnv and SB3's SubprocVecEnv over gym.make (one process per copy)
    step the same trajectories as make_vec, autoreset included."""
    import functools
    N, K = 3, 8
    make = functools.partial(gym.make, "diffgym:DiffCartPole-v0", episode_steps=5)
    if kind == "gym-async":
        other = gym.vector.AsyncVectorEnv([make] * N, context="fork",
                                          autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        obs_o = other.reset(seed=[11 + i for i in range(N)])[0]
    else:
        SubprocVecEnv = pytest.importorskip("stable_baselines3.common.vec_env").SubprocVecEnv
        other = SubprocVecEnv([make] * N, start_method="fork")
        other.seed(11)                      # copy i: seed 11 + i, as make_vec
        obs_o = other.reset()
    ref = diffgym.make_vec("DiffCartPole-v0", N, num_workers=1, episode_steps=5)
    try:
        obs_r = ref.reset(seed=11)[0]
        np.testing.assert_array_equal(obs_o, obs_r)
        rng = np.random.default_rng(0)
        dones = 0
        for _ in range(K):
            a = rng.uniform(-1, 1, (N, ref.n_a))
            obs_r, rew_r, te, tr, _ = ref.step(a)
            if kind == "gym-async":
                obs_o, rew_o, te_o, tr_o, _ = other.step(a)
                np.testing.assert_array_equal(te_o | tr_o, te | tr)
            else:
                obs_o, rew_o, done_o, _ = other.step(a)
                np.testing.assert_array_equal(done_o, te | tr)
            np.testing.assert_array_equal(obs_o, obs_r)
            np.testing.assert_array_equal(rew_o, rew_r.astype(rew_o.dtype))
            dones += int(np.sum(te | tr))
        assert dones > 0, "no episode ended: autoreset untested"
    finally:
        other.close()
        ref.close()
