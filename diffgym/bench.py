"""``diffgym bench``: forward-step time of diffgym next to MuJoCo's ``mj_step`` on the same file.

Both engines load the same model file and start from the same state; the step loops run side by
side in one process. Per model and engine: ``--warmup`` steps (not timed), then ``--steps`` timed
steps; this is repeated ``--repeats`` times from the initial state and the median is reported.
So both engines time the same stretch of the same trajectory regime (step ``warmup`` to
``warmup + steps`` after the same start, under the same control):

* ``cartpole`` (``assets/cartpole.xml``): pole released at 0.3 rad, zero force;
* ``hopper`` (Gymnasium's ``hopper.xml``): default pose, zero control: it drops on its foot and
  topples, so the timed steps are contact steps;
* ``go1`` (example-robot-data's URDF): the SRDF ``standing`` pose with the feet 2 mm above the
  ground, joints held by a PD on that pose (``tau = 100 (q_ref - q) - 2 qdot``, no torque limit).
  In MuJoCo the same PD is the model's own actuators (gain 100, bias ``-100 q - 2 qdot``, ctrl
  ``q_ref``), so no Python runs between its steps; diffgym computes it in the loop (~3 us);
* ``billiards`` (``assets/billiards.xml``): the cue ball sent at 2 m/s into the rack at rest.

MuJoCo is a benchmark-only extra (``pip install diffgym[bench]``), imported lazily. MuJoCo
cannot read the Go1 URDF as it is (the ``base`` link's inertia matrix is singular); it is then
built through ``MjSpec`` the way diffgym reads a URDF: free-floating base, a ground plane,
robot-ground contacts only, visuals dropped, and the singular inertia replaced by a 1e-6
diagonal (the link weighs 1e-6 kg). Which route was taken is printed under the table.

The two engines do not solve the same contact problem: MuJoCo's contacts are soft and its solver
stops at its default tolerance; diffgym solves the unrelaxed NCP to ``tol`` (1e-9 m/s). Contacts
per step are diffgym's contact points (up to 4 per touching pair, including speculative ones
within the margin) and MuJoCo's ``ncon``.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from .forward import Simulator, SolverWarning
from .resources import asset_path

MODELS = {
    "cartpole": "cartpole.xml",
    "hopper": "hopper_gymnasium.xml",
    "go1": "go1.urdf",
    "billiards": "billiards.xml",
}

GO1_KP, GO1_KD = 100.0, 2.0       # PD holding the standing pose
GO1_CLEARANCE = 0.002             # feet start this far above the ground (m)
HOPPER_TARGET = 5.0               # the goal: a hopper step within 5x of MuJoCo's


class NotAvailable(Exception):
    """MuJoCo cannot run this model (the message says why)."""


@dataclass
class Row:
    name: str
    nq: int = 0
    nv: int = 0
    dt: float = float("nan")
    contacts: float = float("nan")
    contacts_mj: float = float("nan")
    t_ours: float = float("nan")          # seconds per step
    t_mj: float = float("nan")
    nonconverged: int = 0                 # diffgym steps whose solver missed its tolerance
    timed_steps: int = 0
    mj_note: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.t_ours / self.t_mj if self.t_mj > 0 else float("nan")


# -- the scenarios, diffgym side -------------------------------------------------------------
@dataclass
class Scenario:
    name: str
    path: str
    sim: Simulator
    q0: np.ndarray
    v0: np.ndarray
    control: object           # (q, v) -> tau, or None for zero torque
    q_ref: np.ndarray | None = None


def _lowest_point(sim: Simulator, q: np.ndarray) -> float:
    """Height of the lowest point of the robot's spheres / bounding spheres at q."""
    import pinocchio as pin
    pin.framesForwardKinematics(sim.model, sim.data, q)
    pin.updateGeometryPlacements(sim.model, sim.data, sim.geom_model, sim.geom_data)
    low = math.inf
    for i, g in enumerate(sim.sm.geoms):
        if g.kind == "plane" or sim.geom_model.geometryObjects[i].parentJoint == 0:
            continue
        if g.kind == "sphere":
            low = min(low, float(sim.geom_data.oMg[i].translation[2] - g.size[0]))
    return low


