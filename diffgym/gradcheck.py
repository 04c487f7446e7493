"""Gradient audit: analytical step Jacobians against central differences at visited states.

Two public entry points share one implementation:

    report = diffgym.check_step_jacobians(sim_or_env, ...)     # a Simulator or any DiffEnv
    report = diffgym.envs.check_jacobians(env, states=..., ...)  # the same, for environments

For a :class:`~diffgym.Simulator` the audit checks the six blocks ``dq_dq, dq_dv, dq_dtau, dv_dq,
dv_dv, dv_dtau`` of ``sim.step(q, v, tau, jacobian=True)`` at given ``(q, v, tau)`` states or at
the states of a rollout (given or random generalized forces). For an environment (a
:class:`diffgym.envs.base.DiffEnv`, or a Gymnasium wrapper around one) it checks the five blocks
of ``step_with_jacobian`` (``state_state, state_action, reward_state, reward_action,
obs_state``) at given states or along an episode of random (or given) actions, and, at every
audited environment step, the simulator's six blocks at each sub-step of the frame skip (the
``(q, v, tau)`` and contact warm start of every sub-step are recorded while the step runs, see
:func:`record_substeps`).

**The comparison.** Every column of every block (one input coordinate, in tangent coordinates:
pinocchio's ``q (+) dq`` for configurations) is compared with central differences of the whole
step at the step sizes ``eps`` (default ``1e-6, 1e-5, 1e-7, 1e-4``: each column is compared at
1e-6 first and at the others only while it does not agree, unless ``adaptive=False``; 1e-4
rescues columns whose differences are limited by rounding and solver noise). Each
perturbed step starts from the same contact warm start as the unperturbed one, so hidden
solver state cannot make the differences disagree.

**The error measure** of column ``j`` of block ``B`` (analytic ``A``, differences ``F``) is
column-wise relative with a floored scale::

    err_j = max_i |A_ij - F_ij| / max(|A_j|_inf, |F_j|_inf, floor * |B|_inf, resolution(h))

``floor`` (default 1e-3) keeps a column of tiny entries next to large ones from blowing up (it
is then judged relative to a thousandth of the block); ``resolution(h) = 1e-9 * max(1, |y|_inf)
/ h`` is the smallest derivative a central difference of outputs of size ``|y|`` at step ``h``
can resolve in double precision (about 1e7 units of rounding), so an entry that rounding
swamps is judged against what the difference can see. A column *agrees* when its error is at
most ``tol`` (default 1e-6) at one of the step sizes.

**Mode switches.** A column that does not agree is *explained* only when, at one of the step
sizes, the two one-sided differences ``(y(x+h) - y(x))/h`` and ``(y(x) - y(x-h))/h`` disagree
with each other by more than ``jump_min`` (1e-3, relative as above: a kink of the step map inside
the stencil, such as a contact making or breaking, a mode changing, a limit engaging, a clip;
100 ``tol`` where the solver's modes at ``x + h`` or ``x - h`` are seen to differ from those at
``x``) and the analytic column matches one of them to within ``max(tol, 1e-2 * jump)``. Everything else
*fails*. Each finding names the model, environment step, sub-step, block, column (with its joint
name), the errors at every step size, the one-sided jump and match, whether the solver's
contact/limit modes differed at the perturbed states, and the contact modes and active limits
at the state.

**Indeterminate velocity.** Where the step's velocity itself is not unique there is no
derivative to check: a column of a simulator state that does not agree and is not explained is
*indeterminate* (not failed) when the mode system of the contact problem has a null direction z
of the impulses that moves the velocity (``G z != 0`` beyond rounding; see
:func:`velocity_indeterminacy`), e.g. a box face sliding and spinning on four coplanar points,
whose split of normal impulse changes the friction torque; the solver returns the member of the
family its warm start leads to (where its stage 1 or 1b solves the step; where stage 1c does,
the limit of the uniformly compliant problems: ``diffgym/sim/solver.py``), and central
differences of it converge as h shrinks only to a limit that depends on the warm start (from the
step's own solution they match the analytic entry; from a cold start they reach another member's
derivative) or, in stage 1c, to the derivative of that selection, which the analytic entry (the
minimum-norm solution of the mode equations) is not.
Redundant impulses that leave the velocity alone (a face resting or sliding without spin) are
determinate and are checked as usual. An environment step is classified the same way, by the
same test at each of its frame-skip sub-steps: a disagreement of its state and reward blocks
that no mode switch explains is indeterminate when a sub-step's velocity is (the finding names
the sub-step); the observation block, a function of the next state alone, is always checked.

The result is a :class:`GradientReport` (counts of columns checked, agreeing, explained,
indeterminate and failed; per-block worst errors; the findings; a readable table) and ``raise_on_failure=True``
raises :class:`JacobianMismatchError` with that table.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import pinocchio as pin

SIM_BLOCKS = ("dq_dq", "dq_dv", "dq_dtau", "dv_dq", "dv_dv", "dv_dtau")
ENV_BLOCKS = ("state_state", "state_action", "reward_state", "reward_action", "obs_state")
DEFAULT_EPS = (1e-6, 1e-5, 1e-7, 1e-4)
DEFAULT_TOL = 1e-6
DEFAULT_FLOOR = 1e-3
RESOLUTION = 1e-9
JUMP_MIN = 1e-3
JUMP_SEEN_TOL = 100.0
MATCH_FRACTION = 1e-2


class JacobianMismatchError(AssertionError):
    """An audited Jacobian disagrees with central differences without a mode switch to explain it."""


# -- the report ----------------------------------------------------------------------------------

@dataclass
class Finding:
    """One block column that did not agree with central differences."""

    status: str                 # "explained", "indeterminate" or "failed"
    model: str
    step: int | None            # environment / rollout step (None: a given state)
    substep: int | None         # sub-step of the frame skip (None: the environment step itself)
    block: str
    column: int
    column_name: str
    error: float                # the smallest central-difference error over the step sizes
    errors: dict                # step size -> central-difference error
    row: int                    # the row of the largest error at the best step size
    analytic: float             # A[row, column]
    central: float              # the central difference there (best step size)
    jump: float                 # largest one-sided disagreement over the step sizes (relative)
    match: float                # the analytic column against the nearer one-sided difference
    side: str                   # "+" / "-": the one-sided difference the analytic one matches
    mode_change: bool           # the solver's contacts/modes/limits differed at x +- h
    modes: str                  # contact modes and active limits at the state
    indeterminate: str = ""     # why the step's velocity is not unique at the state (or "")

    def where(self) -> str:
        s = self.model
        if self.step is not None:
            s += f" step {self.step}"
        if self.substep is not None:
            s += f" sub-step {self.substep}"
        return s

    def __str__(self) -> str:
        errs = ", ".join(f"{h:.0e}: {e:.2e}" for h, e in sorted(self.errors.items(), reverse=True))
        extra = (f"; one-sided differences differ by {self.jump:.2e}" +
                 (f", analytic matches the {self.side} side to {self.match:.2e}" if self.side else
                  f", analytic matches neither (nearer: {self.match:.2e})"))
        return (f"{self.status.upper()}: {self.where()}, {self.block} column {self.column} "
                f"({self.column_name}): relative error {self.error:.2e} (by step size {errs}); worst "
                f"row {self.row}: analytic {self.analytic:.6g}, central difference {self.central:.6g}"
                f"{extra}; modes at x +- h {'changed' if self.mode_change else 'unchanged'}; "
                f"state: {self.modes}"
                + (f"; velocity not unique: {self.indeterminate}" if self.indeterminate else ""))


@dataclass
class _BlockStats:
    checked: int = 0
    agreeing: int = 0
    explained: int = 0
    indeterminate: int = 0
    failed: int = 0
    worst_agreeing: float = 0.0       # the largest error among agreeing columns
    worst_unexplained: float = 0.0
    decades: dict = field(default_factory=dict)   # floor(log10(best error)) -> columns


@dataclass
class GradientReport:
    """What an audit found. Counts are of block columns (one input coordinate of one block at
    one state)."""

    tol: float = DEFAULT_TOL
    states: int = 0                   # audited states (environment steps or simulator states)
    substeps: int = 0                 # audited simulator sub-steps inside environment steps
    skipped: int = 0                  # states skipped (the step diverged)
    visited: int = 0                  # states visited by the rollouts (audited or not)
    episodes_ended: int = 0           # environment rollouts run to termination or truncation
    blocks: dict = field(default_factory=dict)     # block -> _BlockStats
    findings: list = field(default_factory=list)   # Finding, explained and failed
    models: list = field(default_factory=list)

    # counts
    @property
    def checked(self) -> int:
        return sum(b.checked for b in self.blocks.values())

    @property
    def agreeing(self) -> int:
        return sum(b.agreeing for b in self.blocks.values())

    @property
    def explained(self) -> int:
        return sum(b.explained for b in self.blocks.values())

    @property
    def indeterminate(self) -> int:
        return sum(b.indeterminate for b in self.blocks.values())

    @property
    def failed(self) -> int:
        return sum(b.failed for b in self.blocks.values())

    @property
    def ok(self) -> bool:
        return self.failed == 0

    @property
    def failures(self) -> list:
        return [f for f in self.findings if f.status == "failed"]

    @property
    def worst_unexplained(self) -> Finding | None:
        fails = self.failures
        return max(fails, key=lambda f: f.error) if fails else None

    @property
    def worst_agreeing_error(self) -> float:
        return max((b.worst_agreeing for b in self.blocks.values()), default=0.0)

    def _stats(self, block: str) -> _BlockStats:
        if block not in self.blocks:
            self.blocks[block] = _BlockStats()
        return self.blocks[block]

    def merge(self, other: "GradientReport") -> "GradientReport":
        """Add another report's counts and findings to this one (returns self)."""
        self.states += other.states
        self.substeps += other.substeps
        self.skipped += other.skipped
        self.visited += other.visited
        self.episodes_ended += other.episodes_ended
        for k, b in other.blocks.items():
            s = self._stats(k)
            s.checked += b.checked
            s.agreeing += b.agreeing
            s.explained += b.explained
            s.indeterminate += b.indeterminate
            s.failed += b.failed
            s.worst_agreeing = max(s.worst_agreeing, b.worst_agreeing)
            s.worst_unexplained = max(s.worst_unexplained, b.worst_unexplained)
            for d, n in b.decades.items():
                s.decades[d] = s.decades.get(d, 0) + n
        self.findings.extend(other.findings)
        for m in other.models:
            if m not in self.models:
                self.models.append(m)
        return self

    def error_histogram(self) -> str:
        """How many columns had their best central-difference error in each decade."""
        dec: dict = {}
        for b in self.blocks.values():
            for d, n in b.decades.items():
                dec[d] = dec.get(d, 0) + n
        return "  ".join(f"1e{d}: {dec[d]}" for d in sorted(dec))

    def raise_if_failed(self) -> "GradientReport":
        if not self.ok:
            raise JacobianMismatchError(str(self))
        return self

    def __str__(self) -> str:
        lines = [f"gradient audit of {', '.join(self.models) or '?'}: {self.states} states"
                 + (f" of {self.visited} visited" if self.visited else "")
                 + (f" + {self.substeps} sub-steps" if self.substeps else "")
                 + (f" ({self.skipped} skipped: diverged)" if self.skipped else "")
                 + f", tolerance {self.tol:.0e} relative",
                 f"{'block':<14}{'checked':>9}{'agree':>9}{'explained':>11}{'failed':>8}"
                 f"{'worst agreeing':>16}{'worst failed':>14}"]
        for k, b in self.blocks.items():
            lines.append(f"{k:<14}{b.checked:>9}{b.agreeing:>9}{b.explained:>11}{b.failed:>8}"
                         f"{b.worst_agreeing:>16.2e}"
                         f"{(f'{b.worst_unexplained:.2e}' if b.failed else '-'):>14}")
        lines.append(f"{'total':<14}{self.checked:>9}{self.agreeing:>9}{self.explained:>11}"
                     f"{self.failed:>8}")
        fails = sorted(self.failures, key=lambda f: -f.error)
        if fails:
            lines.append(f"{len(fails)} unexplained disagreement(s), worst first:")
            lines += ["  " + str(f) for f in fails[:10]]
            if len(fails) > 10:
                lines.append(f"  ... and {len(fails) - 10} more")
        expl = [f for f in self.findings if f.status == "explained"]
        if expl:
            lines.append(f"{len(expl)} explained by a mode switch inside the stencil, e.g.:")
            lines += ["  " + str(f) for f in sorted(expl, key=lambda f: -f.error)[:3]]
        ind = [f for f in self.findings if f.status == "indeterminate"]
        if ind:
            lines.append(f"{len(ind)} at states where the step's velocity is not unique (no "
                         "derivative to check), e.g.:")
            lines += ["  " + str(f) for f in sorted(ind, key=lambda f: -f.error)[:3]]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"GradientReport(models={self.models}, states={self.states}, substeps={self.substeps}"
                f", checked={self.checked}, agreeing={self.agreeing}, explained={self.explained}, "
                f"indeterminate={self.indeterminate}, failed={self.failed})")


