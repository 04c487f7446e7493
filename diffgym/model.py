"""The loaded model: a pinocchio Model and GeometryModel plus what pinocchio does not hold.

Both loaders (:mod:`diffgym.mjcf`, :mod:`diffgym.urdf`) produce a :class:`SimModel`. It carries
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

    def __post_init__(self) -> None:
        self.pairs = np.asarray(self.pairs, dtype=np.int64).reshape(-1, 2)
        self.geom_model.removeAllCollisionPairs()
        for a, b in self.pairs:
            self.geom_model.addCollisionPair(pin.CollisionPair(int(a), int(b)))
        self.friction = np.array([g.friction for g in self.geoms], dtype=float)
        self.pair_friction = (
            np.maximum(self.friction[self.pairs[:, 0]], self.friction[self.pairs[:, 1]])
            if len(self.pairs) else np.zeros(0))
