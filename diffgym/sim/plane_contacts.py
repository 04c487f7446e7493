"""Closed-form contacts of a sphere, box, capsule, cylinder or ellipsoid against a plane.

coal's contact patches project every patch point onto the deepest point's plane, so the
corners of a slightly tilted box all report the same depth (errors up to the patch tolerance,
1 mm). For the common shape-on-plane pairs the exact points are cheap to write down, and their
identities (corner index, capsule end, cylinder rim point) are stable from step to step, which
the warm start and the step derivatives rely on:

* sphere: its centre minus r n;
* box: the 8 corners (body-fixed);
* capsule: the two segment ends, offset by the radius along the plane normal;
* cylinder: for each cap, the lowest point of its rim (ids 8, 9), or, where the cap lies flat
  to within ``CYLINDER_FLAT_TOL`` (its rim's height varies by less: a face contact, a patch),
  4 body-fixed rim points (ids 4 cap + 0..3), the corners of the square inscribed in the
  rim, so a cylinder standing on its cap or lying on its side (the two ends of the line
  contact) rests without rocking (``cylinder_points``, also the points of a cylinder on a box
  face, ``cylinder_box_face``);
* ellipsoid: its support point along -n, ``c - E n / sqrt(n^T E n)`` with
  ``E = R diag(radii^2) R^T`` (its height above the plane is ``n.c - offset - sqrt(n^T E n)``,
  the exact signed distance of an ellipsoid to a plane; id 0), and ``ELLIPSOID_SAMPLES``
  body-fixed points of its surface (ids 1..), the images of points spread evenly over the unit
  sphere. A single point is not enough on a curved body: a step linearizes the contact at the
  current support point, and a body pivoting about it swings the rest of its surface down. A
  flat or long ellipsoid dropped at 10 Hz turns by a radian in one step: with the support point
  and 4 support points of directions tilted by 0.1 rad (the previous design, cut to the 4 lowest
  by max_contact_points) drops went 18-24 cm through the floor; support points of rings of
  directions tilted up to 1 rad still let a tumbling coin (30:30:3) in by 3-4 mm at 30-50 Hz,
  because even spacing in normal angle leaves a flat face nearly unsampled. The body-fixed
  samples cover the surface evenly, are exact speculative contacts (their linearized motion is
  the rigid motion of a point, as a box's corners), and the driver keeps every one within the
  margin (not the lowest max_contact_points: those all sit near the support point). Only the
  samples whose outward normal is within ``ELLIPSOID_REACH`` (1.25 rad) of -n are candidates:
  the others cannot be the lowest point after one step unless the body turns by more than that
  (with all 64, a box falling on an ellipsoid at 10 Hz gave the solver 65 speculative rows and
  a step it did not converge on).

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
        x, ids = cylinder_points(size[0], size[1], R, t, n, samples=True)
    elif kind == "ellipsoid":
        # its support point along -n (id 0), then the body-fixed samples (ids 1..)
        rm = (n @ R) * size[:3]                   # diag(r) R^T n
        s = np.sqrt(rm @ rm)                      # sqrt(n^T E n) > 0 (radii are positive)
        # (only the samples whose outward normal is within ELLIPSOID_REACH of -n: a point can be
        # the lowest after a step only if the body turns by the angle between them)
        g = (ELLIPSOID_U / size[:3]) @ R.T                  # outward normals (unnormalized)
        low = np.flatnonzero(g @ n < -np.cos(ELLIPSOID_REACH) * np.sqrt(np.einsum("ij,ij->i", g, g)))
        x = np.vstack([(t - (rm * size[:3] / s) @ R.T)[None], t + (ELLIPSOID_U[low] * size[:3]) @ R.T])
        ids = np.concatenate([[0], 1 + low])
    else:
        raise ValueError(kind)
    return x, x @ n - offset, ids


# an ellipsoid's body-fixed surface samples: the images x = t + R diag(radii) u of
# ELLIPSOID_SAMPLES points u spread evenly over the unit sphere (a Fibonacci lattice: spacing
# about sqrt(4 pi / N) = 0.44 rad in u, a chord sagitta below radius * 0.025)
ELLIPSOID_SAMPLES = 64
_k = np.arange(ELLIPSOID_SAMPLES) + 0.5
_polar, _azim = np.arccos(1.0 - 2.0 * _k / ELLIPSOID_SAMPLES), np.pi * (1.0 + np.sqrt(5.0)) * _k
ELLIPSOID_U = np.stack([np.cos(_azim) * np.sin(_polar), np.sin(_azim) * np.sin(_polar),
                        np.cos(_polar)], axis=1)
del _k, _polar, _azim
# the samples that are candidates: those whose outward normal is within this angle (rad) of -n
# (rotations up to this angle in one step: 12.5 rad/s at 10 Hz)
ELLIPSOID_REACH = 1.25
# an ellipsoid on a plane keeps all its candidate points within the margin, whatever the
# simulator's max_contact_points (which keeps the lowest: all near the support point, so the
# far side that a pivot swings down would go uncovered)
ELLIPSOID_POINTS = 1 + ELLIPSOID_SAMPLES


def ellipsoid_directions(n: np.ndarray) -> np.ndarray:
    """(1, 3): the direction n of the ellipsoid's support point (id 0); its other points (ids
    1..ELLIPSOID_SAMPLES) are body-fixed."""
    return np.asarray(n, float).reshape(1, 3)


ANALYTIC_KINDS = ("sphere", "box", "capsule", "cylinder", "ellipsoid")

# a cylinder's cap lies flat on a plane when its rim's height above the plane varies by less
# than this (2 r sin(tilt)): coal's contact patch tolerance, the thickness it gives a support set
CYLINDER_FLAT_TOL = 1e-3
# ids of a cylinder's lowest rim points (a tilted cap): 8 + cap; flat rim points 4 cap + 0..3
CYLINDER_LOWEST_ID = 8
# a tilted cylinder on a plane also offers CYLINDER_RIM_SAMPLES body-fixed points of each cap's
# rim (ids CYLINDER_RIM_ID + CYLINDER_RIM_SAMPLES cap + j, at angle 2 pi j / CYLINDER_RIM_SAMPLES
# from the body x axis), except the one nearest the cap's lowest rim point (within half their
# spacing: that point stands for it). The lowest rim point is not a material point: where a
# cap is nearly flat and the body tips over it within one step, the lowest point jumps to the
# far side of the rim, which a row at the old lowest point cannot see (bench_drops #345, a
# cylinder at 30 Hz: 24 mm into the floor in one step). The samples are material points, exact
# speculative contacts like a box's corners; at rest they lie r (1 - cos(pi / 8)) = 0.076 r
# or more above the lowest point, outside the margin.
CYLINDER_RIM_SAMPLES = 8
# ... only while the caps face the plane, tilted by less than asin(CYLINDER_TIP_SIN) (0.5 rad):
# the lowest point can then flip across the rim within a step. A cylinder rolling on its side
# keeps its two lowest rim points alone: samples there turn it into a rolling octagon (speculative
# rows of rim points about to swing down, a brake on the rolling, redundant rows the solver did
# not converge on: drops #131, #195, #237 at 7.5e-8 to 8.5e-8 m/s)
CYLINDER_TIP_SIN = float(np.sin(0.5))
CYLINDER_RIM_ID = 16
_RIM_ANGLES = 2.0 * np.pi * np.arange(CYLINDER_RIM_SAMPLES) / CYLINDER_RIM_SAMPLES
_RIM_CS = np.stack([np.cos(_RIM_ANGLES), np.sin(_RIM_ANGLES)], axis=1)
# an upper bound on a cylinder's candidates on a plane (it keeps every one within the margin,
# whatever max_contact_points: the lowest would all sit by the lowest rim point)
CYLINDER_POINTS = 2 + 2 * CYLINDER_RIM_SAMPLES


def cylinder_lowest(ids):
    """Whether each cylinder point id is a cap's lowest rim point (not body-fixed)."""
    ids = np.asarray(ids)
    return (ids == CYLINDER_LOWEST_ID) | (ids == CYLINDER_LOWEST_ID + 1)


