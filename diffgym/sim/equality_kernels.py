"""Compiled mixed solve of the :mod:`diffgym.sim.equality` rows (joint dry friction, equality
constraints, ball and tendon limits) with the contact / joint-limit NCP.

``mixed_solve`` is the one implementation of the mixed solve (:meth:`diffgym.sim.equality.ExtraRows.solve`
calls it; it runs as plain Python under ``DIFFGYM_JIT=0``): an active set over the new rows
(equality rows eliminated by a minimum-norm Schur complement, ``pinv`` with ``rcond = 1e-11``;
sliding friction and inactive unilateral rows at fixed impulses; a row violating its mode's
inequality switches, all at once, only the worst one once a set of modes repeats or after 20
rounds, at most 60 rounds), and the reduced contact / joint-limit NCP solved by the compiled
stage 1 (``solver_kernels.solve_stage1``) warm-started by the previous round, rows whose impulse
no longer moves anything (their Schur diagonal below 1e-12 of theirs in G) left out.

Where a reduced solve's stage 1 fails the kernel returns ``ok`` False with its state; the caller
solves that reduced problem by the later stages (stage 2-4, Python) and resumes the kernel with
the result. With ``delegate`` every reduced problem goes to the caller's solver that way.
"""
from __future__ import annotations

import numpy as np

from .jit import njit
from .solver_kernels import natres, solve_stage1

KIND_EQ, KIND_FRICTION, KIND_LIMIT = 0, 1, 2       # (diffgym.sim.equality's KIND_*)
_EMPTY_F = np.zeros(0)
_EMPTY_I = np.zeros(0, dtype=np.int64)


@njit
def _reduced(Gs, gs, d0, nc, nl, mu, lam0, modes0, has_modes, tol, mode_tol, newton_iter,
             mode_rounds, budget):
    """``ExtraRows._solve_reduced`` with stage 1: (ok, lam, sigma, modes, lim_act, its, res,
    elimination) (``elimination``: no row left to solve). (``ExtraRows._solve_reduced`` does the
    same for a delegated or failed reduced problem, with the caller's solver.)"""
    s0 = 3 * nc + nl
    dead = np.zeros(s0, np.bool_)
    for i in range(s0):
        d = d0[i] if d0[i] > 1e-300 else 1e-300
        dead[i] = Gs[i, i] <= 1e-12 * d
    kc = np.ones(nc, np.bool_)
    allkeep = True
    for c in range(nc):
        if dead[3 * c] and dead[3 * c + 1] and dead[3 * c + 2]:
            kc[c] = False
            allkeep = False
    for j in range(nl):
        if dead[3 * nc + j]:
            allkeep = False
    if allkeep:
        out = solve_stage1(Gs, gs, nc, mu, lam0, modes0, has_modes, tol, mode_tol, newton_iter,
                           mode_rounds, budget, None, None, None, None, None, None,
                           False)   # (no body-space steps; no stage 1c: the rounds' own stages)
        return out[0], out[1], out[2], out[3], out[4], out[5], out[6], False
    ncs = 0
    for c in range(nc):
        if kc[c]:
            ncs += 1
    nls = 0
    for j in range(nl):
        if not dead[3 * nc + j]:
            nls += 1
    n = 3 * ncs + nls
    rows = np.empty(n, np.int64)
    t = 0
    for c in range(nc):
        if kc[c]:
            for a in range(3):
                rows[t] = 3 * c + a
                t += 1
    for j in range(nl):
        if not dead[3 * nc + j]:
            rows[t] = 3 * nc + j
            t += 1
    lam = np.zeros(s0)
    modes = np.zeros(nc, np.int64)
    act = np.zeros(nl, np.bool_)
    if n == 0:
        return True, lam, gs.copy(), modes, act, 0, 0.0, True
    Gr = np.empty((n, n))
    gr = np.empty(n)
    for a in range(n):
        gr[a] = gs[rows[a]]
        for b in range(n):
            Gr[a, b] = Gs[rows[a], rows[b]]
    mur = np.empty(ncs)
    t = 0
    for c in range(nc):
        if kc[c]:
            mur[t] = mu[c]
            t += 1
    sub0 = np.empty(n if lam0.shape[0] else 0)
    if lam0.shape[0]:
        for a in range(n):
            sub0[a] = lam0[rows[a]]
    if has_modes:
        long = modes0.shape[0] > nc
        subm = np.empty(ncs + (nls if long else 0), np.int64)
        t = 0
        for c in range(nc):
            if kc[c]:
                subm[t] = modes0[c]
                t += 1
        if long:
            for j in range(nl):
                if not dead[3 * nc + j]:
                    subm[t] = modes0[nc + j]
                    t += 1
    else:
        subm = np.zeros(0, np.int64)
    out = solve_stage1(Gr, gr, ncs, mur, sub0, subm, has_modes, tol, mode_tol, newton_iter,
                       mode_rounds, budget, None, None, None, None, None, None,
                       False)   # (no body-space steps; no stage 1c: the rounds' own stages)
    if not out[0]:
        return False, lam, gs, modes, act, out[5], out[6], False
    for a in range(n):
        lam[rows[a]] = out[1][a]
    sigma = np.empty(s0)
    for i in range(s0):
        acc = 0.0
        for j in range(s0):
            acc += Gs[i, j] * lam[j]
        sigma[i] = acc + gs[i]
    t = 0
    for c in range(nc):
        if kc[c]:
            modes[c] = out[3][t]
            t += 1
    t = 0
    for j in range(nl):
        if not dead[3 * nc + j]:
            act[j] = out[4][t]
            t += 1
    return True, lam, sigma, modes, act, out[5], out[6], False


