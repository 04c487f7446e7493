"""Mass properties of a triangle mesh, by MuJoCo's rules for the same file.

MJCF's ``<mesh inertia="...">`` chooses how a mesh geom's volume, centre of mass and inertia are
computed (MuJoCo's default is ``legacy``, kept for backward compatibility):

* ``convex``: the convex hull's exact volume and inertia (what collision uses).
* ``exact``: the mesh itself, by signed tetrahedra: exact for a closed, consistently oriented
  (watertight) surface, however concave.
* ``legacy``: the same tetrahedron sums with every volume taken positive. On a non-convex
  mesh the apex (the faces' area-weighted centroid, then the centre of mass) sees some faces
  from behind; their volumes add instead of cancel, so the mass is neither the mesh's nor its
  hull's. MuJoCo still loads every file without an ``inertia`` attribute this way.
* ``shell``: the mass spread over the surface (area instead of volume).

Load time only (numpy, no compiled kernel). Returns the volume (or area for ``shell``), the
centre of mass and the inertia about it per unit density, so that ``mass = density * volume``.
"""
from __future__ import annotations

import numpy as np

MODES = ("convex", "exact", "legacy", "shell")
_MINVAL = 1e-15          # MuJoCo's mjMINVAL: below it a volume or an area counts as zero


class MeshInertiaError(ValueError):
    """The mesh has no usable volume (or area) under the chosen rule."""


def _triangles(V: np.ndarray, F: np.ndarray):
    D, E, G = V[F[:, 0]], V[F[:, 1]], V[F[:, 2]]
    cr = np.cross(E - D, G - D)
    n2 = np.linalg.norm(cr, axis=1)
    area = 0.5 * n2
    normal = np.divide(cr, n2[:, None], out=np.zeros_like(cr), where=n2[:, None] > 0)
    return D, E, G, area, normal, (D + E + G) / 3.0


def mesh_mass_properties(V: np.ndarray, F: np.ndarray, mode: str):
    """(volume, com, inertia about com) of the triangle mesh ``V`` (n, 3), ``F`` (m, 3) for unit
    density under ``mode`` in ``exact``, ``legacy``, ``shell`` (``convex``: pass the hull's
    triangles with ``exact``). For ``shell`` the first value is the surface area."""
    if mode not in ("exact", "legacy", "shell"):
        raise ValueError(f"mesh inertia mode {mode!r}: expected exact, legacy or shell")
    V = np.asarray(V, dtype=float)
    F = np.asarray(F, dtype=np.int64)
    D, E, G, area, normal, center = _triangles(V, F)
    total_area = area.sum()
    if total_area < _MINVAL:
        raise MeshInertiaError("mesh surface area is too small")
    # apex for the centre of mass: the faces' area-weighted centroid
    facecen = (area[:, None] * center).sum(0) / total_area
    if mode == "shell":
        w = area
    else:
        w = np.einsum("ij,ij->i", center - facecen, normal) * area / 3.0
        if mode == "legacy":
            w = np.abs(w)
    tot = w.sum()
    if tot < _MINVAL:
        if mode == "shell":
            raise MeshInertiaError("mesh surface area is too small")
        if tot < 0:
            raise MeshInertiaError("mesh volume is negative (misoriented triangles)")
        raise MeshInertiaError("mesh volume is too small (inertia='shell' spreads the mass "
                               "over the surface)")
    com = (w[:, None] * (0.75 * center + 0.25 * facecen)).sum(0) / tot
    # second moments about the centre of mass, tetrahedra (or triangles) with apex there
    D, E, G = D - com, E - com, G - com
    if mode == "shell":
        w, C = area, 12.0
    else:
        w, C = np.einsum("ij,ij->i", center - com, normal) * area / 3.0, 20.0
        if mode == "legacy":
            w = np.abs(w)
    S = (2.0 * (np.einsum("ij,ik->ijk", D, D) + np.einsum("ij,ik->ijk", E, E)
                + np.einsum("ij,ik->ijk", G, G))
         + np.einsum("ij,ik->ijk", D, E) + np.einsum("ij,ik->ijk", E, D)
         + np.einsum("ij,ik->ijk", D, G) + np.einsum("ij,ik->ijk", G, D)
         + np.einsum("ij,ik->ijk", E, G) + np.einsum("ij,ik->ijk", G, E))
    P = np.einsum("i,ijk->jk", w / C, S)           # products of inertia (a symmetric 3x3)
    volume = float(w.sum())
    I = np.trace(P) * np.eye(3) - P
    return volume, com, 0.5 * (I + I.T)


def bvh_triangles(bvh) -> tuple[np.ndarray, np.ndarray]:
    """Vertices and triangles of a coal BVH model (as loaded from the mesh file)."""
    V = np.asarray(bvh.vertices(), dtype=float).copy()
    F = np.empty((bvh.num_tris, 3), dtype=np.int64)
    for i in range(bvh.num_tris):
        t = bvh.tri_indices(i)
        F[i] = (t[0], t[1], t[2])
    return V, F
