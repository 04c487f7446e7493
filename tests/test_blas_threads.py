"""The BLAS threads of a step (diffgym/sim/blas.py): a large model steps with every loaded
OpenBLAS on one thread (their threads made a 16-ball rack's step 2.4-5x slower on a busy
machine) and gets the user's counts back when the step returns or raises; small models, and
``DIFFGYM_BLAS_THREADS=0``, leave the libraries alone."""
from __future__ import annotations

import numpy as np
import pytest

from diffgym.bench_scaling import balls_mjcf
from diffgym.sim import blas
from diffgym.sim.forward import Simulator

pytestmark = pytest.mark.skipif(not blas.openblas_libs(), reason="no OpenBLAS found")

CARTPOLE = """<mujoco><option timestep="0.01"/><worldbody>
  <body name="cart"><joint name="slide" type="slide" axis="1 0 0"/>
    <geom type="box" size="0.2 0.1 0.05" mass="1"/>
    <body name="pole"><joint name="hinge" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0 0 0.6" size="0.02" mass="0.1"/></body></body>
</worldbody></mujoco>"""


def _threads_inside(sim, monkeypatch, fail=False):
    """The BLAS threads seen from inside ``sim``'s step (and the step's own result)."""
    seen = {}
    inner = sim._step

    def spy(*a, **k):
        seen.update(blas.blas_threads())
        if fail:
            raise np.linalg.LinAlgError("a failure inside the step")
        return inner(*a, **k)

    monkeypatch.setattr(sim, "_step", spy)
    return seen


@pytest.fixture
def two_threads():
    restore = blas.limit_blas_threads(2)
    before = blas.blas_threads()
    if not any(k > 1 for k in before.values()):
        restore()
        pytest.skip("OpenBLAS cannot run 2 threads here")
    yield before
    restore()


def test_a_large_model_steps_on_one_thread_and_restores(two_threads, monkeypatch):
    monkeypatch.delenv("DIFFGYM_BLAS_THREADS", raising=False)
    sim = Simulator.from_string(balls_mjcf(16))
    assert sim.nv >= blas.PIN_MIN_NV
    seen = _threads_inside(sim, monkeypatch)
    q, v = sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))
    assert seen and all(k == 1 for k in seen.values()), seen
    assert blas.blas_threads() == two_threads
    # restored when the step raises too (the failure surfaces as SimulationError)
    seen = _threads_inside(sim, monkeypatch, fail=True)
    from diffgym.sim.forward import SimulationError, SolverWarning
    with pytest.raises(SimulationError), pytest.warns(SolverWarning, match="cold start"):
        sim.step(q, v, np.zeros(sim.nv))
    assert all(k == 1 for k in seen.values()) and blas.blas_threads() == two_threads


def test_small_models_and_the_opt_out_leave_blas_alone(two_threads, monkeypatch):
    monkeypatch.delenv("DIFFGYM_BLAS_THREADS", raising=False)
    small = Simulator.from_string(CARTPOLE)
    assert small.nv < blas.PIN_MIN_NV
    seen = _threads_inside(small, monkeypatch)
    small.step(small.q0, np.zeros(small.nv), np.zeros(small.nv))
    assert seen == two_threads
    monkeypatch.setenv("DIFFGYM_BLAS_THREADS", "0")
    big = Simulator.from_string(balls_mjcf(16))
    seen = _threads_inside(big, monkeypatch)
    big.step(big.q0, np.zeros(big.nv), np.zeros(big.nv))
    assert seen == two_threads


def test_a_bad_setting_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("DIFFGYM_BLAS_THREADS", "one")
    sim = Simulator.from_string(balls_mjcf(16))
    with pytest.raises(ValueError, match="DIFFGYM_BLAS_THREADS.*'one'"):
        sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))
