"""The forward step: ABA, collision, constraint assembly, NCP solve and integration.

One step of semi-implicit Euler in impulse form (``shared/notes/gradients.md``)::

    a_free = ABA(q, v, tau + passive)       v_free = v + dt a_free
    G = J M^-1 J^T,  g = J v_free + b       lam = NCP(G, g, mu)
    v1 = v_free + M^-1 J^T lam              q1 = q (+) dt v1
"""
from __future__ import annotations

import dataclasses
import math
import os
import warnings
from dataclasses import dataclass, field

import numpy as np
import pinocchio as pin

from . import collision_driver as _cd
from .collision_driver import CollisionDriver, Contacts, _unpack_rows
from .collision_kernels import detect_closed_form
from .constraint import (ConstraintBuilder, Constraints, _active_limits, assemble_problem,  # noqa: F401
                         _NO_SPENT, _bias_row_ok, _pairs_in_contact, assemble_sparse,
                         island_rows, restitution_bias)
from .constraint import MAX_DEPENETRATION_SPEED, depenetration_speed
from . import blas as _blas
from .derivatives import step_jacobian
from .jit import ENABLED as _JIT, njit
from .model import ModelError, SimModel
from .solver import MODE_NAMES, SLIDING, STICKING, NCPSolver, SolverResult, SolverSettings
from .solver_kernels import (_NO_I, BODY_MIN_ROWS, _row_dofs, island_body, natres, no_body,
                             solve_stage1)
from .frames import tangent_frames
from .gradient_modes import gradient_mode
from .impact_time import MAX_PASSES, consumed_time, displacement, impact_substep, impact_times
from .trees import TreeGroups


_add = np.add.reduce          # (ndarray.sum without its Python wrapper: the same sums)
_minimum = np.minimum.reduce
_maximum = np.maximum.reduce
# (``a.dtype == _F64``, dtype to dtype, costs half of ``a.dtype == np.float64``, which converts
# the type first; not ``is``: the arrays of kernels loaded from the disk cache carry a float64
# dtype object of their own)
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
# the solver result of a step without constraints (what sim.last reports then)
_NO_FRAMES = np.zeros((0, 3, 3))
_NO_MOCAP = np.zeros((0, 3))       # _constrained_step's mocap_b for a model without mocap


def _mocap_rows(bb):
    return _NO_MOCAP if bb is None else np.ascontiguousarray(bb, dtype=np.float64)
_NO_DRIFT = np.zeros(0)   # _constrained_step's ``drift`` where no contact has one (support_drift)
_NO_RT = np.zeros((0, 2), dtype=np.int64)   # _verify_velocity's rt: rows' trees unknown
_NO_WARM = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0),
            np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.bool_))
# (_fused_step's warm-start arguments: none; the record's part where the tuple is given)
_NO_WARM_REC = (np.zeros(0), np.zeros(0, dtype=np.int64), 0, 0, 0)
_NO_WARM_FUSED = (0,) + _NO_WARM + _NO_WARM_REC
_NO_RESULT = SolverResult(np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64),
                          np.zeros(0, dtype=bool), 0, 0.0, True, "none")


@njit
def _checked_state(q, v, tau, qrows):
    """(a copy of q with its quaternions normalized, True) when every entry of q, v and tau is
    finite and every quaternion (rows ``qrows``, 4 each) has a norm within 1e-3 of one; else
    (q, False) and the caller runs the detailed checks, which name what is wrong."""
    for x in (q, v, tau):
        for i in range(x.shape[0]):
            if not np.isfinite(x[i]):
                return q, False
    out = q.copy()
    for s in range(0, qrows.shape[0], 4):
        n2 = 0.0
        for a in range(4):
            n2 += q[qrows[s + a]] * q[qrows[s + a]]
        nrm = np.sqrt(n2)
        if not abs(nrm - 1.0) <= 1e-3:
            return q, False
        for a in range(4):
            out[qrows[s + a]] = q[qrows[s + a]] / nrm
    return out, True


@njit
def _match_warm_start(pair_w, point_w, lam_w, modes_w, limits_w, lim_act_w, pair, point, dist,
                      limits, limit_dist):
    """The warm start of a step from the last one's contacts and limits, matched by identity
    (pair and point index; limit index). Rows seen last step get their impulses and modes;
    new ones start at zero impulse, breaking if apart and sticking if touching (limits: active
    if violated). Returns (lam0, modes (nc contact modes then nl limit 0/1), any found)."""
    nc, nl = pair.shape[0], limits.shape[0]
    ncw = pair_w.shape[0]
    lam0 = np.zeros(3 * nc + nl)
    modes = np.empty(nc + nl, dtype=np.int64)
    found = False
    for i in range(nc):
        # the same index first (the common case: the same contacts as the last step)
        j = i if i < ncw and pair_w[i] == pair[i] and point_w[i] == point[i] else -1
        if j < 0:
            for t in range(ncw):
                if pair_w[t] == pair[i] and point_w[t] == point[i]:
                    j = t
                    break
        if j < 0:
            modes[i] = 0 if dist[i] > 0 else 1
        else:
            for a in range(3):
                lam0[3 * i + a] = lam_w[3 * j + a]
            modes[i] = modes_w[j]
            found = True
    for i in range(nl):
        j = -1
        for t in range(limits_w.shape[0]):
            if limits_w[t] == limits[i]:
                j = t
                break
        if j < 0:
            modes[nc + i] = 1 if limit_dist[i] <= 0 else 0
        else:
            lam0[3 * nc + i] = lam_w[3 * ncw + j]
            modes[nc + i] = 1 if lim_act_w[j] else 0
            found = True
    return lam0, modes, found


def _label_frictionless(res: SolverResult, mu: np.ndarray):
    """The modes of a solution with frictionless contacts as the derivatives use them.

    With mu = 0 the friction cone is a ray: a touching contact can only break or slide, with
    zero tangential impulse whatever its slip. The solver may accept such a contact as
    "sticking" at zero slip (its three velocity rows solved with a tangential impulse within the
    tolerance of zero); differentiating that as a bonded contact is wrong (d lam_T must be 0).
    Returns ``(result with those contacts labelled sliding, the solver's own modes)`` (the latter
    for the next step's warm start, which stays what the solver found), or ``(res, None)``."""
    modes = res.modes
    relabel = (mu == 0.0) & (modes == STICKING)
    if not relabel.any():
        return res, None
    return dataclasses.replace(res, modes=np.where(relabel, SLIDING, modes)), modes


# numba's LAPACK wrappers report a routine that did not converge (info > 0: an SVD, gelsd) as a
# ValueError with this message, where numpy raises LinAlgError
_NUMBA_LAPACK_MESSAGE = "Internal algorithm failed to converge."


def _lapack_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is LAPACK failing on a problem (numpy's LinAlgError or numba's
    convergence ValueError), not a bad argument."""
    return isinstance(exc, np.linalg.LinAlgError) or (
        type(exc) is ValueError and str(exc) == _NUMBA_LAPACK_MESSAGE)


class SimulationError(RuntimeError):
    """The simulation produced a non-finite state (it diverged), the state exploded while the
    solver reported convergence, or the linear algebra of a step failed on a degenerate problem.
    The message names the model, the step and its contacts."""


class StabilityWarning(RuntimeWarning):
    """The time step is too large for the model's joint stiffness (explicit integration of the
    springs is unstable at this step; joint damping is implicit)."""


def _check_settings(*, tol, margin, max_iter, max_contact_points) -> None:
    """Refuse settings that make no sense (ValueError naming the setting and its value)."""
    def real(x):
        return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)

    if not (real(tol) and np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive finite residual (m/s), got {tol!r}")
    if not (real(margin) and np.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be a finite distance >= 0 (m), got {margin!r}")
    if not (isinstance(max_iter, (int, np.integer)) and not isinstance(max_iter, bool)
            and max_iter >= 1):
        raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
    if not (isinstance(max_contact_points, (int, np.integer))
            and not isinstance(max_contact_points, bool) and max_contact_points >= 1):
        raise ValueError(f"max_contact_points must be an integer >= 1, got {max_contact_points!r}")


def _implicit_damping_model(sm) -> pin.Model:
    """The model the simulator steps: ``sm.model`` itself without joint damping, else a copy
    whose armature carries ``dt D`` (D the diagonal joint damping ``sm.damping``).

    Joint damping is implicit in the velocity update (as MuJoCo's Euler with ``eulerdamp`` and
    its implicitfast integrator do for damping): ``M (v1 - v) = dt (tau - c(q, v) - D v1) + J^T
    lam`` is ``(M + dt D)(v1 - v) = dt (tau - c - D v) + J^T lam``, the explicit step of the
    model with armature ``+ dt D`` and the damping force at the pre-step ``v``. Every stage
    (ABA, ``M^-1`` of the constraint problem, pinocchio's ABA derivatives, hence the step
    Jacobians: ``dv1/dv = I + dt (d aba/dv - (M + dt D)^-1 D)``) then takes it from this one
    model, and a damper is stable at any time step (``v1 = v m / (m + dt d)`` for a lone
    slider). The file's physical model stays ``sm.model``."""
    damping = np.asarray(sm.damping, dtype=float)
    if not np.any(damping):
        return sm.model
    model = pin.Model(sm.model)
    model.armature = np.asarray(sm.model.armature, dtype=float) + float(sm.dt) * damping
    return model


def _warn_unstable_dt(sim) -> None:
    """Warn (StabilityWarning) when the time step cannot be stable for the model: the joint
    springs are integrated explicitly, so at the default configuration the step needs ``dt *
    omega_max < 2`` (``omega^2`` the eigenvalues of ``M^-1 K``, the explicit-Euler bound of an
    undamped spring). Joint damping is implicit (:func:`_implicit_damping_model`): stable at any
    step."""
    sm, model, dt = sim.sm, sim.sm.model, sim.dt
    stiff = getattr(sm, "stiffness", {}) or {}
    if not stiff or model.nv == 0:
        return
    try:
        # M, D and K are block diagonal over the kinematic trees (D and K diagonal): the
        # largest eigenvalue over the blocks (diffgym.sim.trees; no whole-model pinocchio Data)
        from .trees import block_mass_matrices
        kdiag = np.zeros(model.nv)
        for iv, (k, _) in stiff.items():
            kdiag[iv] = k
        w2 = 0.0
        for v0, M in block_mass_matrices(model, sim.q0):
            sl = slice(v0, v0 + M.shape[0])
            if np.any(kdiag[sl]):
                Li = np.linalg.inv(np.linalg.cholesky(M))
                w2 = max(w2, float(np.linalg.eigvalsh(Li @ np.diag(kdiag[sl]) @ Li.T).max()))
        msgs = []
        if stiff:
            if w2 > 0 and dt * np.sqrt(w2) >= 2.0:
                msgs.append(f"joint stiffness: dt * omega_max = {dt * np.sqrt(w2):.3g} >= 2 "
                            f"(stable below dt = {2.0 / np.sqrt(w2):.3g} s)")
    except np.linalg.LinAlgError:
        return             # a singular mass matrix is reported by the loader, not here
    if msgs:
        warnings.warn(f"{sm.source}: time step dt = {dt:g} s is too large for this model; "
                      + "; ".join(msgs), StabilityWarning, stacklevel=3)


class SolverWarning(RuntimeWarning):
    """The contact solver stopped before reaching its tolerance."""


@dataclass
class Contact:
    """One contact point of the last step (for reading; the arrays of StepInfo are the data)."""

    geom1: str
    geom2: str
    point: np.ndarray
    normal: np.ndarray
    distance: float
    impulse: np.ndarray      # in the contact frame (t1, t2, n); n from geom1 to geom2
    impulse_world: np.ndarray
    mode: str


@njit
def _island_gather(g, mu, lam0, modes0, found, nc, rows, r0, ms, cs, c0, ncs, ls, l0, nls):
    """The data of one island (rows ``rows[r0:r0 + ms]``, contacts ``cs[c0:c0 + ncs]``, limits
    ``ls[l0:l0 + nls]``) for ``solve_stage1``: its part of ``g``, its contacts' ``mu`` and, where
    a warm start was ``found``, its impulses and modes (contacts', then limits'); shared by
    ``_solve_islands`` (dense G) and ``island_step.constrained_step_blocks`` (per-island G)."""
    gs = np.empty(ms)
    for a in range(ms):
        gs[a] = g[rows[r0 + a]]
    mus = np.empty(ncs)
    for t in range(ncs):
        mus[t] = mu[cs[c0 + t]]
    if found:
        lam0s = np.empty(ms)
        for a in range(ms):
            lam0s[a] = lam0[rows[r0 + a]]
        modes0s = np.empty(ncs + nls, dtype=np.int64)
        for t in range(ncs):
            modes0s[t] = modes0[cs[c0 + t]]
        for t in range(nls):
            modes0s[ncs + t] = modes0[nc + ls[l0 + t]]
    else:
        lam0s, modes0s = np.zeros(0), np.zeros(0, dtype=np.int64)
    return gs, mus, lam0s, modes0s


@njit
def _island_scatter(lam, sigma, modes, lim_act, lam_s, sigma_s, modes_s, lact_s, rows, r0, ms,
                    cs, c0, ncs, ls, l0, nls):
    """Writes one island's stage-1 solution back into the step's arrays (the inverse of
    ``_island_gather``'s indexing)."""
    for a in range(ms):
        lam[rows[r0 + a]] = lam_s[a]
        sigma[rows[r0 + a]] = sigma_s[a]
    for t in range(ncs):
        modes[cs[c0 + t]] = modes_s[t]
    for t in range(nls):
        lim_act[ls[l0 + t]] = lact_s[t]


def _body_data(Minv, J, tree_lo, tree_hi, rows, m, rt):
    """The body-space data (``island_body``) of an island of ``m`` rows (``rows``; empty: all
    rows of J, in order) for ``solve_stage1``: the four arrays when the island has at least
    ``BODY_MIN_ROWS`` rows, empty ones when smaller, and four None when ``Minv`` is None (a
    problem known to be smaller: the compiled chain below then leaves out the body-space
    path, see ``solver_kernels._newton``). Compiled, the choice between None and arrays is
    made from ``Minv``'s type (an ``overload``), so that neither variant carries the other's
    types. ``rt``: each row's trees (``assemble_sparse``; ``island_body`` reads J there only)."""
    if Minv is None:
        return None, None, None, None
    if m >= BODY_MIN_ROWS:
        return island_body(J, Minv, tree_lo, tree_hi, rows if rows.shape[0] else np.arange(m),
                           rt)
    return no_body()


