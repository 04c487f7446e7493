"""The body-space Newton step of large linear active sets (solver_kernels.body_factor /
body_pinv): the minimum-norm least-squares solution of ``J M^-1 J^T lam = r`` through the
sparse ``K = J^T J`` of the island's dofs, checked against an SVD pseudo-inverse (numpy) and,
on whole steps of a ball rack and a box pile, against pinocchio's own ADMM on the same
problem."""
import warnings

import numpy as np
import pytest

import diffgym
import diffgym.sim.forward as fw
from diffgym.sim import solver_kernels as sk
from diffgym.bench_scaling import balls_mjcf, boxes_mjcf
from diffgym.sim.solver import NCPSolver


def _free_bodies_rows(rng, nb, floor_rows, null=None):
    """Rows of a chain of nb free bodies: ``floor_rows`` contacts on each, one between
    neighbours; one row made redundant; ``null``: a dof combination no row sees."""
    n = 6 * nb
    rows = []
    for b in range(nb):
        for _ in range(floor_rows):
            r = np.zeros((3, n))
            r[:, 6 * b:6 * b + 6] = rng.normal(size=(3, 6))
            rows.append(r)
        if b + 1 < nb:
            r = np.zeros((3, n))
            r[:, 6 * b:6 * b + 12] = rng.normal(size=(3, 12))
            rows.append(r)
    J = np.vstack(rows)
    J[3] = J[0] + J[1]
    if null is not None:
        J = J - np.outer(J @ null, null) / (null @ null)
    Minv = np.zeros((n, n))
    for b in range(nb):
        A = rng.normal(size=(6, 6))
        Minv[6 * b:6 * b + 6, 6 * b:6 * b + 6] = A @ A.T + np.eye(6)
    tree_lo = np.repeat(np.arange(nb) * 6, 6)
    return J, Minv, tree_lo, tree_lo + 6


@pytest.mark.parametrize("case", ["redundant", "null dof"])
def test_body_pinv_is_the_minimum_norm_least_squares_solution(case):
    rng = np.random.default_rng(3)
    nb = 5
    null = None
    if case == "null dof":
        null = np.zeros(6 * nb)
        null[[2, 5, 11]] = (0.5, 1.0, -1.0)        # a spin two bodies share, as gears
    J, Minv, lo, hi = _free_bodies_rows(rng, nb, 2, null)
    Jb, M, tlo, thi = sk.island_body(J, np.triu(Minv), lo, hi, np.arange(J.shape[0]))
    Jd, Md = _dense_body(Jb, M, tlo, thi)
    np.testing.assert_allclose(Jd, J, rtol=0, atol=0)
    np.testing.assert_allclose(Md, np.linalg.inv(Minv), rtol=0, atol=1e-10)
    fac = sk.body_factor(Jb, M, tlo, thi)
    assert fac[0]
    assert fac[6] == (0 if null is None else 1)         # the null basis found
    G = J @ Minv @ J.T
    for _ in range(3):
        r = rng.normal(size=G.shape[0])
        x = sk.body_pinv(Jb, M, tlo, thi, *fac[1:], r)
        ref = np.linalg.pinv(G, rcond=1e-11) @ r
        np.testing.assert_allclose(x, ref, rtol=0, atol=1e-10 * np.abs(ref).max())


def _capture(sim, steps, v=None):
    """Step a scene, keeping the compiled call's (G, g, nc, mu, lam, sigma) of each step."""
    out = []
    orig = fw._constrained_step         # (the step's compiled call: the solve and its check)

    def spy(*a):
        r = orig(*a)
        nc = a[0].shape[0]
        G, g, lam, sigma = [fw._unpack_step(r[8], r[9], r[11], r[12], nc, r[2], a[9].shape[1])[i]
                            for i in (4, 5, 6, 7)]
        out.append((G, g, nc, a[6], lam, sigma, np.array([r[0]])))
        return r
    q, v = sim.q0, np.zeros(sim.nv) if v is None else v
    fw._constrained_step = spy
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", fw.SolverWarning)
            for _ in range(steps):
                q, v = sim.step(q, v, np.zeros(sim.nv))
                assert sim.last.method == "newton" and sim.last.converged
    finally:
        fw._constrained_step = orig
    return q, v, out


