"""Gradient modes: which derivative ``Simulator.step(..., jacobian=True)`` returns.

- ``Exact()``: the implicit derivative of the unrelaxed contact problem by contact mode
  (the default).
- ``Smooth(rho)``: the derivative of the contact problem relaxed at complementarity level
  ``rho``, evaluated around the exact solution. The forward simulation is the exact one.
- ``LongRange(scale, ...)``: a globally supported repulsive barrier between bodies that may
  touch, whose gradient reaches bodies that are apart. With ``rho`` set, its derivative is
  taken through the contact problem relaxed at level ``rho`` (as ``Smooth``), so the barrier's
  gradient also passes through contacts that stick in the exact solution.

A mode is given as a name (``"smooth"``), a mapping (``{"mode": "smooth", "rho": 3e-3}``) or
an instance (``Smooth(rho=3e-3)``); :func:`gradient_mode` turns any of them into an instance
and names what is wrong with a bad one.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union


def _positive(mode: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"gradient mode {mode!r}: {key} must be a number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"gradient mode {mode!r}: {key} must be a positive finite number, "
                         f"got {value!r}")
    return value


@dataclass(frozen=True)
class Exact:
    """The exact mode-based implicit derivative."""
    name = "exact"


@dataclass(frozen=True)
class Smooth:
    """The implicit derivative of the contact problem relaxed at level ``rho``.

    ``rho``: the complementarity relaxation ``a o b = rho e`` at which the derivative is
    taken (the forward step stays exact); ``rho -> 0`` recovers :class:`Exact`."""
    rho: float = 3e-3
    name = "smooth"

    def __post_init__(self):
        object.__setattr__(self, "rho", _positive("smooth", "rho", self.rho))


@dataclass(frozen=True)
class LongRange:
    """A barrier potential with global support between bodies that may touch
    (``diffgym.sim.long_range``); its force enters the forward step.

    ``scale``: the potential's strength (J): the centred term between two bounding spheres at
    distance r is ``scale (1 + r^-1/2)^2``. The long-range paper's term is ``12 mu (1 +
    r^-1/2)^2`` (its eq. 7 with its coefficient mu), so ``scale = 12 mu``: the default 1e-8 is
    mu = 8.3e-10, below the paper's Table 3 settings (billiards mu = 1e-7, i.e. scale 1.2e-6;
    push 1e-6, scale 1.2e-5), which move free-rolling balls at rest by centimetres
    (``docs/issue13/billiards_s10.md``).
    ``margin``: the paper's epsilon: a node pair blends from its children's sum to its single
    centred term as its distance grows from ``d1 = R_I + R_J`` to ``(1 + margin) d1``.
    ``rho``: ``None`` (default): the Jacobian is the long-range step's own (the exact contact
    derivative with the barrier's force derivative added). A positive number: the contact part
    of the derivative is the smooth mode's, of the contact problem relaxed at level ``rho``
    (``Smooth(rho)``), with the barrier's force derivative added; the forward step stays the
    long-range one. Needed where the barrier's force is too weak to break static friction (a
    sticking contact's exact derivative is zero, so the barrier's gradient would stop there);
    ``rho -> 0`` recovers ``rho=None``."""
    scale: float = 1e-8
    margin: float = 0.5
    rho: Optional[float] = None
    name = "long_range"

    def __post_init__(self):
        object.__setattr__(self, "scale", _positive("long_range", "scale", self.scale))
        object.__setattr__(self, "margin", _positive("long_range", "margin", self.margin))
        if self.rho is not None:
            object.__setattr__(self, "rho", _positive("long_range", "rho", self.rho))


GradientMode = Union[Exact, Smooth, LongRange]
MODES = {"exact": Exact, "smooth": Smooth, "long_range": LongRange}


def gradient_mode(spec: Any = "exact") -> GradientMode:
    """The gradient mode ``spec`` names (a name, a mapping with key ``mode``, or an instance)."""
    if spec is None:
        return Exact()
    if isinstance(spec, tuple(MODES.values())):
        return spec
    if isinstance(spec, str):
        cls = MODES.get(spec)
        if cls is None:
            raise ValueError(f"unknown gradient mode {spec!r}; expected one of {sorted(MODES)}")
        return cls()
    if isinstance(spec, Mapping):
        params = dict(spec)
        name = params.pop("mode", None)
        if name not in MODES:
            raise ValueError(f"gradient mode mapping {dict(spec)!r}: key 'mode' must be one of "
                             f"{sorted(MODES)}, got {name!r}")
        cls = MODES[name]
        known = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(params) - known)
        if bad:
            raise ValueError(f"gradient mode {name!r}: unknown key(s) {bad}; it takes "
                             f"{sorted(known) or 'no parameters'}")
        return cls(**params)
    raise TypeError(f"gradient mode must be a name, a mapping or a mode instance, got {spec!r}")


def as_dict(mode: GradientMode) -> dict:
    """The mapping form of ``mode`` (for configs and pickling)."""
    return {"mode": mode.name, **dataclasses.asdict(mode)}
