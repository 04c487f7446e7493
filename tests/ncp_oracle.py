"""Oracles of the contact NCP (``sigma = G lam + g``; contacts (t1, t2, n) then joint limits),
independent of diffgym's solver: its defining conditions written out one by one from their
definitions, the mode conditions a solution's reported modes must satisfy, and pinocchio's own
NCP solver (``pin.ADMMConstraintSolver`` with ``solve_ncp``) on the same problem. (The same
conditions as one natural map, with the mixed rows, are tests/mixed_oracle.py.)"""
import numpy as np
import pinocchio as pin

BREAKING, STICKING, SLIDING = 0, 1, 2        # (diffgym.sim.solver's mode numbers)


def ncp_conditions(G, g, nc, mu, lam):
    """The largest violation of each defining condition of the NCP at ``lam``, in velocity
    units (impulses are scaled by the Delassus diagonal, products by the largest |lam|):

    - ``cone``: Coulomb, ``lam_N >= 0`` and ``||lam_T|| <= mu lam_N``;
    - ``signorini``: ``sigma_N >= 0`` and ``lam_N sigma_N = 0``;
    - ``dissipation``: maximal dissipation (with De Saxce's complementarity): the friction
      impulse opposes the slip, ``lam_T || -sigma_T`` (the slip's components across and along
      ``lam_T``), with all the cone allows (with a slip, ``||lam_T|| = mu lam_N``);
    - ``limits``: ``lam >= 0``, ``sigma >= 0``, ``lam sigma = 0``.
    """
    G = np.asarray(G, dtype=float)
    lam = np.asarray(lam, dtype=float)
    sigma = G @ lam + np.asarray(g, dtype=float)
    d = np.maximum(np.diag(G), 1e-12 * max(1.0, float(np.max(np.diag(G), initial=0.0))))
    ls = max(float(np.abs(lam).max(initial=0.0)), 1e-300)
    out = dict(cone=0.0, signorini=0.0, dissipation=0.0, limits=0.0)
    for i in range(nc):
        lt, ln = lam[3 * i:3 * i + 2], lam[3 * i + 2]
        st, sn = sigma[3 * i:3 * i + 2], sigma[3 * i + 2]
        dn = d[3 * i:3 * i + 3].mean()
        nlt, nst = float(np.linalg.norm(lt)), float(np.linalg.norm(st))
        out["cone"] = max(out["cone"], dn * max(-ln, 0.0), dn * max(nlt - mu[i] * ln, 0.0))
        out["signorini"] = max(out["signorini"], max(-sn, 0.0), min(abs(sn), dn * abs(ln)))
        w = max(nlt, 1e-9 * ls)                          # (a negligible lam_T: no direction)
        across = abs(lt[0] * st[1] - lt[1] * st[0]) / w
        along = max(float(lt @ st), 0.0) / w
        out["dissipation"] = max(out["dissipation"], across, along,
                                 min(nst, dn * max(mu[i] * ln - nlt, 0.0)))
    for j in range(3 * nc, len(lam)):
        out["limits"] = max(out["limits"], d[j] * max(-lam[j], 0.0), max(-sigma[j], 0.0),
                            min(abs(sigma[j]), d[j] * abs(lam[j])))
    return out


def assert_modes_consistent(res, G, g, nc, mu, eq_tol=1e-10):
    """The reported modes hold: their equations (to eq_tol, relative to |g|) and their
    inequalities (breaking: no impulse, not approaching; sticking: no velocity, impulse in the
    cone; sliding: no normal velocity, impulse on the boundary against the slip; limits)."""
    vs = max(1.0, float(np.abs(g).max()))
    lam, sigma = res.lam, res.sigma
    ls = max(1e-12, float(np.abs(lam).max()))
    assert np.allclose(sigma, G @ lam + g, rtol=0, atol=1e-12 * vs)
    assert res.modes.shape == (nc,) and res.limit_active.shape == (G.shape[0] - 3 * nc,)
    for i in range(nc):
        l, s = lam[3 * i:3 * i + 3], sigma[3 * i:3 * i + 3]
        if res.modes[i] == BREAKING:
            assert np.all(l == 0.0)
            assert s[2] >= -eq_tol * vs
        elif res.modes[i] == STICKING:
            assert np.linalg.norm(s) <= eq_tol * vs, (i, s)
            assert np.linalg.norm(l[:2]) <= mu[i] * l[2] + 1e-9 * ls, (i, l)
        else:
            assert res.modes[i] == SLIDING
            assert abs(s[2]) <= eq_tol * vs and l[2] >= -1e-9 * ls, (i, l, s)
            slip = np.linalg.norm(s[:2])
            assert slip > 0.0
            # (a velocity error e turns the slip's direction by up to e / slip: a slip within
            # the tolerance has none)
            atol = 1e-9 * ls + mu[i] * abs(l[2]) * min(2.0, eq_tol * vs / slip)
            assert np.allclose(l[:2], -mu[i] * l[2] * s[:2] / slip, rtol=0, atol=atol), (i, l, s)
    for j, act in enumerate(res.limit_active):
        k = 3 * nc + j
        if act:
            assert abs(sigma[k]) <= eq_tol * vs and lam[k] >= -1e-9 * ls
        else:
            assert lam[k] == 0.0 and sigma[k] >= -eq_tol * vs


_PIN_MODEL = pin.Model()
_PIN_MODEL.addJoint(0, pin.JointModelFreeFlyer(), pin.SE3.Identity(), "body")
_PIN_MODEL.appendBodyToJoint(1, pin.Inertia.FromSphere(1.0, 0.1), pin.SE3.Identity())


def pinocchio_ncp(G, g, nc, mu, tol=1e-13, max_iter=50000):
    """pinocchio's ADMM NCP solver on our problem. A point contact's rows are (t1, t2, n) as ours
    (tests/test_solver.py checks it); a joint limit row becomes the normal row of a frictionless
    point contact whose two tangential rows are decoupled dummies (zero impulse, zero
    velocity). Returns (lam, sigma). (Written apart from the solver's own fallback,
    ``NCPSolver._pin_admm``, on purpose: an oracle sharing its embedding would share its
    mistakes.)"""
    m = G.shape[0]
    nl = m - 3 * nc
    M = 3 * nc + 3 * nl
    idx = np.concatenate((np.arange(3 * nc), 3 * nc + 3 * np.arange(nl) + 2))
    Ge = np.eye(M) * float(np.mean(np.diag(G)))
    Ge[np.ix_(idx, idx)] = G
    ge = np.zeros(M)
    ge[idx] = g
    models = pin.StdVec_ConstraintModel()
    for f in np.concatenate((mu, np.zeros(nl))):
        pc = pin.PointContactConstraintModel(_PIN_MODEL, 1)
        pc.setFriction(float(f))
        models.append(pin.ConstraintModel(pc))
    datas = pin.StdVec_ConstraintData()
    for cm in models:
        datas.append(cm.createData())
    st = pin.ADMMSolverSettings()
    st.solve_ncp = True
    st.max_iterations = max_iter
    st.absolute_feasibility_tol = st.absolute_complementarity_tol = tol
    st.relative_feasibility_tol = st.relative_complementarity_tol = tol
    res = pin.ADMMSolverResult()
    pin.ADMMConstraintSolver(M).solve(pin.DelassusOperatorDense(Ge), ge, models, datas, st, res)
    lam = np.asarray(res.retrieveConstraintImpulses())[idx].copy()
    return lam, G @ lam + g
