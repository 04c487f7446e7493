"""Issue 16, pushed box piles: why stage 1 (the compiled active-set Newton) fails, checked on
the problems it fails on (tests/test_pile_stages.py's pushed rollout, session 11's h-piles2).

    python scripts/pile_stage1_diagnosis.py [--boxes 3 4] [--steps 20]

Phase 1 (compiled, this process's child): the pushed rollout of ``_methods`` in
tests/test_pile_stages.py; every island whose stage 1 failed is captured (its G, g, mu, warm
start) with the solution the later stages returned. Phase 2 (``DIFFGYM_JIT=0``, so that
``solver_kernels._violations`` can be wrapped): on each captured problem,

1. stage 1 again with its budget (it fails on every captured problem: the capture is right);
2. every round of the active set whose Newton point violates a mode condition: whether the
   velocity-side conditions hold (breaking contacts not approaching, sliding ones slipping) and,
   if so, whether some impulse with the SAME velocity (``G (lam' - lam) = 0``) satisfies the
   impulse-side ones (normal impulses >= 0, sticking friction inside a 16-sided polygon inscribed
   in the cone, sliding friction on the cone opposite the slip: ``lam'_T = -mu lam'_N u``, linear
   in ``lam'``): a linear program (scipy's HiGHS). This is the "move within the equivalent
   impulses to a feasible point" repair: where it is feasible the round's modes are correct and
   only the impulse point was wrong;
3. Newton on the modes of the later stages' solution from zero impulses (the active set's first
   run): the velocity it reaches against the later stages' velocity;
4. stage 1 with 4x its budget and 2x its rounds: where it converges, its velocity against the
   later stages' one (both natural residuals printed: two valid solutions whose velocities
   differ mean the velocity is not unique).
"""
import argparse
import os
import pickle
import subprocess
import sys
import tempfile

_CAPTURE = r"""
import pickle, sys, warnings, numpy as np
import diffgym
from diffgym.bench_scaling import boxes_mjcf
from diffgym.sim import forward
probs = []
orig = forward.Simulator._solve_failed_islands
def patched(self, solver, G, g, cons, island_ok, isl_c, isl_l, lam, sigma, modes, lim_act, its,
            resid, v):
    nc = cons.nc
    lam0, modes0 = self._warm_start(cons)
    out = orig(self, solver, G, g, cons, island_ok, isl_c, isl_l, lam, sigma, modes, lim_act, its,
               resid, v)
    for s in np.flatnonzero(~island_ok).tolist():
        cs = np.flatnonzero(isl_c == s)
        ls = np.flatnonzero(isl_l == s)
        rows = np.concatenate([(3 * cs[:, None] + np.arange(3)).ravel(), 3 * nc + ls])
        probs.append(dict(G=np.ascontiguousarray(G[np.ix_(rows, rows)]), g=g[rows].copy(),
                          nc=len(cs), mu=cons.mu[cs].copy(),
                          lam0=None if lam0 is None else lam0[rows].copy(),
                          modes0=None if modes0 is None else
                          np.concatenate([modes0[cs], modes0[nc + ls]]).astype(np.int64),
                          lam=out.lam[rows].copy(), modes=out.modes[cs].copy(),
                          method=out.method, converged=bool(out.converged)))
    return out
forward.Simulator._solve_failed_islands = patched
n, steps = int(sys.argv[1]), int(sys.argv[2])
sim = diffgym.Simulator.from_string(boxes_mjcf(n))
rng = np.random.default_rng(1)
q, v = sim.q0, 0.05 * rng.normal(size=sim.nv)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for _ in range(steps):
        q, v = sim.step(q, v, 0.3 * rng.normal(size=sim.nv))
pickle.dump(probs, open(sys.argv[3], "wb"))
"""


