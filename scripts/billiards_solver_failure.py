"""Reproduces a forward-solver failure met by ``diffgym trajopt`` (issue 13, session 9): billiards
task seed 3 with reachable spots, long_range mode at the default scale, cue ball decision
``p`` below. Step 66 of the rollout raises numba's ``ValueError: Internal algorithm failed to
converge.`` (LAPACK SVD) inside ``forward._constrained_step``. At step 65 the state is finite
(max |v| 8.1), the barrier's force is finite (max 1.4e-5 N) and the closest balls are 0.5 mm
apart. The same (q, v) steps without error after ``sim.reset_warmstart()``, so the failure
depends on the warm start. The exact mode at the same decision runs through; its trajectory
differs by the barrier's force.

Since the step's retry (``Simulator.step``: a LAPACK failure from a warm start is solved again
from a cold start, with a SolverWarning; a second failure is a SimulationError) this prints the
warning at step 66 and the run finishes. Which factorization fails (the compiled solver's
``_lstsq`` on more than 32 unknowns is LAPACK dgelsd) is not yet found.

    python scripts/billiards_solver_failure.py
"""
import numpy as np, traceback
from diffgym import trajopt
p = np.array([-0.3880412393642349, 0.13386740775528985, 0.3758599177225792, -0.03452015145847593])
for mode in ["long_range", "exact"]:
    for grad in (False, True):
        t = trajopt.Billiards(mode, 3, 100, "reachable")
        try:
            l, g, ok = t.rollout(p, grad)
            print(mode, "grad" if grad else "fwd", "ok loss", l)
        except Exception as exc:
            print(mode, "grad" if grad else "fwd", "FAILS:", type(exc).__name__, exc, "at step", t.env._elapsed)