# -- the comparison engine -------------------------------------------------------------------------

class _Settings:
    def __init__(self, eps, tol, floor, adaptive):
        eps = tuple(float(h) for h in np.atleast_1d(eps))
        if not eps or any(not (np.isfinite(h) and h > 0) for h in eps):
            raise ValueError(f"eps must be one or more positive step sizes, got {eps!r}")
        if not (np.isfinite(tol) and tol > 0):
            raise ValueError(f"tol must be a positive number, got {tol!r}")
        if not (np.isfinite(floor) and 0 <= floor < 1):
            raise ValueError(f"floor must be in [0, 1), got {floor!r}")
        self.eps, self.tol, self.floor, self.adaptive = eps, float(tol), float(floor), bool(adaptive)


def _audit_problem(report: GradientReport, settings: _Settings, *, model: str, step, substep,
                   groups: dict, outputs: dict, blocks: dict, run, modes: str, base_signature,
                   indeterminate: str = ""):
    """Compare the analytic blocks of one state with differences.

    groups: input group -> (dimension, column names); outputs: output -> magnitude |y|_inf;
    blocks: name -> (output, group, analytic matrix (rows, cols)); run(group, j, delta) ->
    ({output: y(x + delta e_j) (-) y(x) as a vector}, signature of the solver's modes)."""
    by_group: dict = {}
    for name, (out, grp, A) in blocks.items():
        by_group.setdefault(grp, []).append((name, out, np.atleast_2d(np.asarray(A, dtype=float))))
    for grp, (dim, names) in groups.items():
        blist = by_group.get(grp, [])
        if not blist:
            continue
        bscale = {name: max(float(np.max(np.abs(A), initial=0.0)), 0.0) for name, _, A in blist}
        for j in range(dim):
            evals = {}            # h -> (plus outputs, minus outputs)
            changed = False
            status = {}
            for k, h in enumerate(settings.eps):
                plus, sig_p = run(grp, j, h)
                minus, sig_m = run(grp, j, -h)
                changed |= (sig_p != base_signature) or (sig_m != base_signature)
                evals[h] = (plus, minus)
                done = True
                for name, out, A in blist:
                    a = A[:, j]
                    c = (plus[out] - minus[out]) / (2 * h)
                    err = _col_error(a, c, settings.floor * bscale[name],
                                     RESOLUTION * max(1.0, outputs[out]) / h)
                    status.setdefault(name, {})[h] = err
                    if min(status[name].values()) > settings.tol:
                        done = False
                if done and settings.adaptive:
                    break
            for name, out, A in blist:
                a = A[:, j]
                errs = status[name]
                st = report._stats(name)
                st.checked += 1
                best_h = min(errs, key=errs.get)
                best = errs[best_h]
                dec = int(np.floor(np.log10(best))) if best > 0 else -16
                st.decades[max(dec, -16)] = st.decades.get(max(dec, -16), 0) + 1
                if best <= settings.tol:
                    st.agreeing += 1
                    st.worst_agreeing = max(st.worst_agreeing, best)
                    continue
                # one-sided differences
                jump_best, match_best, side_best, explained = 0.0, np.inf, "", False
                for h, (plus, minus) in evals.items():
                    fp = plus[out] / h
                    fm = -minus[out] / h
                    s = _scale(a, 0.5 * (fp + fm), settings.floor * bscale[name],
                               RESOLUTION * max(1.0, outputs[out]) / h)
                    jump = float(np.max(np.abs(fp - fm))) / s
                    mp = float(np.max(np.abs(a - fp))) / s
                    mm = float(np.max(np.abs(a - fm))) / s
                    match, side = (mp, "+") if mp <= mm else (mm, "-")
                    # a kink is evidenced by a jump of JUMP_MIN, or, where the solver's modes
                    # at x + h or x - h differ from those at x (a switch seen, not inferred), by a
                    # jump of JUMP_SEEN_TOL tolerances
                    need = min(JUMP_MIN, JUMP_SEEN_TOL * settings.tol) if changed else JUMP_MIN
                    ok = jump > need and match <= max(settings.tol, MATCH_FRACTION * jump)
                    if ok and not explained:
                        jump_best, match_best, side_best, explained = jump, match, side, True
                    elif not explained and jump > jump_best:
                        jump_best, match_best = jump, match
                plus, minus = evals[best_h]
                c = (plus[out] - minus[out]) / (2 * best_h)
                row = int(np.argmax(np.abs(a - c)))
                verdict = "explained" if explained else ("indeterminate" if indeterminate else "failed")
                f = Finding(status=verdict, model=model, step=step,
                            substep=substep, block=name, column=j, column_name=groups[grp][1][j],
                            error=best, errors=dict(errs), row=row, analytic=float(a[row]),
                            central=float(c[row]), jump=jump_best, match=match_best,
                            side=side_best if explained else "", mode_change=bool(changed),
                            modes=modes, indeterminate=indeterminate if verdict == "indeterminate" else "")
                if explained:
                    st.explained += 1
                elif indeterminate:
                    st.indeterminate += 1
                else:
                    st.failed += 1
                    st.worst_unexplained = max(st.worst_unexplained, best)
                report.findings.append(f)


