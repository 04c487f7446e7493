"""The software renderer (diffgym.render): geometry against coal, shading, camera, files."""
from __future__ import annotations

import sys

import coal
import numpy as np
import pinocchio as pin
import pytest

import diffgym
from diffgym.render import Camera, Renderer, scene_bounds, write_gif, write_video
from diffgym.resources import asset_path

BALL = """
<mujoco>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1" rgba="0.1 0.8 0.1 1"/>
    <body name="ball" pos="0 0 0.5"><freejoint/>
      <geom name="ball" type="sphere" size="0.2" rgba="0.9 0.1 0.1 1"/></body>
  </worldbody>
</mujoco>
"""

# every analytic primitive, tilted, on free bodies (no two overlap)
PRIMS = """
<mujoco>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1" rgba="0.6 0.6 0.6 1"/>
    <body name="s" pos="-0.9 0 0.3"><freejoint/><geom name="sphere" type="sphere" size="0.15"/></body>
    <body name="b" pos="-0.45 0.1 0.3" quat="0.9 0.3 0.2 0.1"><freejoint/>
      <geom name="box" type="box" size="0.12 0.08 0.15"/></body>
    <body name="c" pos="0 -0.1 0.35" quat="0.8 0.5 0.1 0.3"><freejoint/>
      <geom name="capsule" type="capsule" size="0.07 0.15"/></body>
    <body name="y" pos="0.45 0.05 0.3" quat="0.7 0.1 0.7 0.1"><freejoint/>
      <geom name="cylinder" type="cylinder" size="0.1 0.12"/></body>
    <body name="e" pos="0.9 0 0.3" quat="0.9 0.1 0.1 0.4"><freejoint/>
      <geom name="ellipsoid" type="ellipsoid" size="0.15 0.08 0.11"/></body>
  </worldbody>
</mujoco>
"""


@pytest.fixture(scope="module")
def ball():
    return diffgym.Simulator.from_string(BALL)


@pytest.fixture(scope="module")
def prims():
    return diffgym.Simulator.from_string(PRIMS)


def _signed_distance(sim, q, k, points):
    """coal's signed distance from world points to geom k at configuration q."""
    data = sim.model.createData()
    gdata = pin.GeometryData(sim.geom_model)
    pin.forwardKinematics(sim.model, data, q)
    pin.updateGeometryPlacements(sim.model, data, sim.geom_model, gdata)
    M = gdata.oMg[int(k)]
    tf = coal.Transform3s(np.asarray(M.rotation), np.asarray(M.translation))
    shape, probe = sim.geom_model.geometryObjects[int(k)].geometry, coal.Sphere(1e-12)
    req, res = coal.DistanceRequest(), coal.DistanceResult()
    req.enable_signed_distance = True
    req.gjk_tolerance = req.epa_tolerance = 1e-10
    out = []
    for p in points:
        res.clear()
        out.append(coal.distance(shape, tf, probe, coal.Transform3s(np.eye(3), p), req, res))
    return np.array(out)


def _check_hits_on_surfaces(sim, q, renderer, per_geom=25, seed=0):
    """Every sampled hit point lies on its geom's surface (coal), its normal points out of
    the geom, and the ray is outside every geom on the way there."""
    hits = renderer.cast(q)
    rng = np.random.default_rng(seed)
    seen = np.unique(hits.geom[hits.geom >= 0])
    for k in seen:
        ii, jj = np.nonzero(hits.geom == k)
        pick = rng.choice(len(ii), size=min(per_geom, len(ii)), replace=False)
        P = hits.point[ii[pick], jj[pick]]
        N = hits.normal[ii[pick], jj[pick]]
        # just outside along the normal the distance is the offset, just inside it is negative
        # (tested off the surface: coal's EPA is unreliable for points exactly on a face)
        eps = 1e-6
        d0 = _signed_distance(sim, q, k, P + eps * N)
        np.testing.assert_allclose(d0, eps, atol=1e-7, err_msg=sim.sm.geoms[k].name)
        assert np.all(_signed_distance(sim, q, k, P - 1e-4 * N) < 0), sim.sm.geoms[k].name
        h = 1e-3
        d1 = _signed_distance(sim, q, k, P + h * N)
        # a step along the outward normal of a convex surface moves exactly h away from it
        np.testing.assert_allclose(d1, h, atol=2e-5, err_msg=sim.sm.geoms[k].name)
        # points at 10..90% of the way from the eye are outside every geom
        for frac in (0.1, 0.5, 0.9):
            mid = hits.eye + frac * (P - hits.eye)
            for other in range(len(sim.sm.geoms)):
                assert np.all(_signed_distance(sim, q, other, mid) > -1e-9), \
                    (sim.sm.geoms[k].name, sim.sm.geoms[other].name, frac)
    return seen