@pytest.mark.parametrize("scene", ["balls", "boxes"])
def test_rack_and_pile_converge_in_stage1_and_match_pinocchio_admm(scene):
    """A rack of 36 touching balls (one island of 288 rows, more than its dofs, and a
    counter-rotating spin of neighbours no contact holds: the body-space steps) and a pile of
    16 boxes (4 islands, 4 redundant corners a face): every step converges in the compiled active-set Newton, the
    rack stays at rest, and the constraint velocities (unique, unlike the impulses) agree with
    pinocchio's ADMM on the same problem."""
    xml = balls_mjcf(36) if scene == "balls" else boxes_mjcf(16)
    sim = diffgym.Simulator.from_string(xml)
    q, v, steps = _capture(sim, 15)
    assert np.abs(v).max() < 1e-6
    G, g, nc, mu, lam, sigma, ok = steps[-1]
    assert ok.all()
    if scene == "balls":
        assert G.shape[0] >= sk.BODY_MIN_ROWS           # (one island: the body-space steps)
    pin = NCPSolver()._pin_admm(G, g, nc, mu, np.zeros_like(lam), 1e-12, 20000)
    if pin is None:
        pytest.skip("pinocchio without ADMMConstraintSolver")
    np.testing.assert_allclose(sigma, pin[1], rtol=0, atol=1e-7)
    # the same problem by the dense path of stage 1 (no body-space rows): the same velocities
    dense = sk.solve_stage1(G, g, nc, mu, np.zeros(0), np.zeros(0, np.int64), False, 1e-9,
                            1e-10, 20, 12, 240, *sk.no_body())
    if dense[0]:
        np.testing.assert_allclose(sigma, dense[2], rtol=0, atol=1e-8)


def _dense_body(Jb, M, tlo, thi):
    """island_body's rows (values, columns) and tree-block mass matrix as dense (rows, n) and
    (n, n) arrays."""
    Jv, Jc = Jb
    n = len(tlo)
    J = np.zeros((Jv.shape[0], n))
    for a in range(Jv.shape[0]):
        k = Jc[a] >= 0
        assert np.all(np.diff(Jc[a][k]) > 0)            # columns increasing
        J[a, Jc[a][k]] = Jv[a][k]
    Md = np.zeros((n, n))
    for i in range(n):
        Md[i, tlo[i]:thi[i]] = M[i, :thi[i] - tlo[i]]
    return J, Md


def _dense_null_basis(fac, n):
    """body_factor's null vectors as a dense (n, nd) matrix and its N^T M N inverse blocks as
    one dense (nd, nd) matrix (zero between blocks)."""
    (ok, perm, first, lptr, Lv, drop, nd, klo, khi, noff, Nv, bptr, bcol, aoff, Av) = fac[:15]
    N = np.zeros((n, nd))
    for c in range(nd):
        N[perm[klo[c]:khi[c]], c] = Nv[noff[c]:noff[c + 1]]
    Ainv = np.zeros((nd, nd))
    for b in range(len(bptr) - 1):
        cols = bcol[bptr[b]:bptr[b + 1]]
        w = len(cols)
        Ainv[np.ix_(cols, cols)] = Av[aoff[b]:aoff[b] + w * w].reshape(w, w)
    return N, Ainv


@pytest.mark.parametrize("cold", [False, True])
def test_body_factor_many_null_dofs_by_block_matches_svd_pinv(cold):
    """A 40-ball rack (one island) whose active set is the floor contacts only (a resting
    rack's warm start: each ball keeps 3 dofs no row holds, 120 null dofs in 40 independent
    blocks of N^T M N: far more than the old single dense block allowed (32), so it used to
    take the dense O(m^3) path), or every contact (the whole rack coupled). The null basis
    spans null(K) exactly, N^T M N is block diagonal over the blocks found, and Gaa^+ r
    equals numpy's SVD pseudo-inverse."""
    rng = np.random.default_rng(5)
    sim = diffgym.Simulator.from_string(balls_mjcf(40))
    _capture(sim, 2)
    cons, Minv = sim.cache["cons"], sim.cache["Minv"]
    J = np.asarray(cons.J)
    nc = cons.nc
    lo, hi = sim.constraints.tree_lo, sim.constraints.tree_hi
    floor = np.array([i for i in range(nc) if min(cons.contacts.geom1[i], cons.contacts.geom2[i]) == 0])
    contacts = np.arange(nc) if cold else floor
    rows = np.concatenate([[3 * i, 3 * i + 1, 3 * i + 2] for i in contacts])
    Jb, M, tlo, thi = sk.island_body(J, np.triu(Minv), lo, hi, rows)
    fac = sk.body_factor(Jb, M, tlo, thi)
    assert fac[0]
    nd = fac[6]
    assert nd > 32 or cold
    Jd, Md = _dense_body(Jb, M, tlo, thi)
    n = Jd.shape[1]
    # storage by nonzeros: a row touches two balls (12 dofs), M couples one ball's 6 dofs
    assert Jb[0].shape[0] == len(rows) and Jb[0].shape[1] <= 12 and M.shape == (n, 6)
    N, Ainv = _dense_null_basis(fac, n)
    K = Jd.T @ Jd
    assert np.linalg.matrix_rank(N) == nd
    assert nd == n - np.linalg.matrix_rank(K)
    np.testing.assert_allclose(K @ N, 0.0, atol=1e-9 * np.abs(K).max() * max(1.0, np.abs(N).max()))
    np.testing.assert_allclose(Ainv @ (N.T @ Md @ N), np.eye(nd), atol=1e-8)
    if not cold:
        assert len(fac[11]) - 1 == len(floor)             # one block per ball
    G = Jd @ np.linalg.inv(Md) @ Jd.T
    for _ in range(3):
        r = rng.normal(size=G.shape[0])
        x = sk.body_pinv(Jb, M, tlo, thi, *fac[1:], r)
        ref = np.linalg.pinv(G, rcond=1e-11) @ r
        np.testing.assert_allclose(x, ref, rtol=0, atol=1e-8 * np.abs(ref).max())