def _scale(a, c, floor_abs, resolution) -> float:
    return max(float(np.max(np.abs(a), initial=0.0)), float(np.max(np.abs(c), initial=0.0)),
               floor_abs, resolution, 1e-300)


def _col_error(a, c, floor_abs, resolution) -> float:
    return float(np.max(np.abs(a - c), initial=0.0)) / _scale(a, c, floor_abs, resolution)


# -- simulator states ------------------------------------------------------------------------------

def _tangent_names(model) -> list:
    names = []
    for j in range(1, model.njoints):
        jm = model.joints[j]
        for k in range(jm.nv):
            names.append(model.names[j] + (f"[{k}]" if jm.nv > 1 else ""))
    return names


def _sim_signature(sim):
    last = sim.last
    return (tuple(last.contact_geoms), tuple(last.contact_modes),
            tuple(last.limit_joints), tuple(bool(b) for b in last.limit_active), bool(last.converged),
            tuple(last.__dict__.get("constraint_modes", ())))


def describe_modes(sim) -> str:
    """The contacts (geom pair, mode, gap) and joint limits (active or not) of the last step;
    contacts found inside the margin that stay open (breaking, zero impulse) are counted."""
    last = sim.last
    parts, open_ = [], 0
    for (g1, g2), m, d in zip(last.contact_geoms, last.contact_modes, last.contact_distances):
        if m == "breaking" and len(last.contact_modes) > 6:
            open_ += 1
            continue
        parts.append(f"{g1}/{g2} {m} (gap {d:.1e})")
    if open_:
        parts.append(f"{open_} more breaking")
    for jn, act, lam in zip(last.limit_joints, last.limit_active, last.limit_impulses):
        parts.append(f"limit {jn} {'active' if act else 'inactive'} (impulse {lam:.2e})")
    if not last.converged:
        parts.append(f"solver NOT converged ({last.method}, residual {last.residual:.1e})")
    return "; ".join(parts) if parts else "no contact, no limit"