@njit
def _warm_modes(modes, lact, nc, nl):
    """A reduced solve's warm start (``modes0``): the contacts' modes, then each joint limit's
    1 (active) or 0."""
    m0 = np.empty(nc + nl, np.int64)
    for c in range(nc):
        m0[c] = modes[c]
    for j in range(nl):
        m0[nc + j] = 1 if lact[j] else 0
    return m0


@njit
def mixed_solve(G, g, nc, nl, mu, kind, bound, xmode_in, lam0, modes0, has_modes, tol,
                mode_tol, newton_iter, mode_rounds, budget, rnd0, its0, seen_in, nseen0, inj,
                inj_lam, inj_modes, inj_act, inj_its, inj_resid, inj_elim, inj_conv, delegate,
                xmode_cold, restarted0):
    """``ExtraRows.solve`` (its warm-started ``xmode_in`` given): (ok, lam, sigma, modes,
    limit_active (the ``nl`` joint-limit rows), xmode, iterations, residual, converged,
    elimination, state) with ``elimination`` True where no reduced NCP was solved (the
    method "elimination").

    ``ok`` False: the reduced stage 1 of round ``state[0]`` failed; ``state`` = (round,
    iterations, seen modes, their count, Gs, gs, lam0, modes0, has_modes) lets the caller solve
    that reduced problem by the later stages (``ExtraRows._solve_reduced`` from stage 2) and
    resume here: ``rnd0, its0, seen_in, nseen0`` the state, ``xmode_in`` the round's modes,
    ``inj`` True with the reduced result (``inj_*``) for round ``rnd0``. ``delegate`` True:
    every round's reduced problem goes to the caller that way (a solver other than the
    compiled ``NCPSolver``: ``SolverSettings(compiled=False)`` or a user's own).

    ``xmode_cold``: the modes without a warm start (friction rows sticking, limits by their
    free velocity). The first time a set of modes repeats (the warm start led the rounds into
    a cycle), the rounds restart once from them (``restarted0``: already done, for a resumed
    call); only a cycle after that switches one row at a time. (On a Go1 with joint friction
    a warm start cycled for 59 rounds where the cold modes converge in 4.)"""
    m = G.shape[0]
    s0 = 3 * nc + nl
    mx = m - s0
    xmode = xmode_in.copy()
    its = its0
    R = 61
    seen = seen_in.copy()
    nseen = nseen0
    restarted = restarted0
    res_conv = True
    lam = np.zeros(m)
    sigma = np.zeros(m)
    new = xmode.copy()
    have_res = False
    res_resid = 0.0
    res_modes = np.zeros(nc, np.int64)
    res_act = np.zeros(nl, np.bool_)
    elim = True
    cur_lam0 = lam0
    cur_modes0 = modes0
    cur_has = has_modes
    d0 = np.empty(s0)
    for i in range(s0):
        d0[i] = G[i, i]
    Gs = np.zeros((s0, s0))
    gs = np.zeros(s0)
    last = rnd0
    stuck_viol = 0.0
    for rnd in range(rnd0, 60):
        last = rnd
        ne = 0
        for i in range(mx):
            if xmode[i] == 0:
                ne += 1
        nf = mx - ne
        E = np.empty(ne, np.int64)
        F = np.empty(nf, np.int64)
        a = 0
        b = 0
        for i in range(mx):
            if xmode[i] == 0:
                E[a] = s0 + i
                a += 1
            else:
                F[b] = s0 + i
                b += 1
        lamF = np.zeros(nf)
        for t in range(nf):
            mo = xmode[F[t] - s0]
            if mo == 1 or mo == -1:
                lamF[t] = -mo * bound[F[t] - s0]
        # g_S + G_SF lam_F
        gS = np.empty(s0)
        for i in range(s0):
            acc = 0.0
            for t in range(nf):
                acc += G[i, F[t]] * lamF[t]
            gS[i] = g[i] + acc
        Gs = np.empty((s0, s0))
        for i in range(s0):
            for j in range(s0):
                Gs[i, j] = G[i, j]
        gs = gS.copy()
        if ne:
            GEE = np.empty((ne, ne))
            for p in range(ne):
                for r in range(ne):
                    GEE[p, r] = G[E[p], E[r]]
            Kp = np.linalg.pinv(GEE, rcond=1e-11)
            gE = np.empty(ne)
            for p in range(ne):
                acc = 0.0
                for t in range(nf):
                    acc += G[E[p], F[t]] * lamF[t]
                gE[p] = g[E[p]] + acc
            if s0:
                GSE = np.empty((s0, ne))
                for i in range(s0):
                    for p in range(ne):
                        GSE[i, p] = G[i, E[p]]
                W = GSE @ Kp                       # (s0, ne)
                Gs -= W @ GSE.T
                KgE = Kp @ gE
                gs -= GSE @ KgE
        lam = np.zeros(m)
        if s0:
            for i in range(s0):
                for j in range(i + 1, s0):
                    h = 0.5 * (Gs[i, j] + Gs[j, i])
                    Gs[i, j] = h
                    Gs[j, i] = h
            if inj and rnd == rnd0:
                lr, mr, ar, itr, rr, el = inj_lam, inj_modes, inj_act, inj_its, inj_resid, inj_elim
                res_conv = inj_conv
            else:
                if delegate:
                    ok = False
                else:
                    ok, lr, sr, mr, ar, itr, rr, el = _reduced(
                        Gs, gs, d0, nc, nl, mu, cur_lam0, cur_modes0, cur_has, tol, mode_tol,
                        newton_iter, mode_rounds, budget)
                if not ok:
                    return (False, lam, sigma, res_modes, res_act, xmode, its, 0.0, False, elim,
                            (rnd, its, seen, nseen, Gs, gs, cur_lam0, cur_modes0, cur_has,
                             restarted))
                res_conv = True
            for i in range(s0):
                lam[i] = lr[i]
            its += itr
            have_res = True
            res_resid = rr
            res_modes = mr
            res_act = ar
            elim = el
            cur_lam0 = lr
            cur_modes0 = _warm_modes(mr, ar, nc, nl)
            cur_has = True
        if ne:
            rhs = np.empty(ne)
            for p in range(ne):
                acc = 0.0
                for i in range(s0):
                    acc += G[E[p], i] * lam[i]
                rhs[p] = gE[p] + acc
            sol = Kp @ rhs
            for p in range(ne):
                lam[E[p]] = -sol[p]
        for t in range(nf):
            lam[F[t]] = lamF[t]
        sigma = G @ lam + g
        new = xmode.copy()
        viol = np.zeros(mx)
        for i in range(mx):
            r = s0 + i
            dGi = G[r, r] if G[r, r] > 1e-12 else 1e-12
            li = lam[r]
            si = sigma[r]
            if kind[i] == KIND_FRICTION:
                if xmode[i] == 0 and abs(li) > bound[i] * (1 + 1e-12) + 1e-3 * tol / dGi:
                    new[i] = -1 if li > 0 else 1
                    viol[i] = dGi * (abs(li) - bound[i])
                elif xmode[i] == 1 and si < -tol:
                    new[i] = 0
                    viol[i] = -si
                elif xmode[i] == -1 and si > tol:
                    new[i] = 0
                    viol[i] = si
            elif kind[i] == KIND_LIMIT:
                if xmode[i] == 0 and li < -1e-3 * tol / dGi:
                    new[i] = 2
                    viol[i] = -dGi * li
                elif xmode[i] == 2 and si < -tol:
                    new[i] = 0
                    viol[i] = -si
        # a unilateral row (contact normal, joint limit) left out of the reduced NCP because
        # sticking friction rows took its direction (its Schur diagonal vanished) and separating
        # there (sigma < 0, zero impulse): those sticks are infeasible (e.g. a limit's
        # drift-correction velocity on the dof of a friction row); each stuck friction row along
        # it slides against the motion the row's impulse will cause. (Switched back to
        # sticking, the rows would only repeat: 0 -> bound -> 0 on the same dof.)
        # The same for an active unilateral extra row (a tendon or ball-joint limit held as an
        # equality) that took the direction of a joint limit or contact needing more velocity
        # than it allows (a joint limit violated by more than the tendon's on the same dof):
        # that limit is released, and the reduced NCP decides the row it took (released
        # wrongly, its own check re-activates it next round).
        # (A row that only a true equality takes, e.g. the contacts of a body welded to the
        # world, is left breaking with zero impulse by design: not counted.)
        stuck_viol = 0.0
        for i in range(s0):
            if (i >= 3 * nc or i % 3 == 2) and sigma[i] < -tol and lam[i] == 0.0:
                for t in range(mx):
                    r = s0 + t
                    if xmode[t] != 0 or kind[t] == KIND_EQ or \
                            abs(G[r, i]) <= 1e-9 * np.sqrt(G[r, r] * G[i, i]):
                        continue
                    if kind[t] == KIND_FRICTION:
                        new[t] = 1 if G[r, i] > 0 else -1
                    else:
                        new[t] = 2
                    if -sigma[i] > viol[t]:
                        viol[t] = -sigma[i]
                    if -sigma[i] > stuck_viol:
                        stuck_viol = -sigma[i]
        same = True
        for i in range(mx):
            if new[i] != xmode[i]:
                same = False
                break
        if same:
            break
        known = False
        for s in range(nseen):
            eq = True
            for i in range(mx):
                if seen[s, i] != xmode[i]:
                    eq = False
                    break
            if eq:
                known = True
                break
        key = xmode.copy()
        if known and not restarted:
            restarted = True
            cold = True
            for i in range(mx):
                if xmode_cold[i] != xmode_in[i]:
                    cold = False
                    break
            if not cold:             # a cycle from the warm start: once more from the cold modes
                xmode = xmode_cold.copy()
                nseen = 0
                continue
        if known or rnd > 20:       # cycling: switch only the worst row
            k = 0
            best = viol[0]
            for i in range(1, mx):
                if viol[i] > best:
                    best = viol[i]
                    k = i
            xmode[k] = new[k]
        else:
            xmode = new
        if not known:
            seen[nseen] = key
            nseen += 1
    conv = True
    for i in range(mx):
        if new[i] != xmode[i]:
            conv = False
            break
    rx = 0.0
    for i in range(mx):
        if xmode[i] == 0 and abs(sigma[s0 + i]) > rx:
            rx = abs(sigma[s0 + i])
    if stuck_viol > rx:            # (a row left out under infeasible sticks, last round)
        rx = stuck_viol
    resid = rx if rx > res_resid else res_resid
    gmax = 1.0
    for i in range(m):
        if abs(g[i]) > gmax:
            gmax = abs(g[i])
    lim = 100 * tol if 100 * tol > 1e-9 * gmax else 1e-9 * gmax
    conv = conv and rx <= lim and res_conv
    if not have_res:
        elim = True
    return (True, lam, sigma, res_modes, res_act, xmode, its, resid, conv, elim,
            (last, its, seen, nseen, Gs, gs, cur_lam0, cur_modes0, cur_has, restarted))


