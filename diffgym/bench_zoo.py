"""``diffgym bench --zoo``: models nobody here wrote, loaded and simulated next to MuJoCo.

The zoo: every Gymnasium MuJoCo asset (``gymnasium/envs/mujoco/assets``), every dm_control
suite domain XML (``dm_control/suite/*.xml`` as shipped: the suite's Python turns
``swimmer``/``stacker``/``lqr`` templates into bigger models, the files are read as they are)
and example-robot-data robots (Talos, Solo12, ANYmal B and C, Panda, Go1, UR5).

For each model: diffgym loads the file as is. If it refuses it (a ModelError naming what it does
not simulate, :mod:`diffgym.sim.unsupported`), the row says which keys, and the model is loaded
again with ``ignore_unsupported=`` those keys to measure what the refused constructs change.
Both engines then simulate it passively (zero control) for ``--seconds`` (3 s) from the same
state, every velocity coordinate kicked to a value drawn uniformly in [-0.5, 0.5] (seed 0; a
URDF's floating base starts at rest) so that models resting at an equilibrium move, MuJoCo on the same file with its own loader (a URDF is built through
``MjSpec`` as diffgym reads it: free base, ground plane, robot-ground contacts only, see
:mod:`diffgym.bench`; the robots start from their SRDF pose, lifted so the lowest collision geom
is 1 cm above the ground; MJCF models start from MuJoCo's ``qpos0``).

**Quantity compared**: the position of the whole model's centre of mass, every 5 steps; the
column is the largest distance between the two engines over the run (m), after a check of the
total mass (relative difference) and of the centre of mass at t = 0. **Tolerance**: 1e-6 m when
no constraint (contact or joint limit) acts in either engine: both then integrate the same
equations with the same semi-implicit Euler step, joint damping implicit in both (MuJoCo's
default ``eulerdamp``, diffgym's damping folded into the velocity update), so only rounding
separates them. When contacts or limits act, 5 cm: MuJoCo's contacts are soft (``solref``,
``solimp``, ``margin``), diffgym's are exact, so the trajectories agree only in their gross
motion, and a falling or toppling body (a chaotic event) may take another way; such rows say
"differs" with that reason.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

TOL_FREE = 1e-6          # m: no constraint active in either engine
TOL_CONTACT = 0.05       # m: contacts or limits active (soft vs exact contact)
SAMPLE_EVERY = 5
KICK = 0.5               # initial velocities drawn in [-KICK, KICK] (rad/s or m/s), seed 0


def _site_packages_dir(pkg: str) -> str | None:
    try:
        mod = __import__(pkg)
    except ImportError:
        return None
    return os.path.dirname(mod.__file__)


def zoo_models() -> list[tuple[str, str, str]]:
    """(group, name, path) of every model of the zoo that is installed."""
    out = []
    gym = _site_packages_dir("gymnasium")
    if gym:
        for p in sorted(glob.glob(os.path.join(gym, "envs", "mujoco", "assets", "*.xml"))):
            out.append(("gymnasium", os.path.basename(p), p))
    try:
        import dm_control.suite as suite   # noqa: F401 (importing it loads mujoco: fine)
        sdir = os.path.dirname(suite.__file__)
    except ImportError:
        sdir = None
    if sdir:
        for p in sorted(glob.glob(os.path.join(sdir, "*.xml"))):
            out.append(("dm_control", os.path.basename(p), p))
    try:
        from .resources import example_robot_data_dir
        r = os.path.join(example_robot_data_dir(), "robots")
    except FileNotFoundError:
        r = None
    if r:
        for name, rel in (("talos_reduced", "talos_data/robots/talos_reduced.urdf"),
                          ("solo12", "solo_description/robots/solo12.urdf"),
                          ("anymal_b", "anymal_b_simple_description/robots/anymal.urdf"),
                          ("anymal_c", "anymal_c_simple_description/urdf/anymal.urdf"),
                          ("panda", "panda_description/urdf/panda.urdf"),
                          ("go1", "go1_description/urdf/go1.urdf"),
                          ("ur5", "ur_description/urdf/ur5_robot.urdf")):
            p = os.path.join(r, rel)
            if os.path.isfile(p):
                out.append(("robots", name, p))
    return out


FIXED_BASE = {"panda", "ur5"}        # arms: bolted to the world (no floating base)
# loaded (or refused) but not simulated by default, and why (--all simulates them too). Empty
# since 2026-11-25: the dm_control dog (163 mesh geoms), once minutes per simulated second, loads
# and runs its 3 s in 38 s (it matches MuJoCo to 3.8e-16 m before its first contact)
NOT_SIMULATED: dict[str, str] = {}


@dataclass
class Row:
    group: str
    name: str
    path: str
    status: str = ""                 # match | differs | refused | invalid (bad input) | error
    refused: list[str] = field(default_factory=list)
    nv: int = 0
    mass_rel: float = math.nan
    com0: float = math.nan
    com_err: float = math.nan
    constrained: bool = False
    t_first: float = math.nan        # s: first step with a contact or limit row (either engine)
    err_free: float = math.nan       # max COM difference before that
    tol: float = math.nan
    note: str = ""
    seconds: float = 0.0


def _load(path: str, name: str, ignore=None):
    from .sim.forward import Simulator
    from .sim.unsupported import UnsupportedIgnoredWarning
    kw = {}
    if path.endswith(".urdf") and name in FIXED_BASE:
        kw["floating_base"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsupportedIgnoredWarning)
        warnings.simplefilter("ignore", UserWarning)
        return Simulator.from_file(path, ignore_unsupported=ignore, **kw)


def _mj_to_pin_q(m, qpos: np.ndarray) -> np.ndarray:
    """MuJoCo qpos -> diffgym q (quaternions w x y z -> x y z w; same joint order)."""
    q = np.array(qpos, float)
    for j in range(m.njnt):
        a = m.jnt_qposadr[j]
        if m.jnt_type[j] == 0:       # free
            w = q[a + 3]
            q[a + 3:a + 6], q[a + 6] = q[a + 4:a + 7].copy(), w
        elif m.jnt_type[j] == 1:     # ball
            w = q[a]
            q[a:a + 3], q[a + 3] = q[a + 1:a + 4].copy(), w
    return q


def _lift_robot(sim, q: np.ndarray, clearance: float = 0.01) -> np.ndarray:
    """Raise a floating base so the lowest robot collision geom is ``clearance`` above z = 0
    (the distances of the robot-ground pairs: lifting by dz raises each by dz exactly)."""
    import pinocchio as pin
    if sim.model.joints[1].shortname() != "JointModelFreeFlyer" or len(sim.sm.pairs) == 0:
        return q
    pin.computeDistances(sim.model, sim.data, sim.geom_model, sim.geom_data, q)
    low = min(float(r.min_distance) for r in sim.geom_data.distanceResults)
    q = q.copy()
    if np.isfinite(low):
        q[2] += clearance - low
    return q


def _mujoco_model(mujoco, path: str, sim):
    if path.endswith(".urdf"):
        from .bench import _mujoco_urdf_spec
        sc = SimpleNamespace(path=path, sim=sim, gravcomp=False, q_ref=None, base_nq=0)
        m, fixed = _mujoco_urdf_spec(mujoco, sc)
        base = "free base" if sim.model.joints[1].shortname() == "JointModelFreeFlyer" \
            else "fixed base"
        note = f"MuJoCo via MjSpec ({base}, ground, robot-ground contacts)"
        if fixed:
            note += f"; singular inertia of {', '.join(fixed)} -> 1e-9 diagonal in MuJoCo"
        return m, note
    return mujoco.MjModel.from_xml_path(path), ""


def _compare_mass(row: Row, sim) -> None:
    """The mass column (and, in the note, the centre of mass at qpos0) of a model loaded but not
    simulated: its moving mass against MuJoCo's on the same file."""
    import mujoco
    import pinocchio as pin
    m, _ = _mujoco_model(mujoco, row.path, sim)
    moving = np.array([b for b in range(1, m.nbody) if m.body_weldid[b] != 0], dtype=int)
    mass_mj = float(m.body_mass[moving].sum())
    masses = np.array([sim.model.inertias[j].mass for j in range(1, sim.model.njoints)])
    row.mass_rel = abs(float(masses.sum()) - mass_mj) / max(mass_mj, 1e-12)
    if row.path.endswith(".urdf") or m.nq != sim.nq or masses.sum() == 0:
        return
    d = mujoco.MjData(m)
    mujoco.mj_kinematics(m, d)
    data = sim.model.createData()
    pin.forwardKinematics(sim.model, data, _mj_to_pin_q(m, m.qpos0))
    c = sum(masses[j - 1] * data.oMi[j].act(sim.model.inertias[j].lever)
            for j in range(1, sim.model.njoints)) / masses.sum()
    c_mj = (m.body_mass[moving, None] * d.xipos[moving]).sum(0) / mass_mj
    row.com0 = float(np.linalg.norm(np.asarray(c) - c_mj))
    row.note += (f"; moving mass {masses.sum():.4g} kg (MuJoCo {mass_mj:.4g} kg), centre of mass "
                 f"at qpos0 {row.com0:.1e} m from MuJoCo's")