def cylinder_points(r: float, h: float, R: np.ndarray, t: np.ndarray, n: np.ndarray,
                    samples: bool = False):
    """Contact candidates (k, 3) and ids of a cylinder (radius r, half length h, rotation R,
    centre t, axis R[:, 2]) on a plane with unit normal n (out of the plane): per cap, the
    lowest point of its rim ``c - r u`` (u the unit projection of n on the cap plane; id
    8 + cap), or 4 body-fixed rim points (ids 4 cap + 0..3) where the cap is flat to within
    CYLINDER_FLAT_TOL (``2 r |n - (n.a) a| <=`` it; then the lowest rim point is within
    ``0.15 CYLINDER_FLAT_TOL`` of the lowest of the four). With ``samples`` (a cylinder on a
    plane), a cap tilted by less than asin(CYLINDER_TIP_SIN) also gives its body-fixed rim
    samples (ids CYLINDER_RIM_ID + ..., see CYLINDER_RIM_SAMPLES) but the one nearest its lowest
    point."""
    a = R[:, 2]
    d = n - (n @ a) * a
    nd = float(np.sqrt(d @ d))
    caps = np.stack([t - h * a, t + h * a])
    if 2.0 * r * nd <= CYLINDER_FLAT_TOL:
        rim = np.stack([R[:, 0], R[:, 1], -R[:, 0], -R[:, 1]]) * r
        return (caps[:, None, :] + rim[None, :, :]).reshape(8, 3), np.arange(8)
    low = caps - r * d / nd
    ids = np.array([CYLINDER_LOWEST_ID, CYLINDER_LOWEST_ID + 1])
    if not samples or nd >= CYLINDER_TIP_SIN:
        return low, ids
    dirs = _RIM_CS @ R[:, :2].T                    # (K, 3) unit rim directions (body-fixed)
    far = -(dirs @ d) / nd < np.cos(np.pi / CYLINDER_RIM_SAMPLES)   # not the lowest point's own
    j = np.flatnonzero(far)
    rim = r * dirs[j]
    K = CYLINDER_RIM_SAMPLES
    return (np.vstack([low, caps[0] + rim, caps[1] + rim]),
            np.concatenate([ids, CYLINDER_RIM_ID + j, CYLINDER_RIM_ID + K + j]))