# -- frames -------------------------------------------------------------------------------
def test_frame_shape_dtype_and_determinism(ball):
    r = Renderer(ball, width=64, height=48)
    a = r.render(ball.q0)
    assert a.shape == (48, 64, 3) and a.dtype == np.uint8
    assert np.array_equal(a, r.render(ball.q0))
    assert np.array_equal(a, Renderer(ball, width=64, height=48).render(ball.q0.tolist()))
    big = Renderer(ball, width=40, height=30, supersample=2).render(ball.q0)
    assert big.shape == (30, 40, 3) and big.dtype == np.uint8


def test_sphere_colour_at_centre_plane_at_corner(ball):
    r = Renderer(ball, width=80, height=60)
    q = ball.q0.copy()
    img, ids = r.render(q), r.render_ids(q)
    col, row = r.project(np.array([[0.0, 0.0, 0.5]]), q)[0].astype(int)
    assert ids[row, col] == 1
    red = img[row, col].astype(int)
    assert red[0] > 120 and red[0] > 3 * red[1] and red[0] > 3 * red[2], red
    for corner in [(59, 0), (59, 79)]:              # camera looks down: bottom corners see floor
        assert ids[corner] == 0
        g = img[corner].astype(int)
        assert g[1] > 100 and g[1] > 2 * g[0] and g[1] > 2 * g[2], g
    # the projected centre is where the sphere's pixels are
    ii, jj = np.nonzero(ids == 1)
    assert abs(jj.mean() + 0.5 - r.project(np.array([[0.0, 0, 0.5]]), q)[0, 0]) < 1.0


def test_moving_the_sphere_moves_the_blob(ball):
    r = Renderer(ball, width=80, height=60, camera=Camera([0, 0, 0.4], 3.0, 90.0, -20.0, 45.0))
    q = ball.q0.copy()

    def centroid(q):
        ii, jj = np.nonzero(r.render_ids(q) == 1)
        return jj.mean(), ii.mean(), len(ii)

    x0, y0, n0 = centroid(q)
    q[0] += 0.3                                      # +x: to the right (azimuth 90)
    x1, y1, _ = centroid(q)
    assert x1 > x0 + 3 and abs(y1 - y0) < 1.5
    q[0] -= 0.3
    q[2] += 0.3                                      # up: towards the top of the image
    x2, y2, _ = centroid(q)
    assert y2 < y0 - 3 and abs(x2 - x0) < 1.0
    q[2] -= 0.3
    q[1] += 0.8                                      # away from the camera: smaller
    assert centroid(q)[2] < 0.8 * n0


def test_primitives_hit_their_surfaces(prims):
    r = Renderer(prims, width=96, height=72, camera=Camera([0, 0, 0.3], 2.6, 100.0, -30.0, 45.0))
    seen = _check_hits_on_surfaces(prims, prims.q0, r)
    assert set(seen) == set(range(len(prims.sm.geoms))), [prims.sm.geoms[k].name for k in seen]
    # and from below the floor's horizon, looking up at an angle
    r2 = Renderer(prims, width=64, height=48, camera=Camera([0, 0, 0.5], 2.0, 30.0, 5.0, 60.0))
    _check_hits_on_surfaces(prims, prims.q0, r2, per_geom=10)