# a direction z of the linearized contact problem (the mode system A: A z = 0) is a family of
# solutions; it leaves the velocity alone when M^-1 J^T z = 0, i.e. G z = J M^-1 J^T z = 0
# (redundant normal impulses of a resting or purely translating face: |G z| / |G| ~ 3e-16,
# rounding), and moves it otherwise (a box sliding on a face and spinning at 1e-3 rad/s:
# 2e-5; at 1e-9 rad/s: 5e-10)
NULL_REL = 1e-10          # singular values of A below this fraction of the largest: null
VELOCITY_REL = 1e-12      # |G z|_inf above this fraction of |G|_max: the family moves the velocity


def velocity_indeterminacy(sim) -> str:
    """Why the velocity of the step ``sim`` just took is not unique, or "" when it is.

    With four coplanar sliding contacts of a spinning box the split of normal impulse is free
    (the mode system is singular) and, the friction of each point being mu times its share in
    its own slip direction, the split changes the friction torque and so the velocity: the NCP
    has a one-parameter family of solutions, the solver returns one of them (which depends on
    its warm start, hidden state) and there is no step derivative to compare with (central
    differences of the returned velocity converge only to a limit that depends on the warm
    start: scripts/repro_box_jacobian.py shows three). A singular mode system
    whose null directions leave the velocity alone (four sticking or purely sliding points)
    is determinate and is not reported."""
    from .sim import derivatives as D
    C = sim.cache
    cons, res, G = C.get("cons"), C.get("res"), C.get("G")
    if cons is None or res is None or G is None or not getattr(cons, "m", 0) or not cons.nc:
        return ""
    A, _ = D._mode_system(res, G, cons.nc, cons.mu)
    # rows to unit length first (the null space is the same): the mode system's rows are scaled
    # for the solve, and a sliding contact's slip-magnitude row at a slip of 5e-10 under a large
    # normal impulse is ~1e-11 of the others, which a relative cut-off took for a null direction
    # of the tangential impulse (a creeping 10 t block, translating, was called indeterminate)
    rn = np.sqrt(np.einsum("ij,ij->i", A, A))
    A = A / np.where(rn > 0.0, rn, 1.0)[:, None]
    _, s, Vt = np.linalg.svd(A)
    if not len(s) or s[0] == 0.0:
        return ""
    N = Vt[s <= NULL_REL * s[0]]
    if not len(N):
        return ""
    gn = float(np.max(np.abs(G)))
    worst = max(float(np.max(np.abs(G @ z))) for z in N)
    if worst <= VELOCITY_REL * gn:
        return ""
    return (f"the mode system has {len(N)} null direction(s) of the impulses that change the "
            f"velocity (|G z| / |G| = {worst / gn:.1e}): a non-unique split of the impulses "
            "(e.g. coplanar sliding contacts of a spinning face)")