def cylinder_box_face(r: float, h: float, Rc: np.ndarray, tc: np.ndarray, Rb: np.ndarray,
                      tb: np.ndarray, hb: np.ndarray, margin: float):
    """A cylinder (radius r, half length h, pose Rc, tc) against a face of a box (pose Rb, tb,
    half sizes hb), in closed form where a face of the box is the contact feature:
    (face normal n (world, out of the box), face axis index, sign, witness points x (k, 3) on
    the cylinder within ``margin`` of the face plane, their heights above it, ids), or None.

    The face is the one whose plane the cylinder is highest above (its support along the face
    normal m is ``m.tc - h |m.a| - r sqrt(1 - (m.a)^2)``): the separating axis among the face
    normals, and the exact signed distance when the cylinder's points over the plane project
    inside the face (the box lies under the plane, the cylinder above it, and its lowest point
    is over the face). Where a point projects outside the face (a cylinder over an edge or a
    corner) or the cylinder is deeper than half the box, None: the narrow phase (coal) decides.
    The candidates are those of ``cylinder_points`` on the face plane, so a cap flat on the
    face gives 4 rim points and a cylinder on its side the two ends of its line contact."""
    a = Rc[:, 2]
    best, bi, bs = -np.inf, -1, 0.0
    for i in range(3):
        for s in (-1.0, 1.0):
            m = s * Rb[:, i]
            ma = float(m @ a)
            sup = float(m @ tc) - h * abs(ma) - r * np.sqrt(max(1.0 - ma * ma, 0.0))
            height = sup - float(m @ tb) - hb[i]
            if height > best:
                best, bi, bs = height, i, s
    if best < -0.5 * float(np.min(hb)):
        return None
    n = bs * Rb[:, bi]
    offset = float(n @ tb) + hb[bi]
    x, ids = cylinder_points(r, h, Rc, tc, n)
    height = x @ n - offset
    sel = np.flatnonzero(height < margin)
    if not len(sel):
        return n, bi, bs, x[:0], height[:0], ids[:0]
    # inside the face: the other two box coordinates within the half sizes
    loc = (x[sel] - tb) @ Rb
    for j in range(3):
        if j != bi and np.any(np.abs(loc[:, j]) > hb[j]):
            return None
    return n, bi, bs, x[sel], height[sel], ids[sel]
