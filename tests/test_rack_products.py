"""The large islands' Newton products over the Delassus block's nonzeros (issue 16, ball racks'
forward speed): equal, to the bit, to the dense products they replace."""
import numpy as np

import diffgym
import diffgym.sim.forward as fw
from diffgym.bench_scaling import balls_mjcf
from diffgym.sim import solver_kernels as sk


def test_csr_products_equal_dense_to_the_bit():
    """The large Newton's products over the Delassus block's nonzeros (``_csr_matvec_build``,
    ``_csr_matvec``) against the dense ``_matvec`` they replace, to the bit: on the G of a
    64-ball rack's step (rows of bodies that share no tree: exact zeros) and on a matrix whose
    dense rows outgrow the first storage (16 per row)."""
    sim = diffgym.Simulator.from_string(balls_mjcf(64))
    rec = []
    oc = fw._constrained_step

    def spy(*a):
        out = oc(*a)
        rec.append(out[-1])             # (G)
        return out
    fw._constrained_step = spy
    try:
        q, v = sim.q0, np.zeros(sim.nv)
        for _ in range(3):
            q, v = sim.step(q, v, np.zeros(sim.nv))
    finally:
        fw._constrained_step = oc
    rng = np.random.default_rng(3)
    G = rec[-1]
    assert G.shape[0] >= sk.BODY_MIN_ROWS and np.count_nonzero(G) < 0.2 * G.size
    A = rng.normal(size=(40, 40)) * (rng.random((40, 40)) < 0.7)    # > 16 nonzeros a row
    for M in (G, A):
        n = M.shape[0]
        x, b = rng.normal(size=n), rng.normal(size=n)
        ref = np.empty(n)
        sk._matvec(M, x, b, ref)
        out = np.empty(n)
        ptr, col, val = sk._csr_matvec_build(M, x, b, out)
        assert np.array_equal(out, ref)
        assert ptr[-1] == np.count_nonzero(M)
        x2 = rng.normal(size=n)
        sk._matvec(M, x2, b, ref)
        sk._csr_matvec(ptr, col, val, x2, b, out)
        assert np.array_equal(out, ref)