def test_screen_space_culling_loses_no_pixel(prims):
    """Each geom is only tested in the projected rectangle of its bounding sphere, and each
    shadow ray only against casters whose light-space disk holds it: the image is the same as
    with every ray tested against every geom (bounding radii made huge)."""
    q = prims.q0.copy()
    q[7:10] += [0.1, -0.6, 0.2]                   # the box close to the camera, partly out of view
    cams = [Camera([0, 0, 0.3], 2.6, 100.0, -30.0, 45.0), Camera([0, 0, 0.3], 0.9, 80.0, -15.0, 70.0)]
    for cam, light in zip(cams, [(-0.35, -0.55, 1.0), (0.8, 0.2, 0.3)]):
        culled = Renderer(prims, width=64, height=48, camera=cam, light=light)
        brute = Renderer(prims, width=64, height=48, camera=cam, light=light)
        for g in brute._geoms:
            if g.kind != "plane":
                g.radius = 1e6
        ids = culled.render_ids(q)
        assert np.array_equal(ids, brute.render_ids(q))
        assert np.array_equal(culled.render(q), brute.render(q))
        assert len(np.unique(ids)) >= 3


def _write_blob_obj(path, n=60, seed=3):
    """A convex 'potato' mesh: the hull of n random points on an ellipsoid."""
    from scipy.spatial import ConvexHull

    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, 3))
    v = v / np.linalg.norm(v, axis=1, keepdims=True) * [0.2, 0.12, 0.09]
    hull = ConvexHull(v)
    lines = [f"v {x:.9f} {y:.9f} {z:.9f}" for x, y, z in v]
    for tri in hull.simplices:                      # orientation does not matter for the hull
        lines.append("f " + " ".join(str(i + 1) for i in tri))
    path.write_text("\n".join(lines) + "\n")


MESH_SCENE = """
<mujoco><asset><mesh name="tet" file="tet.obj"/><mesh name="blob" file="blob.obj"/></asset>
  <worldbody><geom name="floor" type="plane" size="1 1 0.1"/>
    <body name="b" pos="0 0 0.2" quat="0.9 0.2 0.3 0.1"><freejoint/>
      <geom name="tet" type="mesh" mesh="tet" rgba="0.2 0.8 0.2 1"/></body>
    <body name="c" pos="0.3 0.35 0.25" quat="0.8 -0.2 0.4 0.3"><freejoint/>
      <geom name="blob" type="mesh" mesh="blob" rgba="0.8 0.5 0.2 1"/></body>
  </worldbody></mujoco>"""


@pytest.fixture
def mesh_sim(tmp_path):
    (tmp_path / "tet.obj").write_text(
        "v 0 0 0\nv 0.3 0 0\nv 0 0.3 0\nv 0 0 0.3\nf 1 3 2\nf 1 2 4\nf 1 4 3\nf 2 3 4\n")
    _write_blob_obj(tmp_path / "blob.obj")
    (tmp_path / "scene.xml").write_text(MESH_SCENE)
    return diffgym.Simulator.from_file(str(tmp_path / "scene.xml"))


def test_mesh_renders_as_its_convex_hull(mesh_sim):
    sim = mesh_sim
    for cam in [Camera([0.15, 0.15, 0.25], 1.4, 60.0, -35.0, 45.0), Camera([0.15, 0.15, 0.25], 1.0, 200.0, -10.0, 60.0)]:
        r = Renderer(sim, width=64, height=48, camera=cam)
        seen = _check_hits_on_surfaces(sim, sim.q0, r)
        assert {1, 2} <= set(seen)


def test_mesh_rasterization_equals_ray_casting(mesh_sim, monkeypatch):
    """Camera rays against a hull by rasterizing its front triangles, and shadow rays by its
    light-space silhouette, give the image of testing every ray against every face."""
    sim = mesh_sim
    cams = [Camera([0.15, 0.15, 0.25], 1.4, 60.0, -35.0, 45.0), Camera([0.15, 0.15, 0.2], 0.7, 120.0, -50.0, 60.0)]
    fast = [Renderer(sim, width=80, height=60, camera=c, light=(0.3, -0.6, 0.8)) for c in cams]
    ids = [r.render_ids(sim.q0) for r in fast]
    imgs = [r.render(sim.q0) for r in fast]
    monkeypatch.setattr(Renderer, "_raster_hull", staticmethod(lambda *a: False))
    monkeypatch.setattr(Renderer, "_hull_shadow", staticmethod(lambda g, R, p, B, a, b, s, ci, dark: ci))
    for r, i0, im0 in zip(fast, ids, imgs):
        assert np.isin([1, 2], i0).all()
        assert np.array_equal(r.render_ids(sim.q0), i0)
        im1 = r.render(sim.q0)
        # the normal of a pixel on a hull edge may come from either face
        assert np.mean(np.any(im1 != im0, axis=-1)) < 0.01