def _audit_sim_state(report, settings, sim, q, v, tau, warm, *, model, step, substep):
    """Audit the six blocks of one simulator step from (q, v, tau) and a warm start."""
    sim.set_warm_start_state(warm)
    q1, v1, jac = sim.step(q, v, tau, jacobian=True)
    base_sig = _sim_signature(sim)
    modes = describe_modes(sim)
    nv = sim.nv
    names = _tangent_names(sim.model)

    def run(grp, j, delta):
        dq = np.zeros(nv)
        dq[j] = delta
        qq, vv, tt = q, v, tau
        if grp == "q":
            qq = pin.integrate(sim.model, q, dq)
        elif grp == "v":
            vv = v + dq
        else:
            tt = tau + dq
        sim.set_warm_start_state(warm)
        qa, va = sim.step(qq, vv, tt)
        return {"q": pin.difference(sim.model, q1, qa), "v": va - v1}, _sim_signature(sim)

    groups = {"q": (nv, [f"dq {n}" for n in names]), "v": (nv, [f"v {n}" for n in names]),
              "tau": (nv, [f"tau {n}" for n in names])}
    outputs = {"q": float(np.max(np.abs(q1))), "v": float(np.max(np.abs(v1)))}
    # (block name dX_dY: output X, input group Y)
    blocks = {b: (b[1], b.split("_d")[1], getattr(jac, b)) for b in SIM_BLOCKS}
    _audit_problem(report, settings, model=model, step=step, substep=substep, groups=groups,
                   outputs=outputs, blocks=blocks, run=run, modes=modes, base_signature=base_sig,
                   indeterminate=velocity_indeterminacy(sim))
    # leave the simulator as the unperturbed step left it
    sim.set_warm_start_state(warm)
    sim.step(q, v, tau)


class _SubstepRecords(list):
    """The records of record_substeps, with ``indeterminate``: per sub-step the verdict of
    :func:`velocity_indeterminacy` ("" where the velocity is unique; filled only when asked)."""

    def __init__(self):
        super().__init__()
        self.indeterminate: list = []


def step_differences(sim, q, v, tau, eps: float, *, warm=None, tau_scale: float = 1.0):
    """Central and one-sided differences of the whole step ``sim.step(q, v, tau)``, every block
    of SIM_BLOCKS: ``(central, forward, backward)``, dicts block -> (nv, nv). q is perturbed in
    the tangent space (``pinocchio.integrate``, outputs compared with ``pinocchio.difference``),
    v by ``eps``, tau by ``eps * tau_scale``; every step starts from the warm start ``warm``
    (a ``sim.warm_start_state()``; None: cold), so hidden solver state cannot differ. The raw
    differences behind the audit, for scripts and tests that tabulate errors themselves."""
    nv = sim.nv
    q, v, tau = (np.asarray(a, dtype=float) for a in (q, v, tau))

    def run(qq, vv, tt):
        sim.set_warm_start_state(warm)
        return sim.step(qq, vv, tt)

    cen, fwd, bwd = ({k: np.zeros((nv, nv)) for k in SIM_BLOCKS} for _ in range(3))
    q0, v0 = run(q, v, tau)
    for i in range(nv):
        for name, h in (("q", eps), ("v", eps), ("tau", eps * tau_scale)):
            e = np.zeros(nv)
            e[i] = h
            if name == "q":
                plus, minus = ((pin.integrate(sim.model, q, e), v, tau),
                               (pin.integrate(sim.model, q, -e), v, tau))
            elif name == "v":
                plus, minus = (q, v + e, tau), (q, v - e, tau)
            else:
                plus, minus = (q, v, tau + e), (q, v, tau - e)
            qa, va = run(*plus)
            qb, vb = run(*minus)
            for blk, a, b, z in (("dq_d" + name, qa, qb, q0), ("dv_d" + name, va, vb, v0)):
                if blk[1] == "q":
                    da, db = pin.difference(sim.model, z, a), pin.difference(sim.model, b, z)
                else:
                    da, db = a - z, z - b
                cen[blk][:, i] = (da + db) / (2 * h)
                fwd[blk][:, i] = da / h
                bwd[blk][:, i] = db / h
    return cen, fwd, bwd


