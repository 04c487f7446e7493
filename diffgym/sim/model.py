"""The loaded model: a pinocchio Model and GeometryModel plus what pinocchio does not hold.

Both loaders (:mod:`diffgym.sim.mjcf`, :mod:`diffgym.sim.urdf`) produce a :class:`SimModel`. It carries
the per-geom contact properties (friction, contype/conaffinity), the candidate collision pairs
after MuJoCo's filtering rules, the hard joint limits, actuators and the default state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pinocchio as pin


class ModelError(ValueError):
    """A model file or string could not be turned into a simulation model."""


@dataclass
class GeomInfo:
    """Contact and display properties of one collision geometry (index = geom_model index)."""

    name: str
    body: str                 # name of the (MJCF/URDF) body or link that owns it
    kind: str                 # plane, sphere, box, capsule, cylinder, ellipsoid, mesh
    size: np.ndarray          # MuJoCo-style size parameters (half sizes, radius, half length)
    friction: float = 1.0
    contype: int = 1
    conaffinity: int = 1
    rgba: np.ndarray = field(default_factory=lambda: np.array([0.7, 0.7, 0.7, 1.0]))
    bound_radius: float = np.inf   # radius of a sphere around the geom origin holding the shape
    restitution: float = 0.0  # coefficient of restitution (0: perfectly inelastic impacts)


@dataclass
class JointLimit:
    """A hard unilateral limit on one scalar joint coordinate: sign*(q - bound) >= 0."""

    joint: str
    idx_q: int
    idx_v: int
    bound: float
    sign: float               # +1 for a lower bound, -1 for an upper bound


@dataclass
class Actuator:
    """A motor on one scalar joint: tau[idx_v] += gear * ctrl, ctrl clipped to ctrlrange."""

    name: str
    joint: str
    idx_v: int
    gear: float
    ctrlrange: tuple[float, float] | None
    # a tendon transmission: ((idx_v, coef), ...), tau[idx_v] += gear * ctrl * coef; empty for
    # a joint (then ``joint`` names the joint, else the tendon)
    dofs: tuple = ()


@dataclass
class SimModel:
    model: pin.Model
    geom_model: pin.GeometryModel
    geoms: list[GeomInfo]
    pairs: np.ndarray                 # (P, 2) candidate geom index pairs after filtering
    limits: list[JointLimit]
    actuators: list[Actuator]
    q0: np.ndarray
    dt: float
    damping: np.ndarray               # (nv,) joint damping, applied as -damping * v
    source: str = "<string>"
    keyframes: dict[str, np.ndarray] = field(default_factory=dict)
    # where each joint was declared ("file:line: <body name=...>"), for load-time messages
    joint_where: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_inertia(self.model, self.source, self.joint_where)
        self.pairs = np.asarray(self.pairs, dtype=np.int64).reshape(-1, 2)
        # the candidate pairs are registered in the GeometryModel (its GeometryData then holds
        # per-pair coal objects, ~5.5 kB each: quadratic in the number of bodies) only up to
        # pair_tables.REGISTER_PAIRS_MAX; the narrow phase makes its own per pair on first use
        from .pair_tables import REGISTER_PAIRS_MAX
        self.geom_model.removeAllCollisionPairs()
        if len(self.pairs) <= REGISTER_PAIRS_MAX:
            for a, b in self.pairs:
                self.geom_model.addCollisionPair(pin.CollisionPair(int(a), int(b)))
        self.friction = np.array([g.friction for g in self.geoms], dtype=float)
        self.pair_friction = (
            np.maximum(self.friction[self.pairs[:, 0]], self.friction[self.pairs[:, 1]])
            if len(self.pairs) else np.zeros(0))
        self.update_restitution()

    def update_restitution(self) -> None:
        """``pair_restitution`` (P,) from the geoms' ``restitution``: a pair takes the larger of
        its two coefficients (as friction does), so a bouncy ball bounces on any floor."""
        e = np.array([float(getattr(g, "restitution", 0.0)) for g in self.geoms], dtype=float)
        bad = np.flatnonzero(~((e >= 0.0) & (e <= 1.0)))
        if len(bad):
            g = self.geoms[int(bad[0])]
            raise ModelError(f"{self.source}: geom {g.name!r}: restitution must be in [0, 1], "
                             f"got {g.restitution!r}")
        self.pair_restitution = (np.maximum(e[self.pairs[:, 0]], e[self.pairs[:, 1]])
                                 if len(self.pairs) else np.zeros(0))


def check_inertia(model: pin.Model, source: str = "<string>",
                  where: dict[str, str] | None = None) -> None:
    """ModelError naming the body and attribute when the inertia of a moving body is not
    physical: a non-finite or negative mass, a non-finite centre of mass or rotational inertia,
    or a joint that moves no mass (a singular joint-space mass matrix at the neutral
    configuration: e.g. a free body without inertia, or a zero diagonal)."""
    where = where or {}
    for j in range(1, model.njoints):
        Y = model.inertias[j]
        body = model.names[j]
        at = where.get(body, source)
        if not (np.isfinite(Y.mass) and Y.mass >= 0):
            raise ModelError(f"{at}: body of joint {body!r}: mass must be finite and >= 0, "
                             f"got {Y.mass!r}")
        if not (np.all(np.isfinite(Y.lever)) and np.all(np.isfinite(Y.inertia))):
            raise ModelError(f"{at}: body of joint {body!r}: non-finite centre of mass or "
                             "inertia")
    if model.nv == 0:
        return
    # M is block diagonal over the kinematic trees: each block on its own (diffgym.sim.trees: a
    # whole-model pinocchio Data is cubic in nv), the scale over the whole diagonal
    from .trees import block_mass_matrices
    blocks = list(block_mass_matrices(model, pin.neutral(model)))
    scale = max(max(float(np.max(np.abs(np.diag(M)))) for _, M in blocks), 1e-300)
    for v0, M in blocks:
        # the first velocity whose pivot vanishes names the joint (LDL^T without pivoting)
        n = M.shape[0]
        A = M.copy()
        for il in range(n):
            i = v0 + il
            piv = A[il, il]
            if not (np.isfinite(piv) and piv > 1e-12 * scale):
                j = next(jj for jj in range(1, model.njoints)
                         if model.joints[jj].idx_v <= i < model.joints[jj].idx_v
                         + model.joints[jj].nv)
                what = ("a zero diagonal (no mass or inertia moves with it)"
                        if M[il, il] <= 1e-12 * scale else
                        "a singular mass matrix (its motion is carried by no inertia of its own)")
                raise ModelError(f"{where.get(model.names[j], source)}: joint "
                                 f"{model.names[j]!r} (velocity {i}) has {what}: give the body "
                                 f"it moves a positive mass and inertia (M[{i},{i}] = "
                                 f"{M[il, il]:.3g})")
            A[il + 1:, il + 1:] -= np.outer(A[il + 1:, il], A[il, il + 1:]) / piv
