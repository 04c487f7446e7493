"""Smoke runs of the command line: the benchmark table and the demo."""
import subprocess
import sys

import numpy as np
import pytest

import diffgym
from diffgym.resources import asset_path


def run(*args):
    return subprocess.run([sys.executable, "-m", "diffgym", *args], capture_output=True, text=True, timeout=300)


def test_bench_prints_a_table():
    out = run("bench", "--steps", "5", "--models", "cartpole", "hopper")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["model", "nq/nv", "contacts"]
    assert any(l.startswith("hopper") for l in lines) and any(l.startswith("cartpole") for l in lines)


def test_bench_rejects_unknown_model():
    out = run("bench", "--models", "teapot")
    assert out.returncode != 0 and "teapot" in out.stderr


def test_demo_runs():
    out = run("demo", "--seconds", "0.2")
    assert out.returncode == 0, out.stderr
    assert "sliding box" in out.stdout and "go1 step Jacobian" in out.stdout


def test_shipped_assets_load_and_billiards_rack_is_stable():
    sim = diffgym.Simulator.from_file(asset_path("billiards.xml"))
    assert sim.nq == 16 * 7
    q, v = sim.q0, np.zeros(sim.nv)
    v[0] = 2.0
    for _ in range(150):
        q, v = sim.step(q, v, np.zeros(sim.nv))
        assert sim.last.converged
    assert np.all(q[2::7] > 0.0286 - 1e-3)     # every ball still on the table
    cart = diffgym.Simulator.from_file(asset_path("cartpole.xml"))
    assert len(cart.sm.limits) == 2 and len(cart.sm.pairs) == 0


def test_record_writes_a_gif_and_an_mp4_of_a_rollout(tmp_path, capsys):
    from PIL import Image

    from diffgym.cli import main
    gif = tmp_path / "push.gif"
    assert main(["record", "DiffPush-v0", str(gif), "--steps", "12", "--seed", "3"]) == 0
    assert "12 steps" in capsys.readouterr().out
    with Image.open(gif) as im:
        assert im.size == (320, 240) and im.n_frames == 13          # the reset frame + 12 (25 fps)
        im.seek(12)
        assert np.asarray(im.convert("RGB")).std() > 1.0            # a picture, not a blank frame
    mp4 = tmp_path / "hopper.mp4"
    assert main(["record", "DiffHopper-v0", str(mp4), "--steps", "10", "--actions", "zero",
                 "--width", "160", "--height", "120"]) == 0
    assert mp4.stat().st_size > 1000
    assert main(["record", "DiffHopper-v0", str(tmp_path / "x.txt")]) == 2
    assert "write a .gif or a video" in capsys.readouterr().err


def test_record_usage_errors_and_run_failures_are_told_apart(tmp_path, capsys, monkeypatch):
    """`diffgym record`: a bad argument or an unknown id is a usage error (rc 2, one line naming
    it, before any simulation); a ValueError raised by the rollout itself is not mistaken for
    one (it propagates with its traceback)."""
    import diffgym.record as R
    from diffgym.cli import main
    gif = str(tmp_path / "a.gif")
    for argv, what in ((["--steps", "0"], "steps must be >= 1, got 0"),
                       (["--width", "0"], "width must be >= 1 pixel, got 0"),
                       (["--max-fps", "-1"], "max_fps must be > 0, got -1.0")):
        assert main(["record", "DiffHopper-v0", gif, *argv]) == 2
        assert what in capsys.readouterr().err
    assert main(["record", "DiffNoSuchEnv-v0", gif, "--steps", "1"]) == 2
    assert "DiffNoSuchEnv" in capsys.readouterr().err

    def broken(*a, **k):
        raise ValueError("a failure inside the rollout")
    monkeypatch.setattr(R, "record", broken)
    with pytest.raises(ValueError, match="inside the rollout"):
        main(["record", "DiffHopper-v0", gif, "--steps", "1"])