def step_jacobian_errors(sim, q, v, tau, *, warm=None, tau_scale: float = 1.0,
                         eps=(1e-4, 1e-5, 1e-6), skip_q=()):
    """``(jac, errors, one_sided)`` of the step from (q, v, tau) (warm start ``warm``): per
    block the smallest, over the step sizes ``eps``, of the analytical Jacobian's largest
    deviation from central differences relative to the block's largest difference; and the
    largest disagreement of the one-sided differences on the same scale (a mode switch inside
    the stencil shows there). ``skip_q``: q columns left out of the ``*_dq`` blocks. A cruder,
    block-wise measure than the audit's, for tables of many states."""
    sim.set_warm_start_state(warm)
    sim.step(q, v, tau)
    from .sim.derivatives import step_jacobian
    jac = step_jacobian(sim)
    errors = {k: np.inf for k in SIM_BLOCKS}
    one_sided = {k: 0.0 for k in SIM_BLOCKS}
    keep = [i for i in range(sim.nv) if i not in set(skip_q)]
    for h in eps:
        c, p, m = step_differences(sim, q, v, tau, h, warm=warm, tau_scale=tau_scale)
        for k in SIM_BLOCKS:
            cols = keep if k.endswith("_dq") else list(range(sim.nv))
            C, A = c[k][:, cols], getattr(jac, k)[:, cols]
            scale = max(float(np.abs(C).max(initial=0.0)), 1e-12)
            errors[k] = min(errors[k], float(np.abs(A - C).max(initial=0.0)) / scale)
            one_sided[k] = max(one_sided[k],
                               float(np.abs(p[k][:, cols] - m[k][:, cols]).max(initial=0.0)) / scale)
    return jac, errors, one_sided


@contextlib.contextmanager
def record_substeps(sim, indeterminacy: bool = False):
    """Record the ``(q, v, tau, warm start, signature)`` of every ``sim.step`` made inside the
    block (an environment's frame-skip sub-steps), into the yielded list. The simulator's own
    ``step`` is restored afterwards. With ``indeterminacy``, the list's ``indeterminate``
    attribute gets :func:`velocity_indeterminacy` of each sub-step (why its velocity is not
    unique, or "").

        with record_substeps(env.unwrapped.sim) as subs:
            env.unwrapped.step(action)
        for q, v, tau, warm, sig in subs: ...
    """
    records = _SubstepRecords()
    step = sim.step
    own = sim.__dict__.get("step")          # (a step already patched on this instance stays)

    def recording_step(q, v, tau, jacobian=False):
        warm = sim.warm_start_state()
        out = step(q, v, tau, jacobian=jacobian)
        records.append((np.array(q, dtype=float), np.array(v, dtype=float),
                        np.array(tau, dtype=float), warm, _sim_signature(sim)))
        if indeterminacy:
            records.indeterminate.append(velocity_indeterminacy(sim))
        return out

    sim.step = recording_step
    try:
        yield records
    finally:
        if own is None:
            del sim.step       # (the instance attribute shadowed the method)
        else:
            sim.step = own


# -- environments ----------------------------------------------------------------------------------

def _env_names(env) -> tuple:
    tn = _tangent_names(env.sim.model)
    xs = [f"dq {n}" for n in tn] + [f"v {n}" for n in tn] + [f"extra[{k}]" for k in range(env.n_diff)]
    return xs, [f"a[{k}]" for k in range(env.n_a)]


def _audit_env_step(report, settings, env, snap, action, *, model, step, substeps):
    """Audit the five environment blocks of one step from a snapshot, and the sub-steps."""
    env.restore(snap)
    sim = env.sim
    with record_substeps(sim, indeterminacy=True) as subs:
        obs, r, term, trunc, info, jac = env.step_with_jacobian(action)
    if info.get("diverged"):
        report.skipped += 1
        return
    x_next = env.get_state()
    x0 = snap["state"]
    a0 = np.asarray(action, dtype=float)
    sig0 = tuple(s[4] for s in subs)
    modes = " | ".join(f"sub-step {k}: {describe_modes_from(s[4])}" for k, s in enumerate(subs))
    # the step's next state is not unique where a sub-step's velocity is not (the same verdict
    # as a simulator state's, velocity_indeterminacy): its disagreements are indeterminate
    indeterminate = "; ".join(f"sub-step {k}: {w}" for k, w in enumerate(subs.indeterminate) if w)
    xnames, anames = _env_names(env)

    def run(grp, j, delta):
        x, a = x0, a0
        if grp == "x":
            dx = np.zeros(env.n_x)
            dx[j] = delta
            x = env.integrate_state(x0, dx)
        else:
            a = a0.copy()
            a[j] += delta
        env.restore(dict(snap, state=x))
        with record_substeps(sim) as rec:
            _, rr, *_ = env.step(a)
        xn = env.get_state()
        return ({"state": env.state_difference(x_next, xn), "reward": np.array([rr - r])},
                tuple(s[4] for s in rec))

    groups = {"x": (env.n_x, xnames), "a": (env.n_a, anames)}
    outputs = {"state": float(np.max(np.abs(x_next))), "reward": abs(float(r))}
    blocks = {"state_state": ("state", "x", jac.state_state),
              "state_action": ("state", "a", jac.state_action),
              "reward_state": ("reward", "x", np.asarray(jac.reward_state)[None, :]),
              "reward_action": ("reward", "a", np.asarray(jac.reward_action)[None, :])}
    _audit_problem(report, settings, model=model, step=step, substep=None, groups=groups,
                   outputs=outputs, blocks=blocks, run=run, modes=modes, base_signature=sig0,
                   indeterminate=indeterminate)

    # obs_state: d obs(x_next) / d x_next, by differences of the observation hook
    obs0, _ = env._observe(x_next)

    def run_obs(grp, j, delta):
        dx = np.zeros(env.n_x)
        dx[j] = delta
        o, _ = env._observe(env.integrate_state(x_next, dx))
        return {"obs": np.asarray(o, dtype=float) - obs0}, None

    _audit_problem(report, settings, model=model, step=step, substep=None,
                   groups={"x": (env.n_x, [f"next {n}" for n in xnames])},
                   outputs={"obs": float(np.max(np.abs(obs0), initial=0.0))},
                   blocks={"obs_state": ("obs", "x", jac.obs_state)}, run=run_obs, modes=modes,
                   base_signature=None)
    report.states += 1
    if substeps:
        for k, (q, v, tau, warm, _) in enumerate(subs):
            _audit_sim_state(report, settings, sim, q, v, tau, warm, model=model, step=step,
                             substep=k)
            report.substeps += 1
    # leave the environment where the unperturbed step left it
    env.restore(snap)
    env.step(action)