# -- the proximal-point mixed solve (issue 15: Talos after its fall) -------------------------
PROX_RHO0 = 1e-4        # the first proximal weight, relative to the mean diagonal of G
PROX_RHO_MIN = 1e-10    # its smallest value (lowered while the residual falls slowly)
PROX_RHO_MAX = 1e-1     # its largest (raised where a subproblem is not solved)
PROX_OUTER = 300        # proximal-point iterations at most
PROX_STALL = 100        # ... and none once this many have not lowered the best residual
PROX_POLISH = 1e3       # iterates within this many tol try the original problem's rounds


@njit
def _mean_diagonal(G):
    """The mean diagonal entry of G (1.0 for an empty G): the proximal weights' scale."""
    m = G.shape[0]
    scale = 0.0
    for i in range(m):
        scale += G[i, i]
    return scale / m if m else 1.0


@njit
def _fresh_rounds(G, g, nc, nl, mu, kind, bound, xmode, lam0, modes0, has_modes, tol, mode_tol,
                  newton_iter, mode_rounds, budget, xmode_cold):
    """``mixed_solve`` of (G, g) from a fresh round state, with no reduced solve injected and
    its compiled rounds only (not delegating)."""
    mx = G.shape[0] - 3 * nc - nl
    return mixed_solve(G, g, nc, nl, mu, kind, bound, xmode, lam0, modes0, has_modes, tol,
                       mode_tol, newton_iter, mode_rounds, budget, 0, 0,
                       np.zeros((61, mx), np.int64), 0, False, np.zeros(0),
                       np.zeros(0, np.int64), np.zeros(0, np.bool_), 0, 0.0, False, True, False,
                       xmode_cold, False)