if _JIT:
    from numba.core import types as _types
    from numba.extending import overload as _overload

    @_overload(_body_data, jit_options={"nogil": True})
    def _body_data_ol(Minv, J, tree_lo, tree_hi, rows, m, rt):
        if isinstance(Minv, _types.NoneType):
            return lambda Minv, J, tree_lo, tree_hi, rows, m, rt: (None, None, None, None)

        def impl(Minv, J, tree_lo, tree_hi, rows, m, rt):
            if m >= BODY_MIN_ROWS:
                return island_body(J, Minv, tree_lo, tree_hi,
                                   rows if rows.shape[0] else np.arange(m), rt)
            return no_body()
        return impl


@njit
def _island_keep(b, g, proj, bs, gs, keep, rows, r0, ms, s):
    """Write island ``s``'s offsets back where ``solve_stage1``'s realizable retry took them
    (``bs``, ``gs`` on the island's rows ``rows[r0:r0 + ms]``) and record the rows it projected
    in ``proj`` (``Constraints.projected``)."""
    for a in range(ms):
        b[rows[r0 + a]] = bs[a]
        g[rows[r0 + a]] = gs[a]
        if keep[a]:
            proj[rows[r0 + a]] = s


@njit
def _add_normal_offsets(b, g, extra, nc):
    """Add ``extra[k]`` to the offset of contact k's normal row in ``b`` and ``g``."""
    for k in range(nc):
        b[3 * k + 2] += extra[k]
        g[3 * k + 2] += extra[k]


@njit
def _island_bias(b, rows, r0, ms, nc, touch, dist, skin, rest, lim_dist, realizable):
    """The offsets of one island's rows (``rows[r0:r0 + ms]``) and which of them
    ``solve_stage1`` may make realizable where its stage 1 fails (``constraint._bias_row_ok``;
    none unless ``realizable``, ``SolverSettings.realizable_bias``); ``touch``:
    ``_pairs_in_contact``. Shared by ``_solve_islands`` and ``island_step``."""
    bs = np.empty(ms)
    keep = np.zeros(ms, np.bool_)
    for a in range(ms):
        r = rows[r0 + a]
        bs[a] = b[r]
        if realizable:
            keep[a] = _bias_row_ok(r, nc, touch, dist, skin, rest, lim_dist)
    return bs, keep


# (inlined into _constrained_velocity, its one caller: numba links each callee's machine code
# into its caller and optimizes the whole again, so a level less in the step's chain is one
# such pass less on first use)
@njit(inline="always")
def _solve_islands(G, g, nc, mu, lam0, modes0, found, isl_c, isl_l, nis, tol, mode_tol,
                   newton_iter, mode_rounds, budget, J, Minv, tree_lo, tree_hi, b, pair, dist,
                   skin, rest, lim_dist, realizable, rt):
    """Stage 1 of the NCP solve island by island: the rows of different islands do not couple
    (their block of G is zero), so each island's problem (its contacts' rows, then its limits'
    rows, with their warm start) is solved on its own by ``solve_stage1`` and the results are
    scattered back. Returns (island_ok (nis,), lam, sigma, modes, lim_act, iterations (sum),
    residual (max), how many islands stage 1b (the proximal iteration) solved, the record of
    the projection: per row the island whose offsets the retry projected (-1: none), and the
    raw offsets); the rows of a failed island are left at zero for the later stages.
    An island of at least ``BODY_MIN_ROWS`` rows also gets its rows and mass matrix in body space
    (``island_body``: J, Minv and the trees' dof ranges) for its large linear Newton steps;
    ``Minv`` None: the problem has fewer rows (the step knows it from its contacts and limits),
    and this variant is compiled without the body-space path (``_body_data``); ``rt``: each
    row's trees (``assemble_sparse``), where ``island_body`` reads J.
    With ``realizable`` (``SolverSettings.realizable_bias``), ``solve_stage1`` tries an island
    whose stage 1 fails once more with its drift correction made realizable (``b`` and ``g``
    updated in place where that succeeds, left as they were where not; ``pair``, ``dist``,
    ``skin``, ``rest``, ``lim_dist``: which rows, ``_island_bias``)."""
    m = G.shape[0]
    nl = m - 3 * nc
    touch = _pairs_in_contact(pair, dist) if realizable else np.zeros(0, np.bool_)
    proj = np.full(m, -1, dtype=np.int64)
    braw = b.copy()
    if nis == 1:            # (one island: its rows are all rows, in order; no copies)
        Jb, Mb, tlo, thi = _body_data(Minv, J, tree_lo, tree_hi, _NO_I, m, rt)
        keep = np.zeros(m, np.bool_)
        if realizable:
            for r in range(m):
                keep[r] = _bias_row_ok(r, nc, touch, dist, skin, rest, lim_dist)
        # (b and g in place where the retry with realizable offsets succeeded; keep: its rows)
        ok, lam, sigma, modes, lim_act, its, res, prox = solve_stage1(
            G, g, nc, mu, lam0, modes0, found, tol, mode_tol, newton_iter, mode_rounds, budget,
            Jb, Mb, tlo, thi, b, keep)
        for r in range(m):
            if keep[r]:
                proj[r] = 0
        island_ok = np.ones(1, dtype=np.bool_)
        if not ok:
            island_ok[0] = False
            return (island_ok, np.zeros(m), np.zeros(m), np.zeros(nc, dtype=np.int64),
                    np.zeros(nl, dtype=np.bool_), its, 0.0, 0, proj, braw)
        return island_ok, lam, sigma, modes, lim_act, its, res, prox, proj, braw
    lam = np.zeros(m)
    sigma = np.zeros(m)
    modes = np.zeros(nc, dtype=np.int64)
    lim_act = np.zeros(nl, dtype=np.bool_)
    island_ok = np.ones(nis, dtype=np.bool_)
    ptr, rows, cptr, cs, lptr, ls = island_rows(isl_c, isl_l, nis)
    its = 0
    res = 0.0
    nprox = 0
    for s in range(nis):
        r0, r1 = ptr[s], ptr[s + 1]
        ms = r1 - r0
        ncs = cptr[s + 1] - cptr[s]
        nls = lptr[s + 1] - lptr[s]
        Gs = np.empty((ms, ms))
        for a in range(ms):
            ra = rows[r0 + a]
            for c in range(ms):
                Gs[a, c] = G[ra, rows[r0 + c]]
        gs, mus, lam0s, modes0s = _island_gather(g, mu, lam0, modes0, found, nc, rows, r0, ms,
                                                 cs, cptr[s], ncs, ls, lptr[s], nls)
        Jb, Mb, tlo, thi = _body_data(Minv, J, tree_lo, tree_hi, rows[r0:r1], ms, rt)
        bs, keep = _island_bias(b, rows, r0, ms, nc, touch, dist, skin, rest, lim_dist,
                                realizable)
        ok, lam_s, sigma_s, modes_s, lact_s, its_s, res_s, prox = solve_stage1(
            Gs, gs, ncs, mus, lam0s, modes0s, found, tol, mode_tol, newton_iter, mode_rounds,
            budget, Jb, Mb, tlo, thi, bs, keep)
        if realizable:          # (the realizable offsets where solve_stage1's retry took them)
            _island_keep(b, g, proj, bs, gs, keep, rows, r0, ms, s)
        its += its_s
        nprox += prox
        if not ok:
            island_ok[s] = False
            continue
        if res_s > res:
            res = res_s
        _island_scatter(lam, sigma, modes, lim_act, lam_s, sigma_s, modes_s, lact_s, rows, r0, ms,
                        cs, cptr[s], ncs, ls, lptr[s], nls)
    return island_ok, lam, sigma, modes, lim_act, its, res, nprox, proj, braw


@njit
def _constrained_velocity(pos, frames, geom1, geom2, geom_joint, dist, mu, pair, point, Jw, support,
                          sup_ptr, sup_idx, joint_tree, tree_lo, tree_hi,
                          q, v, lim_q, lim_v, lim_bound, lim_sign, limit_margin, dt, erp, skin,
                          Minv, v_free, warm, pair_w, point_w, lam_w, modes_w, limits_w, lim_act_w,
                          tol, mode_tol, newton_iter, mode_rounds, budget, pair_rest, rest_thr,
                          rest_spent, Mbody, realizable=False, cap=MAX_DEPENETRATION_SPEED,
                          mocap_b=None, drift=None):
    """The constrained part of the step in one compiled call: the active joint limits, the
    problem and its islands (constraint.assemble_sparse), Newton's impact law on the normal rows
    of impacting contacts (constraint.restitution_bias, at the pre-step ``v``; ``pair_rest``
    empty: none; ``rest_spent``: its ``spent``), the warm start (_match_warm_start),
    stage 1 of the NCP solve per island (_solve_islands) and ``v1 = v_free + M^-1 J^T lam``.

    Returns (island_ok, isl_c, isl_l, lim_idx, lim_dist, J, b, G, g, lam, sigma, modes,
    lim_act, its, res, v1, MJt, rest, nprox, proj, braw, rt) (each returned array costs a Python
    object: only those the step keeps; ``proj``, ``braw``: the record of the realizable
    projection, ``_solve_islands``; ``rt``: each row's trees, ``assemble_sparse``); an island
    whose stage 1 failed has ``island_ok`` False (the caller runs the later stages on it);
    ``v1`` then holds only the other islands' impulses. ``Mbody``: ``Minv`` again, or None
    where the problem cannot reach ``BODY_MIN_ROWS`` rows (3 per contact plus the limits): that
    variant is compiled without the body-space path, which small robots never run
    (``_solve_islands``)."""
    nc = pos.shape[0]
    j1 = np.empty(nc, dtype=np.int64)
    j2 = np.empty(nc, dtype=np.int64)
    for k in range(nc):
        j1[k] = geom_joint[geom1[k]]
        j2[k] = geom_joint[geom2[k]]
    if lim_q.shape[0]:
        lim_idx, lim_dist = _active_limits(q, v, lim_q, lim_v, lim_bound, lim_sign, limit_margin, dt)
    else:
        lim_idx, lim_dist = np.zeros(0, dtype=np.int64), np.zeros(0)
    J, b, G, g, MJt, isl_c, isl_l, nis, rt = assemble_sparse(
        pos, frames, j1, j2, dist, Jw, support, sup_ptr, sup_idx, tree_lo, tree_hi, joint_tree,
        lim_idx, lim_dist, lim_v, lim_sign, dt, erp, skin, Minv, v_free, cap)
    rest = restitution_bias(J, b, g, v, dist, pair, pair_rest, nc, dt, erp, skin, rest_thr, j1, j2,
                            joint_tree, rest_spent, cap)
    if mocap_b is not None and mocap_b.shape[0] == nc:
        # moving mocap geoms: their velocity at the contact point in the rows' offsets
        # (diffgym.sim.mocap; (0, 3) for every other model)
        for k in range(nc):
            for a in range(3):
                x = mocap_b[k, a]
                if x != 0.0:
                    b[3 * k + a] += x
                    g[3 * k + a] += x
    if drift is not None and drift.shape[0] == nc:
        # an ellipsoid's support point: the second-order term of its distance (support_drift)
        _add_normal_offsets(b, g, drift, nc)
    m = G.shape[0]
    found = False
    if warm:
        lam0, modes0, found = _match_warm_start(pair_w, point_w, lam_w, modes_w, limits_w,
                                                lim_act_w, pair, point, dist, lim_idx, lim_dist)
    if not found:
        lam0, modes0 = np.zeros(0), np.zeros(0, dtype=np.int64)
    v1 = v_free.copy()
    if m == 0:
        return (np.ones(0, dtype=np.bool_), isl_c, isl_l, lim_idx, lim_dist, J, b, G, g,
                np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.bool_),
                0, 0.0, v1, MJt, rest, 0, np.zeros(0, dtype=np.int64), np.zeros(0), rt)
    island_ok, lam, sigma, modes, lim_act, its, res, nprox, proj, braw = _solve_islands(
        G, g, nc, mu, lam0, modes0, found, isl_c, isl_l, nis, tol, mode_tol, newton_iter,
        mode_rounds, budget, J, Mbody, tree_lo, tree_hi, b, pair, dist, skin, rest, lim_dist,
        realizable, rt)
    _add_impulses(v1, MJt, rt, lam, tree_hi)
    return (island_ok, isl_c, isl_l, lim_idx, lim_dist, J, b, G, g, lam, sigma, modes, lim_act,
            its, res, v1, MJt, rest, nprox, proj, braw, rt)


@njit
def _add_impulses(v1, MJt, rt, lam, tree_hi):
    """``v1 += M^-1 J^T lam`` over the structure: row r moves only the dofs of its (at most
    two) trees ``rt[r]`` (each named by its first dof)."""
    for r in range(rt.shape[0]):
        lr = lam[r]
        if lr == 0.0:
            continue
        for a in range(2):
            t = rt[r, a]
            if t >= 0:
                for i in range(t, tree_hi[t]):
                    v1[i] += MJt[i, r] * lr


_NO_LB = (np.zeros(0), np.zeros(0))


@njit
def _budget_work(v1, tau_total, lam, b, dt):
    """The energy a step may put in (Simulator._energy_budget): the positive part of ``dt v1 .
    tau_total`` plus ``sum max(0, -lam_i b_i)`` (``tau_total`` empty: none)."""
    w = 0.0
    if tau_total.shape[0]:
        for i in range(v1.shape[0]):
            w += v1[i] * tau_total[i]
        w = dt * w if w > 0.0 else 0.0
    for i in range(lam.shape[0]):
        x = -lam[i] * b[i]
        if x > 0.0:
            w += x
    return w


@njit
def _speed_jump(v, v1, gate):
    """Whether |v1|^2 > 1.5 |v|^2 + gate (a cheap test before the energy check of a step;
    ``gate = (2 dt |gravity|)^2``: free fall never triggers it on its own)."""
    a = 0.0
    b = 0.0
    for i in range(v.shape[0]):
        a += v[i] * v[i]
        b += v1[i] * v1[i]
    return b > 1.5 * a + gate