def test_body_factor_drops_a_dof_only_rounding_couples():
    """A dof whose column holds only rounding-level entries (a ball's spin about its floor
    normal, 1e-35 from its rotation matrix) is dependent: before, its K diagonal (1e-70) made
    it its own pivot and scaled the null vectors by 1e35 (N^T M N singular)."""
    rng = np.random.default_rng(7)
    J, Minv, lo, hi = _free_bodies_rows(rng, 4, 2)
    J[:, 6 * np.arange(4) + 5] = 0.0
    J[0, 5] = 1.3e-35
    J[6, 11] = -3.5e-52
    Jb, M, tlo, thi = sk.island_body(J, np.triu(Minv), lo, hi, np.arange(J.shape[0]))
    fac = sk.body_factor(Jb, M, tlo, thi)
    assert fac[0] and fac[6] == 4
    N, Ainv = _dense_null_basis(fac, len(tlo))
    assert np.abs(N).max() < 1e3
    G = J @ Minv @ J.T
    r = rng.normal(size=G.shape[0])
    x = sk.body_pinv(Jb, M, tlo, thi, *fac[1:], r)
    ref = np.linalg.pinv(G, rcond=1e-11) @ r
    np.testing.assert_allclose(x, ref, rtol=0, atol=1e-9 * np.abs(ref).max())


def _rack_problem(n=36, steps=3):
    """A rack's assembled problem at a visited state: (J, G, g, rt, Minv, tree_lo, tree_hi), from
    the step's own compiled call's arguments (constraint.assemble_sparse on them)."""
    from diffgym.sim.constraint import assemble_sparse
    sim = diffgym.Simulator.from_string(balls_mjcf(n))
    got = []
    orig = fw._constrained_step

    def spy(*a):
        got.append(a)
        return orig(*a)
    fw._constrained_step = spy
    try:
        q, v = sim.q0, np.zeros(sim.nv)
        for _ in range(steps):
            q, v = sim.step(q, v, np.zeros(sim.nv))
    finally:
        fw._constrained_step = orig
    a = got[-1]
    (pos, frames, geom1, geom2, geom_joint, dist, mu, pair, point, Jw, support, sup_ptr, sup_idx,
     joint_tree, tree_lo, tree_hi) = a[:16]
    lim_v, lim_sign, dt, erp, skin, Minv, v_free = a[19], a[21], a[23], a[24], a[25], a[26], a[27]
    J, b, G, g, MJt, isl_c, isl_l, nis, rt = assemble_sparse(
        pos, frames, geom_joint[geom1], geom_joint[geom2], dist, Jw, support, sup_ptr, sup_idx,
        tree_lo, tree_hi, joint_tree, np.zeros(0, np.int64), np.zeros(0), lim_v, lim_sign, dt, erp,
        skin, Minv, v_free)
    return J, G, g, rt, Minv, tree_lo, tree_hi


def test_body_data_read_by_trees_match_the_full_scans():
    """The shortcuts of a large island's body-space data give what the full scans give, to the
    bit: ``island_body`` reading J only on each row's trees (``rt``), and the Delassus block's
    nonzeros (and ``G x + g``) read only where two rows share a tree (``_csr_matvec_trees``),
    over all rows and over an active subset."""
    J, G, g, rt, Minv, lo, hi = _rack_problem()
    m = G.shape[0]
    assert m >= sk.BODY_MIN_ROWS
    rows = np.arange(m)
    full = sk.island_body(J, Minv, lo, hi, rows)
    fast = sk.island_body(J, Minv, lo, hi, rows, rt)
    for x, y in zip((full[0][0], full[0][1], full[1], full[2], full[3]),
                    (fast[0][0], fast[0][1], fast[1], fast[2], fast[3])):
        assert x.shape == y.shape and np.array_equal(x, y)
    rng = np.random.default_rng(0)
    Jb, M, tlo, thi = fast
    for act in (rows, np.sort(rng.choice(m, size=m - 40, replace=False))):
        Gaa = np.ascontiguousarray(G[np.ix_(act, act)])
        x = rng.normal(size=len(act))
        out1, out2 = np.empty(len(act)), np.empty(len(act))
        ref = sk._csr_matvec_build(Gaa, x, g[act], out1)
        got = sk._csr_matvec_trees(Gaa, x, g[act], out2, Jb, act, tlo)
        k = ref[0][-1]              # (entries past the last row's end: buffer capacity)
        assert np.array_equal(ref[0], got[0]) and k > 0
        assert np.array_equal(ref[1][:k], got[1][:k]) and np.array_equal(ref[2][:k], got[2][:k])
        assert np.array_equal(out1, out2)
