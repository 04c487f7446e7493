"""Smoke run of the benchmark (a few steps per model) and its MuJoCo side set-up."""
import argparse
import csv

import numpy as np
import pytest

from diffgym import bench


def _args(**kw):
    ns = argparse.Namespace(steps=3, models=None, warmup=1, repeats=1, csv=None)
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def test_bench_table_and_csv(tmp_path, capsys):
    out = tmp_path / "bench.csv"
    assert bench.main(_args(csv=str(out))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["model", "nq/nv", "contacts"]
    body = {l.split()[0]: l for l in lines[1:1 + len(bench.MODELS)]}
    assert set(body) == set(bench.MODELS)
    with open(out, newline="") as fh:
        rows = {r["model"]: r for r in csv.DictReader(fh)}
    assert set(rows) == set(bench.MODELS)
    assert rows["go1"]["nq"] == "19" and rows["go1"]["nv"] == "18"
    assert rows["billiards"]["nq"] == "112"
    for r in rows.values():
        assert float(r["diffgym_us_per_step"]) > 0
    mujoco = bench._import_mujoco()
    if mujoco is not None:
        # the Go1 URDF needs MjSpec (MuJoCo >= 3.2) to be built; otherwise its row says why not
        names = ("cartpole", "hopper", "billiards") + (("go1",) if hasattr(mujoco, "MjSpec") else ())
        for name in names:
            assert float(rows[name]["mujoco_us_per_step"]) > 0, rows[name]
            assert float(rows[name]["ratio"]) > 0
        if "go1" not in names:
            assert "MuJoCo n/a" in rows["go1"]["note"]
        assert any("hopper target" in l for l in lines)


def test_bench_without_mujoco(monkeypatch, capsys):
    monkeypatch.setattr(bench, "_import_mujoco", lambda: None)
    assert bench.main(_args(models=["cartpole"])) == 0
    out = capsys.readouterr().out
    row = out.splitlines()[1]
    assert row.startswith("cartpole") and "n/a" in row
    assert "mujoco not installed" in out


def test_bench_rejects_bad_arguments():
    with pytest.raises(SystemExit, match="teapot"):
        bench.main(_args(models=["teapot"]))
    with pytest.raises(SystemExit, match="steps"):
        bench.main(_args(steps=0))


def test_go1_scenario_matches_mujoco_state():
    """The Go1 starts standing 2 mm above the ground; MuJoCo gets the same pose and PD."""
    from diffgym.resources import asset_path
    sc = bench.scenario("go1", asset_path("go1.urdf"))
    assert abs(bench._lowest_point(sc.sim, sc.q0) - bench.GO1_CLEARANCE) < 1e-9
    mujoco = pytest.importorskip("mujoco")
    if not hasattr(mujoco, "MjSpec"):
        pytest.skip("MuJoCo without MjSpec")
    m, note = bench._mujoco_urdf(mujoco, sc)
    assert m.nq == sc.sim.nq and m.nv == sc.sim.nv and m.nu == sc.sim.nv - 6
    qpos, qvel, ctrl = bench.mujoco_state(mujoco, m, sc)
    model = sc.sim.model
    assert np.allclose(qpos[:3], sc.q0[:3]) and np.allclose(qpos[3:7], [sc.q0[6], *sc.q0[3:6]])
    for j in range(2, model.njoints):
        jid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, model.names[j])
        assert qpos[m.jnt_qposadr[jid]] == pytest.approx(sc.q0[model.joints[j].idx_q])
    assert np.allclose(np.sort(ctrl), np.sort(sc.q_ref))