@njit
def mixed_residual(G, g, nc, nl, mu, kind, bound, lam):
    """(natural-map residual of the whole mixed problem at ``lam``, in velocity units; sigma):
    the contact / joint-limit rows' as ``solver_kernels.natres``, the new rows' by their kind
    (bilateral ``|sigma|``; dry friction ``G_ii |lam - clip(lam - sigma / G_ii, -bound,
    bound)|``; unilateral as a joint limit)."""
    m = G.shape[0]
    s0 = 3 * nc + nl
    sigma = G @ lam + g
    dmax = 1.0
    for i in range(m):
        if G[i, i] > dmax:
            dmax = G[i, i]
    dG = np.empty(m)
    for i in range(m):
        dG[i] = G[i, i] if G[i, i] > 1e-12 * dmax else 1e-12 * dmax
    res = 0.0
    if s0:
        dc = np.empty(nc)
        for c in range(nc):
            dc[c] = (dG[3 * c] + dG[3 * c + 1] + dG[3 * c + 2]) / 3.0
        res = natres(lam[:s0].copy(), sigma[:s0].copy(), nc, mu, dc, dG[:s0].copy())
    for i in range(m - s0):
        a = s0 + i
        d = dG[a]
        li = lam[a]
        if kind[i] == KIND_EQ:
            e = abs(sigma[a])
        else:
            t = li - sigma[a] / d
            if kind[i] == KIND_FRICTION:
                if t > bound[i]:
                    t = bound[i]
                elif t < -bound[i]:
                    t = -bound[i]
            elif t < 0.0:
                t = 0.0
            e = abs(d * (li - t))
        if e > res or e != e:
            res = e
    return res, sigma


