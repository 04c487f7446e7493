"""Model loading, MJCF: parse a MuJoCo XML document into a :class:`~diffgym.sim.model.SimModel`.

pinocchio's own MJCF parser reads only the first body tree under ``<worldbody>`` and ignores
``<option>``; this module reads the whole document the way MuJoCo's compiler does for the
subset of MJCF that rigid-body scenes use:

* ``<include file>`` (relative to the including file; :mod:`diffgym.sim.xmlsource`), several
  ``<worldbody>``/``<actuator>``/... sections
* ``<compiler angle eulerseq inertiafromgeom autolimits meshdir assetdir settotalmass
  boundmass boundinertia balanceinertia exactmeshinertia inertiagrouprange>``,
  ``<option timestep gravity>``, ``<flag contact constraint limit gravity passive spring damper>``
* nested ``<default>`` classes and ``childclass``
* every top-level body (several free bodies in one scene), ``hinge``/``slide``/``ball``/``free``
  joints with ``pos``, ``axis``, ``ref``, ``range``, ``limited``, ``armature``, ``damping``,
  ``stiffness``; several joints in one body become a chain of joints
* ``pos``/``quat``/``euler``/``axisangle``/``xyaxes``/``zaxis`` frames, ``fromto`` geoms
* ``<inertial>`` or inertia computed from geoms (density 1000 by default), like MuJoCo
* geoms: plane, sphere, box, capsule, cylinder, ellipsoid and convex meshes (convex hull for
  contact; mass and inertia by MuJoCo's ``<mesh inertia>`` rule: legacy by default, convex,
  exact or shell, diffgym.sim.mesh_inertia; ``refpos``/``refquat``: the mesh's reference frame)
* ``<body mocap="true">``: poses the user sets (``Simulator.set_mocap``, diffgym.sim.mocap)
* geom ``friction`` (first component), ``contype``/``conaffinity``, ``condim`` 1 (frictionless)
  and 3, ``priority`` (MuJoCo's mixing), ``<contact><exclude>`` and ``<contact><pair>``, and
  MuJoCo's no-parent-child filter
* ``<actuator><motor>`` and ``<general>`` (fixed gain) on joints, the first ``<keyframe><key qpos>``

Anything else that changes the dynamics is refused by name with file and line
(:data:`diffgym.sim.unsupported.RULES`; ``ignore_unsupported`` loads it without), and every numeric
attribute, friction, mass, inertia, size and range is checked at load.
* diffgym's coefficients of restitution, in ``<custom><numeric name="diffgym:restitution"`` (every
  geom) or ``name="diffgym:restitution:GEOM"`` (one geom) ``data="e"/>``: MuJoCo loads and
  ignores them (``parse_restitution``)
* ``<equality>`` connect/weld (by bodies and anchor, or by ``site1``/``site2``: the sites'
  positions or frames coincide; a side on a mocap body follows the pose the user sets)/joint,
  joint ``frictionloss``, ball-joint ``range`` and
  ``<tendon><fixed>`` (rows of the constraint problem: ``diffgym.sim.equality``)

Configuration vectors use pinocchio's convention: a free joint is ``[x y z qx qy qz qw]``
(MuJoCo writes ``[x y z qw qx qy qz]``; keyframes are converted). Its velocity is MuJoCo's:
``[vx vy vz]`` the world-frame velocity of the body origin, then the body-frame angular
velocity (a pinocchio translation joint named after the free joint, then a spherical joint
``<name>_rot`` that carries the body).
"""
from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import coal
import numpy as np
import pinocchio as pin

from .mesh_inertia import MODES as MESH_INERTIA_MODES, MeshInertiaError, bvh_triangles, \
    mesh_mass_properties
from .model import Actuator, GeomInfo, JointLimit, ModelError, SimModel
from .pair_tables import candidate_pairs
from .unsupported import Refusals, rules_for
from .xmlsource import XMLSource, parse_model_xml

GEOM_TYPES = ("plane", "sphere", "box", "capsule", "cylinder", "ellipsoid", "mesh")
JOINT_TYPES = ("hinge", "slide", "ball", "free")
# geom types diffgym has no collision shape for: refused (unsupported.RULES) when they collide,
# dropped silently when visual only (contype = conaffinity = 0, no mass of their own)
UNSIMULATED_GEOMS = ("hfield", "sdf")
ACTUATOR_TAGS = ("motor", "general", "position", "velocity", "intvelocity", "damper",
                 "cylinder", "muscle", "adhesion", "plugin")
# attributes holding names or keywords, not numbers (skipped by the NaN/inf check)
_TEXT_ATTRS = {"name", "class", "childclass", "type", "joint", "joint1", "joint2", "body",
               "body1", "body2", "geom", "geom1", "geom2", "site", "site1", "site2", "mesh",
               "material", "texture", "hfield", "file", "target", "tendon", "objname",
               "objtype", "refsite", "cranksite", "slidersite", "jointinparent", "model",
               "prefix", "mode", "camera", "plugin", "instance", "content_type", "key"}


def _floats(text: str | None, n: int | None = None, what: str = "") -> np.ndarray | None:
    if text is None:
        return None
    try:
        arr = np.array([float(x) for x in text.split()], dtype=float)
    except ValueError as exc:
        raise ModelError(f"{what}: expected numbers, got {text!r}") from exc
    if n is not None and arr.size != n:
        raise ModelError(f"{what}: expected {n} numbers, got {arr.size} ({text!r})")
    return arr


def _float_attr(a: dict, key: str, what: str, err, default: float | None = None) -> float:
    """A scalar attribute as a float (ModelError naming the element and key if not a number)."""
    if key not in a:
        return float(default)
    try:
        return float(a[key])
    except ValueError:
        raise err(f"{what}: {key} must be a number, got {key}={a[key]!r}") from None


def inertia_problem(I: np.ndarray) -> str:
    """Why a 3x3 rotational inertia is not physical ('' if it is): non-finite entries, a
    non-positive principal moment, or principal moments violating the triangle inequality
    (``I1 + I2 >= I3``, with a relative slack of 1e-9 as for thin rods and plates)."""
    I = np.asarray(I, dtype=float)
    if not np.all(np.isfinite(I)):
        return "has non-finite entries"
    if not np.allclose(I, I.T, rtol=1e-12, atol=0.0):
        return "is not symmetric"
    ev = np.linalg.eigvalsh(0.5 * (I + I.T))
    if ev[0] <= 0:
        return f"is not positive definite (principal moments {ev.tolist()})"
    if ev[0] + ev[1] < ev[2] * (1.0 - 1e-9):
        return (f"violates the triangle inequality of principal moments "
                f"({ev[0]:.6g} + {ev[1]:.6g} < {ev[2]:.6g})")
    return ""