def describe_modes_from(sig) -> str:
    geoms, modes, ljoints, lact, converged = sig[:5]
    rows = sig[5] if len(sig) > 5 else ()        # modes of equality / friction / limit rows
    parts = [f"{g1}/{g2} {m}" for (g1, g2), m in zip(geoms, modes)
             if not (m == "breaking" and len(modes) > 6)]
    n_open = sum(1 for m in modes if m == "breaking") if len(modes) > 6 else 0
    if n_open:
        parts.append(f"{n_open} more breaking")
    parts += [f"limit {j} {'active' if a else 'inactive'}" for j, a in zip(ljoints, lact)]
    if rows:
        parts.append("rows " + " ".join(rows))
    if not converged:
        parts.append("solver NOT converged")
    return ", ".join(parts) if parts else "free"


def _unwrap(target):
    from diffgym.sim.forward import Simulator
    if isinstance(target, Simulator):
        return target, "sim"
    env = getattr(target, "unwrapped", target)
    if hasattr(env, "step_with_jacobian") and hasattr(env, "snapshot") and hasattr(env, "sim"):
        return env, "env"
    raise TypeError(f"check_step_jacobians needs a diffgym.Simulator or a DiffEnv (or a Gymnasium "
                    f"wrapper of one), got {type(target).__name__}")


