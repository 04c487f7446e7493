"""Runs of the drop benchmark (diffgym.bench_drops, seed 0) that failed on a cause fixed in the
core, replayed as they are (1.5 s of simulated time each, a few hundred steps)."""
import pytest

from diffgym.bench_drops import make_scene, run_scene


def _run(index):
    r = run_scene(make_scene(0, index))
    return r, (sorted(r.fails), r.max_pen, r.max_gain, r.max_residual, r.error)


@pytest.mark.parametrize("index", [240, 216])
def test_tumbling_box_keeps_the_corners_that_swing_down(index):
    """#240 (a long box, 10 Hz) and #216 (20 Hz) land tumbling: within one step the box turns by
    a radian or more, so the corners that swing into the floor are not the 4 deepest at the
    step's start. Cut to those 4 (max_contact_points), #240 went 22 cm into the floor (its centre
    below it) and #216 23 mm; box-plane pairs now also keep every corner the body's motion can
    bring to the plane within the step (collision_kernels.plane_points' ``reach``)."""
    r, info = _run(index)
    assert not r.fails and r.max_pen < 1e-2, info


@pytest.mark.parametrize("index", [71, 137])
def test_inconsistent_normal_rows_break_a_contact(index):
    """#71 (box + cylinder, 20 Hz) and #137 (sphere + box, 30 Hz): a box resting on four corners
    whose drift offsets straddle the skin's kink (two corners within the skin, two beyond it,
    and a nanometre of second tilt) asks for normal velocities no rigid motion gives (3.6e-8
    m/s apart). The active set's Newton stalled at the least-squares point, every contact
    sticking, spent its budget switching friction modes, and the slow stages ended the step
    unconverged (ADMM, 5,508 iterations). A loaded contact left separating at that point now
    breaks first (solver_kernels._separating_row): the other three carry its load."""
    r, info = _run(index)
    assert r.nonconv_steps == 0 and not r.fails, info


def test_bench_runs_chosen_ids_and_lists_every_failure(capsys):
    """``python -m diffgym.bench_drops --ids ... --list-all``: only those runs, every failing
    one listed (the default report lists the first 15)."""
    import argparse

    from diffgym import bench_drops
    args = bench_drops.add_arguments(argparse.ArgumentParser()).parse_args(
        ["--ids", "2213", "1", "--list-all"])
    assert bench_drops.main(args) == 0
    out = capsys.readouterr().out
    assert "2 runs," in out and "failing runs:" in out
    results, _ = bench_drops.run(0, ids=[2213, 1])
    assert [r.scene.index for r in results] == [2213, 1]
    bad = [r for r in results if r.fails]
    assert all(f"#{r.scene.index} " in out for r in bad)
    with pytest.raises(SystemExit):
        bench_drops.main(bench_drops.add_arguments(argparse.ArgumentParser()).parse_args(
            ["--ids", "-1"]))


@pytest.mark.parametrize("index", [119, 575, 971, 2897])
def test_corners_over_a_box_face_get_rows(index):
    """#119 (box + box, 100 Hz): the upper box touches the lower one edge on edge (one contact
    point, 0.9 mm apart) while a corner of its edge hangs 2 mm over the lower box's face;
    within the step it turned about the contact and that corner went 10 mm into the face (19
    mm at worst). #575 (box + box, 10 Hz, 13 mm), #971 (capsule + box, 20 Hz, 34 mm) and
    #2897 (box + box, 30 Hz, 6.3 mm) the same with a corner or a capsule's end. The box
    corners and capsule ends within the pair's margin over a face of a box (and the points
    where an edge from one leaves the face) of a pair touching at one or two points now have
    rows on the contact's normal and mid plane (collision_kernels.poly_margin_rows)."""
    r, info = _run(index)
    assert not r.fails, info