def scenario(name: str, path: str) -> Scenario:
    sim = Simulator.from_file(path)
    q, v = sim.q0, np.zeros(sim.nv)
    control = None
    q_ref = None
    if name == "cartpole":
        jid = sim.joint_id("hinge") if sim.model.existJointName("hinge") else sim.model.njoints - 1
        q[sim.model.joints[jid].idx_q] += 0.3
    elif name == "billiards":
        v[0] = 2.0                       # cue ball (identity orientation: local = world axes)
    elif name == "go1":
        q[2] += GO1_CLEARANCE - _lowest_point(sim, q)
        q_ref = sim.q0[7:].copy()
        tau = np.zeros(sim.nv)

        def control(q, v, tau=tau, q_ref=q_ref):
            tau[6:] = GO1_KP * (q_ref - q[7:]) - GO1_KD * v[6:]
            return tau
    return Scenario(name, path, sim, q, v, control, q_ref)


def time_diffgym(sc: Scenario, steps: int, warmup: int, repeats: int) -> tuple[float, float, int]:
    """Median seconds per step, mean contact points per timed step, non-converged steps."""
    sim = sc.sim
    zero = np.zeros(sim.nv)
    ctrl = sc.control
    times, contacts, failed = [], [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverWarning)
        for _ in range(repeats):
            sim.reset_warmstart()
            q, v = sc.q0.copy(), sc.v0.copy()
            for _ in range(warmup):
                q, v = sim.step(q, v, ctrl(q, v) if ctrl else zero)
            n_c = n_fail = 0
            t0 = time.perf_counter()
            for _ in range(steps):
                q, v = sim.step(q, v, ctrl(q, v) if ctrl else zero)
                last = sim.last
                n_c += len(last.contact_modes)
                n_fail += not last.converged
            times.append((time.perf_counter() - t0) / steps)
            contacts.append(n_c / steps)
            failed = max(failed, n_fail)
    return float(np.median(times)), float(np.mean(contacts)), failed


# -- MuJoCo side -----------------------------------------------------------------------------
def _import_mujoco():
    try:
        import mujoco
    except ImportError:
        return None
    return mujoco


def _mujoco_urdf(mujoco, sc: Scenario):
    """Build the URDF in MuJoCo as diffgym reads it; returns (model, note)."""
    try:
        mujoco.MjModel.from_xml_path(sc.path)
        first = ""
    except Exception as exc:      # noqa: BLE001 - MuJoCo raises ValueError with its message
        first = str(exc).splitlines()[0].removeprefix("Error: ")
    try:
        m, fixed = _mujoco_urdf_spec(mujoco, sc)
    except Exception as exc:   # noqa: BLE001 - an old MuJoCo without MjSpec, or a compile error
        raise NotAvailable(f"MuJoCo cannot load it ({first or 'as is: ok'}; via MjSpec: "
                           f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc
    note = ((f"cannot load the URDF as is ({first}); " if first else "")
            + "built via MjSpec as diffgym reads URDF: free base, ground plane, robot-ground "
            "contacts only, visuals dropped, PD as actuators"
            + (f", singular inertia of link(s) {', '.join(fixed)} -> diagonal" if fixed else ""))
    return m, note


def _mujoco_urdf_spec(mujoco, sc: Scenario):
    spec = mujoco.MjSpec.from_file(sc.path)
    spec.compiler.discardvisual = True
    fixed = []
    for body in spec.bodies:
        fi = np.asarray(body.fullinertia, float)
        if body.explicitinertial and np.all(np.isfinite(fi)):
            I = np.array([[fi[0], fi[3], fi[4]], [fi[3], fi[1], fi[5]], [fi[4], fi[5], fi[2]]])
            if np.linalg.eigvalsh(I)[0] <= 0:
                body.fullinertia = [np.nan] * 6
                body.inertia = np.maximum(np.diag(I), 1e-9)
                fixed.append(body.name)
    root = spec.worldbody.first_body()
    if sc.sim.model.joints[1].shortname() == "JointModelFreeFlyer" and not root.joints:
        root.add_freejoint(name=sc.sim.model.names[1])
    for g in spec.geoms:                       # robot geoms touch the ground, not each other
        g.contype, g.conaffinity = 1, 0
    spec.worldbody.add_geom(name="ground", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 1],
                            contype=0, conaffinity=1)
    spec.option.timestep = sc.sim.dt
    if sc.q_ref is not None:
        _add_pd_actuators(mujoco, spec, sc)
    return spec.compile(), fixed