def compare(row: Row, sim, seconds: float, budget: float = math.inf) -> None:
    """Simulate both engines passively and fill the comparison columns of ``row``."""
    import mujoco
    import pinocchio as pin
    m, note = _mujoco_model(mujoco, row.path, sim)
    if note:
        row.note = (row.note + "; " if row.note else "") + note
    if m.nq != sim.nq or m.nv != sim.nv:
        raise RuntimeError(f"different coordinates: MuJoCo nq={m.nq} nv={m.nv}, diffgym "
                           f"nq={sim.nq} nv={sim.nv}")
    d = mujoco.MjData(m)
    # a deterministic kick of every joint velocity (a URDF's floating base starts at rest)
    v = np.random.default_rng(0).uniform(-KICK, KICK, sim.nv)
    if row.path.endswith(".urdf"):
        # pinocchio orders a URDF's joints by its own rule, MuJoCo in file order: by name
        from .bench import mujoco_state
        if sim.model.joints[1].shortname() == "JointModelFreeFlyer":
            v[:6] = 0.0
        q = _lift_robot(sim, sim.q0.copy())
        d.qpos[:], d.qvel[:], _ = mujoco_state(mujoco, m, SimpleNamespace(
            sim=sim, path=row.path, q0=q, v0=v, q_ref=None, base_nq=0))
    else:                              # MJCF: the same joints in the same (document) order
        d.qpos[:] = m.qpos0
        q = _mj_to_pin_q(m, m.qpos0)
        d.qvel[:] = v
    data = sim.model.createData()

    # the centre of mass of the moving bodies (static ones are not simulated by either engine)
    masses = np.array([sim.model.inertias[j].mass for j in range(1, sim.model.njoints)])
    moving = np.array([b for b in range(1, m.nbody) if m.body_weldid[b] != 0], dtype=int)

    def com_pin(q):
        pin.forwardKinematics(sim.model, data, q)
        c = sum(masses[j - 1] * data.oMi[j].act(sim.model.inertias[j].lever)
                for j in range(1, sim.model.njoints))
        return np.asarray(c, float) / masses.sum()

    def com_mj():
        mujoco.mj_kinematics(m, d)
        return (m.body_mass[moving, None] * d.xipos[moving]).sum(0) / m.body_mass[moving].sum()

    mass_pin = float(masses.sum())
    mass_mj = float(m.body_mass[moving].sum())
    row.mass_rel = abs(mass_pin - mass_mj) / max(mass_mj, 1e-12)
    if mass_pin == 0:
        row.com0 = row.com_err = row.err_free = 0.0
        row.tol = TOL_FREE
        return
    row.com0 = float(np.linalg.norm(com_pin(q) - com_mj()))
    steps = int(round(seconds / sim.dt))
    zero = np.zeros(sim.nv)
    err, constrained = row.com0, False
    err_free = row.com0
    t_start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(steps):
            if time.perf_counter() - t_start > budget:
                row.note = (row.note + "; " if row.note else "") + \
                    f"stopped at t = {k * sim.dt:.2f} s (wall-clock budget {budget:g} s)"
                break
            q, v = sim.step(q, v, zero)
            mujoco.mj_step(m, d)
            last = sim.last
            now = bool(last.num_contacts > 0 or np.any(last.limit_active) or d.nefc > 0)
            if now and not constrained:
                row.t_first = k * sim.dt
            constrained |= now
            if (k + 1) % SAMPLE_EVERY == 0 or k == steps - 1 or now:
                e = float(np.linalg.norm(com_pin(q) - com_mj()))
                if not np.isfinite(e):
                    raise RuntimeError(f"non-finite state at step {k + 1}")
                err = max(err, e)
                if not constrained:
                    err_free = max(err_free, e)
    row.com_err = err
    row.err_free = err_free
    row.constrained = constrained
    row.tol = TOL_CONTACT if constrained else TOL_FREE


