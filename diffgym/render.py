"""A small software renderer of a diffgym scene (numpy ray casting, no OpenGL).

It draws exactly the collision geometry the physics uses, at the placements of a
configuration ``q``: planes (infinite, with a checkerboard), spheres, boxes, capsules,
cylinders, ellipsoids and meshes. A mesh is drawn as the convex hull of its vertices: that is
what the MJCF loader collides with; a URDF mesh collides as its triangle mesh, so a concave
URDF mesh is drawn filled in. One ray per pixel (or ``supersample**2``) is intersected
analytically with every primitive, the nearest hit wins, and the hit is shaded with ambient +
Lambert light from one directional light (with hard shadows: a second ray cast towards the
light) plus a weak headlight. Each geom is only tested in the screen rectangle of its bounding
sphere; hulls are rasterized (their faces towards the eye tile their silhouette) with the
exact ray-plane depth per pixel.

    from diffgym.render import Camera, Renderer, write_gif
    r = Renderer(sim, width=320, height=240)              # camera framed on sim.q0
    frame = r.render(q)                                   # uint8 (240, 320, 3)
    r = Renderer(sim, camera=Camera.auto(sim, sim.q0), track="torso")   # follow a body
    write_gif(frames, "rollout.gif", fps=25)

Colours come from the geom's ``rgba`` (MJCF); URDF robots, whose collision geoms carry no
colour, get a palette (one hue per limb, darker towards the tip). The alpha channel is ignored:
every collision geom is drawn opaque, also those an MJCF hides with ``alpha = 0``.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pinocchio as pin

__all__ = ["Camera", "Renderer", "RayHits", "scene_bounds", "write_gif", "write_video", "SUPPORTED_KINDS"]

SUPPORTED_KINDS = ("plane", "sphere", "box", "capsule", "cylinder", "ellipsoid", "mesh")

_EPS = 1e-9          # smallest accepted ray parameter for camera rays (m)
_INF = np.inf

_SKY_ZENITH = np.array([0.42, 0.58, 0.80])
_SKY_HORIZON = np.array([0.86, 0.89, 0.93])
_SKY_NADIR = np.array([0.50, 0.50, 0.53])

# URDF palette: trunk, then one hue per limb (cycled)
_TRUNK = np.array([0.36, 0.38, 0.44])
_LIMBS = np.array([[0.92, 0.55, 0.18], [0.22, 0.50, 0.88], [0.30, 0.72, 0.38],
                   [0.70, 0.40, 0.80], [0.85, 0.30, 0.30], [0.20, 0.70, 0.75]])


# --------------------------------------------------------------------------------------------
# camera
# --------------------------------------------------------------------------------------------
@dataclass
class Camera:
    """A look-at camera with MuJoCo's conventions.

    ``lookat`` (3,) world point the camera aims at; ``distance`` (m) from it; ``azimuth``
    (degrees) of the viewing direction about world z (90: looking along +y, so +x points
    right); ``elevation`` (degrees, negative looks down); ``fovy`` vertical field of view
    (degrees).
    """

    lookat: np.ndarray = field(default_factory=lambda: np.zeros(3))
    distance: float = 3.0
    azimuth: float = 90.0
    elevation: float = -20.0
    fovy: float = 45.0

    def __post_init__(self) -> None:
        self.lookat = np.array(self.lookat, dtype=float).reshape(-1)
        if self.lookat.shape != (3,) or not np.all(np.isfinite(self.lookat)):
            raise ValueError(f"Camera.lookat must be 3 finite numbers, got {self.lookat!r}")
        for name in ("distance", "azimuth", "elevation", "fovy"):
            val = getattr(self, name)
            if not isinstance(val, (int, float, np.floating, np.integer)) or not math.isfinite(val):
                raise ValueError(f"Camera.{name} must be a finite number, got {val!r}")
            setattr(self, name, float(val))
        if self.distance <= 0:
            raise ValueError(f"Camera.distance must be > 0, got {self.distance}")
        if not 0.0 < self.fovy < 180.0:
            raise ValueError(f"Camera.fovy must be in (0, 180) degrees, got {self.fovy}")
        if abs(self.elevation) > 90.0:
            raise ValueError(f"Camera.elevation must be in [-90, 90] degrees, got {self.elevation}")

    def frame(self, lookat: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(eye position (3,), rows right/up/forward (3, 3)) of the camera."""
        az, el = math.radians(self.azimuth), math.radians(self.elevation)
        fwd = np.array([math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)])
        right = np.cross(fwd, [0.0, 0.0, 1.0])
        n = np.linalg.norm(right)
        if n < 1e-9:               # looking straight up or down: right is the azimuth's normal
            right = np.array([math.sin(az), -math.cos(az), 0.0])
        else:
            right /= n
        up = np.cross(right, fwd)
        look = self.lookat if lookat is None else lookat
        return look - self.distance * fwd, np.stack([right, up, fwd])

    @classmethod
    def auto(cls, sim, q=None, *, azimuth: float = 90.0, elevation: float | None = None,
             fovy: float = 45.0, aspect: float = 4.0 / 3.0, margin: float = 1.15) -> "Camera":
        """A camera that frames every finite geom of ``sim`` at ``q`` (default ``sim.q0``).

        Infinite planes are ignored. The camera looks at the centre of the geoms' world
        bounding box from ``azimuth``/``elevation``, at the smallest distance from which all
        eight corners of that box lie inside the image (``aspect`` = width / height), times
        ``margin``. ``elevation`` defaults to -20 degrees, or -45 for a flat scene (height
        below half of both horizontal extents, e.g. a table top).
        """
        if not (isinstance(aspect, (int, float, np.floating, np.integer)) and math.isfinite(aspect)
                and aspect > 0):
            raise ValueError(f"aspect must be a positive number, got {aspect!r}")
        if not (isinstance(margin, (int, float, np.floating, np.integer)) and math.isfinite(margin)
                and margin >= 1):
            raise ValueError(f"margin must be a number >= 1, got {margin!r}")
        q = sim.q0 if q is None else q
        bounds = scene_bounds(sim, q)
        if bounds is None:
            lo, hi = -np.ones(3), np.ones(3)
        else:
            lo, hi = bounds
        lookat = 0.5 * (lo + hi)
        ext = hi - lo
        if elevation is None:
            elevation = -45.0 if ext[2] < 0.5 * min(ext[0], ext[1]) else -20.0
        cam = cls(lookat, 1.0, azimuth, elevation, fovy)      # validates the angles
        _, M = cam.frame()
        ty = math.tan(math.radians(cam.fovy) / 2)
        tx = ty * aspect
        corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1])
                            for z in (lo[2], hi[2])]) - lookat
        cx, cy, cz = M @ corners.T                            # camera axes: right, up, forward
        need = np.maximum(np.abs(cx) / tx, np.abs(cy) / ty) - cz
        radius = 0.5 * float(np.linalg.norm(ext))
        cam.distance = margin * max(float(need.max()), 1.01 * radius, 1e-3)
        return cam