def _add_pd_actuators(mujoco, spec, sc: Scenario) -> None:
    """The diffgym-side PD as MuJoCo actuators: force = KP ctrl - KP q - KD qdot."""
    model = sc.sim.model
    for j in range(2, model.njoints):
        act = spec.add_actuator()
        act.name = "pd_" + model.names[j]
        act.target = model.names[j]
        act.trntype = mujoco.mjtTrn.mjTRN_JOINT
        act.gaintype = mujoco.mjtGain.mjGAIN_FIXED
        act.gainprm = [GO1_KP] + [0.0] * (len(act.gainprm) - 1)
        act.biastype = mujoco.mjtBias.mjBIAS_AFFINE
        act.biasprm = [0.0, -GO1_KP, -GO1_KD] + [0.0] * (len(act.biasprm) - 3)
        act.ctrllimited = 0
        act.forcelimited = 0


def _quat_xyzw_to_matrix(x, y, z, w) -> np.ndarray:
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def mujoco_state(mujoco, m, sc: Scenario) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qpos, qvel, ctrl of MuJoCo for the scenario's diffgym state (joints matched by name)."""
    model, sim = sc.sim.model, sc.sim
    qpos, qvel = m.qpos0.copy(), np.zeros(m.nv)
    ctrl = np.zeros(m.nu)
    J = mujoco.mjtJoint
    # the diffgym configuration of MuJoCo's qpos0: the MJCF default pose (diffgym's q0 for an
    # MJCF file); for a URDF the zero joint angles (diffgym's q0 is then the SRDF pose)
    if sc.path.lower().endswith(".urdf"):
        import pinocchio as pin
        q_at_mj0 = pin.neutral(model)
    else:
        q_at_mj0 = sim.sm.q0
    for j in range(1, model.njoints):
        name, jm = model.names[j], model.joints[j]
        if jm.shortname() == "JointModelSpherical" and name.endswith("_rot") and j > 1 \
                and model.joints[j - 1].shortname() == "JointModelTranslation":
            continue                     # the rotation half of an MJCF free joint (done below)
        jid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, name)
        if jid < 0:
            # an MJCF <freejoint/> without a name: the joint of the body of the same name
            bid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, name.rsplit("_joint", 1)[0])
            if bid < 0 or m.body_jntnum[bid] != 1:
                raise NotAvailable(f"joint {name!r} has no MuJoCo counterpart")
            jid = int(m.body_jntadr[bid])
        qa, da, typ = int(m.jnt_qposadr[jid]), int(m.jnt_dofadr[jid]), int(m.jnt_type[jid])
        iq, iv = jm.idx_q, jm.idx_v
        q, v = sc.q0[iq:iq + jm.nq], sc.v0[iv:iv + jm.nv]
        if typ == J.mjJNT_FREE and jm.nq == 3:          # MJCF free joint: translation + ball
            jr = model.joints[j + 1]
            qr, vr = sc.q0[jr.idx_q:jr.idx_q + 4], sc.v0[jr.idx_v:jr.idx_v + 3]
            qpos[qa:qa + 3], qvel[da:da + 3] = q, v            # both: world axes
            qpos[qa + 3:qa + 7] = [qr[3], qr[0], qr[1], qr[2]]
            qvel[da + 3:da + 6] = vr                           # both: body axes
        elif typ == J.mjJNT_FREE and jm.nq == 7:
            qpos[qa:qa + 3] = q[:3]
            qpos[qa + 3:qa + 7] = [q[6], q[3], q[4], q[5]]
            qvel[da:da + 3] = _quat_xyzw_to_matrix(*q[3:7]) @ v[:3]   # MuJoCo: world axes
            qvel[da + 3:da + 6] = v[3:6]                               # both: body axes
        elif typ == J.mjJNT_BALL and jm.nq == 4:
            qpos[qa:qa + 4] = [q[3], q[0], q[1], q[2]]
            qvel[da:da + 3] = v
        elif typ in (J.mjJNT_HINGE, J.mjJNT_SLIDE) and jm.nq == 1:
            # offsets from each engine's default pose (their zero references may differ)
            qpos[qa] = m.qpos0[qa] + (q[0] - q_at_mj0[iq])
            qvel[da] = v[0]
        else:
            raise NotAvailable(f"joint {name!r}: no state mapping for this joint type")
    if sc.q_ref is not None:
        for a in range(m.nu):
            jid = int(m.actuator_trnid[a, 0])
            name = mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_JOINT, jid)
            jm = model.joints[model.getJointId(name)]
            ctrl[a] = sc.q_ref[jm.idx_q - 7]
    return qpos, qvel, ctrl