@njit
def mixed_prox(G, g, nc, nl, mu, kind, bound, xmode_in, modes0, has_modes, tol, mode_tol,
               newton_iter, mode_rounds, budget, xmode_cold):
    """The mixed problem by proximal-point iterations on all its rows: each iteration solves
    the problem of ``G + rho I`` and ``g - rho lam_k`` by ``mixed_solve`` (its compiled rounds
    only), warm-started by the previous one, until the whole problem's natural residual at
    ``lam_k`` (``mixed_residual``) is within ``tol``. Returns (ok, lam, sigma, modes,
    limit_active, xmode, iterations, residual) with the modes of the last subproblem.

    Why: where the rows' modes make the reduced contact problem rank deficient (Talos after its
    fall: sticking joint-friction rows weld links into rigid groups touching the ground at
    several points; 39 reduced rows of rank 26), its impulses are not unique. Stage 1's
    active-set Newton then fails on it (even from the right modes, unless started at an exact
    solution), the later stages reach 1e-7 m/s only, and the rounds switch friction rows on the
    impulses one of many solutions happened to have. With ``rho > 0`` every subproblem has
    unique impulses (its matrix is positive definite), the rounds and stage 1 solve it, and the
    iterates converge to a solution of the original problem (the proximal-point method),
    which exists there: projected Gauss-Seidel on the whole problem reaches a residual of 2e-14
    after 4 million sweeps. ``rho`` starts at ``PROX_RHO0`` times the mean diagonal of G, is
    divided by 4 while the residual falls by less than 0.3 an iteration and multiplied by 10
    where a subproblem is not solved (at most ``PROX_RHO_MAX``: then it fails); it stops after
    ``PROX_STALL`` iterations without a new lowest residual. Once within ``PROX_POLISH tol``,
    the original problem's rounds run from each new set of modes (with the iterate's
    impulses), and their
    solution is returned where they converge within ``tol`` and no further than the iterate
    (the modes right and the impulses unique: the exact solution, not one within ``tol``; it
    also ends the slow tail of iterations that stall a little above ``tol``). An inconsistent problem (no
    solution: e.g. the connected box of tests/test_rows_contacts.py with friction above its
    Painleve bound) fails here: its iterates' impulses grow without bound."""
    m = G.shape[0]
    s0 = 3 * nc + nl
    mx = m - s0
    scale = _mean_diagonal(G)
    rr = PROX_RHO0
    lam = np.zeros(m)
    xmode = xmode_in.copy()
    m0 = modes0.copy()
    has = has_modes
    its = 0
    r = np.inf
    Gr = G.copy()
    gr = np.empty(m)
    modes = np.zeros(nc, np.int64)
    lact = np.zeros(nl, np.bool_)
    sigma = np.zeros(m)
    best = np.inf
    kbest = 0
    tried = False                # (the modes of the last polish: tried once per set of modes)
    px = np.zeros(mx, np.int64)
    pm = np.zeros(nc + nl, np.int64)
    for k in range(PROX_OUTER):
        if k - kbest > PROX_STALL:
            break
        rho = rr * scale
        for i in range(m):
            Gr[i, i] = G[i, i] + rho
            gr[i] = g[i] - rho * lam[i]
        out = _fresh_rounds(Gr, gr, nc, nl, mu, kind, bound, xmode, lam[:s0].copy(), m0, has,
                            tol, mode_tol, newton_iter, mode_rounds, budget, xmode_cold)
        its += out[6]
        if not (out[0] and out[8]):
            if rr >= PROX_RHO_MAX:
                break
            rr *= 10.0
            continue
        lam = out[1]
        modes = out[3]
        lact = out[4]
        xmode = out[5]
        m0 = _warm_modes(modes, lact, nc, nl)
        has = True
        r2, sigma = mixed_residual(G, g, nc, nl, mu, kind, bound, lam)
        fresh = not tried
        if not fresh:
            for i in range(mx):
                if xmode[i] != px[i]:
                    fresh = True
            for i in range(nc + nl):
                if m0[i] != pm[i]:
                    fresh = True
        if r2 <= PROX_POLISH * tol and (fresh or r2 <= tol):
            tried = True
            px = xmode.copy()
            pm = m0.copy()
            # the original problem's rounds from this iterate's modes and impulses: where they
            # converge (the modes right, the impulses unique), the exact solution instead of
            # one within tol (and, near it, the end of a slow tail of iterations)
            ex = _fresh_rounds(G, g, nc, nl, mu, kind, bound, xmode, lam[:s0].copy(), m0, True,
                               tol, mode_tol, newton_iter, mode_rounds, budget, xmode_cold)
            its += ex[6]
            if ex[0] and ex[8]:
                r3, s3 = mixed_residual(G, g, nc, nl, mu, kind, bound, ex[1])
                if r3 <= tol and r3 <= r2:
                    return True, ex[1], s3, ex[3], ex[4], ex[5], its, r3
        if r2 <= tol:
            return True, lam, sigma, modes, lact, xmode, its, r2
        if r2 < best:
            best = r2
            kbest = k
        if r2 > 0.3 * r:
            rr = rr / 4.0 if rr / 4.0 > PROX_RHO_MIN else PROX_RHO_MIN
        r = r2
    return False, lam, sigma, modes, lact, xmode, its, r