def _check_q(sim, q) -> np.ndarray:
    q = np.asarray(q, dtype=float)
    if q.shape != (sim.model.nq,):
        raise ValueError(f"q must have shape ({sim.model.nq},), got {q.shape}")
    if not np.all(np.isfinite(q)):
        raise ValueError(f"q has non-finite entries at {np.flatnonzero(~np.isfinite(q)).tolist()}")
    return q


class _Kinematics:
    """Joint and geom placements of a simulator's model at q. A simulator that steps its model
    tree by tree (diffgym.sim.trees: a whole-model pinocchio Data is cubic in nv, gigabytes for
    a pile of a thousand bodies) is placed tree by tree here too, with its own groups (the
    simulator's hold its step's state); other models with one pinocchio Data."""

    def __init__(self, sim):
        self.sim = sim
        self.gdata = pin.GeometryData(sim.geom_model)
        if sim.__dict__.get("_trees") is not None:
            from .sim.trees import TreeGroups
            self.trees, self.data = TreeGroups(sim.model), None
            self._v0 = np.zeros(sim.model.nv)
        else:
            self.trees, self.data = None, sim.model.createData()

    def place(self, q: np.ndarray) -> pin.GeometryData:
        """Joint and geom placements at q; returns the GeometryData (oMg)."""
        sim = self.sim
        if self.trees is not None:
            self.trees.kinematics(q, self._v0, jacobians=False)
            self.trees.geometry_placements(sim.geom_model, self.gdata)
        else:
            pin.forwardKinematics(sim.model, self.data, q)
            pin.updateGeometryPlacements(sim.model, self.data, sim.geom_model, self.gdata)
        return self.gdata

    def joint(self, j: int) -> pin.SE3:
        """World placement of joint j (after ``place``)."""
        if self.trees is not None:
            P = self.trees.kin.oM[j]
            return pin.SE3(P[:9].reshape(3, 3).T.copy(), P[9:].copy())
        return self.data.oMi[j]


def _placements(sim, q, kin: _Kinematics | None = None) -> pin.GeometryData:
    """The geom placements (a GeometryData) of ``sim`` at q."""
    return (kin if kin is not None else _Kinematics(sim)).place(q)


def _geom_aabb(kind: str, size: np.ndarray, R: np.ndarray, p: np.ndarray, verts=None):
    """World axis-aligned box (lo, hi) of a finite geom at pose (R, p)."""
    if kind == "sphere":
        e = np.full(3, size[0])
    elif kind == "box":
        e = np.abs(R) @ size[:3]
    elif kind == "ellipsoid":
        e = np.sqrt((R * R) @ (np.asarray(size[:3]) ** 2))
    elif kind == "capsule":
        e = np.abs(R[:, 2]) * size[1] + size[0]
    elif kind == "cylinder":
        a = R[:, 2]
        e = np.abs(a) * size[1] + size[0] * np.sqrt(np.maximum(1.0 - a * a, 0.0))
    else:
        w = verts @ R.T + p
        return w.min(axis=0), w.max(axis=0)
    return p - e, p + e


def scene_bounds(sim, q) -> tuple[np.ndarray, np.ndarray] | None:
    """World axis-aligned box (lo, hi) holding every finite geom of ``sim`` at ``q`` (planes
    are ignored), or None when there is no finite geom."""
    q = _check_q(sim, q)
    gdata = _placements(sim, q)
    los, his = [], []
    for k, (g, go) in enumerate(zip(sim.sm.geoms, sim.geom_model.geometryObjects)):
        if g.kind == "plane":
            continue
        verts = _mesh_vertices(go.geometry, g.name) if g.kind == "mesh" else None
        pl = gdata.oMg[k]
        lo, hi = _geom_aabb(g.kind, np.asarray(g.size, float), np.asarray(pl.rotation),
                            np.asarray(pl.translation), verts)
        los.append(lo)
        his.append(hi)
    if not los:
        return None
    return np.min(los, axis=0), np.max(his, axis=0)


# --------------------------------------------------------------------------------------------
# ray-primitive intersection in the geom's local frame, coordinates first ("structure of
# arrays"): o is (3,) or (3, M) ray origins, d is (3, M) or (3,) unit directions; the result
# is t (M,), the ray parameter of the first surface crossing with t > eps (inf: no hit).
# --------------------------------------------------------------------------------------------
def _col(x: np.ndarray) -> np.ndarray:
    return x[:, None] if x.ndim == 1 else x