def time_mujoco(mujoco, sc: Scenario, steps: int, warmup: int, repeats: int):
    """(median seconds per step, mean ncon, note); raises NotAvailable."""
    note = ""
    if sc.path.lower().endswith(".urdf"):
        m, note = _mujoco_urdf(mujoco, sc)
    else:
        try:
            m = mujoco.MjModel.from_xml_path(sc.path)
        except Exception as exc:  # noqa: BLE001
            raise NotAvailable(f"MuJoCo cannot load it: {str(exc).splitlines()[0]}") from exc
    if abs(m.opt.timestep - sc.sim.dt) > 1e-12:
        raise NotAvailable(f"time steps differ (MuJoCo {m.opt.timestep}, diffgym {sc.sim.dt})")
    qpos, qvel, ctrl = mujoco_state(mujoco, m, sc)
    d = mujoco.MjData(m)
    step = mujoco.mj_step
    times, contacts = [], []
    for _ in range(repeats):
        mujoco.mj_resetData(m, d)
        d.qpos[:] = qpos
        d.qvel[:] = qvel
        d.ctrl[:] = ctrl
        for _ in range(warmup):
            step(m, d)
        n_c = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            step(m, d)
            n_c += d.ncon
        times.append((time.perf_counter() - t0) / steps)
        contacts.append(n_c / steps)
    return float(np.median(times)), float(np.mean(contacts)), note


# -- report ----------------------------------------------------------------------------------
_COLUMNS = [("model", 10, "<"), ("nq/nv", 7, ">"), ("contacts", 8, ">"), ("mj-contacts", 11, ">"),
            ("diffgym us/step", 15, ">"), ("steps/s", 8, ">"), ("MuJoCo us/step", 14, ">"),
            ("mj steps/s", 10, ">"), ("ratio", 7, ">")]


def _fmt(x: float, spec: str) -> str:
    return format(x, spec) if np.isfinite(x) else "n/a"


def format_table(rows: list[Row]) -> str:
    lines = ["  ".join(f"{h:{a}{w}}" for h, w, a in _COLUMNS) + "  note"]
    for r in rows:
        cells = [r.name, f"{r.nq}/{r.nv}" if r.nq else "n/a", _fmt(r.contacts, ".1f"),
                 _fmt(r.contacts_mj, ".1f"), _fmt(r.t_ours * 1e6, ".1f"),
                 _fmt(1.0 / r.t_ours if r.t_ours > 0 else math.nan, ".0f"),
                 _fmt(r.t_mj * 1e6, ".1f"), _fmt(1.0 / r.t_mj if r.t_mj > 0 else math.nan, ".0f"),
                 (f"{r.ratio:.1f}x" if np.isfinite(r.ratio) else "n/a")]
        note = "; ".join(r.notes)
        lines.append("  ".join(f"{c:{a}{w}}" for c, (_, w, a) in zip(cells, _COLUMNS)) + "  " + note)
    return "\n".join(lines)