def test_mesh_shadow_rays_are_exact(mesh_sim, monkeypatch):
    """Shadow rays from random points around the hulls: the silhouette shortcut gives the
    answer of the ray-polytope test for every point."""
    sim = mesh_sim
    r = Renderer(sim, width=8, height=6, light=(0.3, -0.6, 0.8))
    poses = r._cast(sim.q0, None).poses
    rng = np.random.default_rng(1)
    O = rng.uniform([-0.4, -0.3, 0.0], [0.8, 0.8, 0.6], size=(40000, 3)).T
    outside = np.ones(O.shape[1], dtype=bool)
    for g in r._geoms:
        if g.hull is not None:
            R, p = poses[g.index]
            outside &= np.max(g.hull.A @ (R.T @ (O - p[:, None])) + g.hull.b[:, None], axis=0) > 1e-6
    O = O[:, outside]
    fast = r._shadowed(O, poses)
    monkeypatch.setattr(Renderer, "_hull_shadow", staticmethod(lambda g, R, p, B, a, b, s, ci, dark: ci))
    brute = r._shadowed(O, poses)
    assert 0.01 < brute.mean() < 0.5
    assert np.array_equal(fast, brute)


def test_shadow_of_a_sphere_is_its_disk(ball):
    """Light straight from above: a floor point is in shadow (lit by ambient and headlight
    only) exactly when it lies within the sphere's radius of the vertical through its centre."""
    cam = Camera([0, 0, 0.3], 2.5, 90.0, -60.0, 45.0)
    q = ball.q0.copy()
    q[:3] = [0.05, -0.03, 1.0]
    kw = dict(width=120, height=90, camera=cam, light=(0, 0, 1), checker=0, fog=0)
    on = Renderer(ball, **kw).render(q)
    off = Renderer(ball, shadows=False, **kw).render(q)
    unlit = Renderer(ball, diffuse=0.0, **kw).render(q)
    hits = Renderer(ball, **kw).cast(q)
    floor = hits.geom == 0
    rho = np.hypot(hits.point[..., 0] - 0.05, hits.point[..., 1] + 0.03)
    inside, outside = floor & (rho < 0.2 - 1e-3), floor & (rho > 0.2 + 1e-3)
    assert inside.sum() > 30                                   # the disk is in view
    assert np.array_equal(on[inside], unlit[inside])
    assert np.array_equal(on[outside], off[outside])
    assert np.all(off[inside].astype(int).sum(-1) > unlit[inside].astype(int).sum(-1) + 60)


def test_no_self_shadowing(prims):
    """Surfaces facing a light with nothing above them are fully lit (no shadow acne)."""
    q = prims.q0
    for cam in [Camera([0, 0, 0.3], 2.6, 100.0, -30.0, 45.0), Camera([0, 0, 0.3], 2.0, 60.0, -70.0, 45.0)]:
        kw = dict(width=96, height=72, camera=cam, light=(0, 0, 1), fog=0)
        hits = Renderer(prims, **kw).cast(q)
        up = (hits.geom > 0) & (hits.normal[..., 2] > 1e-3)
        assert up.sum() > 150
        on, off = Renderer(prims, **kw).render(q), Renderer(prims, shadows=False, **kw).render(q)
        assert np.array_equal(on[up], off[up])
        assert np.any(on[hits.geom == 0] != off[hits.geom == 0])   # the floor does get shadows


