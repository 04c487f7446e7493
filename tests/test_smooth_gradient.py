"""The smooth gradient mode (issue 13): the Jacobian of the relaxed contact problem's step map.

(a) against central differences of the relaxed step map, whose oracle solves the relaxed problem
    from a fixed interior point by continuation in rho (it never sees the exact solution the
    derivative starts from) and is checked here against the relaxed conditions written out;
(b) rho -> 0 recovers the exact Jacobian at states the hopper and cart-pole visit;
(c) the mode reaches the simulator through gym.make, make_vec, the torch bridge and the configs.
"""
import gymnasium as gym
import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym.sim.gradient_modes import Exact, Smooth
from diffgym.resources import asset_path
from diffgym.sim.smoothing import relaxed_solve, row_scale

BLOCKS = ("dq_dq", "dq_dv", "dq_dtau", "dv_dq", "dv_dv", "dv_dtau")
BOX = """<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1" friction="0.5"/>
<body name="box" pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.15 0.1" friction="0.5"/>
</body></worldbody></mujoco>"""


def _check_relaxed_conditions(sol, G, g, nc, mu, rho, scale):
    """The relaxed conditions, written out independently of diffgym.sim.smoothing."""
    lam, sig = sol.lam, G @ sol.lam + g
    l = scale * lam
    for i in range(nc):
        r = 3 * i
        assert l[r + 2] > 0 and sig[r + 2] > 0
        assert abs(l[r + 2] * sig[r + 2] - rho) <= 1e-8 * rho
        if mu[i] == 0:
            assert abs(l[r]) + abs(l[r + 1]) <= 1e-12
            continue
        x = np.array([mu[i] * l[r + 2], l[r], l[r + 1]])
        y = np.array([sol.eta[i], sig[r], sig[r + 1]])
        assert x[0] > np.hypot(x[1], x[2]) and y[0] > np.hypot(y[1], y[2])
        jordan = np.r_[x @ y, x[0] * y[1:] + y[0] * x[1:]]
        assert np.abs(jordan - np.array([rho, 0.0, 0.0])).max() <= 1e-8 * rho
    for k in range(3 * nc, len(lam)):
        assert abs(l[k] * sig[k] - rho) <= 1e-8 * rho


def relaxed_step(sim, q, v, tau, rho, scale=None):
    """The relaxed step map: the exact step's constraint data (G, g, J), the relaxed impulses."""
    sim.reset_warmstart()
    sim.step(q, v, tau)
    C = sim.cache
    cons = C["cons"]
    if scale is None:
        scale = row_scale(C["G"], cons.nc)
    sol = relaxed_solve(C["G"], C["g"], cons.nc, cons.mu, rho, cold=True, scale=scale)
    _check_relaxed_conditions(sol, C["G"], C["g"], cons.nc, cons.mu, rho, scale)
    Minv = np.triu(C["Minv"]) + np.triu(C["Minv"], 1).T
    v1 = C["v_free"] + Minv @ cons.J.T @ sol.lam
    key = (cons.nc, tuple(cons.limits.tolist()))
    return pin.integrate(sim.model, q, v1 * sim.dt), v1, key, scale


def assert_matches_relaxed_fd(sim, q, v, tau, rho, eps=1e-6, rtol=1e-5, mode=None):
    """``mode``: a mode whose derivative is the relaxed one at ``rho`` (default ``Smooth(rho)``;
    also ``LongRange(rho=rho)``, whose forward step, and so the oracle's, carries the barrier)."""
    sim.gradient = Smooth(rho=rho) if mode is None else mode
    sim.reset_warmstart()
    _, _, jac = sim.step(q, v, tau, jacobian=True)
    sol = sim.cache["relaxed"]
    assert sol.converged
    _, _, key, scale = relaxed_step(sim, q, v, tau, rho)
    nv = sim.nv
    fd = {k: np.zeros((nv, nv)) for k in BLOCKS}
    for i in range(nv):
        e = np.zeros(nv)
        e[i] = eps
        for name, plus, minus in (
                ("q", (pin.integrate(sim.model, q, e), v, tau), (pin.integrate(sim.model, q, -e), v, tau)),
                ("v", (q, v + e, tau), (q, v - e, tau)), ("tau", (q, v, tau + e), (q, v, tau - e))):
            qa, va, ka, _ = relaxed_step(sim, *plus, rho, scale)
            qb, vb, kb, _ = relaxed_step(sim, *minus, rho, scale)
            assert ka == key == kb, "the constraint set changed inside the stencil"
            fd["dq_d" + name][:, i] = pin.difference(sim.model, qb, qa) / (2 * eps)
            fd["dv_d" + name][:, i] = (va - vb) / (2 * eps)
    for k in BLOCKS:
        A, F = getattr(jac, k), fd[k]
        err, scale_k = np.abs(A - F).max(), np.abs(F).max()
        assert err <= rtol * scale_k + 1e-8, f"{k}: error {err:.3e}, scale {scale_k:.3e}"
    return jac, sol


