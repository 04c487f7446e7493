"""What diffgym does not simulate, refused at load by name.

A model file that asks for something changing the dynamics that diffgym does not implement
(a spatial tendon, MuJoCo's RK4 integrator, fluid forces, ...) is
refused with a :class:`~diffgym.sim.model.ModelError` naming the file, line, element and attribute
of every such use. A user who accepts the difference loads it anyway with
``Simulator.from_file(path, ignore_unsupported=("tendon", "joint.frictionloss"))``: the named
constructs are left out (a warning, :class:`UnsupportedIgnoredWarning`, lists them). A name
ignores its key and every key under it (``"equality"`` ignores ``"equality.weld"``, ...).

``RULES`` is the single table of refusals: to support a construct, implement it in the loader
and delete its row. A row with ``path`` is checked by the loaders' document scan on every
matching element (``"tag"`` or ``"parent/tag"``; MJCF attributes with the default classes
applied); a row without ``path`` is checked by the loader where it builds the construct
(e.g. the condim of a contact pair, known only once both geoms are).

Accepted without a refusal, because diffgym's contact is exact by design (README, "Models from
elsewhere"): MuJoCo's soft-contact and soft-limit parameters ``solref``,
``solimp``, ``solmix``, ``margin``, ``gap``, ``solreflimit``, ``solimplimit`` (diffgym's
contacts and limits are hard, its margin is a speculative-contact distance, not a force
distance). Accepted because they do not change the dynamics: sensors, sites, cameras, lights,
materials, textures, skins, visual settings, ``<custom>``, solver settings (``iterations``,
``tolerance``, ``solver``, ``jacobian``, ``noslip_*``, ``ccd_*``).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

from .model import ModelError


class UnsupportedIgnoredWarning(UserWarning):
    """A model was loaded with ``ignore_unsupported``: what was left out of the simulation."""


def _num(a: dict, key: str, default: float = 0.0) -> float:
    try:
        return float(str(a.get(key, default)).split()[0])
    except (ValueError, IndexError):
        return default


def _nums(a: dict, key: str) -> list[float]:
    try:
        return [float(x) for x in str(a.get(key, "")).split()]
    except ValueError:
        return []


def _visual_only(a: dict) -> bool:
    return str(a.get("contype", "1")) == "0" and str(a.get("conaffinity", "1")) == "0"


def _force_limited(a: dict, ctx: dict) -> bool:
    lim = a.get("forcelimited", "auto")
    return lim == "true" or (lim == "auto" and ctx.get("autolimits", True) and "forcerange" in a)


# <option><flag> values that change the dynamics in a way diffgym does not follow (contact,
# constraint, limit, gravity, passive, spring and damper are followed; the rest do not change it)
REFUSED_FLAGS = {"actuation": "disable", "clampctrl": "disable", "filterparent": "disable",
                 "override": "enable"}


@dataclass(frozen=True)
class Rule:
    key: str                       # the name ignore_unsupported takes
    why: str                       # what diffgym does not simulate
    fmt: str = "mjcf"              # "mjcf" or "urdf"
    path: str | None = None        # element(s) the scan checks: "tag" or "parent/tag"
    attr: str | None = None        # the attribute named (None: the element itself)
    when: Callable[[dict, dict], bool] | None = None   # (attributes, context) -> refused?


RULES: tuple[Rule, ...] = (
    # -- constraints diffgym does not have (yet) -------------------------------------------
    Rule("equality.tendon", "equality constraint (tendon coupling)", path="equality/tendon"),
    Rule("equality.flex", "equality constraint (flex)", path="equality/flex"),
    Rule("tendon.spatial", "spatial tendon", path="tendon/spatial"),
    Rule("joint.ball_stiffness", "spring on a ball joint", path="joint", attr="stiffness",
         when=lambda a, c: a.get("type", "hinge") == "ball" and _num(a, "stiffness") != 0.0),
    Rule("joint.springdamper", "joint springdamper", path="joint", attr="springdamper",
         when=lambda a, c: any(x != 0 for x in _nums(a, "springdamper"))),
    Rule("joint.actuatorfrcrange", "joint actuator-force limit", path="joint",
         attr="actuatorfrcrange",
         when=lambda a, c: a.get("actuatorfrclimited", "auto") == "true" or (
             a.get("actuatorfrclimited", "auto") == "auto" and "actuatorfrcrange" in a)),
    # -- integration and contact model -----------------------------------------------------
    Rule("option.integrator", "integrator other than semi-implicit Euler", path="option",
         attr="integrator", when=lambda a, c: a.get("integrator", "Euler") != "Euler"),
    Rule("option.cone", "pyramidal friction cone (diffgym's cone is the exact Coulomb cone)",
         path="option", attr="cone", when=lambda a, c: a.get("cone", "pyramidal") == "pyramidal"
         and "cone" in a),
    Rule("option.impratio", "frictional-to-normal impedance ratio", path="option",
         attr="impratio", when=lambda a, c: _num(a, "impratio", 1.0) != 1.0),
    Rule("option.fluid", "fluid forces (medium density or viscosity, wind)", path="option",
         attr="density/viscosity/wind",
         when=lambda a, c: _num(a, "density") != 0 or _num(a, "viscosity") != 0
         or any(x != 0 for x in _nums(a, "wind"))),
    Rule("option.collision", "collision mode other than 'all'", path="option", attr="collision",
         when=lambda a, c: a.get("collision", "all") != "all"),
    Rule("option.flag", "simulation flag", path="option/flag",
         when=lambda a, c: any(a.get(k) == v for k, v in REFUSED_FLAGS.items())),
    Rule("geom.condim", "torsional or rolling friction (contact condim 4 or 6; diffgym's contacts "
         "are condim 3, or 1: frictionless)"),
    Rule("geom.hfield", "height-field geom", path="geom", attr="type",
         when=lambda a, c: a.get("type") == "hfield" and not _visual_only(a)),
    Rule("geom.sdf", "signed-distance-field geom", path="geom", attr="type",
         when=lambda a, c: a.get("type") == "sdf" and not _visual_only(a)),
    Rule("geom.fluid", "fluid forces on a geom", path="geom", attr="fluidshape",
         when=lambda a, c: a.get("fluidshape", "none") != "none"),
    Rule("geom.shellinertia", "shell inertia", path="geom", attr="shellinertia",
         when=lambda a, c: a.get("shellinertia", "false") == "true"),
    Rule("body.gravcomp", "gravity compensation", path="body", attr="gravcomp",
         when=lambda a, c: _num(a, "gravcomp") != 0.0),
    # (anywhere: in <worldbody> as in a <body>)
    Rule("composite", "composite object", path="composite"),
    Rule("flex", "deformable object", path="flexcomp"),
    Rule("deformable", "deformable object", path="deformable"),
    # (model composition the loader does not expand: the bodies inside would be left out)
    Rule("replicate", "replicated bodies (not expanded: its bodies would be left out)",
         path="replicate"),
    Rule("attach", "attached sub-model (not expanded: its bodies would be left out)",
         path="attach"),
    Rule("plugin", "engine plugin", path="extension"),
    # -- actuators ---------------------------------------------------------------------------
    Rule("actuator.position", "position actuator (a PD servo)", path="actuator/position"),
    Rule("actuator.velocity", "velocity actuator", path="actuator/velocity"),
    Rule("actuator.intvelocity", "integrated-velocity actuator", path="actuator/intvelocity"),
    Rule("actuator.damper", "damper actuator", path="actuator/damper"),
    Rule("actuator.cylinder", "cylinder actuator", path="actuator/cylinder"),
    Rule("actuator.muscle", "muscle actuator", path="actuator/muscle"),
    Rule("actuator.adhesion", "adhesion actuator", path="actuator/adhesion"),
    Rule("actuator.plugin", "plugin actuator", path="actuator/plugin"),
    Rule("actuator.dyntype", "actuator activation dynamics", path="actuator/*", attr="dyntype",
         when=lambda a, c: a.get("dyntype", "none") != "none"),
    Rule("actuator.gaintype", "actuator gain other than fixed", path="actuator/*",
         attr="gaintype", when=lambda a, c: a.get("gaintype", "fixed") != "fixed"),
    Rule("actuator.biastype", "actuator bias force (state feedback)", path="actuator/*",
         attr="biastype", when=lambda a, c: a.get("biastype", "none") != "none"),
    Rule("actuator.forcerange", "actuator force limit", path="actuator/*", attr="forcerange",
         when=_force_limited),
    Rule("actuator.transmission", "actuator transmission other than a joint or a fixed tendon",
         path="actuator/*", attr="site/body/jointinparent/cranksite",
         when=lambda a, c: any(k in a for k in ("site", "body", "jointinparent", "cranksite"))),
    # -- URDF ----------------------------------------------------------------------------------
    Rule("joint.mimic_continuous", "mimic coupling of a continuous joint (an unbounded angle "
         "stored as cos/sin; mimic is simulated between revolute and prismatic joints)",
         fmt="urdf"),
)

# Keys of rows deleted from RULES because the construct is now simulated: code that still names
# them in ignore_unsupported keeps working (they ignore nothing). Add a key here when you delete
# its row.
SUPPORTED_NOW: tuple[str, ...] = ("equality.connect", "equality.weld", "equality.joint",
                                  "tendon.fixed", "joint.ball_range", "joint.mimic",
                                  "compiler.boundmass", "compiler.boundinertia",
                                  "body.mocap", "compiler.balanceinertia",
                                  "compiler.inertiagrouprange")

# Simulated elements a user may still leave out by name with ``ignore_unsupported`` (the loader
# drops them and warns, :class:`UnsupportedIgnoredWarning`, as for an ignored refusal): joint dry
# friction (MJCF ``frictionloss``, URDF ``<dynamics friction>``), whose rows take a model off
# the compiled fast path (diffgym.sim.equality).
OPTIONAL: dict[str, str] = {"joint.frictionloss": "joint dry friction"}

KEYS: tuple[str, ...] = tuple(dict.fromkeys(r.key for r in RULES))


def rules_for(fmt: str) -> list[Rule]:
    return [r for r in RULES if r.fmt == fmt]


def rule(key: str) -> Rule:
    return next(r for r in RULES if r.key == key)


def _normalize(ignore) -> tuple[str, ...]:
    if ignore is None:
        return ()
    if isinstance(ignore, str):
        ignore = (ignore,)
    out = tuple(str(x) for x in ignore)
    for name in out:
        if not any(k == name or k.startswith(name + ".")
                   for k in (*KEYS, *SUPPORTED_NOW, *OPTIONAL)):
            raise ValueError(f"ignore_unsupported: unknown name {name!r} (known: "
                             f"{', '.join(KEYS)}; a prefix such as 'equality' names every key "
                             "under it)")
    return out


class Refusals:
    """Collects what a model uses and diffgym does not simulate; :meth:`finish` raises one
    ModelError naming every refused use, or warns about the ignored ones."""

    def __init__(self, source: str, ignore: Iterable[str] | str | None = None):
        self.source = source
        self.ignore = _normalize(ignore)
        self.refused: list[str] = []
        self.ignored: list[str] = []
        self.refused_keys: list[str] = []
        self.ignored_keys: list[str] = []

    def ignores(self, key: str) -> bool:
        return any(key == n or key.startswith(n + ".") for n in self.ignore)

    def hit(self, key: str, where: str, what: str, attr: str | None = None,
            value: str | None = None, detail: str = "") -> None:
        r = rule(key)
        at = f" {attr}={value!r}" if attr and value is not None else (f" {attr}" if attr else "")
        msg = f"{where}: {what}{at}: {r.why}{(' (' + detail + ')') if detail else ''} [{key}]"
        if self.ignores(key):
            self.ignored.append(msg)
            if key not in self.ignored_keys:
                self.ignored_keys.append(key)
        else:
            self.refused.append(msg)
            if key not in self.refused_keys:
                self.refused_keys.append(key)

    def leave_out(self, key: str, where: str, what: str) -> bool:
        """An :data:`OPTIONAL` element the model uses: True (and recorded for the warning) when
        ``ignore_unsupported`` names it, so the loader drops it; False: it is simulated."""
        if not self.ignores(key):
            return False
        self.ignored.append(f"{where}: {what}: {OPTIONAL[key]} [{key}]")
        if key not in self.ignored_keys:
            self.ignored_keys.append(key)
        return True

    def finish(self) -> None:
        if self.refused:
            shown = self.refused[:20]
            more = len(self.refused) - len(shown)
            exc = ModelError(
                f"{self.source}: the model uses what diffgym does not simulate:\n  "
                + "\n  ".join(shown) + (f"\n  ... and {more} more" if more else "")
                + "\nTo load it anyway, accepting the difference: ignore_unsupported="
                + repr(tuple(self.refused_keys)))
            exc.unsupported = tuple(self.refused_keys)     # the keys, for programs
            raise exc
        if self.ignored:
            warnings.warn(UnsupportedIgnoredWarning(
                f"{self.source}: left out of the simulation (ignore_unsupported):\n  "
                + "\n  ".join(self.ignored)), stacklevel=5)