def write_csv(rows: list[Row], path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["model", "nq", "nv", "dt", "contacts_diffgym", "contacts_mujoco",
                    "diffgym_us_per_step", "mujoco_us_per_step", "ratio",
                    "diffgym_nonconverged_steps", "timed_steps", "note"])
        for r in rows:
            w.writerow([r.name, r.nq, r.nv, r.dt, f"{r.contacts:.3f}", f"{r.contacts_mj:.3f}",
                        f"{r.t_ours * 1e6:.2f}", f"{r.t_mj * 1e6:.2f}", f"{r.ratio:.3f}",
                        r.nonconverged, r.timed_steps, "; ".join(r.notes + ([r.mj_note] if r.mj_note else []))])


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per model and repeat")
    parser.add_argument("--models", nargs="*", default=None, help=f"subset of {list(MODELS)}")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps before timing")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (the median is reported)")
    parser.add_argument("--csv", default=None, help="also write the table to this CSV file")
    return parser


def run(names: list[str], steps: int, warmup: int = 20, repeats: int = 3) -> tuple[list[Row], str | None]:
    mujoco = _import_mujoco()
    missing = None if mujoco is not None else "mujoco not installed: pip install diffgym[bench]"
    rows = []
    for name in names:
        row = Row(name, timed_steps=steps)
        rows.append(row)
        try:
            path = asset_path(MODELS[name])
        except FileNotFoundError as exc:
            row.notes.append(f"model file missing: {exc}")
            continue
        sc = scenario(name, path)
        row.nq, row.nv, row.dt = sc.sim.nq, sc.sim.nv, sc.sim.dt
        row.t_ours, row.contacts, row.nonconverged = time_diffgym(sc, steps, warmup, repeats)
        if row.nonconverged:
            row.notes.append(f"diffgym solver missed tol on {row.nonconverged}/{steps} steps")
        if mujoco is None:
            row.notes.append("MuJoCo n/a: not installed")
            continue
        try:
            row.t_mj, row.contacts_mj, row.mj_note = time_mujoco(mujoco, sc, steps, warmup, repeats)
        except NotAvailable as exc:
            row.notes.append(f"MuJoCo n/a: {exc}")
    return rows, missing


def main(args) -> int:
    names = getattr(args, "models", None) or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    steps = int(getattr(args, "steps", 2000))
    warmup = int(getattr(args, "warmup", 20) or 0)
    repeats = max(1, int(getattr(args, "repeats", 3) or 1))
    if steps < 1:
        raise SystemExit(f"--steps must be positive, got {steps}")
    rows, missing = run(names, steps, warmup, repeats)
    print(format_table(rows))
    print()
    print(f"median of {repeats} repeats of {steps} steps after {warmup} warm-up steps, same file, "
          "same initial state and control for both engines; ratio = diffgym / MuJoCo step time.")
    if missing:
        print(f"MuJoCo columns are n/a: {missing}")
    for r in rows:
        if r.mj_note:
            print(f"{r.name}: MuJoCo {r.mj_note}")
    for r in rows:
        if r.name == "hopper" and np.isfinite(r.ratio):
            verdict = "met" if r.ratio <= HOPPER_TARGET else "NOT met"
            print(f"hopper target (diffgym within {HOPPER_TARGET:g}x of MuJoCo): {verdict} "
                  f"({r.ratio:.1f}x)")
    import pinocchio
    mj = _import_mujoco()
    blas = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or "default"
    print(f"python {platform.python_version()}, numpy {np.__version__}, pinocchio "
          f"{pinocchio.__version__}, mujoco {mj.__version__ if mj else 'n/a'}, "
          f"{platform.machine()} x{os.cpu_count()}, BLAS threads {blas} (MuJoCo is single-threaded; "
          "OPENBLAS_NUM_THREADS=1 is faster for diffgym's small dense solves)")
    out = getattr(args, "csv", None)
    if out:
        write_csv(rows, out)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(add_arguments(argparse.ArgumentParser(prog="python -m diffgym.bench",
                                                        description=__doc__.splitlines()[0])).parse_args()))
