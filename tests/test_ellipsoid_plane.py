"""An ellipsoid dropped on a floor (issue 16: 55% of the random ellipsoid drops penetrated more
than 1 cm, 11% fell through). Its contact with a plane is the exact support point along -n plus
speculative support points of fixed directions tilted by up to 1 rad (plane_contacts), so a
flat or long ellipsoid that pivots by a radian in one step does not swing through the floor.
Random drops of the drop benchmark (random size, pose, velocity and spin, 10-100 Hz) and a
fast-spinning flat ellipsoid: every step converged, penetration below 1 cm (1 mm at >= 30 Hz),
never below the floor, no energy gain (``bench_drops.run_scene``'s categories, an oracle
independent of the collision code: the lowest point in closed form). The Jacobians of
ellipsoid-on-plane rows are checked against central differences in test_pair_derivatives."""
import numpy as np
import pytest

from diffgym import bench_drops

# drops that failed before (seed 0: 10 Hz through the floor, 30 and 50 Hz > 1 mm) and one per rate
DROPS = [4, 64, 76, 52, 10, 40]


def _check(scene):
    r = bench_drops.run_scene(scene)
    assert not r.fails, (scene.rate, sorted(r.fails), r.max_pen, r.max_gain, r.error)
    assert r.nonconv_steps == 0
    return r


@pytest.mark.parametrize("index", DROPS)
def test_random_ellipsoid_drop(index):
    scene = bench_drops.make_scene(0, index)
    assert scene.kinds == ["ellipsoid"]
    r = _check(scene)
    print(index, scene.rate, f"deepest {r.max_pen:.1e} m")


def test_rolling_ellipsoid_at_100hz():
    """Known gap, bounded: a flat ellipsoid (20:20:5.6 cm) rolling on its rim at 4-13 rad/s
    at 100 Hz sinks 1.2 mm below the floor (the 1 mm target): the step linearizes the support
    point's height, and the second-order dip of a rolling non-spherical body (its centre
    height changes with the orientation) is only pushed out by the Baumgarte term, 20% a step.
    Everything else holds; the depth stays below 2 mm."""
    scene = bench_drops.make_scene(0, 28)
    r = bench_drops.run_scene(scene)
    assert r.fails <= {"pen"} and r.nonconv_steps == 0, (sorted(r.fails), r.error)
    assert r.max_pen < 2e-3, r.max_pen


def test_box_on_ellipsoid_converges():
    """A box falling on an ellipsoid on the floor at 10 Hz (drop 65 of seed 0): with every
    surface sample as a speculative row (65) the solver did not converge on one step
    (residual 3e-2); with the samples that can be lowest after a step it does."""
    r = _check(bench_drops.make_scene(0, 65))
    print(f"deepest {r.max_pen:.1e} m, at most {r.max_iterations} iterations")


@pytest.mark.parametrize("rate", [10, 30])
def test_spinning_flat_ellipsoid(rate):
    """A flat ellipsoid (a coin, 30:30:3) tumbling at 15 rad/s about a horizontal axis, dropped
    tilted: it turns by up to 1.5 rad per step at 10 Hz."""
    c, s = np.cos(0.3), np.sin(0.3)
    scene = bench_drops.Scene(0, "ellipsoid", rate, ["ellipsoid"], [np.array([0.15, 0.15, 0.015])],
                              [np.array([0.0, 0.0, 0.3])], [np.array([c, s, 0.0, 0.0])],
                              [np.array([0.3, 0.0, -0.5])], [np.array([15.0, 2.0, 1.0])])
    r = _check(scene)
    print(rate, f"deepest {r.max_pen:.1e} m")
