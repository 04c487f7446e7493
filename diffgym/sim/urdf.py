"""Model loading, URDF: pinocchio's URDF parser plus a ground plane, limits and actuators.

URDF has no friction, restitution, gravity or time step, so those come from keyword settings
(``restitution``: the coefficient of every robot geom; the ground's is 0 and a pair takes the
larger). By default a
floating base is added (``floating_base=True``), a ground half-space ``z <= 0`` is added
(``ground=True``) and every robot geom may touch the ground; self-collision is off unless
``self_collision=True`` (then every pair of geoms on different, non-adjacent links is a
candidate, minus the pairs an SRDF ``disable_collisions`` lists). Joint limits of revolute and
prismatic joints become hard limits; each actuated scalar joint gets a unit-gear motor whose
control range is the URDF effort limit. ``<dynamics damping>`` is joint damping (pinocchio reads
it), ``<dynamics friction>`` joint dry friction (the rows of MJCF ``frictionloss``, see
:mod:`diffgym.sim.equality`; ``ignore_unsupported=("joint.frictionloss",)`` leaves it out) and
``<mimic joint multiplier offset>`` a bilateral coupling ``q = multiplier q_joint + offset`` (the
row of MJCF ``<equality><joint>``; between revolute and prismatic joints, a continuous joint's
mimic is refused). If an SRDF sits beside the URDF (``../srdf/NAME.srdf``
as in example-robot-data) its first reference configuration is the default ``q0``.
"""
from __future__ import annotations

import math
import os
import warnings

import coal
import numpy as np
import pinocchio as pin

from .model import Actuator, GeomInfo, JointLimit, ModelError, SimModel
from .mjcf import bounding_radius, inertia_problem
from .unsupported import Refusals, rules_for
from .xmlsource import XMLSource

_URDF_TEXT_ATTRS = {"name", "type", "link", "joint", "filename", "parent", "child"}


