"""The README's user examples run as shipped: a user's own DiffEnv from their own MJCF checked by
diffgym.envs.check_jacobians (which must pass the right reward derivative and flag a wrong
one), and iLQR on the environment's analytical Jacobians (a few iterations must lower the cost)."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_own_env_example_script_runs_and_checker_catches_the_wrong_derivative():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "own_env_example.py")],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "the checker passed the right derivative and flagged the wrong one" in out.stdout
    assert "FAILED: PuckToTarget-v0" in out.stdout and "reward_state" in out.stdout


def test_own_env_checker_names_block_and_column():
    mod = _load("own_env_example")
    mod.register()
    import gymnasium as gym
    import diffgym
    env = gym.make("PuckToTarget-v0", wrong_derivative=True)
    rep = diffgym.envs.check_jacobians(env, seed=1, max_states=4, substeps=False)
    assert not rep.ok
    cols = {f.column for f in rep.failures if f.block == "reward_state"}
    assert {0, 1} <= cols                      # the puck's x and y, where the factor 2 is missing
    assert all(abs(f.error - 0.5) < 0.05 for f in rep.failures
               if f.block == "reward_state" and f.column in (0, 1))
    good = diffgym.envs.check_jacobians(gym.make("PuckToTarget-v0"), seed=1, max_states=4)
    assert good.ok, str(good)


def test_ilqr_smoke(tmp_path):
    mod = _load("ilqr_cartpole")
    res = mod.main(["--out", str(tmp_path), "--iterations", "4", "--horizon", "40"])
    costs = res["costs"]
    assert len(costs) == 5 and costs[-1] < costs[0]
    assert all(b <= a for a, b in zip(costs, costs[1:]))      # accepted steps only lower it
    assert (tmp_path / "ilqr_cartpole.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "ilqr_cartpole.json").read_text())["iterations"] == 4
    assert np.isfinite(res["final_cost"])