def test_render_leaves_the_simulator_alone(ball):
    sim = diffgym.Simulator.from_string(BALL)
    q, v = sim.q0.copy(), np.zeros(sim.model.nv)
    q, v = sim.step(q, v, np.zeros(sim.model.nv))
    before = [np.array(M.translation) for M in sim.data.oMi], [np.array(M.translation) for M in sim.geom_data.oMg]
    q2 = q.copy()
    q2[:3] += [1.0, 2.0, 3.0]
    Renderer(sim, width=32, height=24, track="ball").render(q2)
    after = [np.array(M.translation) for M in sim.data.oMi], [np.array(M.translation) for M in sim.geom_data.oMg]
    for x, y in zip(before[0] + before[1], after[0] + after[1]):
        assert np.array_equal(x, y)


# -- camera -------------------------------------------------------------------------------
def test_camera_auto_frames_the_geoms(prims):
    q = prims.q0
    for aspect, (w, h) in [(4 / 3, (80, 60)), (1.0, (50, 50)), (0.5, (40, 80))]:
        cam = Camera.auto(prims, q, aspect=aspect, margin=1.05)
        r = Renderer(prims, width=w, height=h, camera=cam)
        lo, hi = scene_bounds(prims, q)
        corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
        uv = r.project(corners, q)
        assert np.all((uv[:, 0] >= 0) & (uv[:, 0] <= w) & (uv[:, 1] >= 0) & (uv[:, 1] <= h))
        # tight: some corner is near an edge (within 15% of the image)
        slack = np.minimum.reduce([uv[:, 0], w - uv[:, 0], uv[:, 1], h - uv[:, 1]])
        assert slack.min() < 0.15 * min(w, h)
        ids = r.render_ids(q)
        assert set(np.unique(ids)) >= set(range(1, len(prims.sm.geoms)))


def test_camera_track_follows_a_body():
    sim = diffgym.Simulator.from_file(asset_path("go1.urdf"), ignore_unsupported=("joint.frictionloss",))
    r = Renderer(sim, width=64, height=48, track="trunk")
    q = sim.q0.copy()
    ids0 = r.render_ids(q)
    q[0] += 3.0
    q[1] -= 1.0
    q[2] += 0.2                                      # z is not followed by default
    ids1 = r.render_ids(q)
    robot0, robot1 = ids0 != sim.geom_model.ngeoms - 1, ids1 != sim.geom_model.ngeoms - 1
    rows0, rows1 = np.nonzero(robot0 & (ids0 >= 0))[0], np.nonzero(robot1 & (ids1 >= 0))[0]
    assert rows1.mean() < rows0.mean() - 1          # it moved up in the image ...
    q[2] -= 0.2
    assert np.mean(r.render_ids(q) == ids0) > 0.995  # ... and stayed put in x, y
    static = Renderer(sim, width=64, height=48, camera=r.camera)
    assert not np.any((static.render_ids(q) >= 0) & (static.render_ids(q) != sim.geom_model.ngeoms - 1))
    r_joint = Renderer(sim, width=64, height=48, track="FL_hip_joint", track_axes="xyz")
    assert np.allclose(r_joint.lookat(q) - r_joint.camera.lookat, [3.0, -1.0, 0.0])


# -- shipped assets ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hopper.xml", "go1.urdf", "push.xml", "billiards.xml", "cartpole.xml"])
def test_shipped_assets_render_upright(name):
    sim = diffgym.Simulator.from_file(asset_path(name), ignore_unsupported=("joint.frictionloss",))
    r = Renderer(sim, width=64, height=48)
    q = sim.q0
    img, ids = r.render(q), r.render_ids(q)
    kinds = [g.kind for g in sim.sm.geoms]
    finite = [k for k, kind in enumerate(kinds) if kind != "plane"]
    # the model is in view (the cart-pole's 5 m rail and 3 cm pole fill the least)
    assert np.isin(ids, finite).sum() > 0.015 * ids.size, name
    if "plane" in kinds:
        plane = kinds.index("plane")
        assert np.all(ids[-1] == plane), name                     # floor at the bottom ...
        assert np.mean(ids[0] == plane) < 1.0 or name in ("billiards.xml", "push.xml")
        assert (ids[:8] == -1).sum() > 0 or name in ("billiards.xml", "push.xml")  # sky on top
    # the image is lit: not flat, not saturated
    assert 30 < img.mean() < 230 and img.std() > 10
    assert np.all(np.isfinite(r.render_depth(q)[ids >= 0]))
    # up is up: the highest geom is drawn above the lowest one
    data = sim.model.createData()
    gdata = pin.GeometryData(sim.geom_model)
    pin.forwardKinematics(sim.model, data, q)
    pin.updateGeometryPlacements(sim.model, data, sim.geom_model, gdata)
    z = {k: gdata.oMg[k].translation[2] for k in finite if (ids == k).sum() >= 3}
    if len(z) >= 2:
        top, bottom = max(z, key=z.get), min(z, key=z.get)
        if z[top] - z[bottom] > 0.05:
            assert np.nonzero(ids == top)[0].mean() < np.nonzero(ids == bottom)[0].mean(), name


