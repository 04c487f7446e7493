"""Closed-form contacts of a sphere, box, capsule, cylinder or ellipsoid against a plane.

coal's contact patches project every patch point onto the deepest point's plane, so the
corners of a slightly tilted box all report the same depth (errors up to the patch tolerance,
1 mm). For the common shape-on-plane pairs the exact points are cheap to write down, and their
identities (corner index, capsule end, cylinder rim point) are stable from step to step, which
the warm start and the step derivatives rely on:

* sphere: its centre minus r n;
* box: the 8 corners (body-fixed);
* capsule: the two segment ends, offset by the radius along the plane normal;
* cylinder: for each cap, the lowest rim point, or 4 rim points when the cap lies flat;
* ellipsoid: its support point along -n, ``c - E n / sqrt(n^T E n)`` with
  ``E = R diag(radii^2) R^T`` (its height above the plane is ``n.c - offset - sqrt(n^T E n)``,
  the exact signed distance of an ellipsoid to a plane), and the support points along 4
  directions ``m`` tilted by ``ELLIPSOID_TILT`` from n in the plane's fixed tangent frame. A
  single point is not enough on a curved body: a step linearizes the contact at the current
  support point, and a body pivoting about it dips below the plane at second order (by
  ``rho theta^2 / 2`` for a rotation theta per step about a point of curvature radius rho:
  centimetres for a flat ellipsoid at 10-100 Hz). The ring points are speculative contacts that
  stop the dip at the sagitta between them (``rho ELLIPSOID_TILT^2 / 8``); each is the support
  point of a fixed world direction, so its derivatives have the same closed form.

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
    elif kind == "ellipsoid":
        # support points of x = t + R diag(r) u (|u| = 1) along -m, m = n and 4 directions
        # tilted from n (ellipsoid_directions)
        m = ellipsoid_directions(n)
        rm = (m @ R) * size[:3]                   # rows diag(r) R^T m
        s = np.sqrt(np.einsum("ij,ij->i", rm, rm))   # sqrt(m^T E m) > 0 (radii are positive)
        x = t - (rm * size[:3] / s[:, None]) @ R.T
        ids = np.arange(len(m))
    else:
        raise ValueError(kind)
    return x, x @ n - offset, ids


# tilt (rad) of the 4 extra support directions of an ellipsoid on a plane
ELLIPSOID_TILT = 0.1


def ellipsoid_directions(n: np.ndarray) -> np.ndarray:
    """(5, 3) unit directions: n, then n tilted by ELLIPSOID_TILT towards +t1, +t2, -t1, -t2
    (t1, t2 the tangent frame of n: fixed for a static plane). Row k is the direction of the
    ellipsoid contact point with id k."""
    from .frames import tangent_frames
    F = tangent_frames(np.asarray(n, float).reshape(1, 3))[0]
    c, s = np.cos(ELLIPSOID_TILT), np.sin(ELLIPSOID_TILT)
    t1, t2, nn = F[:, 0], F[:, 1], F[:, 2]
    return np.stack([nn, c * nn + s * t1, c * nn + s * t2, c * nn - s * t1, c * nn - s * t2])


ANALYTIC_KINDS = ("sphere", "box", "capsule", "cylinder", "ellipsoid")