def run_one(group: str, name: str, path: str, seconds: float, budget: float = math.inf,
            simulate_all: bool = False) -> Row:
    from .sim.model import ModelError
    row = Row(group, name, path)
    t0 = time.perf_counter()
    try:
        try:
            sim = _load(path, name)
            row.status = "load"
        except ModelError as exc:
            text = str(exc)
            if not getattr(exc, "unsupported", ()):
                # bad input: the message without the file path (the row names the model)
                first = text.splitlines()[0]
                row.status = "invalid"
                row.note = first.split(": ", 1)[1] if first.startswith(path) else first[-200:]
                return row
            keys = getattr(exc, "unsupported", ())
            row.refused = list(keys)
            row.status = "refused"
            try:
                sim = _load(path, name, ignore=tuple(keys))
            except ModelError as exc2:
                row.note = f"with them ignored: {str(exc2).splitlines()[0][-160:]}"
                return row
        row.nv = sim.nv
        if name in NOT_SIMULATED and not simulate_all:
            row.note = f"not simulated (--all does): {NOT_SIMULATED[name]}"
            _compare_mass(row, sim)
            return row
        try:
            compare(row, sim, seconds, budget)
        except Exception as exc:   # noqa: BLE001 - reported in the table
            row.note = (row.note + "; " if row.note else "") + \
                f"not compared: {type(exc).__name__}: {str(exc).splitlines()[0][:140]}"
            if row.status == "load":
                row.status = "error"
            return row
        if row.status == "load":
            ok = row.com_err <= row.tol and row.err_free <= TOL_FREE and row.mass_rel < 1e-6
            row.status = "match" if ok else "differs"
            if not ok:
                why = []
                if row.mass_rel >= 1e-6:
                    why.append(f"total mass differs by {row.mass_rel:.1e}")
                if row.err_free > TOL_FREE:
                    why.append("differs before any contact or limit: a loading or integration "
                               "difference")
                elif row.constrained:
                    why.append(f"same until the first contact/limit (t = {row.t_first:.3f} s), "
                               "then MuJoCo's soft contact/limits vs diffgym's exact ones")
                row.note = "; ".join([*why, *([row.note] if row.note else [])])
    finally:
        row.seconds = time.perf_counter() - t0
    return row