def test_urdf_gets_a_palette_per_limb():
    sim = diffgym.Simulator.from_file(asset_path("go1.urdf"), ignore_unsupported=("joint.frictionloss",))
    r = Renderer(sim, width=16, height=12)
    names = [g.name for g in sim.sm.geoms]
    col = {n: r._colors[i] for i, n in enumerate(names)}
    assert not np.allclose(col["FL_thigh_0"], col["FR_thigh_0"])
    assert not np.allclose(col["FL_thigh_0"], col["trunk_0"])
    assert np.allclose(col["ground"], sim.sm.geoms[names.index("ground")].rgba[:3])
    grey = Renderer(sim, width=16, height=12, colors="model")
    assert np.allclose(grey._colors[names.index("FL_thigh_0")], sim.sm.geoms[0].rgba[:3])


# -- errors -------------------------------------------------------------------------------
def test_bad_arguments(ball):
    for kw, what in [(dict(width=0), "width"), (dict(height=-3), "height"), (dict(width=2.5), "width"),
                     (dict(supersample=0), "supersample"), (dict(colors="rainbow"), "colors"),
                     (dict(light=(0, 0, 0)), "light"), (dict(checker=-1.0), "checker"),
                     (dict(track_axes="xw"), "track_axes"), (dict(fog=float("nan")), "fog")]:
        with pytest.raises(ValueError, match=what):
            Renderer(ball, **kw)
    with pytest.raises(TypeError, match="camera"):
        Renderer(ball, camera=(0, 0, 0))
    with pytest.raises(ValueError, match="no body, frame or joint named 'nose'"):
        Renderer(ball, track="nose")
    r = Renderer(ball, width=8, height=6)
    with pytest.raises(ValueError, match=r"q must have shape \(7,\)"):
        r.render(np.zeros(6))
    q = ball.q0.copy()
    q[3] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        r.render(q)
    with pytest.raises(ValueError, match="points"):
        r.project(np.zeros(3), ball.q0)
    for kw, what in [(dict(distance=0.0), "distance"), (dict(fovy=180.0), "fovy"),
                     (dict(elevation=95.0), "elevation"), (dict(lookat=[0, 0]), "lookat"),
                     (dict(azimuth=float("inf")), "azimuth")]:
        with pytest.raises(ValueError, match=what):
            Camera(**{"lookat": np.zeros(3), **kw})
    with pytest.raises(ValueError, match="aspect"):
        Camera.auto(ball, aspect=0.0)


def test_unknown_geom_type_is_named():
    sim = diffgym.Simulator.from_string(BALL)
    sim.sm.geoms[1].kind = "heightfield"
    with pytest.raises(ValueError, match="geom 'ball': cannot render geom type 'heightfield'"):
        Renderer(sim)