@njit
def mixed_soft(G, g, nc, nl, mu, kind, bound, xmode_in, modes0, has_modes, tol, mode_tol,
               newton_iter, mode_rounds, budget, xmode_cold):
    """The answer of a step whose mixed problem no stage solved (``ExtraRows.solve``; it is
    reported unconverged): the solution of the problem of ``G + rho I`` (``rho = PROX_RHO0``
    times the mean diagonal of G; every row made slightly compliant: its impulses are unique)
    by ``mixed_solve``'s compiled rounds, from zero impulses. Where the problem has no solution
    (the Painleve-type inconsistency of rigid rows and Coulomb friction), its velocities are
    within O(rho) of their limit as ``rho -> 0`` (the impulses growing like ``1 / rho`` in the
    null space of the rows, which moves nothing) instead of an iterative stage's last iterate.
    Returns (ok, lam, modes, limit_active, xmode, iterations)."""
    rho = PROX_RHO0 * _mean_diagonal(G)
    Gr = G.copy()
    for i in range(G.shape[0]):
        Gr[i, i] += rho
    out = _fresh_rounds(Gr, g, nc, nl, mu, kind, bound, xmode_in, np.zeros(0), modes0, has_modes,
                        tol, mode_tol, newton_iter, mode_rounds, budget, xmode_cold)
    return out[0] and out[8], out[1], out[3], out[4], out[5], out[6]