def test_box_sliding_and_landing_match_relaxed_differences():
    sim = diffgym.Simulator.from_string(BOX)
    # four sliding corners (friction on the cone boundary in the exact solution)
    assert_matches_relaxed_fd(sim, sim.q0, np.array([1.0, 0.3, 0, 0, 0, 0]), np.zeros(6), 1e-2)
    assert set(sim.last.contact_modes) == {"sliding"}
    # tilted box: one edge touching, the two other corners separated within the margin
    # (breaking in the exact solution, a small smooth impulse in the relaxed one)
    q = sim.q0
    q[3:7] = pin.Quaternion(pin.rpy.rpyToMatrix(0.01, 0, 0)).coeffs()
    R = pin.Quaternion(q[6], q[3], q[4], q[5]).toRotationMatrix()
    half = np.array([0.1, 0.15, 0.1])
    q[2] = -min((R @ (half * np.array([sx, sy, -1])))[2] for sx in (-1, 1) for sy in (-1, 1))
    _, sol = assert_matches_relaxed_fd(sim, q, np.array([0.2, 0, 0, 0, 0, 0]), np.zeros(6), 1e-3)
    assert "breaking" in sim.last.contact_modes and sim.last.num_contacts == 4
    assert (sol.lam[2::3] > 0).all()


def _visited(env_id, steps, seed, every, bias=0.0, **make_kw):
    env = gym.make(env_id, **make_kw).unwrapped
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        x = env.get_state()
        a = np.clip(rng.uniform(-1, 1, env.n_a) + bias, -1, 1)
        tau = env._forces(x, a)[0]
        if t % every == 0:
            out.append((x[:env.nq].copy(), x[env.nq:env.nq + env.nv].copy(), tau.copy()))
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            env.reset(seed=seed + t + 1)
    return env.sim, out


def test_hopper_visited_state_matches_relaxed_differences():
    sim, states = _visited("DiffHopper-v0", 40, 0, 1)
    for q, v, tau in states[::-1]:          # the last visited state with contacts
        sim.gradient = Exact()
        sim.reset_warmstart()
        sim.step(q, v, tau)
        if sim.last.num_contacts:
            break
    assert sim.last.num_contacts
    assert_matches_relaxed_fd(sim, q, v, tau, 1e-3, rtol=1e-4)


@pytest.mark.parametrize("env_id, bias", [("DiffHopper-v0", 0.0), ("DiffCartPole-v0", 0.6)])
def test_rho_to_zero_recovers_exact(env_id, bias):
    # (the cart-pole pushed towards a rail stop: its joint-limit row within reach)
    sim, states = _visited(env_id, 150, 1, 5, bias)
    checked = 0
    for q, v, tau in states:
        sim.gradient = Exact()
        sim.reset_warmstart()
        _, _, je = sim.step(q, v, tau, jacobian=True)
        if sim.cache["cons"] is None:
            continue
        # converges where the exact mode is held with some margin (else only once rho is
        # below the square of the margin)
        if je.diagnostics.min_margin < 1e-4:
            continue
        errs = []
        for rho in (1e-6, 1e-9, 1e-12):
            sim.gradient = Smooth(rho=rho)
            sim.reset_warmstart()
            _, _, js = sim.step(q, v, tau, jacobian=True)
            scale = max(np.abs(je.state).max(), np.abs(je.control).max())
            errs.append(max(np.abs(js.state - je.state).max(),
                            np.abs(js.control - je.control).max()) / scale)
        assert errs[-1] <= 1e-5 and errs[-1] <= errs[0], errs
        checked += 1
    assert checked >= 3


def test_gradient_mode_plumbing():
    env = gym.make("DiffCartPole-v0", gradient="smooth")
    assert env.unwrapped.sim.gradient == Smooth() and env.unwrapped.gradient == Smooth()
    env = gym.make("DiffCartPole-v0", gradient={"mode": "smooth", "rho": 1e-4})
    assert env.unwrapped.sim.gradient == Smooth(rho=1e-4)
    with pytest.raises(ValueError, match="smoth"):
        gym.make("DiffCartPole-v0", gradient="smoth")
    venv = diffgym.make_vec("DiffHopper-v0", num_envs=2, num_workers=1, gradient="smooth")
    assert venv.gradient == Smooth()
    assert all(e.sim.gradient == Smooth() for e in venv._envs)
    torch_bridge = pytest.importorskip("diffgym.torch_bridge")
    assert torch_bridge.TorchVecEnv(venv).gradient == Smooth()
    venv.close()