def _quat_wxyz_to_matrix(qw: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(qw)
    if norm == 0.0:
        raise ModelError("zero quaternion")
    w, x, y, z = qw / norm
    return pin.Quaternion(w, x, y, z).toRotationMatrix()


def _axis_angle(axis: np.ndarray, angle: float) -> np.ndarray:
    n = np.linalg.norm(axis)
    if n == 0.0:
        raise ModelError("zero rotation axis")
    return pin.exp3(np.asarray(axis, float) / n * angle)


def _min_rotation(z_from: np.ndarray, z_to: np.ndarray) -> np.ndarray:
    """Smallest rotation taking unit vector z_from onto z_to."""
    a = z_from / np.linalg.norm(z_from)
    b = z_to / np.linalg.norm(z_to)
    c = np.cross(a, b)
    s = np.linalg.norm(c)
    d = float(np.dot(a, b))
    if s < 1e-12:
        if d > 0:
            return np.eye(3)
        perp = np.array([1.0, 0, 0]) if abs(a[0]) < 0.9 else np.array([0, 1.0, 0])
        return _axis_angle(np.cross(a, perp), math.pi)
    return _axis_angle(c, math.atan2(s, d))


def bounding_radius(kind: str, size: np.ndarray, shape=None) -> float:
    """Radius of a sphere about the geom origin that holds the whole shape (inf for planes)."""
    if kind == "plane":
        return math.inf
    if kind == "sphere":
        return float(size[0])
    if kind in ("box", "ellipsoid"):
        return float(np.linalg.norm(size[:3]) if kind == "box" else np.max(size[:3]))
    if kind == "capsule":
        return float(size[0] + size[1])
    if kind == "cylinder":
        return float(math.hypot(size[0], size[1]))
    shape.computeLocalAABB()
    return float(shape.aabb_radius + np.linalg.norm(np.asarray(shape.aabb_center)))


@dataclass
class _Compiler:
    degree: bool = True
    eulerseq: str = "xyz"
    inertiafromgeom: str = "auto"
    autolimits: bool = True
    meshdir: str = ""
    boundmass: float = 0.0
    boundinertia: float = 0.0
    balanceinertia: bool = False     # principal moments breaking A + B >= C set to their mean
    exactmeshinertia: bool = False   # (MuJoCo < 3.2) meshes default to inertia="exact"
    inertiagrouprange: tuple = (0, 5)   # geoms whose group is in it give inertia from geoms

    def angle(self, value: float) -> float:
        return math.radians(value) if self.degree else value


@dataclass
class _Body:
    """Book-keeping for one MJCF body while the pinocchio model is built."""

    name: str
    jid: int                 # pinocchio joint the body is rigidly attached to
    placement: pin.SE3       # body frame expressed in that joint's frame
    frame_id: int
    weld: str                # name of the body that owns that joint ('world' for jid 0)
    parent: str | None
    children: list[str] = field(default_factory=list)
    mocap: str | None = None  # the mocap body it is (or is welded under), else None


class _MJCFBuilder:
    def __init__(self, root: ET.Element, base_dir: str, source: str,
                 src: XMLSource | None = None, ignore_unsupported=None):
        self.root = root
        self.base_dir = base_dir
        self.source = source
        self.src = src or XMLSource(source)
        self.refusals = Refusals(source, ignore_unsupported)
        self.no_contact = False          # <flag contact="disable"> (or constraint)
        self.no_limits = False           # <flag limit="disable"> (or constraint)
        self.no_damping = False          # <flag damper="disable"> (or passive)
        self.no_springs = False          # <flag spring="disable"> (or passive)
        self.geom_el: list[ET.Element | None] = []     # the element of each geom (messages)
        self.geom_attrs: list[dict[str, str]] = []      # its attributes, defaults applied
        self.joint_where: dict[str, str] = {}
        self.static_mass = 0.0           # mass of the bodies welded to the world (settotalmass)
        self.settotalmass = -1.0
        self.compiler = _Compiler()
        self.defaults: dict[str, dict[str, dict[str, str]]] = {}
        self.default_parent: dict[str, str | None] = {}
        self.model = pin.Model()
        self.model.name = root.get("model", "") or "model"     # (<mujoco model="...">)
        self.geom_model = pin.GeometryModel()
        self.geoms: list[GeomInfo] = []
        self.geom_body_index: list[str] = []
        self.bodies: dict[str, _Body] = {}
        self.limits: list[JointLimit] = []
        self.q0_parts: list[tuple[int, np.ndarray]] = []
        self.damping: dict[int, float] = {}
        self.stiffness: dict[int, tuple[float, float]] = {}
        self.meshes: dict[str, tuple[str, np.ndarray]] = {}
        self.mesh_inertia: dict[str, tuple[str, ET.Element]] = {}   # name: (rule, element)
        self.mesh_ref: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # name: (refpos, R)
        self.sites: dict[str, tuple[_Body, pin.SE3, ET.Element]] = {}  # in the joint's frame
        self._mesh_mass: dict[str, tuple[float, np.ndarray, np.ndarray]] = {}
        self.dt = 0.002
        self.gravity = np.array([0.0, 0.0, -9.81])
        self._unnamed = 0
        self.pair_mu: dict[tuple[int, int], float] = {}
        self.mocap_order: list[str] = []                 # mocap bodies in file order
        self.mocap_geoms: dict[str, list] = {}           # name: [(geom, pose in the body)]

    # -- document-level parsing -------------------------------------------------------
    def err(self, msg: str, el: ET.Element | None = None) -> ModelError:
        """A ModelError prefixed by ``file:line`` of ``el`` (or the model's source)."""
        return ModelError(f"{self.src.where(el) if el is not None else self.source}: {msg}")

    @staticmethod
    def desc(el: ET.Element) -> str:
        n = el.get("name")
        return f"<{el.tag} name={n!r}>" if n is not None else f"<{el.tag}>"

    def parse_header(self) -> None:
        if self.root.tag != "mujoco":
            raise self.err(f"root element is <{self.root.tag}>, expected <mujoco>")
        for comp in self.root.findall("compiler"):
            a = comp.attrib
            if "angle" in a:
                if a["angle"] not in ("degree", "radian"):
                    raise self.err(f"<compiler angle={a['angle']!r}>: expected degree or radian")
                self.compiler.degree = a["angle"] == "degree"
            self.compiler.eulerseq = a.get("eulerseq", self.compiler.eulerseq)
            self.compiler.inertiafromgeom = a.get("inertiafromgeom", self.compiler.inertiafromgeom)
            if "autolimits" in a:
                self.compiler.autolimits = a["autolimits"] == "true"
            self.compiler.meshdir = a.get("meshdir", a.get("assetdir", self.compiler.meshdir))
            for key in ("boundmass", "boundinertia"):
                if key in a:
                    val = float(_floats(a[key], 1, f"<compiler {key}>")[0])
                    if not (np.isfinite(val) and val >= 0):
                        raise self.err(f"<compiler {key}={a[key]!r}>: must be finite and >= 0",
                                       comp)
                    setattr(self.compiler, key, val)
            for key in ("balanceinertia", "exactmeshinertia"):
                if key in a:
                    if a[key] not in ("true", "false"):
                        raise self.err(f"<compiler {key}={a[key]!r}>: expected true or false",
                                       comp)
                    setattr(self.compiler, key, a[key] == "true")
            if "inertiagrouprange" in a:
                rg = _floats(a["inertiagrouprange"], None, "<compiler inertiagrouprange>")
                if len(rg) != 2 or not np.all(np.isfinite(rg)) or np.any(rg != np.round(rg)) \
                        or rg[0] > rg[1]:
                    raise self.err(f"<compiler inertiagrouprange={a['inertiagrouprange']!r}>: "
                                   "expected two integers lo <= hi", comp)
                self.compiler.inertiagrouprange = (int(rg[0]), int(rg[1]))
            if "settotalmass" in a:
                self.settotalmass = float(_floats(a["settotalmass"], 1, "<compiler settotalmass>")[0])
            if a.get("coordinate", "local") != "local":
                raise self.err("<compiler coordinate='global'> is not supported")
        for opt in self.root.findall("option"):
            if "timestep" in opt.attrib:
                self.dt = float(_floats(opt.get("timestep"), 1, "<option timestep>")[0])
            if "gravity" in opt.attrib:
                self.gravity = _floats(opt.get("gravity"), 3, "<option gravity>")
            for flag in opt.findall("flag"):
                f = flag.attrib
                off = lambda k: f.get(k) == "disable"  # noqa: E731
                self.no_contact |= off("contact") or off("constraint")
                self.no_limits |= off("limit") or off("constraint")
                self.no_damping |= off("damper") or off("passive")
                self.no_springs |= off("spring") or off("passive")
                if off("gravity"):
                    self.gravity = np.zeros(3)
        for d in self.root.findall("default"):
            self._parse_default(d, "main", None)
        for asset in self.root.findall("asset"):
            for mesh in asset.findall("mesh"):
                self._parse_mesh(mesh)

    # -- what the model asks for that diffgym does not simulate; bad numbers ---------------
    def scan(self) -> None:
        """Check every element against :data:`diffgym.sim.unsupported.RULES` (attributes with the
        default classes applied) and every numeric attribute for NaN/inf, everywhere in the
        document; geom and pair friction must be >= 0."""
        rules = rules_for("mjcf")
        ctx = {"autolimits": self.compiler.autolimits}
        defaulted = {"joint", "geom", "site", *ACTUATOR_TAGS}

        def matches(path: str, tag: str, parent: str) -> bool:
            if "/" in path:
                p, t = path.split("/")
                return parent == p and t in ("*", tag)
            return tag == path

        def visit(el: ET.Element, parent: str, childclass: str | None, inside: bool,
                  owner: str) -> None:
            # (an unnamed element is described with its nearest named ancestor: the body of
            # an <inertial>)
            named = el.get("name") is not None
            self._check_numbers(el, "" if named else owner)
            owner = self.desc(el) if named else owner
            if el.tag == "default":
                for d in el.iter():
                    if d is not el:
                        self._check_numbers(d)
                return
            if el.tag == "body":
                childclass = el.get("childclass", childclass)
            if inside and el.tag in defaulted and (parent != "default"):
                a = self.attrs(el, childclass if parent not in ("actuator", "contact") else None)
                if el.tag == "freejoint":
                    a["type"] = "free"
            else:
                a = dict(el.attrib)
            for r in rules:
                if r.path is None or not matches(r.path, el.tag, parent):
                    continue
                if r.when is not None and not r.when(a, ctx):
                    continue
                attr = r.attr
                value = a.get(attr) if attr and attr in a else None
                if attr and "/" in attr:        # several attributes: name those present
                    present = [k for k in attr.split("/") if k in a]
                    attr = " ".join(f"{k}={a[k]!r}" for k in present) or attr
                detail = ""
                if el.tag == "flag":
                    detail = ", ".join(f"{k}={v!r}" for k, v in a.items())
                self.refusals.hit(r.key, self.src.where(el), self.desc(el), attr, value, detail)
            if el.tag in ("geom", "pair") and "friction" in a:
                fr = _floats(a["friction"], None, f"{self.src.where(el)}: {self.desc(el)} friction")
                if fr.size == 0 or np.any(fr < 0):
                    raise self.err(f"{self.desc(el)}: friction must be >= 0, got "
                                   f"friction={a['friction']!r}", el)
            for child in el:
                visit(child, el.tag, childclass,
                      inside or el.tag in ("worldbody", "actuator", "contact"), owner)

        for el in self.root:
            visit(el, self.root.tag, None, False, "")

    def _check_numbers(self, el: ET.Element, owner: str = "") -> None:
        for k, val in el.attrib.items():
            if k in _TEXT_ATTRS:
                continue
            toks = val.split()
            try:
                nums = [float(t) for t in toks]
            except ValueError:
                continue
            if nums and not all(math.isfinite(x) for x in nums):
                what = f"{owner} {self.desc(el)}" if owner else self.desc(el)
                raise self.err(f"{what}: {k}={val!r} is not finite (NaN or inf)", el)

    def _parse_default(self, el: ET.Element, name: str, parent: str | None) -> None:
        self.default_parent[name] = parent
        table: dict[str, dict[str, str]] = {}
        for child in el:
            if child.tag == "default":
                continue
            table[child.tag] = dict(child.attrib)
        self.defaults[name] = table
        for child in el.findall("default"):
            cname = child.get("class")
            if cname is None:
                raise self.err("nested <default> without a class name", child)
            self._parse_default(child, cname, name)

    def attrs(self, el: ET.Element, childclass: str | None) -> dict[str, str]:
        """An element's attributes with its default class chain applied."""
        cls = el.get("class") or childclass or "main"
        if cls not in self.defaults and cls != "main":
            raise self.err(f"<{el.tag} name={el.get('name')!r}> uses unknown default class {cls!r}", el)
        chain = []
        c: str | None = cls
        while c is not None and c in self.defaults:
            chain.append(c)
            c = self.default_parent.get(c)
        out: dict[str, str] = {}
        tag = el.tag
        tags = [tag]
        if tag == "freejoint":
            tags = []
        if tag in ACTUATOR_TAGS:
            tags = ["general", tag]
        for c in reversed(chain):
            for t in tags:
                out.update(self.defaults[c].get(t, {}))
        out.update(el.attrib)
        return out

    def _parse_mesh(self, el: ET.Element) -> None:
        file = el.get("file")
        if file is None:
            raise self.err("<mesh> without a file (inline vertices are not supported)")
        name = el.get("name") or os.path.splitext(os.path.basename(file))[0]
        path = os.path.join(self.base_dir, self.compiler.meshdir, file)
        a = self.attrs(el, None)
        scale = _floats(a.get("scale", "1 1 1"), 3, f"<mesh name={name!r}> scale")
        # (legacy: MuJoCo's default, kept for old files; MuJoCo before 3.2 read
        # <compiler exactmeshinertia="true"> as exact for every mesh, which 3.2 replaced with
        # this attribute; its own attribute wins)
        mode = a.get("inertia", "exact" if self.compiler.exactmeshinertia else "legacy")
        if mode not in MESH_INERTIA_MODES:
            raise self.err(f"<mesh name={name!r}>: inertia={mode!r} (expected one of "
                           f"{', '.join(MESH_INERTIA_MODES)})", el)
        self.meshes[name] = (path, scale)
        self.mesh_inertia[name] = (mode, el)
        # MuJoCo's mesh reference frame: the vertices are read as S R^-1 (v - refpos), R the
        # rotation of refquat (w x y z) and S the scale (MuJoCo's order, checked against it)
        if "refpos" in a or "refquat" in a:
            rp = _floats(a.get("refpos", "0 0 0"), 3, f"{self.src.where(el)}: <mesh name={name!r}> "
                         "refpos")
            rq = _floats(a.get("refquat", "1 0 0 0"), 4, f"{self.src.where(el)}: <mesh "
                         f"name={name!r}> refquat")
            if not np.linalg.norm(rq) > 0:
                raise self.err(f"<mesh name={name!r}>: refquat={a['refquat']!r} is zero", el)
            R = _quat_wxyz_to_matrix(rq)
            if np.any(rp != 0) or not np.allclose(R, np.eye(3), rtol=0, atol=0):
                self.mesh_ref[name] = (rp, R)

    # -- frames -----------------------------------------------------------------------
    def rotation(self, a: dict[str, str], what: str) -> np.ndarray:
        given = [k for k in ("quat", "euler", "axisangle", "xyaxes", "zaxis") if k in a]
        if len(given) > 1:
            raise self.err(f"{what}: several orientations given ({', '.join(given)})")
        if "quat" in a:
            return _quat_wxyz_to_matrix(_floats(a["quat"], 4, f"{what} quat"))
        if "axisangle" in a:
            v = _floats(a["axisangle"], 4, f"{what} axisangle")
            return _axis_angle(v[:3], self.compiler.angle(v[3]))
        if "euler" in a:
            ang = [self.compiler.angle(x) for x in _floats(a["euler"], 3, f"{what} euler")]
            seq = self.compiler.eulerseq
            R = np.eye(3)
            for ch, th in zip(seq, ang):
                axis = {"x": [1.0, 0, 0], "y": [0, 1.0, 0], "z": [0, 0, 1.0]}[ch.lower()]
                Ri = _axis_angle(np.array(axis), th)
                R = R @ Ri if ch.islower() else Ri @ R
            return R
        if "xyaxes" in a:
            v = _floats(a["xyaxes"], 6, f"{what} xyaxes")
            x = v[:3] / np.linalg.norm(v[:3])
            y = v[3:] - x * np.dot(x, v[3:])
            y /= np.linalg.norm(y)
            return np.column_stack([x, y, np.cross(x, y)])
        if "zaxis" in a:
            return _min_rotation(np.array([0, 0, 1.0]), _floats(a["zaxis"], 3, f"{what} zaxis"))
        return np.eye(3)

    def pose(self, a: dict[str, str], what: str) -> pin.SE3:
        pos = _floats(a.get("pos"), 3, f"{what} pos")
        return pin.SE3(self.rotation(a, what), pos if pos is not None else np.zeros(3))

    # -- geoms ------------------------------------------------------------------------
    def geom_shape(self, a: dict[str, str], what: str):
        """Returns (kind, size, local pose, coal shape, volume, com, inertia-about-com)."""
        kind = a.get("type", "sphere")
        el = getattr(self, "_el", None)
        if kind not in GEOM_TYPES:
            raise self.err(f"{what}: unsupported geom type {kind!r} (supported: {', '.join(GEOM_TYPES)})", el)
        size = _floats(a.get("size"), None, f"{what} size")
        size = np.zeros(3) if size is None else size
        pose = self.pose(a, what)
        if "fromto" in a:
            if kind not in ("capsule", "cylinder", "box", "ellipsoid"):
                raise self.err(f"{what}: fromto is only valid for capsule, cylinder, box, ellipsoid")
            ft = _floats(a["fromto"], 6, f"{what} fromto")
            p0, p1 = ft[:3], ft[3:]
            axis = p1 - p0
            length = np.linalg.norm(axis)
            if length == 0:
                raise self.err(f"{what}: fromto has zero length")
            pose = pin.SE3(_min_rotation(np.array([0, 0, 1.0]), axis), 0.5 * (p0 + p1))
            half = 0.5 * length
            if kind in ("capsule", "cylinder"):
                size = np.array([size[0], half])
            else:
                size = np.array([size[0], size[1] if size.size > 1 else size[0], half])

        def need(n: int) -> np.ndarray:
            if size.size < n or not np.all(np.isfinite(size[:n]) & (size[:n] > 0)):
                raise self.err(f"{what}: {kind} needs {n} positive size values (finite), "
                               f"got size={a.get('size')!r}", el)
            return size[:n]

        com = np.zeros(3)
        if kind == "plane":
            shape = coal.Halfspace(np.array([0.0, 0.0, 1.0]), 0.0)
            return kind, size, pose, shape, 0.0, com, np.zeros((3, 3))
        if kind == "sphere":
            (r,) = need(1)
            shape, vol = coal.Sphere(r), 4.0 / 3.0 * math.pi * r**3
            I = np.eye(3) * 0.4 * r * r
        elif kind == "box":
            hx, hy, hz = need(3)
            shape, vol = coal.Box(2 * hx, 2 * hy, 2 * hz), 8 * hx * hy * hz
            I = np.diag([hy * hy + hz * hz, hx * hx + hz * hz, hx * hx + hy * hy]) / 3.0
        elif kind == "capsule":
            r, h = need(2)
            shape = coal.Capsule(r, 2 * h)
            vc, vs = math.pi * r * r * 2 * h, 4.0 / 3.0 * math.pi * r**3
            vol = vc + vs
            H = 2 * h
            ip = vc * (H * H / 12 + r * r / 4) + vs * (0.4 * r * r + H * H / 4 + 3 * H * r / 8)
            ia = vc * r * r / 2 + vs * 0.4 * r * r
            I = np.diag([ip, ip, ia]) / vol
        elif kind == "cylinder":
            r, h = need(2)
            shape, vol = coal.Cylinder(r, 2 * h), math.pi * r * r * 2 * h
            ip = (3 * r * r + 4 * h * h) / 12.0
            I = np.diag([ip, ip, r * r / 2])
        elif kind == "ellipsoid":
            rx, ry, rz = need(3)
            shape, vol = coal.Ellipsoid(rx, ry, rz), 4.0 / 3.0 * math.pi * rx * ry * rz
            I = np.diag([ry * ry + rz * rz, rx * rx + rz * rz, rx * rx + ry * ry]) / 5.0
        else:  # mesh
            mname = a.get("mesh")
            if mname not in self.meshes:
                raise self.err(f"{what}: mesh {mname!r} is not declared in <asset>")
            path, scale = self.meshes[mname]
            if not os.path.isfile(path):
                raise self.err(f"{what}: mesh file {path!r} not found")
            try:
                ref = self.mesh_ref.get(mname)
                if ref is None:
                    bvh = coal.MeshLoader().load(path, scale)
                else:                # (refpos / refquat: the vertices in the mesh's frame)
                    raw = coal.MeshLoader().load(path, np.ones(3))
                    V, F = bvh_triangles(raw)
                    V = ((V - ref[0]) @ ref[1]) * np.asarray(scale, float)
                    bvh = coal.BVHModelOBBRSS()
                    bvh.beginModel(len(F), len(V))
                    bvh.addVertices(np.ascontiguousarray(V))
                    bvh.addTriangles(np.ascontiguousarray(F, dtype=np.int64))
                    bvh.endModel()
                bvh.buildConvexHull(True, "Qt")
                shape = bvh.convex
            except Exception as exc:  # coal raises plain RuntimeErrors
                raise self.err(f"{what}: could not load mesh {path!r}: {exc}") from exc
            vol, com, I = self._mesh_mass_properties(mname, bvh, shape, scale, what)
            size = np.asarray(scale)
        return kind, size, pose, shape, vol, com, I

    def _mesh_mass_properties(self, mname: str, bvh, hull, scale, what: str):
        """(volume, com, inertia about com per unit volume) of a mesh by MuJoCo's rule for it
        (``<mesh inertia>``: legacy by default, convex, exact, shell; diffgym.sim.mesh_inertia),
        computed once per mesh."""
        if mname in self._mesh_mass:
            return self._mesh_mass[mname]
        mode, el = self.mesh_inertia[mname]
        if mode == "convex":
            vol = float(hull.computeVolume())
            com = np.asarray(hull.computeCOM()).copy()
            I = np.asarray(hull.computeMomentofInertiaRelatedToCOM()) / max(vol, 1e-12)
        else:
            V, F = bvh_triangles(bvh)
            if np.prod(scale) < 0:             # a mirroring scale turns the faces inside out
                F = F[:, [0, 2, 1]]
            try:
                vol, com, I = mesh_mass_properties(V, F, mode)
            except MeshInertiaError as exc:
                raise self.err(f"<mesh name={mname!r}> inertia={mode!r}: {exc} (used by "
                               f"{what})", el) from exc
            I = I / vol
        # (MuJoCo's own check of a mesh's principal moments, with its tolerances)
        ev = np.linalg.eigvalsh(I * vol) if np.all(np.isfinite(I)) else np.full(3, np.nan)
        if not (ev[0] > 0 and ev[0] + ev[1] >= ev[2] * (1 - 1e-6) - 1e-9):
            raise self.err(f"<mesh name={mname!r}> inertia={mode!r}: the mesh's principal "
                           f"moments {ev.tolist()} are not physical (used by {what})", el)
        self._mesh_mass[mname] = (vol, com, I)
        return vol, com, I

    # -- bodies -----------------------------------------------------------------------
    def build(self) -> SimModel:
        self.parse_header()
        self.scan()
        worlds = self.root.findall("worldbody")      # (several: from included files)
        if not worlds:
            raise self.err("no <worldbody>")
        self.model.gravity = pin.Motion(self.gravity, np.zeros(3))
        self.bodies["world"] = _Body("world", 0, pin.SE3.Identity(), 0, "world", None)
        for el in (e for w in worlds for e in w):
            if el.tag == "geom":
                self.add_geom(el, self.bodies["world"], None)
            elif el.tag == "body":
                self.add_body(el, self.bodies["world"], None)
            elif el.tag == "frame":
                raise self.err("<frame> is not supported; fold it into the bodies' pos/quat", el)
            elif el.tag == "site":
                self._add_site(el, self.bodies["world"], None)
        if self.settotalmass > 0:
            # MuJoCo's compiler scales every body's mass and inertia so the total is this value
            total = self.static_mass + sum(self.model.inertias[j].mass
                                           for j in range(1, self.model.njoints))
            if total > 0:
                s = self.settotalmass / total
                for j in range(1, self.model.njoints):
                    Y = self.model.inertias[j]
                    self.model.inertias[j] = pin.Inertia(Y.mass * s, Y.lever.copy(),
                                                         Y.inertia.copy() * s)
        nq = self.model.nq
        q0 = pin.neutral(self.model)
        for idx, val in self.q0_parts:
            q0[idx:idx + val.size] = val
        damping = np.zeros(self.model.nv)
        if not self.no_damping:
            for iv, d in self.damping.items():
                damping[iv] = d
        q0_ref = q0.copy()            # MuJoCo's qpos0: equality constraints are built at it
        pairs = self.collision_pairs()
        if self.no_contact:
            pairs = np.zeros((0, 2), dtype=np.int64)
        limits = [] if self.no_limits else self.limits
        actuators = self.parse_actuators()
        keyframes = self.parse_keyframes(nq)
        self.parse_restitution()
        if keyframes:
            q0 = next(iter(keyframes.values())).copy()
        self.refusals.finish()
        sm = SimModel(self.model, self.geom_model, self.geoms, pairs, limits, actuators,
                      q0, self.dt, damping, source=self.source, keyframes=keyframes,
                      joint_where=self.joint_where)
        sm.stiffness = {} if self.no_springs else self.stiffness
        sm.refused_ignored = list(self.refusals.ignored_keys)
        sm.constraint_spec = self.parse_constraint_spec(q0_ref)
        from .mocap import MocapBody
        sm.mocap = [MocapBody(n, self.bodies[n].placement.copy(),
                              np.array([g for g, _ in self.mocap_geoms.get(n, [])],
                                       dtype=np.int64),
                              [M for _, M in self.mocap_geoms.get(n, [])])
                    for n in self.mocap_order]
        self._mocap_keyframes(sm)
        # an explicit <pair> has its own friction (MuJoCo's default 1), not the geoms' larger one
        for k, (a, b) in enumerate(sm.pairs):
            mu = self.pair_mu.get((int(a), int(b)), self.pair_mu.get((int(b), int(a))))
            if mu is not None:
                sm.pair_friction[k] = mu
        return sm

    def add_body(self, el: ET.Element, parent: _Body, childclass: str | None) -> None:
        name = el.get("name") or f"body{len(self.bodies)}"
        if name in self.bodies:
            raise self.err(f"duplicate body name {name!r}", el)
        what = f"<body name={name!r}>"
        childclass = el.get("childclass", childclass)
        local = self.pose(dict(el.attrib), what)
        T = parent.placement * local          # body frame in the parent joint's frame
        jid, weld = parent.jid, parent.weld
        joints = [j for j in el if j.tag in ("joint", "freejoint")]
        mocap = self._mocap_body(el, name, parent, joints)
        for j in joints:
            a = self.attrs(j, childclass)
            jtype = "free" if j.tag == "freejoint" else a.get("type", "hinge")
            jname = a.get("name") or f"{name}_joint{self._unnamed}"
            self._unnamed += 1
            if jtype not in JOINT_TYPES:
                raise self.err(f"<joint name={jname!r}>: unsupported type {jtype!r}", j)
            self.joint_where[jname] = f"{self.src.where(j)}: <body name={name!r}>"
            self.joint_where[f"{jname}_rot"] = self.joint_where[jname]
            self._el = j
            anchor = _floats(a.get("pos", "0 0 0"), 3, f"<joint name={jname!r}> pos")
            for key in ("damping", "armature", "stiffness"):
                # (a negative damper or spring feeds energy in; a negative armature can make the
                # mass matrix indefinite: bad input, refused at load with the line)
                if key in a:
                    val = _float_attr(a, key, f"<joint name={jname!r}>",
                                      lambda msg: self.err(msg, j))
                    if not (np.isfinite(val) and val >= 0):
                        raise self.err(f"<joint name={jname!r}>: {key} must be finite and >= 0, "
                                       f"got {key}={a[key]!r}", j)
            if jtype == "free":
                if parent.jid != 0 or len(joints) > 1:
                    raise self.err(f"<joint name={jname!r}>: a free joint must be the only joint "
                                   "of a top-level body", j)
                # MuJoCo's free joint: a translation whose velocity is the WORLD-frame linear
                # velocity of the body origin, then a ball joint (body-frame angular velocity).
                # Same q layout [x y z qx qy qz qw] and v layout as one free flyer, but not
                # pinocchio's JointModelFreeFlyer, whose linear velocity is in the body frame:
                # with it, the semi-implicit step rotates that velocity explicitly each step
                # (|v| grows by sqrt(1 + (w dt)^2)) and integrates a screw, so a spinning or
                # rolling body gains energy without bound (a rolling billiard ball diverged).
                tid = self.model.addJoint(jid, pin.JointModelTranslation(), pin.SE3.Identity(), jname)
                tj = self.model.joints[tid]
                self.q0_parts.append((tj.idx_q, T.translation.copy()))
                self.model.armature[tj.idx_v:tj.idx_v + 3] = float(a.get("armature", 0.0))
                if float(a.get("damping", 0.0)) != 0.0:
                    for k in range(3):
                        self.damping[tj.idx_v + k] = float(a["damping"])
                jid, jname = tid, f"{jname}_rot"
                if self.model.existJointName(jname):
                    raise self.err(f"duplicate joint name {jname!r}")
                jm = pin.JointModelSpherical()
                placement = pin.SE3.Identity()
                start = pin.Quaternion(T.rotation).coeffs().copy()   # x y z w
                T = pin.SE3.Identity()
            else:
                frame = T * pin.SE3(np.eye(3), anchor)
                if jtype == "ball":
                    jm = pin.JointModelSpherical()
                    placement, start = frame, np.array([0.0, 0, 0, 1])
                else:
                    axis = _floats(a.get("axis", "0 0 1"), 3, f"<joint name={jname!r}> axis")
                    if np.linalg.norm(axis) == 0:
                        raise self.err(f"<joint name={jname!r}>: zero axis", j)
                    axis = axis / np.linalg.norm(axis)
                    ref = float(a.get("ref", 0.0))
                    if jtype == "hinge":
                        ref = self.compiler.angle(ref)
                        jm = pin.JointModelRevoluteUnaligned(axis)
                        offset = pin.SE3(_axis_angle(axis, -ref), np.zeros(3))
                    else:
                        jm = pin.JointModelPrismaticUnaligned(axis)
                        offset = pin.SE3(np.eye(3), -axis * ref)
                    placement, start = frame * offset, np.array([ref])
                T = pin.SE3(np.eye(3), -anchor)
            new_jid = self.model.addJoint(jid, jm, placement, jname)
            jmodel = self.model.joints[new_jid]
            self.q0_parts.append((jmodel.idx_q, start))
            self.model.armature[jmodel.idx_v:jmodel.idx_v + jmodel.nv] = float(a.get("armature", 0.0))
            if float(a.get("damping", 0.0)) != 0.0:
                for k in range(jmodel.nv):
                    self.damping[jmodel.idx_v + k] = float(a["damping"])
            self._joint_constraint_attrs(a, jtype, jname, jmodel, j)
            if jtype in ("hinge", "slide"):
                k = float(a.get("stiffness", 0.0))
                if k != 0.0:
                    sref = float(a.get("springref", 0.0))
                    sref = self.compiler.angle(sref) if jtype == "hinge" else sref
                    self.stiffness[jmodel.idx_v] = (k, sref)
                self._add_limit(a, jtype, jname, jmodel)
            jid, weld = new_jid, name
        body = _Body(name, jid, T, 0, weld, parent.name)
        parent.children.append(name)
        self.bodies[name] = body
        # (a mocap body and the jointless bodies under it: their geoms move with its pose)
        body.mocap = mocap if mocap is not None else getattr(parent, "mocap", None)
        if body.mocap is not None and body.mocap != name and joints:
            raise self.err(f"{what}: a body with joints under the mocap body {body.mocap!r} is "
                           "not supported (its joints would move with the pose the user sets; "
                           "MuJoCo's mocap bodies drive such bodies through an <equality>)", el)
        body.frame_id = self.model.addBodyFrame(name, jid, T, parent.frame_id)
        for site in el.findall("site"):
            self._add_site(site, body, childclass)
        # inertia
        inertial = el.find("inertial")
        use_geoms = self.compiler.inertiafromgeom == "true" or (
            self.compiler.inertiafromgeom == "auto" and inertial is None)
        geom_mass: list[tuple[float, np.ndarray, np.ndarray]] = []
        for g in el.findall("geom"):
            m_c_I = self.add_geom(g, body, childclass)
            if m_c_I is not None:
                geom_mass.append(m_c_I)
        if use_geoms:
            mass = sum(m for m, _, _ in geom_mass)
            com, I = np.zeros(3), np.zeros((3, 3))
            if mass > 0:
                com = sum(m * c for m, c, _ in geom_mass) / mass
                for m, c, Ig in geom_mass:
                    d = c - com
                    I += Ig + m * (np.dot(d, d) * np.eye(3) - np.outer(d, d))
                I = 0.5 * (I + I.T)           # (rotated geom inertias: rounding asymmetry)
            elif self.compiler.boundmass > 0:
                # MuJoCo puts the bounded mass of a body without mass at the body's own pos
                # (read in its frame, a quirk followed so the same file gives the same model),
                # and its principal axes along the body's own quat
                com = local.translation.copy()
                if self.compiler.boundinertia <= 0 and jid != 0:
                    raise self.err(f"{what}: no mass of its own: <compiler boundmass> gives it "
                                   "a mass but no inertia (MuJoCo refuses it too; set "
                                   "boundinertia, or give it geoms or an <inertial>)", el)
            mass, I = self._bounded(mass, I)
            if mass > 0 and self.compiler.boundmass > 0 and not geom_mass:
                I = local.rotation @ I @ local.rotation.T
            if jid == 0:
                self.static_mass += mass     # a body welded to the world: not simulated
            elif mass > 0:
                self.model.appendBodyToJoint(jid, pin.Inertia(mass, com, I), T)
        elif inertial is not None:
            a = dict(inertial.attrib)
            mass = _float_attr(a, "mass", f"{what} <inertial>", self.err, 0.0)
            if not (np.isfinite(mass) and mass > 0):
                raise self.err(f"{what} <inertial>: mass must be positive and finite, got "
                               f"mass={a.get('mass')!r}", inertial)
            R = self.rotation(a, f"{what} <inertial>")
            if "diaginertia" in a:
                I = np.diag(_floats(a["diaginertia"], 3, f"{what} diaginertia"))
                key = "diaginertia"
            elif "fullinertia" in a:
                xx, yy, zz, xy, xz, yz = _floats(a["fullinertia"], 6, f"{what} fullinertia")
                I = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
                key = "fullinertia"
            else:
                raise self.err(f"{what} <inertial>: needs diaginertia or fullinertia", inertial)
            problem = inertia_problem(I)
            if problem and self.compiler.balanceinertia and "triangle" in problem:
                # MuJoCo's <compiler balanceinertia="true">: the three principal moments set
                # to their mean (checked against MuJoCo, tests/test_mesh_inertia.py)
                I = np.eye(3) * (np.trace(I) / 3.0)
                problem = ""
            if problem:
                hint = ("; <compiler balanceinertia=\"true\"> sets the moments to their mean, "
                        "as in MuJoCo") if "triangle" in problem else ""
                raise self.err(f"{what} <inertial>: {key}={a[key]!r} {problem}{hint}", inertial)
            pos = _floats(a.get("pos", "0 0 0"), 3, f"{what} <inertial> pos")
            mass, I = self._bounded(mass, I)
            if jid == 0:
                self.static_mass += mass
            else:
                self.model.appendBodyToJoint(jid, pin.Inertia(mass, pos, R @ I @ R.T), T)
        for child in el.findall("body"):
            self.add_body(child, body, childclass)

    def _mocap_body(self, el: ET.Element, name: str, parent: _Body, joints) -> str | None:
        """``mocap="true"``: MuJoCo's rules (a child of the world without joints) checked with
        the line; returns the name (its geoms are world geoms whose pose the user sets,
        ``Simulator.set_mocap``) or None."""
        val = el.get("mocap", "false")
        if val not in ("true", "false"):
            raise self.err(f"<body name={name!r}>: mocap={val!r} (expected true or false)", el)
        if val != "true":
            return None
        if parent.name != "world":
            raise self.err(f"<body name={name!r}> mocap='true': a mocap body must be a child of "
                           f"the world (it is in {parent.name!r}; MuJoCo refuses it too)", el)
        if joints:
            raise self.err(f"<body name={name!r}> mocap='true': a mocap body cannot have joints "
                           "(MuJoCo refuses it too)", el)
        self.mocap_order.append(name)
        return name

    def _add_site(self, el: ET.Element, body: _Body, childclass: str | None) -> None:
        """A named site's frame in its body's joint frame (equality constraints name sites)."""
        a = self.attrs(el, childclass)
        name = a.get("name")
        if name is None:
            return
        what = f"<site name={name!r}>"
        if "fromto" in a:        # (a capsule-like site: its frame sits at the midpoint)
            ft = _floats(a["fromto"], 6, f"{what} fromto")
            a = {k: v for k, v in a.items() if k != "fromto"}
            a["pos"] = " ".join(repr(float(x)) for x in 0.5 * (ft[:3] + ft[3:]))
            a["zaxis"] = " ".join(repr(float(x)) for x in ft[3:] - ft[:3])
            for k in ("quat", "euler", "axisangle", "xyaxes"):
                a.pop(k, None)
        self.sites[name] = (body, body.placement * self.pose(a, what), el)

    def _bounded(self, mass: float, I: np.ndarray) -> tuple[float, np.ndarray]:
        """MuJoCo's ``<compiler boundmass boundinertia>``: every body but the world gets at least
        that mass, and principal moments of at least that inertia (a body without geoms too)."""
        c = self.compiler
        if c.boundmass > 0:
            mass = max(mass, c.boundmass)
        if c.boundinertia > 0 and mass > 0:
            ev, R = np.linalg.eigh(0.5 * (I + I.T))
            if np.any(ev < c.boundinertia):
                I = (R * np.maximum(ev, c.boundinertia)) @ R.T
                I = 0.5 * (I + I.T)
        return mass, I

    def _add_limit(self, a: dict[str, str], jtype: str, jname: str, jmodel) -> None:
        limited = a.get("limited", "auto")
        if limited == "auto":
            limited = "true" if (self.compiler.autolimits and "range" in a) else "false"
        if limited != "true":
            return
        el = getattr(self, "_el", None)
        if "range" not in a:
            raise self.err(f"<joint name={jname!r}>: limited joint without range", el)
        lo, hi = _floats(a["range"], 2, f"{self.src.where(el)}: <joint name={jname!r}> range")
        if jtype == "hinge":
            lo, hi = self.compiler.angle(lo), self.compiler.angle(hi)
        if lo >= hi:
            raise self.err(f"<joint name={jname!r}>: range lower {lo} >= upper {hi} "
                           f"(range={a['range']!r})", el)
        self.limits.append(JointLimit(jname, jmodel.idx_q, jmodel.idx_v, lo, +1.0))
        self.limits.append(JointLimit(jname, jmodel.idx_q, jmodel.idx_v, hi, -1.0))

    def add_geom(self, el: ET.Element, body: _Body, childclass: str | None):
        a = self.attrs(el, childclass)
        if a.get("type") in UNSIMULATED_GEOMS:
            # refused by the scan when it collides; visual-only: no dynamics (in MuJoCo an
            # hfield has no mass either)
            return None
        gname = a.get("name") or f"{body.name}_geom{len(self.geoms)}"
        what = f"<geom name={gname!r}>"
        self._el = el
        kind, size, pose, shape, vol, com, I = self.geom_shape(a, what)
        placement = body.placement * pose
        go = pin.GeometryObject(gname, body.jid, body.frame_id, placement, shape)
        self.geom_model.addGeometryObject(go)
        fr = _floats(a.get("friction", "1"), None, f"{what} friction")
        rgba = _floats(a.get("rgba", "0.5 0.5 0.5 1"), 4, f"{what} rgba")
        info = GeomInfo(gname, body.name, kind, np.asarray(size, float), float(fr[0]),
                        int(a.get("contype", 1)), int(a.get("conaffinity", 1)), rgba,
                        bounding_radius(kind, size, shape))
        self.geoms.append(info)
        self.geom_el.append(el)
        self.geom_attrs.append(a)
        self.geom_body_index.append(body.name)
        mb = getattr(body, "mocap", None)
        if mb is not None:
            if kind == "plane":
                raise self.err(f"{what}: a plane on the mocap body {mb!r} is not supported (a "
                               "moving half-space; use a box)", el)
            # (the geom's placement in the mocap body's frame: body.placement is the body's
            # world pose, the mocap body's own one times the jointless bodies' in between)
            root = self.bodies[mb].placement
            self.mocap_geoms.setdefault(mb, []).append((len(self.geoms) - 1,
                                                        root.actInv(placement)))
        if body.name == "world" or kind == "plane":
            return None
        # MuJoCo's <compiler inertiagrouprange>: only geoms whose group is in the range give
        # mass and inertia (the others still collide)
        lo, hi = self.compiler.inertiagrouprange
        grp = _floats(a.get("group", "0"), 1, f"{what} group")[0]
        if not (np.isfinite(grp) and grp == round(grp)):
            raise self.err(f"{what}: group must be an integer, got group={a.get('group')!r}", el)
        if not lo <= int(grp) <= hi:
            return None
        # (a zero mass or density is MuJoCo's massless geom, e.g. a visual; negative or
        # non-finite values are errors)
        if "mass" in a:
            mass = _float_attr(a, "mass", what, self.err)
            if not (np.isfinite(mass) and mass >= 0):
                raise self.err(f"{what}: mass must be finite and >= 0, got mass={a['mass']!r}", el)
        else:
            density = _float_attr(a, "density", what, self.err, 1000.0)
            if not (np.isfinite(density) and density >= 0):
                raise self.err(f"{what}: density must be finite and >= 0, got "
                               f"density={a.get('density')!r}", el)
            mass = density * vol
        if mass <= 0:
            return None
        R, p = pose.rotation, pose.translation
        return mass, p + R @ com, mass * (R @ I @ R.T)

    # -- restitution (a diffgym extension MuJoCo itself still loads) ------------------
    def parse_restitution(self) -> None:
        """Coefficients of restitution from ``<custom><numeric>`` fields, which MuJoCo accepts
        and ignores: ``name="diffgym:restitution"`` sets every geom's, ``name=
        "diffgym:restitution:GEOM"`` one geom's (it wins). One number in [0, 1]; default 0."""
        names = {g.name: i for i, g in enumerate(self.geoms)}
        every, per = None, {}
        for custom in self.root.findall("custom"):
            for el in custom.findall("numeric"):
                key = el.get("name") or ""
                if not (key == "diffgym:restitution" or key.startswith("diffgym:restitution:")):
                    continue
                what = f"<custom><numeric name={key!r}>"
                val = _floats(el.get("data"), 1, f"{what} data")
                if val is None:
                    raise self.err(f"{what}: needs data=\"e\", the coefficient of restitution")
                e = float(val[0])
                if not 0.0 <= e <= 1.0:
                    raise self.err(f"{what}: the coefficient of restitution must be in [0, 1], "
                                   f"got {e!r}")
                if key == "diffgym:restitution":
                    every = e
                    continue
                gname = key[len("diffgym:restitution:"):]
                if gname not in names:
                    raise self.err(f"{what}: no geom named {gname!r}")
                per[names[gname]] = e
        for i, g in enumerate(self.geoms):
            g.restitution = per.get(i, every if every is not None else g.restitution)

    # -- pairs, actuators, keyframes -----------------------------------------------
    def collision_pairs(self) -> np.ndarray:
        excluded = set()
        explicit: list[tuple[int, int]] = []
        names = {g.name: i for i, g in enumerate(self.geoms)}
        for contact in self.root.findall("contact"):
            for ex in contact.findall("exclude"):
                b1, b2 = ex.get("body1"), ex.get("body2")
                for b in (b1, b2):
                    if b not in self.bodies:
                        raise self.err(f"<exclude body1={b1!r} body2={b2!r}>: unknown body {b!r}")
                excluded.add(frozenset((b1, b2)))
            for pr in contact.findall("pair"):
                g1, g2 = pr.get("geom1"), pr.get("geom2")
                for g in (g1, g2):
                    if g not in names:
                        raise self.err(f"<pair geom1={g1!r} geom2={g2!r}>: unknown geom {g!r}", pr)
                explicit.append((names[g1], names[g2]))
                pa = self.attrs(pr, None)
                if int(pa.get("condim", 3)) == 1:
                    self.pair_mu[(names[g1], names[g2])] = 0.0
                elif int(pa.get("condim", 3)) != 3 and not self.no_contact:
                    self.refusals.hit("geom.condim", self.src.where(pr),
                                      f"<pair geom1={g1!r} geom2={g2!r}>", "condim", pa["condim"])
                fr = _floats(pr.get("friction", "1"), None, f"<pair geom1={g1!r} geom2={g2!r}> friction")
                self.pair_mu.setdefault((names[g1], names[g2]), float(fr[0]))
        weld_parent = {b.weld: self.bodies[b.parent].weld for b in self.bodies.values()
                       if b.parent is not None and b.weld != self.bodies[b.parent].weld}
        # (a numpy pass per geom over the geoms after it, not a Python loop over the pairs)
        pairs = candidate_pairs(self.geoms, self.bodies, weld_parent, excluded)
        # MuJoCo's mixing: the geom of higher priority gives condim and friction, else the
        # larger condim and friction (diffgym's contacts are condim 3: others are refused)
        flagged: set[int] = set()
        explicit_set = set(explicit) | {p[::-1] for p in explicit}
        # only pairs of geoms with a priority or a condim other than 3 mix anything
        pri = [int(a.get("priority", 0)) for a in self.geom_attrs]
        cdm = [int(a.get("condim", 3)) for a in self.geom_attrs]
        special = {g for g in range(len(self.geoms)) if pri[g] != 0 or cdm[g] != 3}
        mixed = [(i, k) for i, k in pairs if i in special or k in special] if special else []
        for i, k in mixed:
            if (i, k) in explicit_set:      # a <pair> has its own condim and friction
                continue
            ai, ak = self.geom_attrs[i], self.geom_attrs[k]
            pi, pk = int(ai.get("priority", 0)), int(ak.get("priority", 0))
            ci, ck = int(ai.get("condim", 3)), int(ak.get("condim", 3))
            if pi != pk:
                src = i if pi > pk else k
                self.pair_mu.setdefault((i, k), self.geoms[src].friction)
                condim = ci if pi > pk else ck
                culprits = [src]
            else:
                condim = max(ci, ck)
                culprits = [g for g, c in ((i, ci), (k, ck)) if c == condim]
            if condim == 1:                 # frictionless contact
                self.pair_mu[(i, k)] = 0.0
            elif condim != 3 and not self.no_contact:
                for g in culprits:
                    if g in flagged:
                        continue
                    flagged.add(g)
                    el = self.geom_el[g]
                    other = self.geoms[k if g == i else i].name
                    self.refusals.hit("geom.condim", self.src.where(el),
                                      f"<geom name={self.geoms[g].name!r}>", "condim",
                                      str(condim), f"in its contacts with {other!r}, ...")
        have = set(pairs)
        for p in explicit:
            if p not in have and p[::-1] not in have:
                pairs.append(p)
                have.add(p)
        return np.array(pairs, dtype=np.int64).reshape(-1, 2)

    def parse_actuators(self) -> list[Actuator]:
        acts = []
        for sec in self.root.findall("actuator"):
            for el in sec:
                if el.tag not in ACTUATOR_TAGS:
                    raise self.err(f"<actuator><{el.tag}>: unknown actuator type", el)
                if el.tag != "motor" and el.tag != "general":
                    continue       # refused by the scan, or ignored: left out
                a = self.attrs(el, None)
                jname = a.get("joint")
                if jname is None and "tendon" in a:
                    acts.append(self._tendon_actuator(el, a))
                    continue
                if jname is None:
                    continue       # another transmission: refused by the scan, or ignored
                if not self.model.existJointName(jname):
                    raise self.err(f"<{el.tag}>: unknown joint {jname!r}", el)
                jm = self.model.joints[self.model.getJointId(jname)]
                if jm.nv != 1:
                    raise self.err(f"<{el.tag} joint={jname!r}>: actuated joint must be hinge or slide", el)
                gear = float(_floats(a.get("gear", "1"), None, "gear")[0])
                if el.tag == "general":     # force = gain * ctrl (gaintype fixed; the rest refused)
                    gear *= float(_floats(a.get("gainprm", "1"), None,
                                          f"{self.src.where(el)}: gainprm")[0])
                cr = None
                limited = a.get("ctrllimited", "auto")
                if "ctrlrange" in a and limited != "false":
                    lo, hi = _floats(a["ctrlrange"], 2, f"<{el.tag} joint={jname!r}> ctrlrange")
                    if not lo <= hi:
                        raise self.err(f"<{el.tag} joint={jname!r}>: ctrlrange lower {lo} > "
                                       f"upper {hi}", el)
                    cr = (float(lo), float(hi))
                acts.append(Actuator(a.get("name", jname), jname, jm.idx_v, gear, cr))
        return acts

    # -- issue 15: equality constraints, dry friction, ball limits, fixed tendons ----------
    def _joint_constraint_attrs(self, a: dict[str, str], jtype: str, jname: str, jmodel,
                                el=None) -> None:
        """A joint's ``frictionloss`` (dry friction on each of its dofs) and a ball joint's
        ``range`` (MuJoCo: the largest rotation angle, ``range[1]``)."""
        if not hasattr(self, "frictionloss"):
            self.frictionloss: dict[int, float] = {}
            self.ball_limits: list = []
        if "frictionloss" in a:
            f = _float_attr(a, "frictionloss", f"<joint name={jname!r}>", self.err)
            if not (np.isfinite(f) and f >= 0):
                raise self.err(f"<joint name={jname!r}>: frictionloss must be finite and >= 0, "
                               f"got {a['frictionloss']!r}", el)
            if f > 0 and self.refusals.leave_out(
                    "joint.frictionloss", self.src.where(el) if el is not None else self.source,
                    f"<joint name={jname!r}> frictionloss={a['frictionloss']!r}"):
                f = 0.0
            if f > 0:        # (a free joint: its translation's 3 dofs come right before)
                first = jmodel.idx_v - 3 if jtype == "free" else jmodel.idx_v
                for k in range(first, jmodel.idx_v + jmodel.nv):
                    self.frictionloss[k] = f
        if jtype == "ball":
            from .equality import BallLimit
            limited = a.get("limited", "auto")
            if limited == "auto":
                limited = "true" if (self.compiler.autolimits and "range" in a) else "false"
            if limited != "true":
                return
            if "range" not in a:
                raise self.err(f"<joint name={jname!r}>: limited ball joint without range", el)
            lo, hi = _floats(a["range"], 2, f"<joint name={jname!r}> range")
            if lo != 0 or not hi > 0:
                raise self.err(f"<joint name={jname!r}>: a ball joint's range must be '0 max' "
                               f"with max > 0 (the largest rotation angle), got {a['range']!r}",
                               el)
            self.ball_limits.append(BallLimit(jname, jmodel.idx_q, jmodel.idx_v,
                                              self.compiler.angle(float(hi))))

    def _scalar_joint(self, jname: str | None, what: str):
        if jname is None or not self.model.existJointName(jname):
            raise self.err(f"{what}: unknown joint {jname!r}")
        jm = self.model.joints[self.model.getJointId(jname)]
        if jm.nv != 1 or jm.nq != 1:
            raise self.err(f"{what}: joint {jname!r} must be a hinge or slide")
        return jm

    def _body_of(self, name: str | None, what: str, el: ET.Element | None = None):
        if name is None:
            raise self.err(f"{what}: missing body", el)
        if name not in self.bodies:
            raise self.err(f"{what}: unknown body {name!r}", el)
        return self.bodies[name]

    def parse_constraint_spec(self, q0: np.ndarray):
        """``<equality>`` (connect, weld, joint) and ``<tendon><fixed>``, with the joints'
        frictionloss and ball ranges, as a :class:`diffgym.sim.equality.ConstraintSpec`."""
        from .equality import ConstraintSpec, Connect, FixedTendon, JointCoupling, Weld
        spec = ConstraintSpec(frictionloss=dict(getattr(self, "frictionloss", {})),
                              ball_limits=list(getattr(self, "ball_limits", [])))
        from .trees import joint_placements
        # the joints' placements at qpos0, only where an equality needs them (tree by tree:
        # a whole-model pinocchio Data is cubic in nv)
        oMi: list = []

        def placement(jid):
            if not oMi:
                oMi.extend(joint_placements(self.model, q0))
            return oMi[jid]

        def pose(body):          # the body frame in the world at qpos0
            return placement(body.jid) * body.placement

        mocap_index = {n: i for i, n in enumerate(self.mocap_order)}
        for sec in self.root.findall("equality"):
            for el in sec:
                a = self.attrs(el, None)
                name = a.get("name", f"{el.tag}{len(spec.connects) + len(spec.welds) + len(spec.couplings)}")
                what = f"<equality><{el.tag} name={name!r}>"
                if a.get("active", "true") == "false":
                    continue
                if el.tag in ("connect", "weld"):
                    by_site = "site1" in a or "site2" in a
                    if by_site:
                        # MuJoCo's site form: the two sites' positions (connect) or frames
                        # (weld) coincide; body1/body2/anchor/relpose are not read
                        for k in ("site1", "site2"):
                            if a.get(k) is None:
                                raise self.err(f"{what}: site1 and site2 go together (missing "
                                               f"{k})", el)
                            if a[k] not in self.sites:
                                raise self.err(f"{what}: unknown site {k}={a[k]!r}", el)
                        mixed = [k for k in ("body1", "body2", "anchor") if k in el.attrib]
                        if mixed:
                            raise self.err(f"{what}: site1/site2 with {', '.join(mixed)} (give "
                                           "either sites or bodies)", el)
                        b1, S1, _ = self.sites[a["site1"]]
                        b2, S2, _ = self.sites[a["site2"]]
                    else:
                        b1 = self._body_of(a.get("body1"), what, el)
                        b2 = self._body_of(a.get("body2", "world"), what, el)
                    # a side on a mocap body (MuJoCo's way to drag a body by a target the
                    # user sets): held in the mocap body's frame, its pose read at each step
                    # (diffgym.sim.equality, ``mocap1``/``mocap2``); a side on the world or a
                    # mocap body has no dof, so at least one side must have joints
                    mi = [mocap_index.get(b.mocap, -1) if b.mocap is not None else -1
                          for b in (b1, b2)]
                    if b1.jid == b2.jid and (b1.jid or (mi[0] < 0 and mi[1] < 0)
                                             or mi[0] == mi[1]):
                        raise self.err(f"{what}: body1 {b1.name!r} and body2 {b2.name!r} move "
                                       "rigidly together: the constraint does nothing", el)
                    if b1.jid == 0 and b2.jid == 0:
                        raise self.err(f"{what}: neither body1 {b1.name!r} nor body2 "
                                       f"{b2.name!r} has a degree of freedom (the world and "
                                       "mocap bodies): the constraint acts on nothing", el)

                    def in_mocap(b, M):
                        """M (an SE3 in b's joint frame) in its mocap body's frame, if any."""
                        if b.mocap is None:
                            return M
                        return self.bodies[b.mocap].placement.actInv(M)

                    def pt_in_mocap(b, p):
                        return p if b.mocap is None else self.bodies[b.mocap].placement.actInv(p)

                    if by_site and el.tag == "connect":
                        spec.connects.append(Connect(name, b1.name, b2.name, b1.jid, b2.jid,
                                                     pt_in_mocap(b1, S1.translation.copy()),
                                                     pt_in_mocap(b2, S2.translation.copy()),
                                                     mi[0], mi[1]))
                        continue
                    if by_site:
                        if float(a.get("torquescale", 1)) != 1:
                            raise self.err(f"{what}: torquescale={a['torquescale']!r} is not "
                                           "supported (the weld is hard: torquescale 1)", el)
                        spec.welds.append(Weld(name, b1.name, b2.name, b1.jid, b2.jid,
                                               in_mocap(b1, S1), in_mocap(b2, S2),
                                               pin.SE3.Identity(), np.zeros(3), mi[0], mi[1]))
                        continue
                    P1, P2 = pose(b1), pose(b2)
                    if el.tag == "connect":
                        anchor = _floats(a.get("anchor"), 3, f"{what} anchor") \
                            if "anchor" in a else None
                        if anchor is None:
                            raise self.err(f"{what}: missing anchor", el)
                        pw = P1.act(anchor)
                        spec.connects.append(Connect(name, b1.name, b2.name, b1.jid, b2.jid,
                                                     pt_in_mocap(b1, b1.placement.act(anchor)),
                                                     placement(b2.jid).actInv(pw) if b2.jid
                                                     else pt_in_mocap(b2, pw), mi[0], mi[1]))
                    else:
                        if float(a.get("torquescale", 1)) != 1:
                            raise self.err(f"{what}: torquescale={a['torquescale']!r} is not "
                                           "supported (the weld is hard: torquescale 1)", el)
                        anchor = _floats(a.get("anchor", "0 0 0"), 3, f"{what} anchor")
                        rp = _floats(a.get("relpose", "0 1 0 0 0 0 0"), 7, f"{what} relpose")
                        if np.all(rp[3:] == 0) or "relpose" not in a:
                            rel = P1.actInv(P2)
                        else:
                            qw = rp[3:] / np.linalg.norm(rp[3:])
                            rel = pin.SE3(_quat_wxyz_to_matrix(qw), rp[:3])
                        spec.welds.append(Weld(name, b1.name, b2.name, b1.jid, b2.jid,
                                               in_mocap(b1, b1.placement),
                                               in_mocap(b2, b2.placement), rel, anchor,
                                               mi[0], mi[1]))
                elif el.tag == "joint":
                    j1 = self._scalar_joint(a.get("joint1"), what)
                    j2n = a.get("joint2")
                    j2 = self._scalar_joint(j2n, what) if j2n is not None else None
                    poly = np.zeros(5)
                    pc = _floats(a.get("polycoef", "0 1 0 0 0"), None, f"{what} polycoef")
                    if len(pc) > 5 or not np.all(np.isfinite(pc)):
                        raise self.err(f"{what}: polycoef must be at most 5 finite numbers")
                    poly[:len(pc)] = pc
                    spec.couplings.append(JointCoupling(
                        name, a["joint1"], j2n, j1.idx_q, j1.idx_v,
                        j2.idx_q if j2 else -1, j2.idx_v if j2 else -1,
                        float(q0[j1.idx_q]), float(q0[j2.idx_q]) if j2 else 0.0, poly))
                # (tendon, flex: refused by name by the document scan, or ignored by the user)
        for sec in self.root.findall("tendon"):
            for el in sec:
                a = self.attrs(el, None)
                name = a.get("name", f"tendon{len(spec.tendons)}")
                what = f"<tendon><{el.tag} name={name!r}>"
                if el.tag != "fixed":
                    continue     # spatial: refused by the document scan, or ignored by the user
                dofs, qidx, coef = [], [], []
                for j in el:
                    if j.tag != "joint":
                        raise self.err(f"{what}: unexpected <{j.tag}> (expected <joint>)")
                    jm = self._scalar_joint(j.get("joint"), what)
                    c = float(_floats(j.get("coef"), 1, f"{what} <joint> coef")[0]) \
                        if "coef" in j.attrib else None
                    if c is None:
                        raise self.err(f"{what} <joint joint={j.get('joint')!r}>: missing coef")
                    dofs.append(jm.idx_v)
                    qidx.append(jm.idx_q)
                    coef.append(c)
                if not dofs:
                    raise self.err(f"{what}: no <joint>")
                t = FixedTendon(name, np.array(dofs, dtype=np.int64),
                                np.array(qidx, dtype=np.int64), np.array(coef, dtype=float))
                L0 = float(np.dot(t.coef, q0[t.qidx]))
                limited = a.get("limited", "auto")
                if limited == "auto":
                    limited = "true" if (self.compiler.autolimits and "range" in a) else "false"
                if limited == "true":
                    if "range" not in a:
                        raise self.err(f"{what}: limited tendon without range")
                    lo, hi = _floats(a["range"], 2, f"{what} range")
                    if not lo < hi:
                        raise self.err(f"{what}: range lower {lo} >= upper {hi}")
                    t.range = (float(lo), float(hi))
                for key in ("stiffness", "damping"):
                    val = _float_attr(a, key, what, self.err, 0.0)
                    if not (np.isfinite(val) and val >= 0):
                        raise self.err(f"{what}: {key} must be finite and >= 0, got {a[key]!r}")
                    setattr(t, key, val)
                sl = _floats(a.get("springlength", "-1 -1"), None, f"{what} springlength")
                if len(sl) == 1:
                    sl = np.array([sl[0], sl[0]])
                t.spring = (L0, L0) if sl[0] == -1 and sl[-1] == -1 else (float(sl[0]), float(sl[1]))
                if "frictionloss" in a and float(a["frictionloss"]) != 0:
                    raise self.err(f"{what}: tendon frictionloss is not supported")
                spec.tendons.append(t)
        self.tendon_names = {t.name: t for t in spec.tendons}
        return spec

    def _tendon_actuator(self, el: ET.Element, a: dict[str, str]) -> Actuator:
        """A motor on a fixed tendon: ``tau += gear * ctrl * coef`` (the tendon's Jacobian)."""
        tname = a["tendon"]
        what = f"<{el.tag} tendon={tname!r}>"
        found = None
        for sec in self.root.findall("tendon"):
            for t in sec.findall("fixed"):
                if t.get("name") == tname:
                    found = t
        if found is None:
            raise self.err(f"{what}: unknown fixed tendon {tname!r}")
        dofs = []
        for j in found.findall("joint"):
            jm = self._scalar_joint(j.get("joint"), f"<tendon><fixed name={tname!r}>")
            dofs.append((jm.idx_v, float(_floats(j.get("coef", "nan"), 1, "coef")[0])))
        gear = float(_floats(a.get("gear", "1"), None, "gear")[0])
        cr = None
        if "ctrlrange" in a and a.get("ctrllimited", "auto") != "false":
            lo, hi = _floats(a["ctrlrange"], 2, f"{what} ctrlrange")
            cr = (float(lo), float(hi))
        return Actuator(a.get("name", tname), tname, dofs[0][0] if dofs else -1, gear, cr,
                        tuple(dofs))

    def _mocap_keyframes(self, sm: SimModel) -> None:
        """Keyframes' ``mpos``/``mquat`` (the mocap bodies' poses, in file order; quat w x y
        z): ``sm.mocap_keyframes`` {key name: (mpos (nm, 3), mquat (nm, 4))}; the key that
        gives ``q0`` (the first with a qpos, else the first) gives the mocap bodies' initial
        poses, as its qpos gives q0."""
        nm = len(sm.mocap)
        sm.mocap_keyframes = {}
        first = None
        for kf in self.root.findall("keyframe"):
            for i, key in enumerate(kf.findall("key")):
                if "mpos" not in key.attrib and "mquat" not in key.attrib:
                    if first is None and "qpos" in key.attrib:
                        first = False               # q0 comes from a key without mocap poses
                    continue
                what = f"<key name={key.get('name')!r}>"
                if not nm:
                    raise self.err(f"{what}: mpos/mquat given but the model has no mocap body",
                                   key)
                mp = np.array([b.pose.translation for b in sm.mocap]) if "mpos" not in \
                    key.attrib else _floats(key.get("mpos"), 3 * nm, f"{what} mpos").reshape(nm, 3)
                mq = np.array([pin.Quaternion(b.pose.rotation).coeffs()[[3, 0, 1, 2]]
                               for b in sm.mocap]) if "mquat" not in key.attrib else \
                    _floats(key.get("mquat"), 4 * nm, f"{what} mquat").reshape(nm, 4)
                if np.any(np.linalg.norm(mq, axis=1) == 0):
                    raise self.err(f"{what}: mquat has a zero quaternion", key)
                name = key.get("name", f"key{i}")
                sm.mocap_keyframes[name] = (mp, mq)
                if first is None and ("qpos" in key.attrib or not sm.keyframes):
                    first = True
                    for b, p, qw in zip(sm.mocap, mp, mq):
                        b.pose = pin.SE3(_quat_wxyz_to_matrix(qw), p.copy())
                        b.from_key = True

    def parse_keyframes(self, nq: int) -> dict[str, np.ndarray]:
        out = {}
        for kf in self.root.findall("keyframe"):
            for i, key in enumerate(kf.findall("key")):
                if "qpos" not in key.attrib:
                    continue
                q = _floats(key.get("qpos"), nq, f"<key name={key.get('name')!r}> qpos")
                for j in range(1, self.model.njoints):
                    jm = self.model.joints[j]
                    if jm.shortname() == "JointModelFreeFlyer":
                        w = q[jm.idx_q + 3]
                        q[jm.idx_q + 3:jm.idx_q + 6], q[jm.idx_q + 6] = q[jm.idx_q + 4:jm.idx_q + 7].copy(), w
                    elif jm.shortname() == "JointModelSpherical":
                        w = q[jm.idx_q]
                        q[jm.idx_q:jm.idx_q + 3], q[jm.idx_q + 3] = q[jm.idx_q + 1:jm.idx_q + 4].copy(), w
                out[key.get("name", f"key{i}")] = q
        return out


def load_mjcf(text: str, base_dir: str = ".", source: str = "<string>",
              ignore_unsupported=None) -> SimModel:
    """Build the model of an MJCF document. ``<include>`` files are read relative to the
    including file (``base_dir`` for the text itself). What the model asks for and diffgym does
    not simulate (:data:`diffgym.sim.unsupported.RULES`) raises a ModelError naming file, line,
    element and attribute, unless named in ``ignore_unsupported`` (then it is left out, with a
    warning)."""
    root, src = parse_model_xml(text, source, base_dir)
    return _MJCFBuilder(root, base_dir, source, src, ignore_unsupported).build()