def _dot(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def _sphere_entry(o, d, r, eps):
    b = _dot(o, d)
    c = _dot(o, o) - r * r
    disc = b * b - c
    with np.errstate(invalid="ignore"):
        t = -b - np.sqrt(disc)
    return np.where((disc >= 0) & (t > eps), t, _INF)


def _hit_sphere(o, d, size, eps):
    return _sphere_entry(o, d, float(size[0]), eps)


def _hit_ellipsoid(o, d, size, eps):
    inv = 1.0 / np.asarray(size[:3], float)
    os_, ds = _col(o) * inv[:, None], _col(d) * inv[:, None]
    a = _dot(ds, ds)
    b = _dot(os_, ds)
    c = _dot(os_, os_) - 1.0
    disc = b * b - a * c
    with np.errstate(invalid="ignore", divide="ignore"):
        t = (-b - np.sqrt(disc)) / a
    return np.where((disc >= 0) & (t > eps), t, _INF)


def _safe_inv(d):
    d = np.asarray(d, float)
    return 1.0 / np.where(np.abs(d) < 1e-15, 1e-15, d)


def _hit_box(o, d, size, eps):
    h = np.asarray(size[:3], float)[:, None]
    o, inv = _col(o), _safe_inv(_col(d))
    t1 = (-h - o) * inv
    t2 = (h - o) * inv
    tmin = np.minimum(t1, t2).max(axis=0)
    tmax = np.maximum(t1, t2).min(axis=0)
    return np.where((tmax >= tmin) & (tmin > eps), tmin, _INF)


def _side_entry(o, d, r, eps):
    """Entry of the ray into the infinite z-cylinder of radius r: (t, valid)."""
    a = d[0] * d[0] + d[1] * d[1]
    b = o[0] * d[0] + o[1] * d[1]
    c = o[0] * o[0] + o[1] * o[1] - r * r
    disc = b * b - a * c
    with np.errstate(invalid="ignore", divide="ignore"):
        t = (-b - np.sqrt(disc)) / a
    ok = (disc >= 0) & (a > 1e-18) & (t > eps)
    return t, ok


def _hit_capsule(o, d, size, eps):
    r, h = float(size[0]), float(size[1])
    t, ok = _side_entry(o, d, r, eps)
    with np.errstate(invalid="ignore"):
        ok &= np.abs(o[2] + t * d[2]) <= h
    best = np.where(ok, t, _INF)
    off = np.array([0.0, 0.0, h]).reshape((3,) + (1,) * (np.ndim(o) - 1))
    best = np.minimum(best, _sphere_entry(o - off, d, r, eps))
    return np.minimum(best, _sphere_entry(o + off, d, r, eps))


def _hit_cylinder(o, d, size, eps):
    r, h = float(size[0]), float(size[1])
    t, ok = _side_entry(o, d, r, eps)
    with np.errstate(invalid="ignore"):
        ok &= np.abs(o[2] + t * d[2]) <= h
    best = np.where(ok, t, _INF)
    inv = _safe_inv(d[2])
    for zc in (-h, h):
        tc = (zc - o[2]) * inv
        x = o[0] + tc * d[0]
        y = o[1] + tc * d[1]
        best = np.minimum(best, np.where((tc > eps) & (x * x + y * y <= r * r), tc, _INF))
    return best


def _hit_plane(o, d, size, eps):
    t = -o[2] * _safe_inv(d[2])
    t = np.broadcast_to(t, np.broadcast_shapes(np.shape(o[2]), np.shape(d[2])))
    return np.where(t > eps, t, _INF)


def _make_hit_mesh(A, b):
    """Convex polytope {x: A x + b <= 0} (rows of A unit normals)."""
    def hit(o, d, size, eps):
        den = A @ _col(d)                              # (F, M) or (F, 1)
        num = -(b[:, None] + A @ _col(o))              # (F, M) or (F, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = num / den
        enter = np.where(den < 0, ratio, -_INF).max(axis=0)
        leave = np.where(den > 0, ratio, _INF).min(axis=0)
        parallel_out = ((den == 0) & (num < 0)).any(axis=0)
        ok = (enter <= leave) & (enter > eps) & ~parallel_out
        return np.where(ok, enter, _INF)
    return hit


# local outward normals (not normalized) at local hit points p (3, M)
def _n_sphere(p, size):
    return p


def _n_ellipsoid(p, size):
    return p / (np.asarray(size[:3], float)[:, None] ** 2)


def _n_box(p, size):
    rel = np.abs(p) / np.asarray(size[:3], float)[:, None]
    k = np.argmax(rel, axis=0)
    n = np.zeros_like(p)
    cols = np.arange(p.shape[1])
    n[k, cols] = np.sign(p[k, cols])
    return n


def _n_capsule(p, size):
    h = float(size[1])
    n = p.copy()
    n[2] -= np.clip(p[2], -h, h)
    return n


def _n_cylinder(p, size):
    r, h = float(size[0]), float(size[1])
    rho = np.hypot(p[0], p[1])
    cap = np.abs(np.abs(p[2]) - h) < np.abs(rho - r)
    n = p.copy()
    n[0] = np.where(cap, 0.0, p[0])
    n[1] = np.where(cap, 0.0, p[1])
    n[2] = np.where(cap, np.sign(p[2]), 0.0)
    return n


def _n_plane(p, size):
    n = np.zeros_like(p)
    n[2] = 1.0
    return n


def _make_n_mesh(A, b):
    def normal(p, size):
        return A[np.argmax(A @ p + b[:, None], axis=0)].T
    return normal


_HIT = {"sphere": _hit_sphere, "box": _hit_box, "capsule": _hit_capsule,
        "cylinder": _hit_cylinder, "ellipsoid": _hit_ellipsoid, "plane": _hit_plane}
_NORMAL = {"sphere": _n_sphere, "box": _n_box, "capsule": _n_capsule,
           "cylinder": _n_cylinder, "ellipsoid": _n_ellipsoid, "plane": _n_plane}


def _mesh_vertices(geometry, name: str) -> np.ndarray:
    """(V, 3) vertices of a coal convex shape or triangle mesh, in the geom frame."""
    if hasattr(geometry, "num_points"):
        pts = geometry.points()
    elif hasattr(geometry, "num_vertices"):
        pts = geometry.vertices()
    else:
        raise ValueError(f"geom {name!r}: mesh shape {type(geometry).__name__} has no vertices")
    pts = np.array(pts, dtype=float).reshape(-1, 3)
    if len(pts) == 0:
        raise ValueError(f"geom {name!r}: mesh has no vertices")
    return pts


@dataclass
class _Hull:
    """Convex hull of a mesh: vertices (V, 3), triangles (F, 3) and their planes A x + b <= 0."""

    verts: np.ndarray
    tris: np.ndarray
    A: np.ndarray
    b: np.ndarray


def _hull(verts: np.ndarray, name: str) -> _Hull:
    from scipy.spatial import ConvexHull

    try:
        hull = ConvexHull(verts)
    except Exception as exc:   # flat or degenerate vertex set
        raise ValueError(f"geom {name!r}: cannot build the convex hull of its {len(verts)} "
                         f"vertices for rendering: {exc}") from exc
    used = hull.vertices
    remap = np.full(len(verts), -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    eq = hull.equations
    return _Hull(np.ascontiguousarray(verts[used]), remap[hull.simplices],
                 np.ascontiguousarray(eq[:, :3]), np.ascontiguousarray(eq[:, 3]))


# --------------------------------------------------------------------------------------------
# renderer
# --------------------------------------------------------------------------------------------
@dataclass
class _Geom:
    index: int
    name: str
    kind: str
    size: np.ndarray
    radius: float           # bounding radius about the geom origin (inf for planes)
    color: np.ndarray
    hit: object
    normal: object
    hull: _Hull | None = None
    pos: np.ndarray | None = None     # world position of a marker (not a model geom)


class Renderer:
    """Ray-cast images of ``sim``'s collision geometry.

    Arguments: ``width``, ``height`` (pixels); ``camera`` (a :class:`Camera`; default
    ``Camera.auto(sim, sim.q0, aspect=width/height)``); ``track``: name of a body/link frame or
    of a joint whose world position the camera's ``lookat`` follows (``lookat(q) =
    camera.lookat + mask * (p(q) - p(sim.q0))``; ``track_axes`` picks the followed axes,
    default ``"xy"`` so that the ground does not bob); ``light``: direction *towards* the
    light (world frame, normalized inside); ``shadows``: hard shadows cast by the finite geoms;
    ``checker``: checkerboard square size on planes in metres (default from the scene size,
    0 disables); ``fog``: distance scale (m) of the haze that blends far geometry into the
    horizon (default from the scene size, 0 disables); ``colors``: ``"model"`` (geom rgba),
    ``"palette"`` (one hue per limb) or ``"auto"`` (palette for URDF files, rgba otherwise);
    ``supersample``: rays per pixel side (anti-aliasing, costs ``supersample**2``).
    """

    _shadow_grid = 128     # at most G x G light-space cells for the shadow-ray culling

    def __init__(self, sim, width: int = 320, height: int = 240, camera: Camera | None = None, *,
                 track: str | None = None, track_axes: str = "xy",
                 light: Sequence[float] = (-0.35, -0.55, 1.0), shadows: bool = True,
                 checker: float | None = None, fog: float | None = None, colors: str = "auto",
                 supersample: int = 1, ambient: float = 0.3, diffuse: float = 0.6,
                 headlight: float = 0.15):
        for name, val in (("width", width), ("height", height), ("supersample", supersample)):
            if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val <= 0:
                raise ValueError(f"{name} must be a positive integer, got {val!r}")
        if camera is not None and not isinstance(camera, Camera):
            raise TypeError(f"camera must be a diffgym.render.Camera, got {type(camera).__name__}")
        if colors not in ("auto", "model", "palette"):
            raise ValueError(f"colors must be 'auto', 'model' or 'palette', got {colors!r}")
        light = np.asarray(light, dtype=float).reshape(-1)
        if light.shape != (3,) or not np.all(np.isfinite(light)) or np.linalg.norm(light) == 0:
            raise ValueError(f"light must be a non-zero direction of 3 finite numbers, got {light!r}")
        if not isinstance(track_axes, str) or not track_axes or not set(track_axes) <= set("xyz"):
            raise ValueError(f"track_axes must be a non-empty subset of 'xyz', got {track_axes!r}")
        for name, val in (("ambient", ambient), ("diffuse", diffuse), ("headlight", headlight)):
            if not (isinstance(val, (int, float, np.floating, np.integer)) and math.isfinite(val)
                    and val >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {val!r}")
        self.sim = sim
        self.width, self.height, self.supersample = int(width), int(height), int(supersample)
        self.light = light / np.linalg.norm(light)
        self.shadows = bool(shadows)
        self.ambient, self.diffuse, self.headlight = float(ambient), float(diffuse), float(headlight)
        self._kin = _Kinematics(sim)
        self._gdata = self._kin.gdata
        # geoms
        if colors == "auto":
            colors = "palette" if str(getattr(sim.sm, "source", "")).lower().endswith(".urdf") else "model"
        palette = self._palette() if colors == "palette" else None
        self._geoms: list[_Geom] = []
        for k, (g, go) in enumerate(zip(sim.sm.geoms, sim.geom_model.geometryObjects)):
            if g.kind not in SUPPORTED_KINDS:
                raise ValueError(f"geom {g.name!r}: cannot render geom type {g.kind!r} "
                                 f"(supported: {', '.join(SUPPORTED_KINDS)})")
            if g.kind == "mesh":
                hull = _hull(_mesh_vertices(go.geometry, g.name), g.name)
                hit, normal = _make_hit_mesh(hull.A, hull.b), _make_n_mesh(hull.A, hull.b)
                radius = float(np.max(np.linalg.norm(hull.verts, axis=1)))
            else:
                hit, normal = _HIT[g.kind], _NORMAL[g.kind]
                radius = math.inf if g.kind == "plane" else float(g.bound_radius)
            color = np.asarray(g.rgba, float)[:3] if (g.kind == "plane" or palette is None) else palette[k]
            self._geoms.append(_Geom(k, g.name, g.kind, np.asarray(g.size, float), radius,
                                     np.clip(color, 0, 1), hit, normal,
                                     hull if g.kind == "mesh" else None))
        self._finite = [g for g in self._geoms if g.kind != "plane"]
        self._colors = np.array([g.color for g in self._geoms] + [np.zeros(3)]).reshape(-1, 3)
        bounds = scene_bounds(sim, np.asarray(sim.q0, float))
        scale = 0.5 * float(np.linalg.norm(bounds[1] - bounds[0])) if bounds is not None else 1.0
        scale = max(scale, 1e-3)
        if checker is None:
            checker = _nice_step(scale / 2.5)
        if not (isinstance(checker, (int, float, np.floating, np.integer)) and math.isfinite(checker)
                and checker >= 0):
            raise ValueError(f"checker must be a square size >= 0 (m), got {checker!r}")
        if fog is None:
            fog = 12.0 * scale
        if not (isinstance(fog, (int, float, np.floating, np.integer)) and math.isfinite(fog) and fog >= 0):
            raise ValueError(f"fog must be a distance >= 0 (m), got {fog!r}")
        self.checker, self.fog = float(checker), float(fog)
        self.camera = camera if camera is not None else Camera.auto(
            sim, sim.q0, aspect=self.width / self.height)
        # tracking
        self.track = track
        self._track_mask = np.array([c in track_axes for c in "xyz"], dtype=float)
        self._track_ref = None
        if track is not None:
            if not isinstance(track, str):
                raise TypeError(f"track must be a body, frame or joint name, got {type(track).__name__}")
            self._track_ref = self._track_position(np.asarray(sim.q0, float))
        self._rays_cache: tuple | None = None
        self._sky_cache: tuple | None = None

    # -- helpers ----------------------------------------------------------------------------
    def _palette(self) -> dict[int, np.ndarray]:
        model = self.sim.model
        base = 1 if model.njoints > 1 and model.joints[1].nq == 7 and model.parents[1] == 0 else 0
        limbs: dict[int, int] = {}
        out = {}
        for k, go in enumerate(self.sim.geom_model.geometryObjects):
            j = int(go.parentJoint)
            if j <= base:
                out[k] = _TRUNK
                continue
            depth, a = 0, j
            while model.parents[a] != base:
                a = model.parents[a]
                depth += 1
            idx = limbs.setdefault(a, len(limbs))
            out[k] = _LIMBS[idx % len(_LIMBS)] * (0.78 ** depth)
        return out

    def _track_position(self, q: np.ndarray) -> np.ndarray:
        model, name = self.sim.model, self.track
        self._kin.place(q)
        if model.existFrame(name):
            fr = model.frames[model.getFrameId(name)]
            return np.asarray((self._kin.joint(fr.parentJoint) * fr.placement).translation).copy()
        if model.existJointName(name):
            return np.asarray(self._kin.joint(model.getJointId(name)).translation).copy()
        names = sorted({f.name for f in model.frames} - {"universe"})
        raise ValueError(f"track: no body, frame or joint named {name!r} (frames: {', '.join(names)})")

    def _rays(self, camera: Camera):
        """Camera-frame unit ray directions (3, H*W) and the focal length in pixels."""
        H, W = self.height * self.supersample, self.width * self.supersample
        key = (H, W, camera.fovy)
        if self._rays_cache is None or self._rays_cache[0] != key:
            f = 0.5 * H / math.tan(math.radians(camera.fovy) / 2)
            x = (np.arange(W) + 0.5 - W / 2) / f
            y = -(np.arange(H) + 0.5 - H / 2) / f
            d = np.empty((3, H, W))
            d[0] = x[None, :]
            d[1] = y[:, None]
            d[2] = 1.0
            d /= np.sqrt(d[0] ** 2 + d[1] ** 2 + 1.0)
            self._rays_cache = (key, d.reshape(3, -1), f)
        return self._rays_cache[1], self._rays_cache[2]

    @staticmethod
    def _rect(cc: np.ndarray, r: float, f: float, H: int, W: int):
        """Pixel rectangle (i0, i1, j0, j1) holding the projection of a sphere (camera coords)."""
        x, y, z = cc
        if z < -r:
            return None
        if z <= r * 1.0001:
            return 0, H, 0, W
        den = z * z - r * r
        out = []
        for u in (x, y):
            s = r * math.sqrt(u * u + den)
            out.append(((u * z - s) / den, (u * z + s) / den))
        (ulo, uhi), (vlo, vhi) = out
        j0 = max(int(math.floor(ulo * f + W / 2 - 0.5)), 0)
        j1 = min(int(math.ceil(uhi * f + W / 2 - 0.5)) + 1, W)
        i0 = max(int(math.floor(H / 2 - 0.5 - vhi * f)), 0)
        i1 = min(int(math.ceil(H / 2 - 0.5 - vlo * f)) + 1, H)
        if i0 >= i1 or j0 >= j1:
            return None
        return i0, i1, j0, j1

    # -- ray casting ------------------------------------------------------------------------
    def lookat(self, q, camera: Camera | None = None) -> np.ndarray:
        """The camera's look-at point for configuration q (moves with ``track``)."""
        cam = self.camera if camera is None else camera
        if self.track is None:
            return cam.lookat.copy()
        return cam.lookat + self._track_mask * (self._track_position(_check_q(self.sim, q))
                                                - self._track_ref)

    def _markers(self, markers) -> list[_Geom]:
        """Marker spheres (drawn, not simulated) as geoms numbered after the model's."""
        out: list[_Geom] = []
        if markers is None:
            return out
        n = len(self._geoms)
        for m, mk in enumerate(markers):
            try:
                pos, radius, rgb = mk
                pos = np.asarray(pos, dtype=float).reshape(-1)
                radius = float(radius)
                rgb = np.asarray(rgb, dtype=float).reshape(-1)[:3]
            except (TypeError, ValueError) as exc:
                raise ValueError(f"markers[{m}] must be (position (3,), radius, rgb), got {mk!r}") from exc
            if pos.shape != (3,) or not np.all(np.isfinite(pos)):
                raise ValueError(f"markers[{m}]: position must be 3 finite numbers, got {pos!r}")
            if not (math.isfinite(radius) and radius > 0):
                raise ValueError(f"markers[{m}]: radius must be > 0, got {radius!r}")
            if rgb.shape != (3,) or not np.all((rgb >= 0) & (rgb <= 1)):
                raise ValueError(f"markers[{m}]: rgb must be 3 numbers in [0, 1], got {rgb!r}")
            out.append(_Geom(n + m, f"marker{m}", "sphere", np.array([radius]), radius, rgb,
                             _hit_sphere, _n_sphere, pos=pos))
        return out

    def _cast(self, q, camera: Camera | None, markers=None) -> "_CastResult":
        q = _check_q(self.sim, q)
        extra = self._markers(markers)
        cam = self.camera if camera is None else camera
        if not isinstance(cam, Camera):
            raise TypeError(f"camera must be a diffgym.render.Camera, got {type(cam).__name__}")
        eye, M = cam.frame(self.lookat(q, cam))
        dcam, f = self._rays(cam)
        H, W = self.height * self.supersample, self.width * self.supersample
        dirs = M.T @ dcam                                # (3, N) world directions
        dirs3 = dirs.reshape(3, H, W)
        _placements(self.sim, q, self._kin)
        depth = np.full((H, W), _INF)
        gid = np.full((H, W), -1, dtype=np.int64)
        face = np.full(H * W, -1, dtype=np.int64)       # hull triangle seen, for meshes
        poses, rects = [], []
        geoms = self._geoms + extra
        for g in geoms:
            if g.index < len(self._geoms):
                pl = self._gdata.oMg[g.index]
                R, p = np.array(pl.rotation), np.array(pl.translation)
            else:
                R, p = np.eye(3), g.pos
            poses.append((R, p))
            rect = (0, H, 0, W) if g.kind == "plane" else self._rect(M @ (p - eye), g.radius, f, H, W)
            rects.append(rect)
            if rect is None:
                continue
            i0, i1, j0, j1 = rect
            if g.hull is not None and self._raster_hull(g, R, p, eye, M, f, dirs, depth, gid, face):
                continue
            if g.kind == "plane":
                dl = R.T @ dirs
            else:
                dl = R.T @ dirs3[:, i0:i1, j0:j1].reshape(3, -1)
            t = g.hit(R.T @ (eye - p), dl, g.size, _EPS).reshape(i1 - i0, j1 - j0)
            dv, gv = depth[i0:i1, j0:j1], gid[i0:i1, j0:j1]
            closer = t < dv
            dv[closer] = t[closer]
            gv[closer] = g.index
        hit = gid >= 0
        point = eye.reshape(3, 1, 1) + np.where(hit, depth, 0.0) * dirs3        # (3, H, W)
        normal = np.zeros((3, H, W))
        for g, (R, p), rect in zip(geoms, poses, rects):
            if rect is None:
                continue
            i0, i1, j0, j1 = rect
            mask = gid[i0:i1, j0:j1] == g.index
            if not mask.any():
                continue
            if g.kind == "plane":
                nw = np.broadcast_to(R[:, 2].reshape(3, 1, 1), (3, H, W))
                np.copyto(normal[:, i0:i1, j0:j1], nw, where=mask[None])
                continue
            ii, jj = np.nonzero(mask)
            flat = (ii + i0) * W + (jj + j0)
            fk = face[flat] if g.hull is not None else None
            if fk is not None and np.all(fk >= 0):
                nl = g.hull.A[fk].T
            else:
                nl = g.normal(R.T @ (point.reshape(3, -1)[:, flat] - p[:, None]), g.size)
            normal.reshape(3, -1)[:, flat] = R @ nl
        normal /= np.sqrt(np.maximum(_dot(normal, normal), 1e-300))
        normal *= np.where(_dot(normal, dirs3) > 0, -1.0, 1.0)   # face the camera (planes)
        colors = self._colors if not extra else np.vstack(
            [self._colors[:-1]] + [g.color[None] for g in extra] + [self._colors[-1:]])
        return _CastResult(H, W, eye, f, dirs3, gid, depth, point, normal, poses, colors)

    def project(self, points, q, camera: Camera | None = None) -> np.ndarray:
        """Image coordinates (K, 2) = (column, row) of world points (K, 3) seen at
        configuration q (the camera may track a body), continuous: pixel ``[row, col]`` of an
        image covers ``[row, row + 1) x [col, col + 1)``, so ``int()`` of the coordinates
        indexes the pixel. NaN for points behind the camera."""
        pts = np.asarray(points, dtype=float)
        if pts.ndim != 2 or pts.shape[1] != 3:
            raise ValueError(f"points must have shape (K, 3), got {pts.shape}")
        cam = self.camera if camera is None else camera
        eye, M = cam.frame(self.lookat(q, cam))
        x, y, z = M @ (pts - eye).T
        f = 0.5 * self.height / math.tan(math.radians(cam.fovy) / 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            col = np.where(z > 0, x / z * f + 0.5 * self.width, np.nan)
            row = np.where(z > 0, 0.5 * self.height - y / z * f, np.nan)
        return np.stack([col, row], axis=1)

    def cast(self, q, camera: Camera | None = None, markers=None) -> RayHits:
        """The first surface along every camera ray at configuration q, at the internal
        resolution (``height * supersample``, ``width * supersample``): geom index, ray
        length, world hit point and unit normal (facing the camera) per pixel."""
        c = self._cast(q, camera, markers)
        return RayHits(c.gid, c.depth, np.moveaxis(c.point, 0, -1), np.moveaxis(c.normal, 0, -1),
                       np.moveaxis(c.dirs, 0, -1), c.eye)

    @staticmethod
    def _raster_hull(g: _Geom, R, p, eye, M, f, dirs, depth, gid, face) -> bool:
        """Camera rays against a convex hull by rasterizing its camera-facing triangles (each
        pixel centre inside a projected triangle gets the exact ray-plane distance): the
        faces facing the eye tile the silhouette, so this equals the ray-polytope test at a
        cost proportional to the covered pixels. False (not done) when the hull reaches
        behind the camera."""
        H, W = depth.shape
        hull = g.hull
        cam = M @ (R @ hull.verts.T + (p - eye)[:, None])          # (3, V) camera coords
        if cam[2].min() <= 1e-6 * max(g.radius, 1e-9):
            return False
        col = cam[0] / cam[2] * f + 0.5 * W
        row = 0.5 * H - cam[1] / cam[2] * f
        ol = R.T @ (eye - p)
        front = np.flatnonzero(hull.A @ ol + hull.b > 0)
        if len(front) == 0:                                        # eye inside the hull
            return True
        tri = hull.tris[front]
        c, r = col[tri], row[tri]                                  # (F, 3)
        area = (c[:, 1] - c[:, 0]) * (r[:, 2] - r[:, 0]) - (r[:, 1] - r[:, 0]) * (c[:, 2] - c[:, 0])
        j0 = np.maximum(np.ceil(c.min(1) - 0.5), 0).astype(np.int64)
        j1 = np.minimum(np.floor(c.max(1) - 0.5), W - 1).astype(np.int64)
        i0 = np.maximum(np.ceil(r.min(1) - 0.5), 0).astype(np.int64)
        i1 = np.minimum(np.floor(r.max(1) - 0.5), H - 1).astype(np.int64)
        wk, hk = j1 - j0 + 1, i1 - i0 + 1
        keep = np.flatnonzero((wk > 0) & (hk > 0) & (np.abs(area) > 1e-12))
        if len(keep) == 0:
            return True
        front, c, r, area = front[keep], c[keep], r[keep], area[keep]
        j0, i0, wk, hk = j0[keep], i0[keep], wk[keep], hk[keep]
        counts = wk * hk
        k = np.repeat(np.arange(len(keep)), counts)                # (triangle, pixel) pairs
        local = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        ii = i0[k] + local // wk[k]
        jj = j0[k] + local % wk[k]
        px, py = jj + 0.5, ii + 0.5
        ck, rk, inv = c[k], r[k], 1.0 / area[k]
        tol = -1e-9
        inside = np.ones(len(k), dtype=bool)
        for e in range(3):                                         # barycentric coordinates
            a_, b_ = (e + 1) % 3, (e + 2) % 3
            lam = ((ck[:, b_] - ck[:, a_]) * (py - rk[:, a_]) - (rk[:, b_] - rk[:, a_]) * (px - ck[:, a_])) * inv
            inside &= lam >= tol
        k, flat = k[inside], (ii * W + jj)[inside]
        if len(k) == 0:
            return True
        An = hull.A[front[k]] @ R.T                                 # world plane normals
        den = np.einsum("ij,ji->i", An, dirs[:, flat])
        num = -(hull.A[front[k]] @ ol + hull.b[front[k]])
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(den < 0, num / den, _INF)
        t = np.where(t > _EPS, t, _INF)
        best = np.full(H * W, _INF)
        np.minimum.at(best, flat, t)
        dflat, gflat = depth.reshape(-1), gid.reshape(-1)
        win = (t == best[flat]) & (t < dflat[flat])           # this hull's front face is nearest
        pix = flat[win]
        dflat[pix] = t[win]
        gflat[pix] = g.index
        face[pix] = front[k[win]]
        return True

    def render_ids(self, q, camera: Camera | None = None, markers=None) -> np.ndarray:
        """(height, width) int array: index of the geom seen at each pixel (``sim.sm.geoms``
        order; marker m is ``len(sim.sm.geoms) + m``), -1 for background. With
        supersampling, the sample nearest the pixel centre."""
        c = self._cast(q, camera, markers)
        s = self.supersample
        return c.gid[s // 2::s, s // 2::s].copy()

    def render_depth(self, q, camera: Camera | None = None, markers=None) -> np.ndarray:
        """(height, width) float array: distance (m) from the eye along each pixel's ray to
        the first surface, inf for background (sampled like :meth:`render_ids`)."""
        c = self._cast(q, camera, markers)
        s = self.supersample
        return c.depth[s // 2::s, s // 2::s].copy()

    def render(self, q, camera: Camera | None = None, markers=None) -> np.ndarray:
        """RGB image (height, width, 3) uint8 of the collision geometry at configuration q.

        ``camera`` overrides the renderer's camera for this frame; ``markers``: spheres that
        are drawn but not simulated (targets, contact points), a sequence of
        ``(position (3,), radius, rgb)``; they receive shadows but cast none.
        """
        cam = self.camera if camera is None else camera
        c = self._cast(q, cam, markers)
        hit = c.gid >= 0
        shade = np.ones((c.H, c.W))
        if self.checker > 0:
            for g in self._geoms:
                if g.kind != "plane":
                    continue
                mask = c.gid == g.index
                if not mask.any():
                    continue
                R, p = c.poses[g.index]
                loc = R[:, :2].T @ (c.point.reshape(3, -1) - p[:, None])
                ij = np.floor(loc / self.checker)
                np.nan_to_num(ij, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
                parity = ((ij[0] + ij[1]).astype(np.int64) & 1).reshape(c.H, c.W)   # 0 or 1
                # footprint of a pixel on the plane: fade the squares out below ~4 pixels
                cosang = np.maximum(np.abs(_dot(c.dirs, R[:, 2])), 1e-3)
                w = np.clip(2.0 - 8.0 * c.depth / (c.f * cosang * self.checker), 0.0, 1.0)
                np.copyto(shade, 0.89 + 0.11 * w * (1.0 - 2.0 * parity), where=mask)
        ndl = _dot(c.normal, self.light)
        lit = np.maximum(ndl, 0.0)
        if self.shadows and self._finite:
            facing = np.flatnonzero((ndl > 0).ravel())
            if len(facing):
                P = c.point.reshape(3, -1)[:, facing]
                n = c.normal.reshape(3, -1)[:, facing]
                t = c.depth.ravel()[facing]
                O = P + n * (1e-6 + 1e-5 * t)
                lit.ravel()[facing[self._shadowed(O, c.poses)]] = 0.0
        k = (self.ambient + self.diffuse * lit - self.headlight * _dot(c.normal, c.dirs)) * shade
        col = c.colors.T[:, c.gid] * k                          # (3, H, W)
        if self.fog > 0:
            with np.errstate(invalid="ignore"):
                haze = -np.expm1(-np.maximum(c.depth - 2.0 * cam.distance, 0.0) / self.fog)
            col += haze * (_SKY_HORIZON.reshape(3, 1, 1) - col)
        img = np.where(hit, col, self._sky(c))
        return self._finish(img)

    def _sky(self, c: "_CastResult") -> np.ndarray:
        key = c.dirs[2, :, 0].tobytes() + c.dirs[2, 0, :].tobytes()
        if self._sky_cache is None or self._sky_cache[0] != key:
            self._sky_cache = (key, _sky(c.dirs[2]))
        return self._sky_cache[1]

    def _shadowed(self, O: np.ndarray, poses) -> np.ndarray:
        """Which of the points O (3, M) see a finite geom towards the light."""
        L = self.light
        M = O.shape[1]
        e1 = np.cross(L, [1.0, 0, 0] if abs(L[0]) < 0.9 else [0, 1.0, 0])
        e1 /= np.linalg.norm(e1)
        B = np.stack([e1, np.cross(L, e1), L])           # rows: light-space axes
        a, b, s = B @ O                                  # light-space coordinates and height
        dark = np.zeros(M, dtype=bool)
        # bucket the points in a G x G grid over (a, b): a caster only tests the cells its
        # shadow disk covers
        G = max(1, min(self._shadow_grid, int(math.sqrt(M) / 3)))
        amin, bmin = a.min(), b.min()
        ca = max((a.max() - amin) / G, 1e-12)
        cb = max((b.max() - bmin) / G, 1e-12)
        ia = np.minimum(((a - amin) / ca).astype(np.int64), G - 1)
        ib = np.minimum(((b - bmin) / cb).astype(np.int64), G - 1)
        cell = (ia * G + ib).astype(np.int16)
        order = np.argsort(cell, kind="stable")
        starts = np.concatenate([[0], np.cumsum(np.bincount(cell, minlength=G * G))])
        for g in self._finite:
            R, p = poses[g.index]
            cl = B @ p
            r = g.radius
            a0 = int(math.floor((cl[0] - r - amin) / ca))
            a1 = int(math.floor((cl[0] + r - amin) / ca))
            b0 = int(math.floor((cl[1] - r - bmin) / cb))
            b1 = int(math.floor((cl[1] + r - bmin) / cb))
            if a1 < 0 or b1 < 0 or a0 >= G or b0 >= G:
                continue
            a0, b0, a1, b1 = max(a0, 0), max(b0, 0), min(a1, G - 1), min(b1, G - 1)
            parts = [order[starts[i * G + b0]:starts[i * G + b1 + 1]] for i in range(a0, a1 + 1)]
            ci = np.concatenate(parts) if len(parts) > 1 else parts[0]
            if len(ci) == 0:
                continue
            ci = ci[~dark[ci]]
            da, db = a[ci] - cl[0], b[ci] - cl[1]
            ci = ci[(da * da + db * db <= r * r) & (s[ci] <= cl[2] + r)]
            if len(ci) == 0:
                continue
            if g.hull is not None:
                ci = self._hull_shadow(g, R, p, B, a, b, s, ci, dark)
                if len(ci) == 0:
                    continue
            th = g.hit(R.T @ (O[:, ci] - p[:, None]), R.T @ L, g.size, 0.0)
            dark[ci[np.isfinite(th)]] = True
        return dark

    @staticmethod
    def _hull_shadow(g: _Geom, R, p, B, a, b, s, ci, dark) -> np.ndarray:
        """Shadow rays against a convex hull without testing every face: a point is shadowed
        iff it lies inside the hull's silhouette seen along the light and below the hull.
        Marks the sure cases in ``dark`` and returns the candidates left for the exact test
        (points level with the hull)."""
        la, lb, ls = B @ (R @ g.hull.verts.T + p[:, None])
        try:
            from scipy.spatial import ConvexHull
            ring = ConvexHull(np.stack([la, lb], axis=1)).vertices   # counter-clockwise
        except Exception:                                            # flat silhouette
            return ci
        pa, pb = la[ring], lb[ring]
        ea, eb = np.roll(pa, -1) - pa, np.roll(pb, -1) - pb
        tol = -1e-12 * float(np.max(np.abs(ea)) + np.max(np.abs(eb))) ** 2
        inside = np.ones(len(ci), dtype=bool)
        qa, qb = a[ci], b[ci]
        for k in range(len(ring)):
            inside &= ea[k] * (qb - pb[k]) - eb[k] * (qa - pa[k]) >= tol
        ci, sq = ci[inside], s[ci[inside]]
        below = sq <= ls.min()
        dark[ci[below]] = True
        return ci[~below & (sq < ls.max())]

    def _finish(self, img: np.ndarray) -> np.ndarray:
        """(3, H*s, W*s) floats in [0, 1] -> (H, W, 3) uint8."""
        s = self.supersample
        img = np.moveaxis(img, 0, -1)
        if s > 1:
            img = img.reshape(self.height, s, self.width, s, 3).mean(axis=(1, 3))
        return (np.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


@dataclass
class RayHits:
    """Per-pixel result of :meth:`Renderer.cast` (arrays (H, W) or (H, W, 3))."""

    geom: np.ndarray        # geom index into sim.sm.geoms, -1 for background
    depth: np.ndarray       # distance from the eye along the ray (m), inf for background
    point: np.ndarray       # world hit point (the eye for background)
    normal: np.ndarray      # unit world normal facing the camera (0 for background)
    dirs: np.ndarray        # unit world ray direction
    eye: np.ndarray         # (3,) camera position


@dataclass
class _CastResult:
    H: int
    W: int
    eye: np.ndarray
    f: float
    dirs: np.ndarray        # (3, H, W) world ray directions
    gid: np.ndarray         # (H, W) geom index, -1 background
    depth: np.ndarray       # (H, W) ray length, inf background
    point: np.ndarray       # (3, H, W) world hit points (the eye for background)
    normal: np.ndarray      # (3, H, W) unit world normals facing the camera (0 background)
    poses: list             # (R, p) per geom (then per marker)
    colors: np.ndarray      # (n_geoms + n_markers + 1, 3) base colours, background last


def _sky(dz: np.ndarray) -> np.ndarray:
    up = np.sqrt(np.maximum(dz, 0.0))
    down = np.sqrt(np.maximum(-dz, 0.0))
    z = (slice(None),) + (None,) * dz.ndim
    return (_SKY_HORIZON[z] + up * (_SKY_ZENITH - _SKY_HORIZON)[z]
            + down * (_SKY_NADIR - _SKY_HORIZON)[z])


def _nice_step(x: float) -> float:
    """Largest of 1, 2, 5 x 10^k not above x (x > 0)."""
    if not (x > 0 and math.isfinite(x)):
        return 1.0
    e = math.floor(math.log10(x))
    for m in (5.0, 2.0, 1.0):
        if m * 10.0 ** e <= x:
            return m * 10.0 ** e
    return 10.0 ** e


# --------------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------------
def _stack_frames(frames: Iterable[np.ndarray]) -> np.ndarray:
    frames = [np.asarray(f) for f in frames]
    if not frames:
        raise ValueError("frames is empty: nothing to write")
    shape = frames[0].shape
    for i, fr in enumerate(frames):
        if fr.ndim != 3 or fr.shape[2] != 3 or fr.dtype != np.uint8:
            raise ValueError(f"frame {i}: expected a uint8 (H, W, 3) image, got {fr.dtype} {fr.shape}")
        if fr.shape != shape:
            raise ValueError(f"frame {i} has shape {fr.shape}, frame 0 has {shape}")
    return np.stack(frames)


def _check_fps(fps) -> float:
    if isinstance(fps, bool) or not isinstance(fps, (int, float, np.integer, np.floating)) \
            or not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"fps must be a positive number, got {fps!r}")
    return float(fps)


def write_gif(frames: Iterable[np.ndarray], path, fps: float = 30.0, loop: int = 0) -> None:
    """Write uint8 (H, W, 3) frames as an animated GIF (``loop=0``: forever).

    GIF stores frame delays in 10 ms units and viewers play delays under 20 ms slowly, so
    ``fps`` above 50 is written at 50 with a warning (pass every n-th frame instead).
    """
    arr = _stack_frames(frames)
    fps = _check_fps(fps)
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError("write_gif needs Pillow: pip install diffgym[render]") from exc
    delay = max(20, int(round(100.0 / fps)) * 10)
    if 1000.0 / delay < fps * 0.999 and fps > 50:
        warnings.warn(f"write_gif: GIF cannot play {fps:g} fps, writing {1000.0 / delay:g} fps",
                      stacklevel=2)
    ims = [Image.fromarray(a) for a in arr]
    # one adaptive palette per frame (Pillow's default for RGB input)
    ims[0].save(path, format="GIF", save_all=True, append_images=ims[1:], duration=delay,
                loop=int(loop), optimize=False, disposal=1)


def write_video(frames: Iterable[np.ndarray], path, fps: float = 30.0, **kwargs) -> None:
    """Write uint8 (H, W, 3) frames as a video (e.g. ``.mp4``) with imageio's ffmpeg plugin.

    Frames of odd width or height are padded by one edge pixel (yuv420p needs even sizes).
    Extra keyword arguments go to ``imageio.v3.imwrite`` (e.g. ``codec="libx264"``,
    ``quality=8``). Needs ``pip install diffgym[render]`` (imageio and imageio-ffmpeg); a path
    ending in ``.gif`` is written by :func:`write_gif`.
    """
    arr = _stack_frames(frames)
    fps = _check_fps(fps)
    try:
        import imageio.v3 as iio
    except ImportError as exc:
        raise ImportError("write_video needs imageio: pip install diffgym[render]") from exc
    if str(path).lower().endswith(".gif"):
        return write_gif(arr, path, fps)
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError as exc:
        raise ImportError("write_video needs the ffmpeg plugin of imageio: "
                          "pip install diffgym[render] (or pip install imageio-ffmpeg)") from exc
    if arr.shape[1] % 2 or arr.shape[2] % 2:     # yuv420p needs even sizes
        arr = np.pad(arr, ((0, 0), (0, arr.shape[1] % 2), (0, arr.shape[2] % 2), (0, 0)), mode="edge")
    kwargs.setdefault("macro_block_size", 2)     # the default 16 rescales other sizes
    iio.imwrite(path, arr, plugin="FFMPEG", fps=fps, **kwargs)