@njit
def _verify_velocity(J, b, v1, lam, nc, mu, G, rt, tree_hi):
    """An independent check of a step's solution: the natural-map residual (m/s) of the NCP at
    the final velocity, ``sigma = J v1 + b`` (not the solver's ``G lam + g``), and the scale of
    the velocities it is compared with (``max |J v1|``, ``max |b|``). Catches a solver that
    reports convergence on a wrong solution and a wrong ``v1`` (a bad ``M^-1 J^T lam``).
    ``rt``: each row's (at most two) trees (``constraint.assemble_sparse``: J's row is zero
    elsewhere), whose dofs alone are summed, in increasing order: the sum of the whole row less
    its exact zeros (the same value; a rack of 64 balls has 12 of 384 dofs a row). Where a
    component of ``v1`` is not finite, the whole rows (its NaN reaches every sum)."""
    m = J.shape[0]
    nv = J.shape[1]
    sparse = rt.shape[0] == m
    for i in range(nv):
        if not math.isfinite(v1[i]):
            sparse = False
    sigma = np.empty(m)
    scale = 0.0
    for r in range(m):
        acc = 0.0
        if sparse:
            lo1, hi1, lo2, hi2 = _row_dofs(rt, r, nv, tree_hi)
            for i in range(lo1, hi1):
                acc += J[r, i] * v1[i]
            for i in range(lo2, hi2):
                acc += J[r, i] * v1[i]
        else:
            for i in range(nv):
                acc += J[r, i] * v1[i]
        sigma[r] = acc + b[r]
        a = max(abs(acc), abs(b[r]))
        if a > scale:
            scale = a
    dmax = 0.0
    for i in range(m):
        if G[i, i] > dmax:
            dmax = G[i, i]
    floor = 1e-12 * (dmax if dmax > 1.0 else 1.0)
    dG = np.empty(m)
    for i in range(m):
        dG[i] = G[i, i] if G[i, i] >= floor else floor
    dc = np.empty(nc)
    for i in range(nc):
        dc[i] = (dG[3 * i] + dG[3 * i + 1] + dG[3 * i + 2]) / 3.0
    return natres(lam, sigma, nc, mu, dc, dG), scale


@njit
def _constrained_step(pos, frames, geom1, geom2, geom_joint, dist, mu, pair, point, Jw, support,
                      sup_ptr, sup_idx, joint_tree, tree_lo, tree_hi,
                      q, v, lim_q, lim_v, lim_bound, lim_sign, limit_margin, dt, erp, skin,
                      Minv, v_free, warm, pair_w, point_w, lam_w, modes_w, limits_w, lim_act_w,
                      tol, mode_tol, newton_iter, mode_rounds, budget, pair_rest, rest_thr,
                      rest_spent, Mbody, realizable=False, cap=MAX_DEPENETRATION_SPEED,
                      mocap_b=None, drift=None):
    """``_constrained_velocity`` (same arguments) and, when every island's stage 1 succeeded,
    the check of its solution at the final velocity (``_verify_velocity``), in one compiled call
    that returns only what the common step keeps, packed into three arrays: every array a
    compiled call returns costs numba a boxing (a Python object, about 0.4 us each), and a
    view the caller slices costs less (``_unpack_step``); J and G, the large ones, are returned
    as they are (a copy of G would double a large island's peak memory). The islands' labels and
    ``M^-1 J^T`` are left out; the rare step with a failed island calls
    ``_constrained_velocity`` again, a pure function of the same arguments, for them.

    Returns (all_ok, islands, nl, its, res, verify residual, verify scale, nprox, F, I,
    lim_act, J, G): ``nl`` active limits (``m = 3 nc + nl`` rows); ``F`` (float64) holds, in
    order, lim_dist (nl), b (m), g (m), lam (m), sigma (m), v1 (nv), the restitution pair
    (2, nc) and the raw offsets (m) before the realizable projection; ``I`` (int64) lim_idx
    (nl), modes (nc), then per row the island the projection acted on (m, -1: none);
    ``lim_act`` (nl,)
    bool. The verify pair is 0.0 unless all_ok and there are rows; nprox: islands that took
    the compiled proximal stage 1b."""
    (island_ok, isl_c, isl_l, lim_idx, lim_dist, J, b, G, g, lam, sigma, modes, lim_act,
     its, res, v1, MJt, rest, nprox, proj, braw, rt) = _constrained_velocity(
        pos, frames, geom1, geom2, geom_joint, dist, mu, pair, point, Jw, support, sup_ptr,
        sup_idx, joint_tree, tree_lo, tree_hi, q, v, lim_q, lim_v, lim_bound, lim_sign,
        limit_margin, dt, erp, skin, Minv, v_free, warm, pair_w, point_w, lam_w, modes_w,
        limits_w, lim_act_w, tol, mode_tol, newton_iter, mode_rounds, budget, pair_rest, rest_thr,
        rest_spent, Mbody, realizable, cap, mocap_b, drift)
    all_ok = True
    for s in range(island_ok.shape[0]):
        if not island_ok[s]:
            all_ok = False
    r1 = 0.0
    vs = 0.0
    nc = pos.shape[0]
    if all_ok and G.shape[0]:
        r1, vs = _verify_velocity(J, b, v1, lam, nc, mu, G, rt, tree_hi)
    nl = lim_idx.shape[0]
    m = G.shape[0]
    nv = v1.shape[0]
    # J and G are returned as they are (each boxed once): copying them into the packed array
    # would double the step's largest allocations on a large island (G is m x m).
    # (written out, not a helper: a helper called with 1-d and 2-d arrays would be a kernel
    # with two signatures, compiled twice on first use)
    F = np.empty(nl + 5 * m + nv + 2 * nc)
    for i in range(nl):
        F[i] = lim_dist[i]
    o = nl
    for r in range(m):
        F[o + r] = b[r]
        F[o + m + r] = g[r]
        F[o + 2 * m + r] = lam[r]
        F[o + 3 * m + r] = sigma[r]
    o += 4 * m
    for i in range(nv):
        F[o + i] = v1[i]
    o += nv
    if rest.shape[0] == 2 and rest.shape[1] == nc:
        for a in range(2):
            for k in range(nc):
                F[o + a * nc + k] = rest[a, k]
    else:
        for i in range(2 * nc):
            F[o + i] = 0.0
    o += 2 * nc
    for r in range(m):
        F[o + r] = braw[r] if braw.shape[0] == m else b[r]
    ints = np.empty(nl + modes.shape[0] + m, dtype=np.int64)
    for i in range(nl):
        ints[i] = lim_idx[i]
    for i in range(modes.shape[0]):
        ints[nl + i] = modes[i]
    o = nl + modes.shape[0]
    for r in range(m):
        ints[o + r] = proj[r] if proj.shape[0] == m else -1
    return (all_ok, island_ok.shape[0], nl, its, res, r1, vs, nprox, F, ints, lim_act, J, G)


_CONSTRAINED_STEP = _constrained_step     # (_fast_step: not replaced by a test's spy)


def _unpack_step(F, ints, J, G, nc, nl, nv, rest=True):
    """Views of ``_constrained_step``'s packed arrays, with its J and G: (lim_idx, lim_dist, J,
    b, G, g, lam, sigma, modes, v1, restitution (2, nc) (None when ``rest`` is False: a model
    without restitution pairs), the record of the realizable projection
    (``Constraints.projected``; None where it acted on no row))."""
    m = 3 * nc + nl
    o1 = nl + m
    o2, o3, o4 = o1 + m, o1 + 2 * m, o1 + 3 * m
    o5 = o4 + nv
    o6 = o5 + 2 * nc
    proj = ints[nl + nc:nl + nc + m]
    rec = (proj, F[o6:o6 + m]) if m and _maximum(proj) >= 0 else None
    return (ints[:nl], F[:nl], J, F[nl:o1], G, F[o1:o2], F[o2:o3], F[o3:o4], ints[nl:nl + nc],
            F[o4:o5], F[o5:o6].reshape(2, nc) if rest else None, rec)


@njit
def _step_checks(v, v1, q1, gate, mu):
    """The checks at the end of a step in one compiled call: (every entry of v1 and q1 finite,
    the speed jumped (``_speed_jump``), the smallest friction coefficient of ``mu`` is 0 (False
    when ``mu`` is empty))."""
    finite = True
    for i in range(v1.shape[0]):
        if not np.isfinite(v1[i]):
            finite = False
    for i in range(q1.shape[0]):
        if not np.isfinite(q1[i]):
            finite = False
    frictionless = False
    if mu.shape[0]:
        m = mu[0]
        for i in range(1, mu.shape[0]):
            if mu[i] < m:
                m = mu[i]
        frictionless = m == 0.0
    return finite, _speed_jump(v, v1, gate), frictionless


@njit
def _step_end(q, v, v1, dt, gate, mu):
    """``q1 = q + dt v1`` (a model whose joints all integrate additively, a step without impact
    times: ``displacement``'s ``v1 * dt`` added to q, the same arithmetic) and ``_step_checks``
    in one compiled call: (q1, finite, speed jump, frictionless)."""
    q1 = np.empty(q.shape[0])
    for i in range(q.shape[0]):
        q1[i] = q[i] + v1[i] * dt
    finite, jump, frictionless = _step_checks(v, v1, q1, gate, mu)
    return q1, finite, jump, frictionless


@njit
def _fused_step(oM, mj, Jw, v, support, gslot, W0, reach, pairs, perm, pcat, rad, sap_g,
                base_margin, dt, hp_k, hp_pl, hp_ot, ext_vec, ext_const, use_rot, mesh_i, mesh_pl,
                mesh_ot, mesh_sw, hull_off, hull_pts, g_boxhalf, g_isbox, friction, max_points,
                bp_pair, bp_kind, bp_geom, bp_n, bp_off, bp_N, bp_frames, bp_size, g_ssr,
                g_sbhalf, g_sbr, geom_joint, csupport, sup_ptr, sup_idx, joint_tree, tree_lo,
                tree_hi, q,
                lim_q, lim_v, lim_bound, lim_sign, limit_margin, erp, skin, Minv, a_free, wkind,
                pair_w, point_w, lam_w, modes_w, limits_w, lim_act_w, wFo, wIo, wn, wnl, wm,
                tol, mode_tol, newton_iter,
                mode_rounds, budget, pair_rest, rest_spent, realizable, cap, mocap_b, drift,
                tau_total, gate, additive, dr_plane, dr_carrier, dr_ids):
    """A small robot's whole step after pinocchio's calls in one compiled call (issue 14: each
    call from Python costs the unboxing of its arguments and the boxing of its results): the
    collision pass's closed forms (``collision_kernels.detect_closed_form``, the driver's
    arguments), then, where it found no narrow-phase candidate, ``_constrained_step`` on its
    rows (the arguments of the step's call, without restitution, mocap offsets or support drift,
    ``Mbody`` None), ``q1 = q + dt v1`` with the end-of-step checks (``_step_end``) and the work
    of the energy budget (``_budget_work``): the same kernels on the same values as the separate
    calls, bit for bit. It takes ``a_free`` and makes ``v_free = v + dt a_free`` itself; inputs
    that are not finite give status 0. ``additive`` False (a free or ball joint: pinocchio
    integrates q1): q1 is left empty and ``finite`` covers v1 only. ``dr_plane``, ``dr_carrier``, ``dr_ids``: the
    geoms of ``support_drift`` (its ``_Table``'s plane, carrier, ids; empty where it is not
    active): a row carrying its term sends the step to the separate calls.

    The warm start: ``wkind`` 0 none, 1 the arrays ``pair_w`` ... ``lim_act_w`` (as
    ``_constrained_step`` takes them), 2 those of the last fused step, read from its packed
    arrays ``wFo``, ``wIo`` (its ``n``, ``nl``, ``m``: ``wn``, ``wnl``, ``wm``; ``lim_act_w`` its
    limits' modes): no Python slicing between two fused steps.

    Returns (status, n, nl, m, islands, its, res, verify residual, verify scale, nprox, finite,
    jump, frictionless, work, Fo, Io, lim_act): ``status`` 0 where the step needs what this
    call does not do (narrow-phase candidates, a problem of at least ``BODY_MIN_ROWS`` rows, a
    failed island, a row with support drift: the caller takes the separate calls), 1 without
    constraints (``v1 = v_free``; ``Fo`` holds q1 and v_free), 2 with. Every array but
    ``lim_act`` is packed into two (each returned array costs a boxing; ``_FastRecord`` gives
    the views): ``Fo`` = ``_constrained_step``'s F (``_unpack_step``), J (m, nv) and G (m, m)
    row-major, q1 (nq; none where not ``additive``), v_free, the detection's float rows
    (``_unpack_rows``, no candidate); ``Io`` = its int array, then the detection's int rows."""
    nv = v.shape[0]
    zi = np.zeros(0, dtype=np.int64)
    # (inputs not finite: the separate calls, whose checks name them)
    for x in (q, v, tau_total):
        for i in range(x.shape[0]):
            if not np.isfinite(x[i]):
                return (0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0, False, False, False, 0.0,
                        np.zeros(0), zi, np.zeros(0, dtype=np.bool_))
    v_free = np.empty(nv)           # (v + dt a_free, as numpy computes it)
    for i in range(nv):
        v_free[i] = v[i] + dt * a_free[i]
    zf = np.zeros(0)
    zb = np.zeros(0, dtype=np.bool_)
    ncand, n, Fd, Id = detect_closed_form(
        oM, mj, Jw, v, support, zf, zf, True, gslot, W0, reach, pairs, perm, pcat, rad, sap_g,
        base_margin, dt, hp_k, hp_pl, hp_ot, ext_vec, ext_const, use_rot, mesh_i, mesh_pl,
        mesh_ot, mesh_sw, hull_off, hull_pts, g_boxhalf, g_isbox, friction, max_points, bp_pair,
        bp_kind, bp_geom, bp_n, bp_off, bp_N, bp_frames, bp_size, g_ssr, g_sbhalf, g_sbr)
    if ncand or 3 * n + lim_q.shape[0] >= BODY_MIN_ROWS:
        return (0, n, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0, False, False, False, 0.0, zf, zi, zb)
    free = n == 0
    if free and lim_q.shape[0]:
        idx, _ = _active_limits(q, v, lim_q, lim_v, lim_bound, lim_sign, limit_margin, dt)
        free = idx.shape[0] == 0
    if not free and wkind == 2:
        # the last fused step's warm start (Simulator._record's arrays, _FastRecord.warm)
        oI = wnl + wn + wm
        pair_w = np.empty(wn, dtype=np.int64)
        point_w = np.empty(wn, dtype=np.int64)
        modes_w = np.empty(wn, dtype=np.int64)
        for k in range(wn):
            pair_w[k] = wIo[oI + k]
            point_w[k] = wIo[oI + 3 * wn + k]
            modes_w[k] = wIo[wnl + k]
        limits_w = np.empty(wnl, dtype=np.int64)
        for k in range(wnl):
            limits_w[k] = wIo[k]
        lam_w = np.empty(wm)
        for k in range(wm):
            lam_w[k] = wFo[wnl + 2 * wm + k]
    if not free:
        # the rows as the driver's views hold them (collision_driver._unpack_rows), in arrays
        # of their own (the layouts of the separate call: the same compiled _constrained_step)
        pair = np.empty(n, dtype=np.int64)
        g1 = np.empty(n, dtype=np.int64)
        g2 = np.empty(n, dtype=np.int64)
        point = np.empty(n, dtype=np.int64)
        dist = np.empty(n)
        mu = np.empty(n)
        pos = np.empty((n, 3))
        frames = np.empty((n, 3, 3))
        o = 2 * n
        for r in range(n):
            pair[r] = Id[r]
            g1[r] = Id[n + r]
            g2[r] = Id[2 * n + r]
            point[r] = Id[3 * n + r]
            dist[r] = Fd[r]
            mu[r] = Fd[n + r]
            for c in range(3):
                pos[r, c] = Fd[o + 3 * r + c]
                for e in range(3):
                    frames[r, c, e] = Fd[o + 6 * n + 9 * r + 3 * c + e]
        (all_ok, nis, nl, its, res, r1, vs, nprox, F, I, lim_act, J, G) = _constrained_step(
            pos, frames, g1, g2, geom_joint, dist, mu, pair, point, Jw, csupport, sup_ptr,
            sup_idx, joint_tree, tree_lo, tree_hi, q, v, lim_q, lim_v, lim_bound, lim_sign,
            limit_margin, dt, erp, skin, Minv, v_free, wkind > 0, pair_w, point_w, lam_w,
            modes_w, limits_w, lim_act_w, tol, mode_tol, newton_iter, mode_rounds, budget,
            pair_rest, 0.0, rest_spent, None, realizable, cap, mocap_b, drift)
        m = G.shape[0]
        if m and dr_plane.shape[0]:
            for r in range(n):          # (support_drift._rows: a row carrying the term)
                a1, a2 = g1[r], g2[r]
                first = dr_plane[a1] and dr_carrier[a2]
                if first or (dr_plane[a2] and dr_carrier[a1]):
                    ge = a2 if first else a1
                    if point[r] == dr_ids[ge, 0] or point[r] == dr_ids[ge, 1]:
                        all_ok = False
        if m:
            if not all_ok:
                return (0, n, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0, False, False, False, 0.0, zf, zi, zb)
            v1 = np.empty(nv)
            o = nl + 4 * m
            for i in range(nv):
                v1[i] = F[o + i]
            b = np.empty(m)
            lam = np.empty(m)
            for r in range(m):
                b[r] = F[nl + r]
                lam[r] = F[nl + 2 * m + r]
            if additive:
                q1, finite, jump, frictionless = _step_end(q, v, v1, dt, gate, mu)
            else:
                q1 = zf
                finite, jump, frictionless = _step_checks(v, v1, zf, gate, mu)
            work = _budget_work(v1, tau_total, lam, b, dt)
            LF = F.shape[0]
            nd = Fd.shape[0]
            Fo = np.empty(LF + m * nv + m * m + q1.shape[0] + nv + nd)
            for i in range(LF):
                Fo[i] = F[i]
            o = LF
            for r in range(m):
                for i in range(nv):
                    Fo[o + r * nv + i] = J[r, i]
            o += m * nv
            for r in range(m):
                for c in range(m):
                    Fo[o + r * m + c] = G[r, c]
            o += m * m
            for i in range(q1.shape[0]):
                Fo[o + i] = q1[i]
            o += q1.shape[0]
            for i in range(nv):
                Fo[o + i] = v_free[i]
            o += nv
            for i in range(nd):
                Fo[o + i] = Fd[i]
            Io = np.empty(I.shape[0] + Id.shape[0], dtype=np.int64)
            for i in range(I.shape[0]):
                Io[i] = I[i]
            for i in range(Id.shape[0]):
                Io[I.shape[0] + i] = Id[i]
            return (2, n, nl, m, nis, its, res, r1, vs, nprox, finite, jump, frictionless, work,
                    Fo, Io, lim_act)
    if additive:
        q1, finite, jump, frictionless = _step_end(q, v, v_free, dt, gate, zf)
    else:
        q1 = zf
        finite, jump, frictionless = _step_checks(v, v_free, zf, gate, zf)
    work = _budget_work(v_free, tau_total, zf, zf, dt)
    Fo = np.empty(q1.shape[0] + nv)
    for i in range(q1.shape[0]):
        Fo[i] = q1[i]
    for i in range(nv):
        Fo[q1.shape[0] + i] = v_free[i]
    return (1, n, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0, finite, jump, frictionless, work, Fo, zi, zb)


