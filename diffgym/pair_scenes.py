"""Scenes of one primitive pair, shared by the pair census (``scripts/pair_census.py``) and the
closed-form pair derivative tests (``tests/test_pair_derivatives.py``): a free body of one kind
(``TOP``) above a static geom of another (``BASE``), in MJCF, with the convex meshes they use.

Kinds: sphere, capsule, box, cylinder, ellipsoid, mesh (a box with an apex: ``POLY_OBJ``); the
bases also include a plane, a large flat slab mesh (``mesh``, the polytope scaled 4 x 5 x 0.5)
and ``flat``, the polytope without its apex scaled 4 x 5 x 1 (a box as a convex mesh)."""
from __future__ import annotations

import os

import diffgym

KINDS = ("sphere", "capsule", "box", "cylinder", "ellipsoid", "mesh")
UPRIGHT, TILTED = "0 0 20", "25 15 0"
# a capsule or cylinder lying along x, the base capsule's axis (capsule on capsule: a line contact)
LYING = "0 90 0"
EULER = {"upright": UPRIGHT, "tilted": TILTED}

POLY_OBJ = """v -0.1 -0.08 -0.06
v 0.1 -0.08 -0.06
v 0.1 0.08 -0.06
v -0.1 0.08 -0.06
v -0.1 -0.08 0.06
v 0.1 -0.08 0.06
v 0.1 0.08 0.06
v -0.1 0.08 0.06
v 0.0 0.0 0.09
f 1 3 2
f 1 4 3
f 1 2 6
f 1 6 5
f 2 3 7
f 2 7 6
f 3 4 8
f 3 8 7
f 4 1 5
f 4 5 8
f 5 6 9
f 6 7 9
f 7 8 9
f 8 5 9
"""
# the same without its apex: a box as a convex mesh
FLAT_OBJ = ("\n".join(ln for ln in POLY_OBJ.splitlines() if ln.startswith("v ") and "0.09" not in ln)
            + "\nf 1 3 2\nf 1 4 3\nf 5 6 7\nf 5 7 8\nf 1 2 6\nf 1 6 5\n"
            "f 2 3 7\nf 2 7 6\nf 3 4 8\nf 3 8 7\nf 4 1 5\nf 4 5 8\n")
ASSETS = ('<asset><mesh name="poly" file="poly.obj"/><mesh name="slab" file="poly.obj" '
          'scale="4 5 0.5"/><mesh name="flat" file="flat.obj" scale="4 5 1"/></asset>')

TOP = {"sphere": 'type="sphere" size="0.08"',
       "capsule": 'type="capsule" size="0.05 0.1"',
       "box": 'type="box" size="0.1 0.08 0.06"',
       "cylinder": 'type="cylinder" size="0.08 0.07"',
       "ellipsoid": 'type="ellipsoid" size="0.1 0.07 0.05"',
       "mesh": 'type="mesh" mesh="poly"'}
BASE = {"sphere": 'type="sphere" size="0.2" pos="0 0 -0.2"',
        "capsule": 'type="capsule" size="0.1 0.4" pos="0 0 -0.1" euler="0 90 0"',
        "box": 'type="box" size="0.4 0.4 0.1" pos="0 0 -0.1"',
        "cylinder": 'type="cylinder" size="0.3 0.1" pos="0 0 -0.1"',
        "ellipsoid": 'type="ellipsoid" size="0.4 0.3 0.1" pos="0 0 -0.1"',
        "mesh": 'type="mesh" mesh="slab" pos="0 0 -0.045"',
        "flat": 'type="mesh" mesh="flat" pos="0 0 -0.06"',
        "plane": 'type="plane" size="2 2 0.1"'}


def write_assets(folder) -> None:
    """The mesh files the scenes refer to, written into ``folder``."""
    with open(os.path.join(folder, "poly.obj"), "w") as f:
        f.write(POLY_OBJ)
    with open(os.path.join(folder, "flat.obj"), "w") as f:
        f.write(FLAT_OBJ)


def scene_xml(base: str, top: str, euler: str, x: float = 0.02, y: float = 0.01) -> str:
    """MJCF of the free ``top`` (at x, y, 0.3 with Euler angles ``euler``, degrees) above
    the static ``base``; geoms named "base" and "top", friction 0.5, dt 0.01."""
    if base not in BASE or top not in TOP:
        raise ValueError(f"pair_scenes: unknown pair {base!r}-{top!r} (bases {sorted(BASE)}, "
                         f"tops {sorted(TOP)})")
    return f"""<mujoco><option timestep="0.01"/>
{ASSETS}<worldbody>
<geom name="base" {BASE[base]} friction="0.5"/>
<body name="top" pos="{x} {y} 0.3" euler="{euler}"><freejoint name="top"/>
  <geom name="top" {TOP[top]} mass="1" friction="0.5"/></body>
</worldbody></mujoco>"""


def load(folder, base: str, top: str, euler: str, x: float = 0.02,
         y: float = 0.01) -> "diffgym.Simulator":
    """A Simulator of the scene, its files written into ``folder``."""
    write_assets(folder)
    path = os.path.join(str(folder), "scene.xml")
    with open(path, "w") as f:
        f.write(scene_xml(base, top, euler, x, y))
    return diffgym.Simulator.from_file(path)