def _fmt(x: float, spec: str = ".1e") -> str:
    return "-" if not np.isfinite(x) else format(x, spec)


def format_table(rows: list[Row], seconds: float) -> str:
    lines = [f"Model zoo: passive {seconds:g} s, diffgym vs MuJoCo on the same file; |COM "
             f"difference| (m), the largest before the first contact/limit (tolerance "
             f"{TOL_FREE:g} m) and over the run ({TOL_FREE:g} m without contacts/limits, "
             f"{TOL_CONTACT:g} m with them)",
             "",
             "| group | model | nv | status | refused (ignore_unsupported keys) | mass rel. diff | "
             "first contact/limit (s) | COM diff before it (m) | max COM diff (m) | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        first = "-" if not np.isfinite(r.com_err) else (
            f"{r.t_first:.3f}" if r.constrained else "none")
        lines.append(
            f"| {r.group} | {r.name} | {r.nv or '-'} | {r.status} | "
            f"{', '.join(r.refused) or '-'} | {_fmt(r.mass_rel)} | {first} | "
            f"{_fmt(r.err_free)} | {_fmt(r.com_err)} | {r.note.replace('|', '/') or ''} |")
    counts = {s: sum(r.status == s for r in rows)
              for s in ("match", "differs", "refused", "invalid", "error")}
    lines.append("")
    lines.append(", ".join(f"{v} {k}" for k, v in counts.items())
                 + " (for refused rows the columns are measured with the refused keys ignored)")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--seconds", type=float, default=3.0, help="simulated time per model")
    p.add_argument("--only", default="", help="comma-separated substrings of model names")
    p.add_argument("--budget", type=float, default=120.0,
                   help="wall-clock seconds per model (the row says where a run was stopped)")
    p.add_argument("--all", action="store_true", help=f"also simulate {sorted(NOT_SIMULATED)}")
    return p


def main(args) -> int:
    try:
        import mujoco  # noqa: F401
    except ImportError:
        print("diffgym bench --zoo needs MuJoCo (pip install 'diffgym[bench]')", file=sys.stderr)
        return 2
    seconds = float(getattr(args, "zoo_seconds", None) or getattr(args, "seconds", 3.0))
    only = [s for s in str(getattr(args, "only", "") or "").split(",") if s]
    rows = []
    for group, name, path in zoo_models():
        if only and not any(s in name for s in only):
            continue
        row = run_one(group, name, path, seconds, float(getattr(args, "budget", 120.0)),
                      bool(getattr(args, "all", False)))
        rows.append(row)
        print(f"  {group}/{name}: {row.status} ({row.seconds:.1f} s)", file=sys.stderr, flush=True)
    print(format_table(rows, seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(add_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0])).parse_args()))