def check_urdf(path: str, ignore_unsupported=None) -> dict[str, str]:
    """Check a URDF before pinocchio reads it: non-finite numbers, negative masses, inertias
    that are not physical (a negative principal moment, the triangle inequality), geometry
    sizes, joint ranges, and what diffgym does not simulate (:data:`diffgym.sim.unsupported.RULES`).
    Errors name file, line, element and attribute. Returns
    where each joint was declared (for later messages)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    src = XMLSource(path)
    root = src.parse(text, path)
    if root.tag != "robot":
        raise ModelError(f"{path}: root element is <{root.tag}>, expected <robot>")
    refusals = Refusals(path, ignore_unsupported)
    rules = [r for r in rules_for("urdf") if r.path is not None]

    def desc(el):
        n = el.get("name")
        return f"<{el.tag} name={n!r}>" if n is not None else f"<{el.tag}>"

    def err(el, msg):
        return ModelError(f"{src.where(el)}: {msg}")

    where: dict[str, str] = {}
    for parent in root.iter():
        for el in parent:
            for k, val in el.attrib.items():
                if k in _URDF_TEXT_ATTRS:
                    continue
                try:
                    nums = [float(t) for t in val.split()]
                except ValueError:
                    continue
                if nums and not all(math.isfinite(x) for x in nums):
                    raise err(el, f"{desc(parent)} {desc(el)}: {k}={val!r} is not finite "
                                  "(NaN or inf)")
            if parent.tag == "joint" and parent.get("type") == "fixed":
                continue         # (a fixed joint's <mimic> or <dynamics> has no effect)
            for r in rules:
                p_tag, _, tag = r.path.partition("/")
                if parent.tag == p_tag and el.tag == tag and (r.when is None or r.when(el.attrib, {})):
                    refusals.hit(r.key, src.where(el), f"{desc(parent)} {desc(el)}", r.attr,
                                 el.get(r.attr) if r.attr else None)
    for link in root.findall("link"):
        what = desc(link)
        inertial = link.find("inertial")
        if inertial is not None:
            m = inertial.find("mass")
            mass = float(m.get("value", "0")) if m is not None else 0.0
            if mass < 0:
                raise err(m, f"{what} <inertial> <mass>: value must be >= 0, got {m.get('value')!r}")
            ie = inertial.find("inertia")
            if ie is not None and mass > 0:
                c = {k: float(ie.get(k, "0")) for k in ("ixx", "iyy", "izz", "ixy", "ixz", "iyz")}
                I = np.array([[c["ixx"], c["ixy"], c["ixz"]], [c["ixy"], c["iyy"], c["iyz"]],
                              [c["ixz"], c["iyz"], c["izz"]]])
                ev = np.linalg.eigvalsh(I)
                scale = max(float(np.abs(ev).max()), 1e-300)
                # a singular (zero-moment) inertia is accepted here: pinocchio lumps the links
                # fixed to one joint, and the lumped mass matrix is checked after loading
                if ev[0] < -1e-9 * scale:
                    raise err(ie, f"{what} <inertial> <inertia>: not positive semi-definite "
                                  f"(principal moments {ev.tolist()})")
                if ev[0] > 0 and inertia_problem(I):
                    raise err(ie, f"{what} <inertial> <inertia>: {inertia_problem(I)}")
        for kind in ("collision", "visual"):
            for part in link.findall(kind):
                geo = part.find("geometry")
                for shape in (list(geo) if geo is not None else []):
                    for k in ("radius", "length"):
                        if k in shape.attrib and not float(shape.get(k)) > 0:
                            raise err(shape, f"{what} <{kind}> <{shape.tag}>: {k} must be > 0, "
                                             f"got {shape.get(k)!r}")
                    if shape.tag == "box":
                        size = [float(x) for x in shape.get("size", "").split()]
                        if len(size) != 3 or min(size) <= 0:
                            raise err(shape, f"{what} <{kind}> <box>: size must be 3 positive "
                                             f"numbers, got {shape.get('size')!r}")
    for joint in root.findall("joint"):
        where[joint.get("name", "")] = f"{src.where(joint)}: {desc(joint)}"
        dyn = joint.find("dynamics")
        for k in ("friction", "damping"):
            if dyn is not None and k in dyn.attrib and not float(dyn.get(k)) >= 0:
                raise err(dyn, f"{desc(joint)} <dynamics>: {k} must be >= 0, got {dyn.get(k)!r}")
        lim = joint.find("limit")
        if lim is not None and joint.get("type") in ("revolute", "prismatic"):
            lo, hi = float(lim.get("lower", "0")), float(lim.get("upper", "0"))
            if lo > hi:
                raise err(lim, f"{desc(joint)} <limit>: lower {lo} > upper {hi}")
    refusals.finish()
    return where

_SHAPES = [(coal.Sphere, "sphere"), (coal.Box, "box"), (coal.Capsule, "capsule"),
           (coal.Cylinder, "cylinder"), (coal.Ellipsoid, "ellipsoid"), (coal.Halfspace, "plane"),
           (coal.ConvexBase, "mesh"), (coal.BVHModelBase, "mesh")]


def _shape_kind_size(shape) -> tuple[str, np.ndarray]:
    for cls, kind in _SHAPES:
        if isinstance(shape, cls):
            break
    else:
        raise ModelError(f"unsupported collision shape {type(shape).__name__}")
    if kind == "sphere":
        return kind, np.array([shape.radius])
    if kind == "box":
        return kind, np.asarray(shape.halfSide, float).copy()
    if kind in ("capsule", "cylinder"):
        return kind, np.array([shape.radius, shape.halfLength])
    if kind == "ellipsoid":
        return kind, np.asarray(shape.radii, float).copy()
    return kind, np.zeros(3)


def _find_srdf(path: str) -> str | None:
    base = os.path.splitext(os.path.basename(path))[0]
    cand = os.path.join(os.path.dirname(os.path.dirname(path)), "srdf", base + ".srdf")
    return cand if os.path.isfile(cand) else None


def load_urdf(path: str, *, floating_base: bool = True, ground: bool = True,
              friction: float = 1.0, self_collision: bool = False, dt: float = 0.002,
              gravity=(0.0, 0.0, -9.81), package_dirs: list[str] | None = None,
              srdf: str | None = None, mesh_collisions: bool = True,
              restitution: float = 0.0, ignore_unsupported=None) -> SimModel:
    if not os.path.isfile(path):
        raise ModelError(f"{path}: no such file")
    if not (np.isfinite(friction) and friction >= 0):
        raise ModelError(f"{path}: friction must be finite and >= 0, got {friction!r}")
    joint_where = check_urdf(path, ignore_unsupported)
    try:
        if floating_base:
            model = pin.buildModelFromUrdf(path, pin.JointModelFreeFlyer())
        else:
            model = pin.buildModelFromUrdf(path)
    except Exception as exc:
        raise ModelError(f"{path}: pinocchio could not parse the URDF: {exc}") from exc
    model.gravity = pin.Motion(np.asarray(gravity, float), np.zeros(3))
    dirs = list(package_dirs or [])
    # package://NAME/... resolves against a folder holding NAME: try the URDF's ancestors
    # (example-robot-data's robots/*/urdf/x.urdf names package://example-robot-data/robots/...)
    anc = os.path.dirname(os.path.abspath(path))
    for _ in range(5):
        anc = os.path.dirname(anc)
        dirs.append(anc)
    try:
        with warnings.catch_warnings():      # pinocchio warns when package_dirs are given
            warnings.simplefilter("ignore", UserWarning)
            gmodel = pin.buildGeomFromUrdf(model, path, pin.GeometryType.COLLISION, dirs)
    except Exception as exc:
        raise ModelError(f"{path}: could not build collision geometry: {exc}") from exc
    robot_geoms = list(range(len(gmodel.geometryObjects)))
    geoms: list[GeomInfo] = []
    for go in gmodel.geometryObjects:
        kind, size = _shape_kind_size(go.geometry)
        if kind == "mesh" and not mesh_collisions:
            raise ModelError(f"{path}: geom {go.name!r} is a mesh and mesh_collisions=False")
        body = model.frames[go.parentFrame].name
        geoms.append(GeomInfo(go.name, body, kind, size, friction, 1, 1,
                              np.array([0.6, 0.6, 0.65, 1.0]),
                              bounding_radius(kind, size, go.geometry), float(restitution)))
    pairs: list[tuple[int, int]] = []
    if ground:
        gid = gmodel.addGeometryObject(pin.GeometryObject(
            "ground", 0, 0, pin.SE3.Identity(), coal.Halfspace(np.array([0, 0, 1.0]), 0.0)))
        geoms.append(GeomInfo("ground", "world", "plane", np.array([0.0, 0.0, 0.0]), friction, 1, 1,
                              np.array([0.8, 0.9, 0.8, 1.0]), math.inf))
        pairs += [(i, gid) for i in robot_geoms if gmodel.geometryObjects[i].parentJoint != 0]
    if self_collision:
        srdf_file = srdf or _find_srdf(path)
        tmp = pin.GeometryModel()
        for go in gmodel.geometryObjects:
            tmp.addGeometryObject(go)
        tmp.addAllCollisionPairs()
        if srdf_file:
            pin.removeCollisionPairs(model, tmp, srdf_file)
        parent = {j: model.parents[j] for j in range(model.njoints)}
        for cp in tmp.collisionPairs:
            a, b = cp.first, cp.second
            if a not in robot_geoms or b not in robot_geoms:
                continue
            ja = gmodel.geometryObjects[a].parentJoint
            jb = gmodel.geometryObjects[b].parentJoint
            if ja == jb or parent[ja] == jb or parent[jb] == ja:
                continue
            pairs.append((a, b))
    limits: list[JointLimit] = []
    actuators: list[Actuator] = []
    for j in range(1, model.njoints):
        jm = model.joints[j]
        if jm.nq != 1 or jm.nv != 1:
            continue
        name = model.names[j]
        lo, hi = model.lowerPositionLimit[jm.idx_q], model.upperPositionLimit[jm.idx_q]
        if np.isfinite(lo) and np.isfinite(hi) and lo < hi and not (lo == 0 and hi == 0):
            limits.append(JointLimit(name, jm.idx_q, jm.idx_v, float(lo), +1.0))
            limits.append(JointLimit(name, jm.idx_q, jm.idx_v, float(hi), -1.0))
        effort = float(model.effortLimit[jm.idx_v])
        cr = (-effort, effort) if np.isfinite(effort) and effort > 0 else None
        actuators.append(Actuator(name, name, jm.idx_v, 1.0, cr))
    q0 = pin.neutral(model)
    keyframes: dict[str, np.ndarray] = {}
    srdf_file = srdf or _find_srdf(path)
    if srdf_file:
        try:
            pin.loadReferenceConfigurations(model, srdf_file, False)
            for entry in model.referenceConfigurations:
                keyframes[entry.key()] = np.asarray(entry.data(), float).copy()
        except Exception as exc:
            raise ModelError(f"{srdf_file}: could not read reference configurations: {exc}") from exc
    if keyframes:
        q0 = (keyframes.get("standing") if "standing" in keyframes else next(iter(keyframes.values()))).copy()
    damping = np.asarray(model.damping, float).copy()
    sm = SimModel(model, gmodel, geoms, np.array(pairs, dtype=np.int64).reshape(-1, 2), limits,
                  actuators, q0, dt, damping, source=path, keyframes=keyframes,
                  joint_where=joint_where)
    sm.constraint_spec = _constraint_spec(path, model, joint_where, ignore_unsupported)
    return sm


def _constraint_spec(path: str, model, joint_where: dict[str, str], ignore_unsupported):
    """The URDF's joint dry friction (``<dynamics friction>``, read by pinocchio into
    ``model.friction``: one box-constrained row per dof, as MJCF ``frictionloss``) and its
    ``<mimic>`` couplings (``q_j = multiplier q_i + offset``: one bilateral row, as MJCF
    ``<equality><joint>``), as a :class:`diffgym.sim.equality.ConstraintSpec`."""
    from .equality import ConstraintSpec, JointCoupling
    refusals = Refusals(path, ignore_unsupported)
    spec = ConstraintSpec()
    for j in range(1, model.njoints):
        jm = model.joints[j]
        name = model.names[j]
        for k in range(jm.idx_v, jm.idx_v + jm.nv):
            f = float(model.friction[k])
            if f > 0 and not refusals.leave_out(
                    "joint.frictionloss", joint_where.get(name, path),
                    f"<dynamics friction={f:g}>"):
                spec.frictionloss[k] = f
    src = XMLSource(path)
    with open(path, encoding="utf-8") as fh:
        root = src.parse(fh.read(), path)
    for el in root.findall("joint"):
        mim = el.find("mimic")
        if mim is None or el.get("type") == "fixed":
            continue
        name, other = el.get("name", ""), mim.get("joint")
        what = f"<joint name={name!r}> <mimic joint={other!r}>"
        if other is None or not model.existJointName(other):
            raise ModelError(f"{src.where(mim)}: {what}: no joint named {other!r}")
        if other == name:
            raise ModelError(f"{src.where(mim)}: {what}: a joint cannot mimic itself")
        j1, j2 = model.joints[model.getJointId(name)], model.joints[model.getJointId(other)]
        if j1.nq != 1 or j2.nq != 1:
            refusals.hit("joint.mimic_continuous", src.where(mim), what)
            continue
        mult = float(mim.get("multiplier", "1"))
        off = float(mim.get("offset", "0"))
        spec.couplings.append(JointCoupling(
            f"mimic {name}", name, other, j1.idx_q, j1.idx_v, j2.idx_q, j2.idx_v, 0.0, 0.0,
            np.array([off, mult, 0.0, 0.0, 0.0])))
    refusals.finish()
    return spec
