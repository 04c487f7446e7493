"""Smoke runs of the command line: the benchmark table and the demo."""
import subprocess
import sys

import numpy as np

import diffgym
from diffgym.resources import asset_path


def run(*args):
    return subprocess.run([sys.executable, "-m", "diffgym", *args], capture_output=True, text=True, timeout=300)


def test_bench_prints_a_table():
    out = run("bench", "--steps", "5", "--models", "cartpole", "hopper")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["model", "nq/nv", "contacts"]
    assert any(l.startswith("hopper") for l in lines) and any(l.startswith("cartpole") for l in lines)


def test_bench_rejects_unknown_model():
    out = run("bench", "--models", "teapot")
    assert out.returncode != 0 and "teapot" in out.stderr


def test_demo_runs():
    out = run("demo", "--seconds", "0.2")
    assert out.returncode == 0, out.stderr
    assert "sliding box" in out.stdout and "go1 step Jacobian" in out.stdout


def test_shipped_assets_load_and_billiards_rack_is_stable():
    sim = diffgym.Simulator.from_file(asset_path("billiards.xml"))
    assert sim.nq == 16 * 7
    q, v = sim.q0, np.zeros(sim.nv)
    v[0] = 2.0
    for _ in range(150):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.converged
    assert np.all(q[2::7] > 0.0286 - 1e-3)     # every ball still on the table
    cart = diffgym.Simulator.from_file(asset_path("cartpole.xml"))
    assert len(cart.sm.limits) == 2 and len(cart.sm.pairs) == 0