# -- files --------------------------------------------------------------------------------
def test_write_gif_round_trip(ball, tmp_path):
    Image = pytest.importorskip("PIL.Image")
    r = Renderer(ball, width=32, height=24)
    frames = []
    q = ball.q0.copy()
    for k in range(3):
        q[0] = 0.2 * k
        frames.append(r.render(q))
    path = tmp_path / "roll.gif"
    write_gif(frames, path, fps=20)
    with Image.open(path) as im:
        assert im.size == (32, 24) and im.n_frames == 3
        assert im.info["duration"] == 50
        im.seek(2)
        last = np.asarray(im.convert("RGB"), dtype=int)
    assert np.abs(last - frames[2].astype(int)).mean() < 8     # palette quantization only
    with pytest.raises(ValueError, match="empty"):
        write_gif([], path)
    with pytest.raises(ValueError, match="frame 1"):
        write_gif([frames[0], frames[1][:, :10]], path)
    with pytest.raises(ValueError, match="uint8"):
        write_gif([frames[0].astype(float)], path)
    with pytest.raises(ValueError, match="fps"):
        write_gif(frames, path, fps=0)
    with pytest.warns(UserWarning, match="cannot play"):
        write_gif(frames, tmp_path / "fast.gif", fps=100)


def test_missing_writers_say_what_to_install(ball, tmp_path, monkeypatch):
    frames = [Renderer(ball, width=8, height=6).render(ball.q0)]
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r"pip install diffgym\[render\]"):
        write_gif(frames, tmp_path / "a.gif")
    monkeypatch.setitem(sys.modules, "imageio", None)
    monkeypatch.setitem(sys.modules, "imageio.v3", None)
    with pytest.raises(ImportError, match=r"pip install diffgym\[render\]"):
        write_video(frames, tmp_path / "a.mp4")


def test_write_video_mp4(ball, tmp_path):
    pytest.importorskip("imageio.v3")
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    import subprocess

    r = Renderer(ball, width=33, height=25)          # odd sizes are padded to even
    q = ball.q0.copy()
    frames = []
    for k in range(4):
        q[0] = 0.1 * k
        frames.append(r.render(q))
    path = tmp_path / "roll.mp4"
    write_video(frames, path, fps=10)
    # decode with the ffmpeg binary itself (imageio's reader leaks its pipes)
    raw = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-loglevel", "error", "-i", str(path),
                          "-f", "rawvideo", "-pix_fmt", "rgb24", "-"], capture_output=True, check=True).stdout
    back = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 26, 34, 3)
    assert back.shape[0] == 4
    for k in (0, 3):                                  # lossy codec: close, and in order
        err = np.abs(back[k, :25, :33].astype(int) - frames[k].astype(int)).mean()
        other = np.abs(back[k, :25, :33].astype(int) - frames[3 - k].astype(int)).mean()
        assert err < 12 and err < 0.5 * other, (k, err, other)


def test_markers_are_drawn_not_simulated(ball):
    r = Renderer(ball, width=80, height=60, camera=Camera([0, 0, 0.4], 3.0, 90.0, -20.0, 45.0))
    q = ball.q0
    target = np.array([0.6, 0.0, 0.3])
    ids = r.render_ids(q, markers=[(target, 0.1, (0.1, 0.2, 0.9))])
    col, row = r.project(target[None], q)[0].astype(int)
    assert ids[row, col] == 2                         # numbered after the model's geoms
    img = r.render(q, markers=[(target, 0.1, (0.1, 0.2, 0.9))]).astype(int)
    assert img[row, col, 2] > 2 * img[row, col, 0]
    assert r.render_ids(q)[row, col] == 0             # without it: the floor behind
    _check = r.cast(q, markers=[(target, 0.1, (0.1, 0.2, 0.9))])
    P = _check.point[_check.geom == 2]
    np.testing.assert_allclose(np.linalg.norm(P - target, axis=1), 0.1, atol=1e-9)
    # the ball is drawn the same with and without the marker (markers cast no shadow)
    plain = r.render(q).astype(int)
    ball_px = r.render_ids(q) == 1
    assert np.array_equal(img[ball_px], plain[ball_px])
    for bad, what in [([(target, -1.0, (1, 0, 0))], "radius"), ([(target[:2], 0.1, (1, 0, 0))], "position"),
                      ([(target, 0.1, (2, 0, 0))], "rgb"), ([target], r"markers\[0\]")]:
        with pytest.raises(ValueError, match=what):
            r.render(q, markers=bad)
