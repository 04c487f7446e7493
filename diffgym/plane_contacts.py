"""Closed-form contacts of a sphere, box, capsule or cylinder against a plane.

coal's contact patches project every patch point onto the deepest point's plane, so the
corners of a slightly tilted box all report the same depth (errors up to the patch tolerance,
1 mm). For the common shape-on-plane pairs the exact points are cheap to write down, and their
identities (corner index, capsule end, cylinder rim point) are stable from step to step, which
the warm start and the step derivatives rely on:

* sphere: its centre minus r n;
* box: the 8 corners (body-fixed);
* capsule: the two segment ends, offset by the radius along the plane normal;
* cylinder: for each cap, the lowest rim point, or 4 rim points when the cap lies flat.

(``collision_kernels.plane_points`` computes the sphere, capsule and box points of a whole
model in one compiled pass; this function is the pair-by-pair reference.) Each returns
witness points ``x`` on the shape, their signed heights above the plane and ids.
"""
from __future__ import annotations

import numpy as np

_BOX_SIGNS = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], float)


def shape_points(kind: str, size: np.ndarray, R: np.ndarray, t: np.ndarray,
                 n: np.ndarray, offset: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidate witness points (k, 3), signed heights above the plane n.x = offset, ids."""
    if kind == "sphere":
        x = (t - size[0] * n)[None]
        ids = np.arange(1)
    elif kind == "box":
        x = t + (_BOX_SIGNS * size[:3]) @ R.T
        ids = np.arange(8)
    elif kind == "capsule":
        r, h = size[0], size[1]
        ends = np.stack([t - h * R[:, 2], t + h * R[:, 2]])
        x = ends - r * n
        ids = np.arange(2)
    elif kind == "cylinder":
        r, h = size[0], size[1]
        a = R[:, 2]
        d = n - (n @ a) * a
        nd = np.linalg.norm(d)
        caps = np.stack([t - h * a, t + h * a])
        if nd < 1e-9:
            rim = np.stack([R[:, 0], R[:, 1], -R[:, 0], -R[:, 1]]) * r
            x = (caps[:, None, :] + rim[None, :, :]).reshape(8, 3)
            ids = np.arange(8)
        else:
            x = caps - r * d / nd
            ids = np.array([0, 4])
    else:
        raise ValueError(kind)
    return x, x @ n - offset, ids


ANALYTIC_KINDS = ("sphere", "box", "capsule", "cylinder")