def test_env_step_jacobian_carries_the_mode():
    """The environment's Jacobian comes from the mode it was made with: equal in free flight...
    and different (finite) once the hopper's foot is on the ground."""
    envs = {m: gym.make("DiffHopper-v0", gradient=m).unwrapped for m in ("exact", "smooth")}
    for env in envs.values():
        env.reset(seed=3)
    a = np.zeros(envs["exact"].n_a)
    differs = False
    for _ in range(40):
        out = {m: env.step_with_jacobian(a) for m, env in envs.items()}
        x = {m: env.get_state() for m, env in envs.items()}
        np.testing.assert_array_equal(x["exact"], x["smooth"])      # the same exact forward
        if envs["exact"].sim.last.num_contacts:
            J = {m: o[-1] for m, o in out.items()}
            d = {m: J[m].state_state for m in J}
            assert np.isfinite(d["smooth"]).all()
            differs |= not np.allclose(d["exact"], d["smooth"])
    assert differs


def test_config_validation():
    from diffgym.train.config import ConfigError, load_config
    cfg = load_config("configs/cartpole_shac.yaml", overrides=["shac.gradient=smooth"])
    assert cfg.shac.gradient == "smooth"
    with pytest.raises(ConfigError, match="shac.gradient: unknown gradient mode 'smoth'"):
        load_config("configs/cartpole_shac.yaml", overrides=["shac.gradient=smoth"])
    with pytest.raises(ConfigError, match="shac.gradient: gradient mode 'smooth': unknown key"):
        load_config("configs/cartpole_shac.yaml", overrides=["shac.gradient={mode: smooth, rh: 1}"])
    with pytest.raises(ConfigError, match="rho must be a positive"):
        load_config("configs/cartpole_shac.yaml", overrides=["shac.gradient={mode: smooth, rho: -1}"])
    with pytest.raises(ConfigError, match="contradicts shac.gradient"):
        load_config("configs/cartpole_shac.yaml",
                    overrides=["shac.gradient=smooth", "env.kwargs={gradient: exact}"])


def test_bench_sweep_across_the_rail_stop():
    """``diffgym bench --smooth``'s cart-pole sweep: before the stop d x(T)/d v0 = T dt in both
    modes (no constraint row within reach), against it the exact one is 0."""
    from diffgym.bench_smooth import sweep
    xs, finals, grads, steps, dt = sweep("cartpole", n=3, rhos=(1e-2,))
    g = grads["x(T)"]
    assert g["exact"][0] == pytest.approx(steps * dt) and g["smooth 0.01"][0] == pytest.approx(steps * dt)
    assert abs(g["exact"][-1]) < 1e-12 and np.isfinite(g["smooth 0.01"]).all()


def test_gradient_audit_refuses_a_smooth_target():
    env = gym.make("DiffCartPole-v0", gradient="smooth")
    with pytest.raises(ValueError, match="(?s)audits the step.s own Jacobian.*Smooth"):
        diffgym.check_step_jacobians(env, steps=2)


def test_sweep_grid_over_gradient_modes(tmp_path):
    import shutil

    from diffgym.train.config import ConfigError
    from diffgym.train.sweep import expand
    shutil.copy("configs/cartpole_shac.yaml", tmp_path / "cartpole_shac.yaml")
    spec = tmp_path / "s.yaml"
    spec.write_text("name: g\ntrials:\n  - {base: cartpole_shac.yaml}\nseeds: [0]\n"
                    "grid: {shac.gradient: [exact, smooth, {mode: smooth, rho: 1.0e-4}]}\n")
    _, trials = expand(str(spec), str(tmp_path / "out"))
    assert [t.config["shac"]["gradient"] for t in trials] == ["exact", "smooth",
                                                             {"mode": "smooth", "rho": 1e-4}]
    spec.write_text("name: g\ntrials:\n  - {base: cartpole_shac.yaml}\nseeds: [0]\n"
                    "grid: {shac.gradient: [exact, smoth]}\n")
    with pytest.raises(ConfigError, match="shac.gradient"):
        expand(str(spec), str(tmp_path / "out2"))