_NO_MU = np.zeros(0)
# joints whose configuration space is a vector space (``integrate(q, v) = q + v``)
# the solver's stages in the order it tries them (SolverResult.method)
_STAGE_RANK = {m: i for i, m in enumerate(("none", "newton", "prox+newton", "pinadmm+newton",
                                            "ssn+newton", "admm+newton", "pgs+newton", "admm",
                                            "pgs"))}
_ADDITIVE_JOINTS = frozenset(
    "JointModel" + k for k in ("RX", "RY", "RZ", "PX", "PY", "PZ", "RevoluteUnaligned",
                                "PrismaticUnaligned", "Translation"))
_LAZY_FIELDS = frozenset(("contact_points", "contact_normals", "contact_distances",
                          "contact_impulses", "contact_impulses_world", "contact_modes",
                          "contact_geoms", "limit_joints", "limit_impulses", "limit_active"))


class _FastRecord:
    """What a fused step (``Simulator._fast_step``) found, kept in the two arrays the fused call
    packed it into (``_fused_step``): its ``Contacts``, ``Constraints`` and ``SolverResult``
    (the objects ``_step``'s separate calls build, with the same values), its J, G and g, and
    the warm start of the next step are views made on first read."""

    __slots__ = ("sm", "Fo", "Io", "n", "nl", "m", "nv", "nqa", "lim_act", "its", "resid",
                 "nprox", "_contacts", "_built")

    def __init__(self, sm, Fo, Io, n, nl, m, nv, nqa, lim_act, its, resid, nprox):
        self.sm, self.Fo, self.Io, self.n, self.nl, self.m, self.nv = sm, Fo, Io, n, nl, m, nv
        self.nqa = nqa                  # (q1's length in Fo: nq, or 0 where pinocchio integrates)
        self.lim_act, self.its, self.resid, self.nprox = lim_act, its, resid, nprox
        self._contacts = self._built = None

    def _offsets(self):
        """(start of J, of G, of q1, of v_free in Fo; start of the detection's int rows in
        Io)."""
        n, nl, m, nv = self.n, self.nl, self.m, self.nv
        oJ = nl + 5 * m + nv + 2 * n
        oq = oJ + m * nv + m * m
        return oJ, oJ + m * nv, oq, oq + self.nqa, nl + n + m

    @property
    def contacts(self) -> Contacts:
        c = self._contacts
        if c is None:
            n = self.n
            Fd = self.Fo[self.Fo.shape[0] - 17 * n:]
            c = self._contacts = Contacts(*_unpack_rows(Fd, self.Io[self._offsets()[4]:], 0, n))
        return c

    @property
    def v_free(self) -> np.ndarray:
        o = self._offsets()[3]
        return self.Fo[o:o + self.nv]

    @property
    def G(self) -> np.ndarray:
        return self.built()[2]

    @property
    def g(self) -> np.ndarray:
        return self.built()[3]

    def warm(self) -> tuple:
        """The warm start of the next step (``Simulator._record``'s tuple)."""
        n, nl, m = self.n, self.nl, self.m
        oI = self._offsets()[4]
        Io = self.Io
        return (Io[oI:oI + n], Io[oI + 3 * n:oI + 4 * n], self.Fo[nl + 2 * m:nl + 3 * m],
                Io[nl:nl + n], Io[:nl], self.lim_act)

    def built(self) -> tuple:
        """(Constraints, SolverResult, G, g) of the step, made once."""
        b = self._built
        if b is None:
            c = self.contacts
            m, nv = self.m, self.nv
            oJ, oG, oq, _, _ = self._offsets()
            J0 = self.Fo[oJ:oG].reshape(m, nv)
            G0 = self.Fo[oG:oq].reshape(m, m)
            (lim_idx, lim_dist, J, bb, G, g, lam, sigma, modes, v1, rest,
             projected) = _unpack_step(self.Fo, self.Io, J0, G0, self.n, self.nl, nv, False)
            cons = Constraints(J, bb, self.n, c.mu, _NO_FRAMES if c.frames is None else c.frames,
                               c, lim_idx, lim_dist, c.dist, None, None, projected)
            res = SolverResult(lam, sigma, modes, self.lim_act, self.its, self.resid, True,
                               "prox+newton" if self.nprox else "newton")
            b = self._built = (cons, res, G, g)
        return b


_FAST_LAZY = frozenset(("cons", "res", "G", "g", "v_free"))


class _FastCache(dict):
    """``sim.cache`` of a fused step: ``"cons"``, ``"res"``, ``"G"``, ``"g"`` and ``"v_free"``
    are made on first read."""

    __slots__ = ("_rec",)

    def __init__(self, base: dict, rec: _FastRecord):
        super().__init__(base)
        self._rec = rec

    def __missing__(self, key):
        if key == "v_free":
            val = self[key] = self._rec.v_free
            return val
        if key in _FAST_LAZY:
            cons, res, G, g = self._rec.built()
            self["cons"], self["res"], self["G"], self["g"] = cons, res, G, g
            return self[key]
        raise KeyError(key)

    def get(self, key, default=None):
        if key in _FAST_LAZY:
            return self[key]
        return dict.get(self, key, default)

    def __contains__(self, key) -> bool:
        return key in _FAST_LAZY or dict.__contains__(self, key)


@dataclass
class StepInfo:
    """What the last step found. Arrays have one row per contact point.

    The simulator fills it lazily: the per-contact arrays and lists are built from the step's
    constraints and solver result the first time one of them is read (they are then stored)."""

    contact_points: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    contact_normals: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    contact_distances: np.ndarray = field(default_factory=lambda: np.zeros(0))
    contact_impulses: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    contact_impulses_world: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    contact_modes: list = field(default_factory=list)
    contact_geoms: list = field(default_factory=list)
    limit_joints: list = field(default_factory=list)
    limit_impulses: np.ndarray = field(default_factory=lambda: np.zeros(0))
    limit_active: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    iterations: int = 0
    residual: float = 0.0
    converged: bool = True
    method: str = "none"
    islands: int = 0           # independent constraint problems (islands) the step solved

    @classmethod
    def _lazy(cls, cons: Constraints, res: SolverResult, sm: SimModel,
              islands: int | None = None) -> "StepInfo":
        """A StepInfo whose per-contact fields are computed on first access."""
        info = object.__new__(cls)
        d = info.__dict__
        d["_src"] = (cons, res, sm)
        d["iterations"] = res.iterations
        d["residual"] = res.residual
        d["converged"] = res.converged
        d["method"] = res.method
        if islands is not None:
            d["islands"] = islands
        return info

    @classmethod
    def _lazy_record(cls, rec: "_FastRecord", iterations: int, residual: float, method: str,
                     islands: int) -> "StepInfo":
        """A StepInfo of a fused step (``Simulator._fast_step``): its constraints and solver
        result too are built on first access of a per-contact field."""
        info = object.__new__(cls)
        d = info.__dict__
        d["_src"] = rec
        d["iterations"] = iterations
        d["residual"] = residual
        d["converged"] = True
        d["method"] = method
        d["islands"] = islands
        return info

    def _source(self):
        """The (constraints, solver result, model) the lazy fields are built from, or None."""
        src = self.__dict__.get("_src")
        if isinstance(src, _FastRecord):
            cons, res = src.built()[:2]
            src = self.__dict__["_src"] = (cons, res, src.sm)
        return src

    def __getattr__(self, name: str):
        # only called for attributes not set yet: the lazy fields of a simulator's StepInfo
        if name in _LAZY_FIELDS:
            src = self._source()
            if src is not None and src[0] is None:      # no constraint this step: the defaults
                d = self.__dict__
                for f in dataclasses.fields(self):
                    if f.name in _LAZY_FIELDS:
                        d.setdefault(f.name, f.default_factory())
                d.pop("_src", None)
                return d[name]
            if src is not None:
                if name == "contact_modes":          # (read every step by some loops: alone)
                    val = self.__dict__[name] = [MODE_NAMES[m] for m in src[1].modes.tolist()]
                    return val
                self._fill(*src)
                return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self):
        # (pickling and copying fill the lazy fields: the copy holds no simulator objects)
        src = self._source()
        if src is not None:
            getattr(self, "contact_points") if src[0] is None else self._fill(*src)
        return dict(self.__dict__)

    def _fill(self, cons: Constraints, res: SolverResult, sm: SimModel) -> None:
        nc = cons.nc
        c = cons.contacts
        lam_c = res.lam[:3 * nc].reshape(nc, 3)
        names = [g.name for g in sm.geoms]
        d = self.__dict__
        vals = dict(
            contact_points=c.pos.copy(), contact_normals=c.normal.copy(),
            contact_distances=c.dist.copy(), contact_impulses=lam_c.copy(),
            contact_impulses_world=np.einsum("kij,kj->ki", cons.frames, lam_c) if nc else np.zeros((0, 3)),
            contact_modes=[MODE_NAMES[m] for m in res.modes],
            contact_geoms=[(names[a], names[b]) for a, b in zip(c.geom1, c.geom2)],
            limit_joints=[sm.limits[li].joint for li in cons.limits],
            limit_impulses=res.lam[3 * nc:].copy(), limit_active=res.limit_active.copy())
        for k, val in vals.items():
            d.setdefault(k, val)           # (a field assigned by the user stays)
        d.pop("_src", None)

    @property
    def num_contacts(self) -> int:
        src = self.__dict__.get("_src")
        if isinstance(src, _FastRecord):
            return src.n
        if src is not None and "contact_modes" not in self.__dict__:
            return int(src[0].nc) if src[0] is not None else 0
        return len(self.contact_modes)

    @property
    def contacts(self) -> list[Contact]:
        return [Contact(g[0], g[1], self.contact_points[i], self.contact_normals[i],
                        float(self.contact_distances[i]), self.contact_impulses[i],
                        self.contact_impulses_world[i], self.contact_modes[i])
                for i, g in enumerate(self.contact_geoms)]

    def __repr__(self) -> str:
        modes = {m: self.contact_modes.count(m) for m in MODE_NAMES if m in self.contact_modes}
        return (f"StepInfo(contacts={self.num_contacts} {modes}, active_limits="
                f"{int(np.sum(self.limit_active))}, iterations={self.iterations}, "
                f"residual={self.residual:.2e}, converged={self.converged}, method={self.method!r})")


_LOADER_KEYS = ("floating_base", "ground", "friction", "self_collision", "package_dirs", "srdf",
                "gravity", "restitution")