def _select(n: int, max_states, rng, priority=()) -> list:
    """Which of n visited states to audit: all, or max_states of them spread evenly over the
    episode (first and last included) after the ``priority`` ones."""
    if max_states is None or max_states >= n:
        return list(range(n))
    max_states = int(max_states)
    chosen = []
    priority = sorted(set(int(i) for i in priority))
    if priority:
        take = min(len(priority), max_states // 2)
        if take:
            for k in np.unique(np.linspace(0, len(priority) - 1, take).round().astype(int)):
                chosen.append(priority[int(k)])
    for i in np.linspace(0, n - 1, max_states).round().astype(int):
        if len(chosen) >= max_states:
            break
        if int(i) not in chosen:
            chosen.append(int(i))
    k = 0
    while len(chosen) < max_states:          # (collisions with the priority ones: fill evenly)
        i = int(round(k * (n - 1) / max(1, max_states - 1) + 0.5)) % n
        k += 1
        while i in chosen:
            i = (i + 1) % n
        chosen.append(i)
    return sorted(chosen)


def check_step_jacobians(target, *, states=None, actions=None, steps: int | None = None,
                         max_states: int | None = None, seed: int = 0, substeps: bool = True,
                         eps=DEFAULT_EPS, tol: float = DEFAULT_TOL, floor: float = DEFAULT_FLOOR,
                         adaptive: bool = True, raise_on_failure: bool = False,
                         name: str | None = None, report: GradientReport | None = None,
                         start=None) -> GradientReport:
    """Audit the analytical step Jacobians of a simulator or environment against central
    differences at visited (or given) states; see the module documentation for the measure.

    target: a :class:`diffgym.Simulator` or a DiffEnv (a Gymnasium wrapper is unwrapped).

    Simulator: ``states`` is a list of ``(q, v, tau)`` (each audited from a cold warm start), or
    None for a rollout of ``steps`` (default 50) steps from ``sim.q0`` at rest with generalized
    forces ``actions`` (a (steps, nv) array) or, when None, random controls uniform in each
    actuator's ctrlrange (``seed``); the warm start is carried along the rollout as in use.

    Environment: ``states`` is a list of full states ``x`` (``env.get_state()`` layout, each
    audited from a cold warm start) with ``actions`` (one per state; random when None), or None
    for an episode from ``env.reset(seed=seed)`` with ``actions`` (a sequence) or random actions
    until it ends or ``steps`` steps. At each audited step the five environment blocks and (with
    ``substeps``) the six simulator blocks at every sub-step of the frame skip are checked.

    ``max_states``: audit at most this many of the visited states: first those where a joint
    limit was active or a contact changed mode, up to half, then evenly spread over the whole
    rollout (first and last step included). ``eps``: the step sizes, in tangent coordinates and
    action/force units; ``tol``: the agreement bound (relative, see the module doc); ``floor``:
    the scale floor relative to the block's largest entry; ``adaptive``: try further step sizes
    only for columns not yet agreeing. ``raise_on_failure``: raise JacobianMismatchError when
    any disagreement is unexplained. ``report``: add to this report instead of a new one.
    ``start``: where a rollout starts: ``(q, v)`` for a simulator (default ``sim.q0`` at rest),
    a full state ``x`` for an environment (set after ``reset(seed=seed)``).
    """
    settings = _Settings(eps, tol, floor, adaptive)
    obj, kind = _unwrap(target)
    mode = getattr(obj if kind == "sim" else obj.sim, "gradient", None)
    from .sim.derivatives import relaxed_derivative
    if mode is not None and relaxed_derivative(mode):
        # central differences of the step are the oracle of the modes whose Jacobian is the
        # step's: exact, and long_range without rho (its force is part of the step)
        raise ValueError(f"check_step_jacobians audits the step's own Jacobian (modes 'exact', "
                         f"'long_range' without rho) against central "
                         f"differences of the step; this {'simulator' if kind == 'sim' else 'environment'}"
                         f" uses gradient mode {mode!r}, whose Jacobian is by design not the "
                         "step's (make it with gradient='exact' to audit it)")
    rep = report if report is not None else GradientReport(tol=settings.tol)
    rng = np.random.default_rng(seed)
    if kind == "sim":
        model = name or (obj.sm.source if getattr(obj.sm, "source", None) else "simulator")
        model = str(model)
        if model not in rep.models:
            rep.models.append(model)
        _check_sim(rep, settings, obj, states, actions, steps, max_states, rng, model, start)
    else:
        model = name or (obj.spec.id if getattr(obj, "spec", None) is not None else type(obj).__name__)
        if model not in rep.models:
            rep.models.append(model)
        _check_env(rep, settings, obj, states, actions, steps, max_states, seed, rng, model,
                   substeps, start)
    if raise_on_failure:
        rep.raise_if_failed()
    return rep


def _check_sim(rep, settings, sim, states, actions, steps, max_states, rng, model, start):
    from diffgym.sim.forward import SimulationError
    nv = sim.nv
    if states is not None:
        items = []
        for k, s in enumerate(states):
            if len(s) not in (3, 4):
                raise ValueError(f"states[{k}] must be (q, v, tau) or (q, v, tau, warm start), "
                                 f"got {len(s)} items")
            q, v, tau = (np.asarray(a, dtype=float) for a in s[:3])
            items.append((q, v, tau, s[3] if len(s) == 4 else None, None))
        for i in _select(len(items), max_states, rng):
            q, v, tau, warm, _ = items[i]
            _audit_sim_state(rep, settings, sim, q, v, tau, warm, model=model, step=None,
                             substep=None)
            rep.states += 1
        return
    steps = 50 if steps is None else int(steps)
    if actions is not None:
        taus = np.asarray(actions, dtype=float)
        if taus.ndim != 2 or taus.shape[1] != nv:
            raise ValueError(f"actions for a simulator are generalized forces (steps, {nv}), got "
                             f"shape {taus.shape}")
        steps = len(taus)
    else:
        taus = np.zeros((steps, nv))
        for t in range(steps):
            ctrl = [rng.uniform(*(a.ctrlrange if a.ctrlrange is not None else (-1.0, 1.0)))
                    for a in sim.actuators]
            if ctrl:
                taus[t] = sim.actuation(ctrl)
    if start is None:
        q, v = sim.q0, np.zeros(nv)
    else:
        q, v = (np.asarray(a, dtype=float).copy() for a in start)
    sim.reset_warmstart()
    visited, priority = [], []
    prev = None
    for t in range(steps):
        warm = sim.warm_start_state()
        try:
            q1, v1 = sim.step(q, v, taus[t])
        except SimulationError:      # a diverged rollout ends here
            break
        sig = _sim_signature(sim)
        visited.append((q, v, taus[t], warm))
        if any(sig[3]) or (prev is not None and sig[1] != prev[1]):
            priority.append(t)
        prev = sig
        q, v = q1, v1
    rep.visited += len(visited)
    for i in _select(len(visited), max_states, rng, priority):
        q, v, tau, warm = visited[i]
        _audit_sim_state(rep, settings, sim, q, v, tau, warm, model=model, step=i, substep=None)
        rep.states += 1


def _check_env(rep, settings, env, states, actions, steps, max_states, seed, rng, model, substeps,
               start):
    arng = np.random.default_rng(seed)

    def random_action():
        return arng.uniform(-1.0, 1.0, env.n_a)

    if states is not None:
        if env._x is None:
            env.reset(seed=seed)
        base = env.snapshot()
        for k, x in enumerate(states):
            a = random_action() if actions is None else np.asarray(actions[k], dtype=float)
            snap = dict(base, state=np.asarray(x, dtype=float), warm_start=None, elapsed=0)
            _audit_env_step(rep, settings, env, snap, a, model=model, step=k, substeps=substeps)
        return
    env.reset(seed=seed)
    if start is not None:
        env.set_state(start)
    visited, priority = [], []
    limit = env.episode_steps if steps is None else int(steps)
    prev = None
    for t in range(limit):
        a = random_action() if actions is None else np.asarray(actions[t], dtype=float)
        snap = env.snapshot()
        with record_substeps(env.sim) as subs:
            _, _, term, trunc, info = env.step(a)
        visited.append((snap, a))
        sigs = [s[4] for s in subs]
        if any(any(s[3]) for s in sigs) or (prev is not None and sigs and sigs[0][1] != prev[1]):
            priority.append(t)
        prev = sigs[-1] if sigs else None
        if term or trunc:
            break
        if actions is not None and t + 1 >= len(actions):
            break
    rep.episodes_ended += int(bool(term or trunc))
    final = env.snapshot()
    rep.visited += len(visited)
    for i in _select(len(visited), max_states, rng, priority):
        snap, a = visited[i]
        _audit_env_step(rep, settings, env, snap, a, model=model, step=i, substeps=substeps)
    env.restore(final)