def analyze(paths):
    import numpy as np
    from scipy.optimize import linprog

    from diffgym.sim import solver_kernels as sk
    from diffgym.sim.solver import SolverSettings
    st = SolverSettings()
    rec = []
    orig = sk._violations

    def hook(lam, sigma, nc, mu, modes, lim_act, dc, dG, tol_v, tol_l):
        out = orig(lam, sigma, nc, mu, modes, lim_act, dc, dG, tol_v, tol_l)
        rec.append((lam.copy(), sigma.copy(), modes.copy(), tol_v, tol_l, out[0]))
        return out

    K = 16
    ang = 2 * np.pi * np.arange(K) / K

    def repairable(G, nc, mu, lam, sigma, modes, tol_v):
        """(velocity-side conditions hold, an equivalent impulse meets the impulse-side ones)."""
        for i in range(nc):
            s = sigma[3 * i:3 * i + 3]
            if modes[i] == sk.BREAKING and s[2] < -tol_v:
                return False, False
            if modes[i] == sk.SLIDING and np.hypot(s[0], s[1]) <= tol_v:
                return False, False
        act = [3 * i + r for i in range(nc) if modes[i] != sk.BREAKING for r in range(3)]
        n = len(act)
        pos = {r: a for a, r in enumerate(act)}
        A_eq, b_eq, A_ub = [G[:, act]], [G[:, act] @ lam[act]], []
        for i in range(nc):
            if modes[i] == sk.BREAKING:
                continue
            a0, a1, an = pos[3 * i], pos[3 * i + 1], pos[3 * i + 2]
            if modes[i] == sk.SLIDING:
                s = sigma[3 * i:3 * i + 2]
                u = s / np.hypot(*s)
                for t, at in ((0, a0), (1, a1)):
                    r = np.zeros(n)
                    r[at], r[an] = 1.0, mu[i] * u[t]
                    A_eq.append(r[None])
                    b_eq.append([0.0])
            else:
                for th in ang:
                    r = np.zeros(n)
                    r[a0], r[a1], r[an] = np.cos(th), np.sin(th), -mu[i] * np.cos(np.pi / K)
                    A_ub.append(r)
            r = np.zeros(n)
            r[an] = -1.0
            A_ub.append(r)
        res = linprog(np.zeros(n), A_ub=np.array(A_ub), b_ub=np.zeros(len(A_ub)),
                      A_eq=np.vstack(A_eq), b_eq=np.concatenate(b_eq),
                      bounds=[(None, None)] * n, method="highs")
        return True, res.status == 0

    def pre(p):
        G = p["G"]
        d = np.diagonal(G)
        dG = np.maximum(d, 1e-12 * max(1.0, d.max()))
        dc = (dG[0::3] + dG[1::3] + dG[2::3]) / 3.0
        return dG, dc, max(float(np.abs(p["g"]).max()), 1e-3 * st.tol), d <= 1e-14 * d.max()

    tot = dict(problems=0, stage1_fails=0, rounds=0, violated=0, velocity_side_ok=0,
               repairable=0, final_modes_same_velocity=0, big_budget_converged=0,
               two_valid_solutions=0)
    for path in paths:
        probs = pickle.load(open(path, "rb"))
        for k, p in enumerate(probs):
            G, g, nc, mu = p["G"], p["g"], p["nc"], p["mu"]
            m = G.shape[0]
            dG, dc, vscale, zero = pre(p)
            lam0 = np.zeros(0) if p["lam0"] is None else p["lam0"]
            m0 = np.zeros(0, np.int64) if p["modes0"] is None else p["modes0"]
            tot["problems"] += 1
            sk._violations = hook
            rec.clear()
            out = sk.solve_stage1(G, g, nc, mu, lam0, m0, p["modes0"] is not None, st.tol,
                                  st.mode_tol, st.newton_iter, st.mode_rounds, st.newton_budget,
                                  None, None, None, None)
            sk._violations = orig
            tot["stage1_fails"] += not out[0]
            nrep = 0
            for lam, sigma, modes, tol_v, _tol_l, found in rec:
                tot["rounds"] += 1
                if not found:
                    continue
                tot["violated"] += 1
                vok, feas = repairable(G, nc, mu, lam, sigma, modes, tol_v)
                tot["velocity_side_ok"] += vok
                tot["repairable"] += feas
                nrep += feas
            sig_l = G @ p["lam"] + g
            res_l = sk.natres(p["lam"], sig_l, nc, mu, dc, dG)
            modes = p["modes"].astype(np.int64)
            x0 = np.zeros(m)
            lim = np.zeros(m - 3 * nc, np.bool_)
            sk._prepare(x0, nc, mu, modes, lim)
            x, sig, ok, _ = sk._newton(G, g, nc, mu, modes, lim, x0, dc, vscale, st.newton_iter,
                                       True, 0, zero, bool(zero.any()), st.tol, None, None,
                                       None, None)
            dv_modes = float(np.abs(sig - sig_l).max())
            tot["final_modes_same_velocity"] += dv_modes < 1e-6
            big = sk.solve_stage1(G, g, nc, mu, lam0, m0, p["modes0"] is not None, st.tol,
                                  st.mode_tol, st.newton_iter, 2 * st.mode_rounds,
                                  4 * st.newton_budget, None, None, None, None)
            line = (f"{os.path.basename(path)} #{k}: stage 1 {'ok' if out[0] else 'fails'}, "
                    f"{len(rec)} rounds, {nrep} repairable; later stages ({p['method']}) "
                    f"residual {res_l:.1e}; Newton on their modes from zero: ok {ok}, "
                    f"|dsigma| {dv_modes:.1e}")
            if big[0]:
                tot["big_budget_converged"] += 1
                dv = float(np.abs(big[2] - sig_l).max())
                tot["two_valid_solutions"] += dv > 1e-6 and res_l <= st.tol
                line += f"; 4x budget: residual {big[6]:.1e}, |dsigma| {dv:.1e}"
            print(line, flush=True)
    print(tot)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--boxes", type=int, nargs="+", default=[3, 4])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--analyze", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.analyze:
        analyze(a.analyze)
        sys.exit(0)
    tmp = tempfile.mkdtemp(prefix="pile_stage1_")
    paths = []
    for n in a.boxes:
        path = os.path.join(tmp, f"boxes{n}.pkl")
        subprocess.run([sys.executable, "-c", _CAPTURE, str(n), str(a.steps), path], check=True)
        paths.append(path)
    env = dict(os.environ, DIFFGYM_JIT="0")
    subprocess.run([sys.executable, __file__, "--analyze", *paths], check=True, env=env)
