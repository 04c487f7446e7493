"""The defining conditions of the mixed constraint problem (contacts, joint limits and the rows
of diffgym.sim.equality), written out from their definitions: the test oracle of the mixed
solve (equality_kernels.mixed_solve), independent of its algorithm."""
import numpy as np


def mixed_conditions(G, g, nc, nl, mu, kind, bound, lam, tol=1e-9):
    """The largest violation (velocity units) of the mixed problem's defining conditions at
    ``lam``, written out from the definitions (module docstring of diffgym.sim.equality), not
    from the solver: contacts in the Coulomb cone with De Saxce's complementarity, limits
    complementary, bilateral rows at zero velocity, friction rows inside the box and sticking
    there or at the bound against the slip."""
    sigma = G @ lam + g
    d = np.maximum(np.diag(G), 1e-12)
    worst = 0.0
    for i in range(nc):
        l, s = lam[3 * i:3 * i + 3], sigma[3 * i:3 * i + 3]
        dc = d[3 * i:3 * i + 3].mean()
        # lam in K_mu, sigma + Gamma in K_mu^*, lam . (sigma + Gamma) = 0: the natural map
        y = l - (s + np.array([0.0, 0.0, mu[i] * np.linalg.norm(s[:2])])) / dc
        nt, yn = np.linalg.norm(y[:2]), y[2]
        if nt <= mu[i] * yn:
            p = y
        elif mu[i] * nt <= -yn:
            p = np.zeros(3)
        else:
            a = (mu[i] * nt + yn) / (1.0 + mu[i] ** 2)
            p = np.array([mu[i] * a * y[0] / nt, mu[i] * a * y[1] / nt, a])
        worst = max(worst, dc * float(np.linalg.norm(l - p)))
    for j in range(3 * nc, 3 * nc + nl):
        worst = max(worst, d[j] * max(-lam[j], 0.0), max(-sigma[j], 0.0),
                    min(abs(sigma[j]), d[j] * abs(lam[j])))
    for k in range(len(kind)):
        r = 3 * nc + nl + k
        if kind[k] == 0:                                  # bilateral
            worst = max(worst, abs(sigma[r]))
        elif kind[k] == 1:                                # dry friction, |lam| <= bound
            over = abs(lam[r]) - bound[k]
            worst = max(worst, d[r] * max(over, 0.0))
            if over < -1e-9 * max(bound[k], 1e-300):      # inside the box: sticking
                worst = max(worst, abs(sigma[r]))
            else:                                         # at the bound: against the slip
                worst = max(worst, max(lam[r] * sigma[r], 0.0) / max(bound[k], 1e-300))
        else:                                             # unilateral
            worst = max(worst, d[r] * max(-lam[r], 0.0), max(-sigma[r], 0.0),
                        min(abs(sigma[r]), d[r] * abs(lam[r])))
    return worst


def step_conditions(sim):
    """``mixed_conditions`` of ``sim``'s last step, relative to its largest |g| (None where the
    step had no rows of diffgym.sim.equality)."""
    c = sim.cache
    cons = c["cons"]
    if cons is None or getattr(cons, "extra", None) is None:
        return None
    xr = cons.extra
    vs = max(1.0, float(np.abs(c["g"]).max()))
    return mixed_conditions(c["G"], c["g"], cons.nc, len(cons.limits), cons.mu, xr.kind,
                            xr.bound, c["res"].lam) / vs