class Simulator:
    """A differentiable rigid-body simulator with unrelaxed frictional contact.

    Keyword settings: ``dt`` (time step, s), ``erp`` (Baumgarte fraction of a penetration
    removed per step, default 0.2), ``margin`` (base contact margin, m), ``tol`` (NCP residual
    tolerance, m/s), ``max_iter`` (ADMM iterations), ``max_contact_points`` per pair (4),
    ``restitution_threshold`` (m/s: impacts closing slower stay inelastic; default
    ``2 |gravity| dt``, at least 1e-3). Coefficients of restitution come from the model
    (``set_restitution`` changes them).

    Joint damping is implicit in the velocity update: ``sim.model`` (the model the step runs) is
    the file's model ``sim.sm.model`` with ``dt * damping`` added to its armature (see
    ``_implicit_damping_model``); use ``sim.sm.model`` for the physical mass matrix.
    """

    def __init__(self, sm: SimModel, *, dt: float | None = None, erp: float = 0.2,
                 margin: float = 1e-3, tol: float = 1e-9, max_iter: int = 2000,
                 max_contact_points: int = 4, gradient="exact",
                 restitution_threshold: float | None = None, jacobian_format: str = "auto"):
        # how to rebuild this simulator (pickling); from_file / from_string replace it
        self._source: tuple | None = None
        self._settings = dict(dt=dt, erp=erp, margin=margin, tol=tol, max_iter=max_iter,
                              max_contact_points=max_contact_points)
        # which derivative step(..., jacobian=True) returns (diffgym.sim.gradient_modes)
        self.gradient = gradient_mode(gradient)
        # the type of step(..., jacobian=True)'s six blocks (diffgym.sim.derivative_blocks):
        # "dense" numpy arrays, "sparse" scipy.sparse CSR matrices (built block by block, memory
        # linear in the bodies), "auto": sparse only where the dense ones would be large
        from .derivative_blocks import JACOBIAN_FORMATS
        if jacobian_format not in JACOBIAN_FORMATS:
            raise ValueError(f"jacobian_format must be one of {JACOBIAN_FORMATS}, got "
                             f"{jacobian_format!r}")
        self.jacobian_format = jacobian_format
        if dt is not None:
            sm.dt = dt
        if not (isinstance(sm.dt, (int, float, np.floating)) and np.isfinite(sm.dt) and sm.dt > 0):
            raise ValueError(f"dt must be a positive finite number of seconds, got {sm.dt!r}")
        if not 0.0 <= erp <= 1.0:
            raise ValueError(f"erp must be in [0, 1], got {erp!r}")
        _check_settings(tol=tol, margin=margin, max_iter=max_iter,
                        max_contact_points=max_contact_points)
        if restitution_threshold is not None and not (
                isinstance(restitution_threshold, (int, float, np.integer, np.floating))
                and np.isfinite(restitution_threshold) and restitution_threshold >= 0):
            raise ValueError("restitution_threshold must be a finite speed >= 0 (m/s) or None, "
                             f"got {restitution_threshold!r}")
        self.sm = sm
        self.model: pin.Model = _implicit_damping_model(sm)
        self.geom_model: pin.GeometryModel = sm.geom_model
        # per-tree dynamics (diffgym.sim.trees): a scene of many independent trees keeps one small
        # pinocchio Data per group of trees (a whole-model Data is cubic in nv); None: one
        # model, one Data (a single tree, or a small scene)
        trees = TreeGroups(self.model)
        self._trees = None if trees.single else trees
        if self._trees is None:
            self.data = self.model.createData()
        self.geom_data = pin.GeometryData(self.geom_model)
        for req in self.geom_data.collisionRequests:
            req.enable_contact = True
        self.collision = CollisionDriver(sm, base_margin=margin, max_points=max_contact_points)
        self.constraints = ConstraintBuilder(sm, erp=erp, limit_margin=margin,
                                             restitution_threshold=restitution_threshold)
        self.solver = NCPSolver(SolverSettings(tol=tol, max_iter=max_iter))
        self.last = StepInfo()
        # warm start: (pair, point, impulses, modes, limits, limit impulses, limit modes) of the
        # last step's contacts, or None
        self._warm: tuple | None = None
        self._warned = False
        self._gate = (2.0 * self.sm.dt * float(np.linalg.norm(self.model.gravity.linear))) ** 2
        self._nstep = 0                   # steps taken (error messages)
        self._last_contacts = None
        self._stiff_idx = np.array(list(getattr(sm, "stiffness", {}).keys()), dtype=np.int64)
        self._stiff_k = np.array([v[0] for v in getattr(sm, "stiffness", {}).values()])
        self._stiff_ref = np.array([v[1] for v in getattr(sm, "stiffness", {}).values()])
        self._stiff_q = np.array([self._idx_q_of_v(i) for i in self._stiff_idx], dtype=np.int64)
        # issue 15: equality constraints, dry friction, ball limits, fixed tendons
        # (diffgym.sim.equality); such models take the stage-by-stage path
        spec = getattr(sm, "constraint_spec", None)
        self._extra = None
        if spec is not None and not spec.empty():
            from .equality import ExtraRows
            self._extra = ExtraRows(sm, spec, erp, self.constraints.skin, margin)
        # mocap bodies (diffgym.sim.mocap): poses the user sets; their contacts' offsets enter
        # the compiled step (mocap_b) or the stage-by-stage one (_mocap_offsets)
        self._mocap = None
        if getattr(sm, "mocap", None):
            from .mocap import MocapState
            self._mocap = MocapState(self, sm.mocap)
            if self._extra is not None:       # (connect / weld rows with a mocap side)
                self._extra.mocap = self._mocap
        self.cache: dict = {}
        # the rows of q holding unit quaternions (free-flyer and spherical joints), 4 each
        rows = []
        for j in range(1, self.model.njoints):
            jm = self.model.joints[j]
            name = jm.shortname()
            if name in ("JointModelFreeFlyer", "JointModelSpherical"):
                s0 = jm.idx_q + (3 if name == "JointModelFreeFlyer" else 0)
                rows.extend(range(s0, s0 + 4))
        self._quat_rows = np.array(rows, dtype=np.int64)
        # every joint a vector space (revolute, prismatic, translation: pinocchio's integrate
        # is q + v, bit for bit): the step's q1 is one numpy sum, no pinocchio call
        self._additive_q = all(self.model.joints[j].shortname() in _ADDITIVE_JOINTS
                               for j in range(1, self.model.njoints))
        _warn_unstable_dt(self)

    @property
    def _warm(self):
        """The warm start of the next step: (pair, point, impulses, modes, limits, limit
        modes) of the last step's contacts and limits, or None (after a fused step, made from
        its record when read: ``_FastRecord.warm``)."""
        w = self.__dict__.get("_warm_st")
        if type(w) is _FastRecord:
            w = self.__dict__["_warm_st"] = w.warm()
        return w

    @_warm.setter
    def _warm(self, w) -> None:
        self.__dict__["_warm_st"] = w

    def _idx_q_of_v(self, iv: int) -> int:
        for j in range(1, self.model.njoints):
            jm = self.model.joints[j]
            if jm.idx_v <= iv < jm.idx_v + jm.nv:
                return jm.idx_q + (iv - jm.idx_v)
        raise ValueError(iv)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs) -> "Simulator":
        """Load an MJCF (.xml) or URDF (.urdf) file. Keyword settings override the file.

        What the file asks for and diffgym does not simulate (a spatial tendon, RK4, fluid
        forces, ...: :data:`diffgym.sim.unsupported.RULES`) raises a ModelError naming file, line,
        element and attribute; ``ignore_unsupported=("tendon", ...)`` loads it anyway without
        them (and warns what was left out). ``"joint.frictionloss"`` leaves out joint dry
        friction, which is simulated (MJCF ``frictionloss``, URDF ``<dynamics friction>``)."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such model file")
        source = ("file", os.path.abspath(path), dict(kwargs))
        ext = os.path.splitext(path)[1].lower()
        ignore = kwargs.pop("ignore_unsupported", None)
        loader_kw = {k: kwargs.pop(k) for k in list(kwargs) if k in _LOADER_KEYS}
        if ext == ".urdf":
            from .urdf import load_urdf
            dt = kwargs.get("dt")
            sm = load_urdf(path, dt=dt if dt is not None else 0.002, ignore_unsupported=ignore,
                           **loader_kw)
        elif ext in (".xml", ".mjcf"):
            if loader_kw:
                raise TypeError(f"{path}: settings {sorted(loader_kw)} apply to URDF files only")
            from .mjcf import load_mjcf
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            sm = load_mjcf(text, os.path.dirname(os.path.abspath(path)), source=path,
                           ignore_unsupported=ignore)
        else:
            raise ModelError(f"{path}: unknown model format {ext!r} (expected .xml MJCF or .urdf)")
        sim = cls(sm, **kwargs)
        sim._source = source
        return sim

    @classmethod
    def from_string(cls, text: str, base_dir: str = ".", **kwargs) -> "Simulator":
        """Load an MJCF document held in a string (``<include>`` files relative to
        ``base_dir``; ``ignore_unsupported`` as for :meth:`from_file`)."""
        if not isinstance(text, str):
            raise TypeError(f"from_string expects the MJCF text as str, got {type(text).__name__}")
        from .mjcf import load_mjcf
        ignore = kwargs.pop("ignore_unsupported", None)
        sim = cls(load_mjcf(text, base_dir, ignore_unsupported=ignore), **kwargs)
        if ignore is not None:
            kwargs["ignore_unsupported"] = ignore
        sim._source = ("string", text, os.path.abspath(base_dir), dict(kwargs))
        return sim

    # -- pickling and copying ----------------------------------------------------------------
    # pinocchio's GeometryData and coal's collision requests cannot be pickled: a pickled (or
    # deep-copied) Simulator holds the recipe it was built from (model file or MJCF text and
    # the settings) plus what a step carries to the next, and rebuilds the native objects.
    def __getstate__(self):
        if self._source is None:
            raise TypeError("a Simulator built directly from a SimModel cannot be pickled or "
                            "deep-copied; build it with Simulator.from_file or from_string")
        import copy
        return {"source": self._source, "dt": float(self.sm.dt),
                "solver_settings": copy.copy(self.solver.settings),
                "warm_start": self.warm_start_state(), "warned": self._warned,
                "last": self.last,
                "restitution": [float(g.restitution) for g in self.sm.geoms],
                "jacobian_format": self.jacobian_format,
                "mocap": (None if self.__dict__.get("_mocap") is None else
                          tuple(a.copy() for a in (self._mocap.pos, self._mocap.R,
                                                   self._mocap.lin, self._mocap.ang)))}

    def __setstate__(self, state) -> None:
        src = state["source"]
        if src[0] == "file":
            fresh = Simulator.from_file(src[1], **src[2])
        elif src[0] == "string":
            fresh = Simulator.from_string(src[1], src[2], **src[3])
        else:
            raise ValueError(f"unknown Simulator source kind {src[0]!r}")
        self.__dict__.update(fresh.__dict__)
        if self.sm.dt != state["dt"]:
            self.sm.dt = state["dt"]
            self.model = _implicit_damping_model(self.sm)      # (dt D as armature)
            self.data = self.model.createData()
        self.solver.settings = state["solver_settings"]
        self.set_warm_start_state(state["warm_start"])
        self._warned = state["warned"]
        self.last = state["last"]
        for g, e in zip(self.sm.geoms, state.get("restitution", ())):
            g.restitution = e
        self.jacobian_format = state.get("jacobian_format", self.jacobian_format)
        self.sm.update_restitution()
        self.constraints.refresh_restitution()
        if state.get("mocap") is not None:
            mz = self._mocap
            mz.pos[:], mz.R[:], lin, ang = state["mocap"]
            for i in range(len(mz.names)):
                mz.set(self, i, vel=lin[i], angvel=ang[i])

    # -- properties ------------------------------------------------------------------------
    @property
    def data(self) -> pin.Data:
        """A pinocchio Data of the whole model, holding the kinematics (placements, velocities,
        joint Jacobians) at the last step's (q, v). On a scene stepped tree by tree
        (diffgym.sim.trees) the step does not use it: it is made on first access (its size is cubic
        in nv) and brought to the last step's (q, v) on the first access after each step."""
        d = self.__dict__.get("_data")
        if d is None:
            d = self.__dict__["_data"] = self.model.createData()
        if self.__dict__.get("_trees") is not None and self.__dict__.get("_data_step") != self._nstep:
            self.__dict__["_data_step"] = self._nstep
            c = self.cache
            if "q" in c:
                pin.forwardKinematics(self.model, d, c["q"], c["v"])
                pin.computeJointJacobians(self.model, d)
        return d

    @data.setter
    def data(self, d: pin.Data) -> None:
        self.__dict__["_data"] = d

    @property
    def dt(self) -> float:
        return float(self.sm.dt)

    @property
    def q0(self) -> np.ndarray:
        return self.sm.q0.copy()

    @property
    def nq(self) -> int:
        return self.model.nq

    @property
    def nv(self) -> int:
        return self.model.nv

    @property
    def actuators(self):
        return self.sm.actuators

    def set_restitution(self, geom, e: float) -> None:
        """Set the coefficient of restitution of a geom (name or index), in [0, 1]; a pair uses
        the larger of its two geoms' coefficients."""
        i = self.geom_id(geom) if isinstance(geom, str) else int(geom)
        if not 0 <= i < len(self.sm.geoms):
            raise KeyError(f"no geom with index {geom!r} ({len(self.sm.geoms)} geoms)")
        if not (isinstance(e, (int, float, np.integer, np.floating)) and 0.0 <= e <= 1.0):
            raise ValueError(f"geom {self.sm.geoms[i].name!r}: restitution must be in [0, 1], "
                             f"got {e!r}")
        self.sm.geoms[i].restitution = float(e)
        self.sm.update_restitution()
        self.constraints.refresh_restitution()

    def geom_id(self, name: str) -> int:
        for i, g in enumerate(self.sm.geoms):
            if g.name == name:
                return i
        raise KeyError(f"no geom named {name!r}; geoms: {[g.name for g in self.sm.geoms]}")

    def joint_id(self, name: str) -> int:
        if not self.model.existJointName(name):
            raise KeyError(f"no joint named {name!r}; joints: {list(self.model.names)[1:]}")
        return self.model.getJointId(name)

    def actuation(self, ctrl) -> np.ndarray:
        """Generalized forces (nv,) from one control value per actuator (clipped to ctrlrange)."""
        ctrl = self._vector(ctrl, len(self.sm.actuators), "ctrl")
        tau = np.zeros(self.nv)
        for a, c in zip(self.sm.actuators, ctrl):
            if a.ctrlrange is not None:
                c = min(max(c, a.ctrlrange[0]), a.ctrlrange[1])
            if a.dofs:                       # a tendon transmission
                for iv, coef in a.dofs:
                    tau[iv] += a.gear * coef * c
            else:
                tau[a.idx_v] += a.gear * c
        return tau

    def _has_warm_start(self) -> bool:
        ex = self.__dict__.get("_extra")
        return self._warm is not None or (ex is not None and bool(ex._warm))

    def reset_warmstart(self) -> None:
        self._warm = None
        if self.__dict__.get("_extra") is not None:
            self._extra.reset_warm()

    def warm_start_state(self):
        """The warm start the next step will use (the last step's impulses and modes per
        contact and limit), as a tuple of arrays, or None; ``set_warm_start_state`` restores it
        (checkpoints: a resumed run then solves its first step from the same point)."""
        w = self._warm
        return None if w is None else tuple(np.array(a) for a in w)

    def set_warm_start_state(self, w) -> None:
        if w is None:
            self._warm = None
            return
        if len(w) != 6:
            raise ValueError(f"a warm start is 6 arrays (pair, point, impulses, modes, limits, "
                             f"limit modes), got {len(w)}")
        dtypes = (np.int64, np.int64, np.float64, np.int64, np.int64, np.bool_)
        self._warm = tuple(np.ascontiguousarray(a, dtype=d) for a, d in zip(w, dtypes))

    # -- input checking ------------------------------------------------------------------
    @staticmethod
    def _vector(x, n: int, name: str) -> np.ndarray:
        if x is None or isinstance(x, (str, bytes, dict)):
            raise TypeError(f"{name} must be an array of real numbers, got {type(x).__name__}")
        if np.iscomplexobj(x):
            raise TypeError(f"{name} must be real, got complex values")
        try:
            arr = np.asarray(x, dtype=float)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be an array of real numbers, got {type(x).__name__}") from exc
        if arr.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {arr.shape}")
        bad = ~np.isfinite(arr)
        if np.any(bad):
            raise ValueError(f"{name} contains NaN or inf at index {np.flatnonzero(bad).tolist()}")
        return arr

    def _check_q(self, q) -> np.ndarray:
        q = self._vector(q, self.nq, "q").copy()
        for j in range(1, self.model.njoints):
            jm = self.model.joints[j]
            name = jm.shortname()
            if name in ("JointModelFreeFlyer", "JointModelSpherical"):
                s = jm.idx_q + (3 if name == "JointModelFreeFlyer" else 0)
                nrm = np.linalg.norm(q[s:s + 4])
                if abs(nrm - 1.0) > 1e-3:
                    raise ValueError(f"q[{s}:{s + 4}] is the quaternion (x y z w) of joint "
                                     f"{self.model.names[j]!r} and must have unit norm, got {nrm:.6g}")
                q[s:s + 4] /= nrm
        return q

    # -- the step --------------------------------------------------------------------------
    def passive_forces(self, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        f = -self.sm.damping * v
        if len(self._stiff_idx):
            f[self._stiff_idx] -= self._stiff_k * (q[self._stiff_q] - self._stiff_ref)
        ex = self.__dict__.get("_extra")
        if ex is not None and ex.passive:
            f += ex.passive_forces(q, v)
        return f

    def step(self, q, v, tau, jacobian: bool = False):
        """Advance one time step. Returns ``(q1, v1)`` or ``(q1, v1, jac)`` with jacobian=True.

        Raises SimulationError (naming the model, the step and its contacts) when the step
        diverges or its linear algebra fails on a degenerate problem.

        A model of at least ``blas.PIN_MIN_NV`` velocity dimensions steps with the loaded
        OpenBLAS libraries on ``DIFFGYM_BLAS_THREADS`` threads (default 1), restored on return
        (``diffgym.sim.blas``: their threads cost a step more than they give)."""
        guard = self.__dict__.get("_blas")
        if guard is None:
            guard = self._blas = _blas.step_guard(self.nv) or False
        if guard:
            guard.enter()
            try:
                return self._checked_step(q, v, tau, jacobian)
            finally:
                guard.exit()
        return self._checked_step(q, v, tau, jacobian)

    def _checked_step(self, q, v, tau, jacobian):
        """``step``'s body: the step, its failures turned into SimulationError, the energy
        budget."""
        self._nstep += 1
        try:
            try:
                out = self._step(q, v, tau, jacobian)
            except (np.linalg.LinAlgError, ValueError) as exc:
                if not _lapack_failure(exc) or not self._has_warm_start():
                    raise
                # LAPACK gave up on the problem the warm start led to (an SVD that does not
                # converge): the same step again from a cold start, said, never silently
                warnings.warn(f"{self._context()}: the step's linear algebra failed "
                              f"from the warm start ({type(exc).__name__}: {exc}); the step was "
                              "solved again from a cold start", SolverWarning,
                              stacklevel=3)            # (the caller of step)
                self.reset_warmstart()
                out = self._step(q, v, tau, jacobian)
        except (np.linalg.LinAlgError, ValueError, ZeroDivisionError, FloatingPointError) as exc:
            if isinstance(exc, ValueError) and not _lapack_failure(exc):
                raise
            raise SimulationError(f"{self._context()}: the step failed on a degenerate problem "
                                  f"({type(exc).__name__}: {exc})") from exc
        self._energy_budget(q, v, out[0], out[1])
        return out

    def _fast_args(self):
        """The fused call's arguments that the model fixes (``_fused_step``), or None where
        this simulator's steps cannot take it: several trees (``island_step``), rows of
        ``diffgym.sim.equality``, mocap bodies, a model without contact pairs or without moving
        joints. Built on first use."""
        fa = self.__dict__.get("_fused")
        if fa is not None:
            return fa
        drv, cb = self.collision, self.constraints
        ok = (self.__dict__.get("_trees") is None and self.__dict__.get("_extra") is None
              and self.__dict__.get("_mocap") is None and drv._npairs and len(drv._mj))
        if not ok:
            fa = self._fused = False
            return fa
        from .support_drift import _table
        t = _table(self)
        # (support drift: the geoms whose rows carry its term, which the separate calls handle)
        dr = ((t.plane, t.carrier, t.ids) if t.active else
              (np.zeros(0, np.bool_), np.zeros(0, np.bool_), np.zeros((0, 2), np.int64)))
        fa = self._fused = ((cb.geom_joint, cb.support, cb.sup_ptr, cb.sup_idx, cb.joint_tree,
                             cb.tree_lo, cb.tree_hi), (bool(self._additive_q),) + dr)
        return fa

    def _fast_step(self, q, v, tau):
        """The step of a small robot in one compiled call after pinocchio's (``_fused_step``),
        with what the step leaves (``sim.last``, ``sim.cache``, the constraints and contacts)
        built when first read (``_FastRecord``): the same values as the separate calls of
        ``_step``, bit for bit. Returns (q1, v1), or None where the step takes ``_step``'s
        separate calls (anything but the common case, and where a kernel has been replaced)."""
        fa = self._fused if "_fused" in self.__dict__ else self._fast_args()
        if not fa:
            return None
        solver, cb, drv = self.solver, self.constraints, self.collision
        if (type(solver) is not NCPSolver or not solver.settings.compiled
                or len(cb.pair_restitution) or self.gradient.name == "long_range"
                or _constrained_step is not _CONSTRAINED_STEP
                or _cd.detect_closed_form is not detect_closed_form
                or "detect" in drv.__dict__ or self.__dict__.get("_toi_pass")):
            return None
        model, data = self.model, self.__dict__.get("_data")
        nq, nv = model.nq, model.nv
        if not (type(q) is np.ndarray and type(v) is np.ndarray and type(tau) is np.ndarray
                and q.dtype == _F64 and v.dtype == _F64 and tau.dtype == _F64
                and q.shape == (nq,) and v.shape == (nv,) and tau.shape == (nv,)):
            return None
        if len(self._quat_rows):
            q, fast = _checked_state(q, v, tau, self._quat_rows)
            if not fast:
                return None
        else:                           # (the finiteness checks in the fused call)
            q = q.copy()
        dt = self.sm.dt
        pin.forwardKinematics(model, data, q, v)
        pin.updateGeometryPlacements(model, data, self.geom_model, self.geom_data)
        pin.computeJointJacobians(model, data)
        Jw = data.J.reshape(6, nv).copy()
        oM = drv._placements(data)
        if len(self._stiff_idx):
            tau_total = tau + self.passive_forces(q, v)
        else:
            tau_total = tau - self.sm.damping * v
        a_free = pin.aba(model, data, q, v, tau_total)
        Minv = pin.computeMinverse(model, data, q)
        if nv == 1:
            Minv = Minv.reshape(1, 1)
        m0 = drv.base_margin + dt * dt * drv._gravity
        fixed = drv.__dict__.get("_fixed_args")
        if fixed is None:
            fixed = drv._fixed_args = drv._detect_fixed_args()
        mj, support, broad, rest = fixed
        w = self.__dict__.get("_warm_st")
        if w is None:
            wa = _NO_WARM_FUSED
        elif type(w) is _FastRecord:
            wa = (2,) + _NO_WARM[:5] + (w.lim_act, w.Fo, w.Io, w.n, w.nl, w.m)
        else:
            wa = (1,) + w + _NO_WARM_REC
        st = solver.settings
        out = _fused_step(oM, mj, Jw, v, support, *broad, m0, dt, *rest, *fa[0], q, cb.lim_q,
                          cb.lim_v, cb.lim_bound, cb.lim_sign, cb.limit_margin, cb.erp, cb.skin,
                          Minv, a_free, *wa, st.tol, st.mode_tol, st.newton_iter,
                          st.mode_rounds, st.newton_budget,
                          cb.pair_restitution, _NO_SPENT, bool(st.realizable_bias),
                          depenetration_speed(solver), _NO_MOCAP, _NO_DRIFT, tau_total,
                          self._gate, *fa[1])
        (status, n, nl, m, nis, its, resid, r1, vs, nprox, finite, jump, frictionless, work, Fo,
         Io, lim_act) = out
        if not status or not finite or frictionless:
            return None
        if status == 2 and not r1 <= max(100.0 * st.tol, 1e-9 * vs):
            return None
        additive = fa[1][0]
        if status == 1:
            o = nq if additive else 0
            v1 = v_free = Fo[o:o + nv]
        else:
            o = nl + 4 * m
            v1 = Fo[o:o + nv]
        if additive:
            o = nl + 5 * m + nv + 2 * n + m * nv + m * m if status == 2 else 0
            q1 = Fo[o:o + nq]
        else:                       # (a free or ball joint: q1 by pinocchio, as _step)
            q1 = pin.integrate(model, q, v1 * dt)
            s1 = float(_add(q1))
            if s1 - s1 != 0.0:      # (not finite: _step raises the error)
                return None
        drv._margin0 = m0
        drv.last_candidates = 0
        if status == 1:
            if jump and self._energy_excess(q, v, v1, tau_total, None, None) > 0.0:
                return None
            self._last_contacts = drv._empty          # (n = 0: no contact row)
            self._warm = None
            self.last = StepInfo._lazy(None, _NO_RESULT, self.sm)
            self.cache = {"q": q, "v": v, "tau": tau, "tau_total": tau_total, "a_free": a_free,
                          "v_free": v_free, "cons": None, "res": None, "Minv": None, "G": None,
                          "g": None, "v1": v1, "q1": q1, "impact_times": None,
                          "support_drift": None}
        else:
            rec = _FastRecord(self.sm, Fo, Io, n, nl, m, nv, nq if additive else 0, lim_act, its,
                              resid, nprox)
            if not n:                   # (limits alone: the driver's empty contacts, as detect)
                rec._contacts = drv._empty
            # (the speed jumped: the energy check of _step, which a step failing it takes)
            if jump and self._energy_excess(q, v, v1, tau_total, *rec.built()[:2]) > 0.0:
                return None
            self._last_contacts = rec
            self.__dict__["_warm_st"] = rec            # (its tuple made when read: _warm)
            self.last = StepInfo._lazy_record(rec, its, resid,
                                              "prox+newton" if nprox else "newton", nis)
            self.cache = _FastCache({"q": q, "v": v, "tau": tau, "tau_total": tau_total,
                                     "a_free": a_free, "Minv": Minv, "v1": v1,
                                     "q1": q1, "impact_times": None, "support_drift": None}, rec)
        self._step_work = work
        return q1, v1

    # steps between two evaluations of the trajectory's mechanical energy (_energy_budget)
    ENERGY_CHECK_EVERY = 8

    def _energy_budget(self, q, v, q1, v1) -> None:
        """The energy check of a trajectory (issue 16): slow growth that no single step shows.

        A trajectory is a run of steps each starting where the previous one ended (the state
        this step starts from equals, bit for bit, the one the last step returned; anything else
        starts a new one). Along it, the mechanical energy ``E = kinetic + gravity`` may grow
        only by the work put in: the positive part of ``dt v1 . tau_total`` of each step (applied
        and passive forces) and the energy the contact and limit stabilization may inject
        (``sum max(0, -lam_i b_i)``). Every ``ENERGY_CHECK_EVERY`` steps, a growth beyond that
        budget by more than half the largest kinetic energy seen on the trajectory (plus 1e-6 J
        and rounding) raises SimulationError: the integration is unstable for this motion (the
        explicit gyroscopic term of a fast spin grows |v| about 1% a step, every step reporting
        converged=True). The one-step check (``_energy_excess``, a 1.5x jump) stays."""
        cache = self.__dict__.get("cache")
        eb = self.__dict__.get("_ebudget")
        # (bytes: a cheap exact comparison that also sees a returned array changed in place)
        if type(q) is not np.ndarray or q.dtype != _F64:
            q = np.asarray(q, dtype=float)
        if type(v) is not np.ndarray or v.dtype != _F64:
            v = np.asarray(v, dtype=float)
        if eb is None or q.tobytes() != eb["q1"] or v.tobytes() != eb["v1"]:
            eb = self._ebudget = {"E0": self._mech_energy(q, v), "W": 0.0, "K": 0.0, "n": 0,
                                  "n0": self._nstep}
            eb["K"] = self._ebudget_kin
        eb["q1"], eb["v1"] = q1.tobytes(), v1.tobytes()
        work = self.__dict__.get("_step_work")
        if work is not None:
            eb["W"] += work
        elif cache is not None:
            tt = cache.get("tau_total")
            cons, res = cache.get("cons"), cache.get("res")
            lb = (res.lam, cons.b) if (cons is not None and res is not None
                                       and len(res.lam) == len(cons.b)) else _NO_LB
            eb["W"] += _budget_work(v1, tt if tt is not None else v1[:0], lb[0], lb[1], self.dt)
        eb["n"] += 1
        if eb["n"] % self.ENERGY_CHECK_EVERY:
            return
        e1 = self._mech_energy(q1, v1)
        k1 = self._ebudget_kin
        eb["K"] = max(eb["K"], k1)
        e0 = eb["E0"]
        excess = e1 - e0 - eb["W"]
        if excess > 0.5 * eb["K"] + 1e-6 + 1e-9 * (abs(e0) + abs(e1)):
            raise SimulationError(
                f"{self._context()}: the mechanical energy grew from {e0:.6g} J to {e1:.6g} J "
                f"over the {eb['n']} steps since step {eb['n0']} (the start of this trajectory), "
                f"{excess:.3g} J more than the work of the applied forces and the contact "
                f"stabilization ({eb['W']:.3g} J); the kinetic energy is {k1:.3g} J, |v| = "
                f"{np.linalg.norm(v1):.3g}. The integration is unstable for this motion (e.g. "
                "a fast spin at this time step): a smaller dt is needed")

    def _mech_energy(self, q, v) -> float:
        """Kinetic + gravity potential energy of (q, v) (its kinetic part left in
        ``_ebudget_kin``)."""
        trees = self.__dict__.get("_trees")
        if trees is not None:
            # per tree group, each with a Data of its own (a whole-model Data is cubic in nv;
            # the groups' own Data hold the step's kinematics, which the Jacobian reads)
            ds = self.__dict__.get("_etree_data")
            if ds is None:
                ds = self._etree_data = [g.model.createData() for g in trees.groups]
            k = p = 0.0
            for g, d in zip(trees.groups, ds):
                qg = q[g.q0:g.q1]
                k += float(pin.computeKineticEnergy(g.model, d, qg, v[g.v0:g.v1]))
                p += float(pin.computePotentialEnergy(g.model, d, qg))
        else:
            model = self.model
            d = self.__dict__.get("_edata")
            if d is None:
                d = self._edata = model.createData()
            k = float(pin.computeKineticEnergy(model, d, q, v))
            p = float(pin.computePotentialEnergy(model, d, q))
        self._ebudget_kin = k
        return k + p

    def _energy_excess(self, q, v, v1, tau_total, cons, res) -> float:
        """How much the kinetic energy of the step, at the configuration q, grew beyond the work
        of the applied and passive forces and gravity (``dt v1 . (tau - g(q))``, counted when
        positive), the energy contact and limit stabilization may inject (``sum max(0, -lam_i
        b_i)``) and a slack of half the kinetic energy before the step: a positive value flags
        an exploding step (0.0 otherwise). Called only when the speed jumped."""
        model, dt = self.model, self.dt
        trees = self.__dict__.get("_trees")
        if trees is not None:
            ke0, ke1, grav = trees.kinetic_and_gravity(q, v, v1)
            work = dt * float(v1 @ (tau_total - grav))
        else:
            d = self.__dict__.get("_edata")
            if d is None:
                d = self._edata = model.createData()
            M = pin.crba(model, d, q)
            M = np.triu(M) + np.triu(M, 1).T
            ke0 = 0.5 * float(v @ M @ v)
            ke1 = 0.5 * float(v1 @ M @ v1)
            work = dt * float(v1 @ (tau_total - pin.computeGeneralizedGravity(model, d, q)))
        inj = 0.0
        if cons is not None and res is not None and len(res.lam):
            inj = float(np.maximum(0.0, -res.lam * cons.b).sum())
        excess = ke1 - ke0 - max(work, 0.0) - inj - 0.5 * ke0 - 1e-9 * (ke0 + ke1) - 1e-12
        return excess if excess > 0.0 else 0.0

    def _context(self) -> str:
        """Where a failing step happened: model, step number, contacts and limits."""
        sm = self.sm
        name = getattr(sm.model, "name", "") or "model"
        c = getattr(self, "_last_contacts", None)
        if isinstance(c, _FastRecord):
            c = c.contacts
        ctx = f"{name} ({sm.source}), step {self._nstep} of this simulator"
        if c is not None and len(c):
            pairs = sorted({(self.sm.geoms[int(a)].name, self.sm.geoms[int(b)].name)
                            for a, b in zip(c.geom1.tolist(), c.geom2.tolist())})
            shown = ", ".join(f"{a}/{b}" for a, b in pairs[:8]) + (" ..." if len(pairs) > 8 else "")
            ctx += (f", {len(c)} contact points (pairs {shown}), deepest "
                    f"{-float(np.min(c.dist)):.3g} m")
        else:
            ctx += ", no contact"
        return ctx

    def _step(self, q, v, tau, jacobian: bool = False):
        self._step_work = None        # (the energy budget's work where the fused call gave it)
        if not jacobian:
            out = self._fast_step(q, v, tau)
            if out is not None:
                return out
        trees = self.__dict__.get("_trees")
        model, data, dt = self.model, self.__dict__.get("_data"), self.dt
        nq, nv = model.nq, model.nv
        # Input checks. Fast path: float64 vectors of the right shapes whose sums are finite
        # (so every entry is) and unit quaternions; anything else takes the full checks, which
        # raise the detailed errors. Both give the same q, v, tau.
        qrows = self._quat_rows
        fast = False
        if (type(q) is np.ndarray and type(v) is np.ndarray and type(tau) is np.ndarray
                and q.dtype == _F64 and v.dtype == _F64 and tau.dtype == _F64
                and q.shape == (nq,) and v.shape == (nv,) and tau.shape == (nv,)):
            q, fast = _checked_state(q, v, tau, qrows)
        if not fast:
            q = self._check_q(q)
            v = self._vector(v, nv, "v")
            tau = self._vector(tau, nv, "tau")

        if trees is not None:              # tree by tree (diffgym.sim.trees)
            data = trees.kinematics(q, v)
            trees.geometry_placements(self.geom_model, self.geom_data)
        else:
            pin.forwardKinematics(model, data, q, v)
            pin.updateGeometryPlacements(model, data, self.geom_model, self.geom_data)
            # world-frame joint Jacobians at these placements (a copy: later calls reuse data.J)
            pin.computeJointJacobians(model, data)
        Jd = data.J.reshape(6, nv)          # (eigenpy gives a (6,) vector when nv = 1)
        Jw = Jd.copy()                      # (a copy: later calls reuse data.J)
        # (detect reads data.J as it is now, passed on: one conversion of it a step)
        contacts = self._last_contacts = self.collision.detect(data, self.geom_data, dt, v, Jd)
        # the second-order term of an ellipsoid's support point on a plane at the step's own
        # angular velocity (support_drift.fixed_point): None, or "v1" where the step has it
        drift_at = None

        ex = self.__dict__.get("_extra")
        if len(self._stiff_idx) or (ex is not None and ex.passive):
            tau_total = tau + self.passive_forces(q, v)
        else:
            tau_total = tau - self.sm.damping * v       # (= tau + (-damping * v), exactly)
        if self.gradient.name == "long_range":
            # the long-range barrier's generalized force enters the step (diffgym.sim.long_range)
            tau_total = tau_total + self._long_range_force(Jw)
        a_free = (pin.aba(model, data, q, v, tau_total) if trees is None
                  else trees.aba(q, v, tau_total))
        v_free = v + dt * a_free

        cb = self.constraints
        solver = self.solver
        nc = contacts.pair.shape[0]           # (len(contacts), without its Python call)
        nis = 1
        # a later pass of impact_substep: the time each dof has drifted (impact_time)
        pre = self.__dict__.get("_toi_pass")
        spent = consumed_time(pre) if pre else None
        xrows = None
        verified = None
        blk = None
        if ex is not None:
            xrows = ex.rows(q, v, dt)
        if xrows is not None and xrows.m:
            # the stage-by-stage path with the rows of diffgym.sim.equality after the others
            (cons, res, G, g, Minv, v1), drift_at = support_fixed_point(
                self, contacts, Jw, v,
                lambda d: self._solve_with_extra(q, v, Jw, contacts, v_free, xrows, drift=d),
                lambda o: o[5] if o[1].converged else None)
        elif not nc and cb.has_limits and not len(cb.active_limits(q, v, dt)[0]):
            cons = None                          # (no contact, no limit within reach)
        elif trees is not None and self._mocap is None and (
                blk := block_step(self, trees, q, v, Jw, contacts, v_free)) is not None:
            # large split scenes: the same compiled step in per-island storage (island_step)
            cons, res, g, v1, verified, nis, lazy_minv, r1, drift_at = blk
            Minv = G = None
        elif (nc or cb.has_limits) and type(solver) is NCPSolver and solver.settings.compiled:
            # the constrained part in one compiled call (limits, assembly, warm start, stage 1)
            # only its upper triangle is filled
            Minv = pin.computeMinverse(model, data, q) if trees is None else trees.minverse(q)
            if nv == 1:
                Minv = Minv.reshape(1, 1)
            frames = contacts.frames
            if frames is None:
                frames = tangent_frames(contacts.normal) if nc else _NO_FRAMES
            # the kernel takes M^-1 row-major: the layout pinocchio's computeMinverse gives one
            # tree, while Trees.minverse (several trees) builds it column-major; a second layout
            # would compile the whole constrained step (and everything it calls) a second time.
            # (The kernels read M^-1 entry by entry: the copy changes no result.)
            Mk = Minv if Minv.flags.c_contiguous else np.ascontiguousarray(Minv)
            w = self._warm
            st = solver.settings
            args = (contacts.pos, frames, contacts.geom1, contacts.geom2, cb.geom_joint,
                    contacts.dist, contacts.mu, contacts.pair, contacts.point, Jw, cb.support,
                    cb.sup_ptr, cb.sup_idx, cb.joint_tree, cb.tree_lo, cb.tree_hi,
                    q, v, cb.lim_q, cb.lim_v, cb.lim_bound, cb.lim_sign, cb.limit_margin, dt,
                    cb.erp, cb.skin, Mk, v_free, w is not None, *(w if w is not None else _NO_WARM),
                    st.tol, st.mode_tol, st.newton_iter, st.mode_rounds, st.newton_budget,
                    cb.pair_restitution,
                    cb.restitution_thr(dt) if len(cb.pair_restitution) else 0.0,
                    _NO_SPENT if spent is None else spent,
                    # (at most 3 rows a contact and one a limit: a smaller bound than
                    # BODY_MIN_ROWS takes the variant compiled without the body-space path)
                    Mk if 3 * nc + len(cb.lim_q) >= BODY_MIN_ROWS else None,
                    bool(st.realizable_bias), depenetration_speed(solver),
                    # (moving mocap geoms: the offsets of their contacts, diffgym.sim.mocap)
                    _NO_MOCAP if self._mocap is None or not nc else
                    _mocap_rows(self._mocap.contact_bias(contacts, frames)))

            def solve_pass(drift):
                a = args + (_NO_DRIFT if drift is None else drift,)
                return a, _constrained_step(*a)

            def pass_velocity(o):
                out = o[1]
                if not out[0]:                 # (a later stage to run: v1 is not complete)
                    return None
                o1 = out[2] + 4 * out[12].shape[0]
                return out[8][o1:o1 + nv]
            # (the solve and the check of its solution at v1 in one compiled call)
            (args, out), drift_at = support_fixed_point(self, contacts, Jw, v, solve_pass,
                                                        pass_velocity)
            (all_ok, nis, nl, its, resid, r1, vs, nprox, F, ints, lim_act, J, G) = out
            (lim_idx, lim_dist, J, b, G, g, lam, sigma, modes, v1,
             rest, projected) = _unpack_step(F, ints, J, G, nc, nl, nv,
                                             len(cb.pair_restitution) > 0)
            if G.shape[0]:
                cons = Constraints(J, b, nc, contacts.mu, frames, contacts, lim_idx, lim_dist,
                                   contacts.dist, *(rest if rest is not None else (None, None)),
                                   projected)
                if all_ok:
                    res = SolverResult(lam, sigma, modes, lim_act, its, resid, True,
                                       "prox+newton" if nprox else "newton")
                    verified = r1 <= max(100.0 * solver.settings.tol, 1e-9 * vs)
                else:                              # (rare) stages 2-4 in Python, per island
                    # (the islands and M^-1 J^T: the same pure call, which returns them)
                    out = _constrained_velocity(*args)
                    island_ok, isl_c, isl_l, MJt = out[0], out[1], out[2], out[16]
                    res = self._solve_failed_islands(solver, G, g, cons, island_ok, isl_c, isl_l,
                                                     lam, sigma, modes, lim_act, its, resid, v)
                    v1 = v_free + MJt @ res.lam
            else:
                cons, res, Minv, G, g = None, None, None, None, None
        elif nc or cb.has_limits:
            # any other solver (or compiled=False): stage by stage
            limits = cb.active_limits(q, v, dt)
            cons = None
            if nc or len(limits[0]):
                Minv = (pin.computeMinverse(model, data, q) if trees is None
                        else trees.minverse(q))
                if nv == 1:
                    Minv = Minv.reshape(1, 1)
                Minv0 = Minv

                def solve_pass(drift):
                    cons, G, g, MJt, Minv = cb.assemble(Jw, contacts, limits, dt, Minv0, v_free,
                                                        v, spent, depenetration_speed(solver),
                                                        drift=drift)
                    if self._mocap is not None:
                        g = self._mocap_offsets(cons, g)
                    lam0, modes0 = self._warm_start(cons)
                    bias = None
                    if (isinstance(solver, NCPSolver) and type(solver).solve is NCPSolver.solve
                            and solver.settings.realizable_bias):
                        # (solve_stage1's retry with realizable offsets: cons.b and g in place;
                        # a subclass overriding solve() keeps its own call, without the retry)
                        g = np.array(g, dtype=np.float64)
                        cons.b = np.array(cons.b, dtype=np.float64)
                        bias = (cons.b, cb.realizable_rows(cons))
                        braw = cons.b.copy()
                    res = self._solve(solver, G, g, cons, lam0, modes0, v, bias=bias)
                    if bias is not None and bias[1].any():  # (solve_stage1's record, in place)
                        cons.projected = (np.where(bias[1], 0, -1).astype(np.int64), braw)
                    return cons, G, g, MJt, Minv, res, v_free + MJt @ res.lam
                (cons, G, g, MJt, Minv, res, v1), drift_at = support_fixed_point(
                    self, contacts, Jw, v, solve_pass, lambda o: o[6] if o[5].converged else None)
        else:
            cons = None
        if cons is None:
            res, Minv, G, g = None, None, None, None
            v1 = v_free
        elif res.converged and (xrows is None or not xrows.m):
            # independent check of the reported solution at the final velocity (the compiled
            # path has checked it in its call: ``verified``)
            if verified is None:
                r1, vs = _verify_velocity(cons.J, cons.b, v1, res.lam, cons.nc, cons.mu, G,
                                          _NO_RT, _NO_I)
                verified = r1 <= max(100.0 * solver.settings.tol, 1e-9 * vs)
            if not verified:
                res = dataclasses.replace(res, converged=False, residual=float(r1),
                                          method=res.method + "+unverified")
        # an impact-law contact: the impact at its time inside the step (diffgym.sim.impact_time)
        toi = None
        if cons is not None and getattr(cons, "restitution", None) is not None:
            toi = impact_times(self, cons, v, spent)
            if toi is not None and toi.interior.any() and len(pre or ()) < MAX_PASSES:
                return impact_substep(self, q, v, tau, jacobian, toi, cons)
            toi = None if pre else toi
        mu_c = cons.mu if cons is not None else _NO_MU
        if toi is None and spent is None and self.__dict__.get("_additive_q"):
            q1, finite, jump, frictionless = _step_end(q, v, v1, dt, self._gate, mu_c)
        else:
            q1 = (q + displacement(toi, dt, v, v1, spent) if self.__dict__.get("_additive_q")
                  else pin.integrate(model, q, displacement(toi, dt, v, v1, spent)))
            finite, jump, frictionless = _step_checks(v, v1, q1, self._gate, mu_c)
        if not finite:
            raise SimulationError(f"{self._context()}: the step produced a non-finite state (the "
                                  f"simulation diverged); |v| = {np.linalg.norm(v):.3g}, "
                                  f"|tau| = {np.linalg.norm(tau):.3g}")
        excess = self._energy_excess(q, v, v1, tau_total, cons, res) if jump else 0.0
        warm_modes = None
        if frictionless and cons.nc:
            res, warm_modes = _label_frictionless(res, cons.mu)
        self._record(cons, res, warm_modes, nis if cons is not None else 0)
        if xrows is not None:
            self._record_extra(cons, res, xrows)
        if excess > 0.0:
            d = self.last.__dict__
            d["converged"] = False
            d["method"] = d["method"] + "+energy"
            warnings.warn(f"{self._context()}: the kinetic energy grew by {excess:.3g} J more than "
                          "the work of the applied forces, gravity and contact stabilization "
                          "(the explicit integration is unstable at this time step for this "
                          "motion, e.g. a fast spin); sim.last.converged is False",
                          SolverWarning, stacklevel=4)
        # (Minv: pinocchio's computeMinverse, of which only the upper triangle is filled)
        # (a dict display: cheaper than dict(...) with keywords, every step)
        self.cache = {"q": q, "v": v, "tau": tau, "tau_total": tau_total, "a_free": a_free,
                      "v_free": v_free, "cons": cons, "res": res, "Minv": Minv, "G": G, "g": g,
                      "v1": v1, "q1": q1, "impact_times": toi, "support_drift": drift_at}
        if blk is not None:        # (G and M^-1 made dense only when read: island_step)
            self.cache = BlockCache(self.cache, cons, lazy_minv)
        if jacobian:
            jac = step_jacobian(self)
            self.last.__dict__["jacobian_diagnostics"] = jac.diagnostics
            return q1, v1, jac
        return q1, v1

    def _solve_with_extra(self, q, v, Jw, contacts, v_free, xrows, drift=None):
        """The constrained velocity with the rows of :mod:`diffgym.sim.equality` (equality
        constraints, dry friction, ball and tendon limits) after the contact and joint-limit
        rows: assembly of all rows, the mixed solve (``ExtraRows.solve``) and ``v1``."""
        model, data, dt, nv = self.model, self.__dict__.get("_data"), self.dt, self.model.nv
        cb = self.constraints
        limits = cb.active_limits(q, v, dt)
        trees = self.__dict__.get("_trees")
        Minv = pin.computeMinverse(model, data, q) if trees is None else trees.minverse(q)
        if nv == 1:
            Minv = Minv.reshape(1, 1)
        # (v: Newton's impact law of restitution contacts, as on the path without these rows)
        pre = self.__dict__.get("_toi_pass")
        cons, G0, g0, MJt0, Ms = cb.assemble(Jw, contacts, limits, dt, Minv, v_free, v,
                                             consumed_time(pre) if pre else None,
                                             depenetration_speed(self.solver), drift=drift)
        if self._mocap is not None:
            self._mocap_offsets(cons, g0)
        nc, nl = cons.nc, len(cons.limits)
        MJx = Ms @ xrows.J.T
        J = np.vstack([cons.J, xrows.J])
        b = np.concatenate([cons.b, xrows.b])
        MJt = np.hstack([Ms @ cons.J.T, MJx])
        G = J @ MJt
        G = 0.5 * (G + G.T)
        g = J @ v_free + b
        cons.J, cons.b = J, b
        cons.extra = xrows
        lam0, modes0 = self._warm_start(cons) if cons.m > 3 * nc + nl else (None, None)
        if lam0 is not None:
            lam0 = lam0[:3 * nc + nl]
        try:
            lam, sigma, modes, active, its, resid, ok, method, xmode = self._extra.solve(
                self.solver, G, g, nc, nl, cons.mu, xrows, lam0, modes0)
        except np.linalg.LinAlgError as exc:
            raise np.linalg.LinAlgError(f"the constraint solver failed ({exc}); {nc} contacts, "
                                        f"{xrows.m} equality/friction/limit rows") from exc
        xrows.xmode = xmode
        res = SolverResult(lam, sigma, modes, active, its, resid, ok, method + "+rows")
        v1 = v_free + MJt @ lam
        return cons, res, G, g, Ms, v1

    def _mocap_offsets(self, cons, g):
        """The velocity of moving mocap geoms in the offsets of their contacts' rows
        (diffgym.sim.mocap): ``cons.b`` and ``g = J v_free + b`` get ``R_k^T (w2 - w1)``."""
        bb = self._mocap.contact_bias(cons.contacts, cons.frames) if cons.nc else None
        if bb is None:
            return g
        r = 3 * cons.nc
        cons.b = np.array(cons.b, dtype=np.float64)
        cons.b[:r] += bb.reshape(-1)
        g = np.array(g, dtype=np.float64)
        g[:r] += bb.reshape(-1)
        return g

    # -- mocap bodies (diffgym.sim.mocap) ----------------------------------------------------
    @property
    def mocap_names(self) -> tuple:
        """The mocap bodies' names, in file order (their indices for ``set_mocap``)."""
        mz = self.__dict__.get("_mocap")
        return mz.names if mz is not None else ()

    def set_mocap(self, body, pos=None, quat=None, *, vel=None, angvel=None) -> None:
        """Place mocap body ``body`` (name or index) for the next steps, as MuJoCo's
        ``data.mocap_pos[i] = pos; data.mocap_quat[i] = quat``: ``pos`` (3,) world position,
        ``quat`` (4,) world orientation in MuJoCo's order ``w x y z`` (either left as it is when
        None). ``vel`` / ``angvel`` (3,): its world linear velocity (of the body origin) and
        angular velocity during the step, which contacts with it feel; each defaults to the
        finite difference of the pose this call replaces over ``dt``. Pass ``vel=0, angvel=0``
        for a jump (a reset). See :mod:`diffgym.sim.mocap`."""
        mz = self.__dict__.get("_mocap")
        if mz is None:
            raise ValueError(f"{self.sm.source}: the model has no mocap body")
        mz.set(self, body, pos, quat, vel, angvel)

    def mocap_pose(self, body) -> tuple[np.ndarray, np.ndarray]:
        """(pos (3,), quat (4,) ``w x y z``) of mocap body ``body`` (name or index)."""
        mz = self.__dict__.get("_mocap")
        if mz is None:
            raise ValueError(f"{self.sm.source}: the model has no mocap body")
        i = mz.body(body)
        qx = pin.Quaternion(mz.R[i]).coeffs()          # x y z w
        return mz.pos[i].copy(), np.array([qx[3], qx[0], qx[1], qx[2]])

    def mocap_velocity(self, body) -> tuple[np.ndarray, np.ndarray]:
        """(vel (3,), angvel (3,)) of mocap body ``body``: what its contacts feel."""
        mz = self.__dict__.get("_mocap")
        if mz is None:
            raise ValueError(f"{self.sm.source}: the model has no mocap body")
        i = mz.body(body)
        return mz.lin[i].copy(), mz.ang[i].copy()

    def _record_extra(self, cons, res, xrows) -> None:
        """sim.last's fields of the diffgym.sim.equality rows (``constraint_labels``,
        ``constraint_impulses``, ``constraint_modes``); ``limit_impulses`` / ``limit_active``
        keep only the joint-limit rows."""
        d = self.last.__dict__
        if cons is None or getattr(cons, "extra", None) is None:
            d["constraint_labels"], d["constraint_impulses"], d["constraint_modes"] = [], np.zeros(0), []
            return
        nc, nl = cons.nc, len(cons.limits)
        s0 = 3 * nc + nl
        d["limit_impulses"] = res.lam[3 * nc:s0].copy()
        d["limit_active"] = np.asarray(res.limit_active[:nl], dtype=bool).copy()
        d["constraint_labels"] = list(xrows.labels)
        d["constraint_impulses"] = res.lam[s0:].copy()
        names = {0: "active", 1: "sliding", -1: "sliding", 2: "inactive"}
        d["constraint_modes"] = [("equality" if k == 0 else "sticking" if (k == 1 and x == 0)
                                  else names[x]) for k, x in zip(xrows.kind.tolist(),
                                                                 xrows.xmode.tolist())]

    def _long_range_force(self, Jw: np.ndarray) -> np.ndarray:
        """The generalized force of the long-range potential at the current kinematics (the
        potential is built on first use; ``self.long_range`` holds it and its last value)."""
        lr = self.__dict__.get("long_range")
        mode = self.gradient
        if (lr is None or lr.model is not self.model or lr.scale != float(mode.scale)
                or lr.margin != float(mode.margin)):      # (a new model, or a new scale/margin)
            from .long_range import LongRangePotential
            lr = self.long_range = LongRangePotential(self, mode)
        lr.value, force = lr.evaluate(self.__dict__.get("_data"), self.geom_data, Jw)
        return force

    @staticmethod
    def _solve(solver, G, g, cons: Constraints, lam0, modes0, v, later_stages: bool = False,
               bias=None):
        """The NCP solve (``later_stages``: stage 1 already failed compiled, from stage 2 on;
        ``bias``: ``NCPSolver.solve``'s), LAPACK failures reported as a SimulationError."""
        if not (np.isfinite(G).all() and np.isfinite(g).all()):
            # (LAPACK would print "DLASCL parameter number 4 had an illegal value" to stderr
            # before failing: the problem is checked first; step() adds the context)
            bad = "G" if not np.isfinite(G).all() else "g"
            raise FloatingPointError(
                f"the contact problem has non-finite entries in {bad} ({cons.nc} contacts, "
                f"|v| = {np.linalg.norm(v):.3g}, max |G| = {np.max(np.abs(G), initial=0.0):.3g})")
        try:
            if later_stages:
                return solver._solve(G, g, cons.nc, cons.mu, lam0, modes0, stage1=False)
            if bias is not None:
                return solver.solve(G, g, cons.nc, cons.mu, lam0, modes0, bias=bias)
            return solver.solve(G, g, cons.nc, cons.mu, lam0, modes0)
        except np.linalg.LinAlgError as exc:     # LAPACK gave up on a degenerate problem
            # (step() adds the model, step and contacts to the SimulationError it becomes)
            raise np.linalg.LinAlgError(f"the contact solver failed ({exc}); {cons.nc} contacts, "
                                        f"|v| = {np.linalg.norm(v):.3g}") from exc

    def _solve_failed_islands(self, solver, G, g, cons: Constraints, island_ok, isl_c, isl_l,
                              lam, sigma, modes, lim_act, its, resid, v) -> SolverResult:
        """The later stages (2-4, in Python) on each island whose compiled stage 1 failed, the
        other islands' solutions kept; the result of the whole problem."""
        lam, sigma = lam.copy(), sigma.copy()
        modes, lim_act = modes.copy(), lim_act.copy()
        nc = cons.nc
        lam0, modes0 = self._warm_start(cons)
        converged, methods = True, []
        for s in np.flatnonzero(~island_ok).tolist():
            cs = np.flatnonzero(isl_c == s)
            ls = np.flatnonzero(isl_l == s)
            rows = np.concatenate([(3 * cs[:, None] + np.arange(3)).ravel(), 3 * nc + ls])
            sub = cons.__class__(cons.J[rows], cons.b[rows], len(cs), cons.mu[cs], cons.frames[cs],
                                 cons.contacts, cons.limits[ls], cons.limit_dist[ls], cons.dist[cs])
            r = self._solve(solver, np.ascontiguousarray(G[np.ix_(rows, rows)]), g[rows], sub,
                            None if lam0 is None else lam0[rows],
                            None if modes0 is None else np.concatenate([modes0[cs], modes0[nc + ls]]),
                            v, later_stages=True)
            lam[rows], sigma[rows] = r.lam, r.sigma
            modes[cs], lim_act[ls] = r.modes, r.limit_active
            its += r.iterations
            resid = max(resid, r.residual)
            converged &= bool(r.converged)
            methods.append(r.method)
        # the most common label; a tie goes to the later stage (not to the iteration order of a
        # set of strings, which Python's per-process hash seed decides: the same step was
        # labelled "pinadmm+newton" in one process and "ssn+newton" in another)
        method = max(methods, key=lambda m: (methods.count(m), _STAGE_RANK.get(m, -1), m)) \
            if methods else "newton"
        return SolverResult(lam, sigma, modes, lim_act, its, resid, converged, method)

    def _warm_start(self, cons: Constraints):
        """Impulses and modes of the previous step for the contacts (same pair and point) and
        limits found again; (None, None) when none is."""
        w = self._warm
        if w is None:
            return None, None
        c = cons.contacts
        lam0, modes, found = _match_warm_start(*w, c.pair, c.point, cons.dist, cons.limits,
                                               cons.limit_dist)
        return (lam0, modes) if found else (None, None)

    def _record(self, cons: Constraints | None, res: SolverResult | None,
                warm_modes: np.ndarray | None = None, islands: int = 1) -> None:
        if cons is None:
            self._warm = None
            self.last = StepInfo._lazy(None, _NO_RESULT, self.sm)
            return
        c = cons.contacts
        # the warm start of the next step: impulses and modes per (pair, point) and per limit
        # (the step's own arrays: nothing writes to them afterwards)
        modes = res.modes if warm_modes is None else warm_modes
        self._warm = (c.pair, c.point, res.lam,
                      modes if modes.dtype == _I64 else modes.astype(np.int64),
                      cons.limits, res.limit_active)
        self.last = StepInfo._lazy(cons, res, self.sm, islands)
        if not res.converged and not self._warned:
            self._warned = True
            warnings.warn(f"contact solver did not converge: residual {res.residual:.3e} m/s after "
                          f"{res.iterations} iterations (tolerance {self.solver.settings.tol:.1e}); "
                          "see sim.last.converged", SolverWarning, stacklevel=5)

    def rollout(self, q, v, taus):
        """Simulate len(taus) steps; returns arrays of q (T+1, nq) and v (T+1, nv)."""
        qs, vs = [np.asarray(q, float)], [np.asarray(v, float)]
        for tau in taus:
            q, v = self.step(q, v, tau)
            qs.append(q)
            vs.append(v)
        return np.array(qs), np.array(vs)


# (at the end: island_step reads this module's compiled warm start)
from .island_step import BlockCache, block_step  # noqa: E402
from .support_drift import fixed_point as support_fixed_point  # noqa: E402
