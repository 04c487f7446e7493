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
    # the Go1 twice: joint friction left out in both engines (go1-nofric) and in both (go1)
    names = set(bench.MODELS) | {"go1-nofric"}
    body = {l.split()[0]: l for l in lines[1:1 + len(names)]}
    assert set(body) == names
    with open(out, newline="") as fh:
        rows = {r["model"]: r for r in csv.DictReader(fh)}
    assert set(rows) == names
    assert rows["go1"]["nq"] == "19" and rows["go1"]["nv"] == "18"
    assert "left out in both" in rows["go1-nofric"]["note"]
    assert "0.2 N m in both" in rows["go1"]["note"]
    assert rows["billiards"]["nq"] == "112"
    for r in rows.values():
        assert float(r["diffgym_us_per_step"]) > 0
    mujoco = bench._import_mujoco()
    if mujoco is not None:
        # the Go1 URDF needs MjSpec (MuJoCo >= 3.2) to be built; otherwise its row says why not
        names = ("cartpole", "hopper", "billiards") + (("go1", "go1-nofric") if hasattr(mujoco, "MjSpec") else ())
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


def test_go1_scenario_with_and_without_joint_friction():
    """bench's Go1 rows: the URDF's 0.2 N m joint friction simulated by both engines (``go1``:
    12 diffgym friction rows, MuJoCo's importer reads it into dof_frictionloss) or by neither."""
    from diffgym.resources import asset_path
    on = bench.scenario("go1", asset_path("go1.urdf"))
    off = bench.scenario("go1", asset_path("go1.urdf"), friction=False)
    assert on.friction and not off.friction
    assert set(on.sim.sm.constraint_spec.frictionloss.values()) == {0.2}
    spec = getattr(off.sim.sm, "constraint_spec", None)
    assert spec is None or not spec.frictionloss
    mujoco = bench._import_mujoco()
    if mujoco is None or not hasattr(mujoco, "MjSpec"):
        return
    m, _ = bench.mujoco_model(mujoco, on)
    assert np.allclose(m.dof_frictionloss[6:], 0.2)


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


def test_bench_jacobian_table(tmp_path, capsys):
    """The Jacobian table: our forward step, step with Jacobian, our central differences and
    MuJoCo's mj_step / mjd_transitionFD, for the four models, and its CSV."""
    out = tmp_path / "bench.csv"
    args = _args(models=["cartpole", "ur5"], csv=str(out), jacobian=True, jac_states=3, jac_warmup=2,
                 fd_states=1)
    assert bench.main(args) == 0
    text = capsys.readouterr().out
    assert "Step Jacobians" in text and "jac/fwd target" in text
    with open(tmp_path / "bench_jacobian.csv", newline="") as fh:
        rows = {r["model"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"cartpole", "ur5"}
    assert rows["ur5"]["nv"] == "6"                  # fixed base: six arm joints
    for r in rows.values():
        for key in ("forward_us", "jacobian_us", "diffgym_fd_us"):
            assert float(r[key]) > 0, (key, r)
    if bench._import_mujoco() is not None:
        for r in rows.values():
            assert float(r["mjd_transitionFD_us"]) > 0 and float(r["mj_step_us"]) > 0, r
        assert rows["ur5"]["mujoco_nu"] == "6"


def test_bench_fd_jacobian_matches_analytic():
    """The finite-difference Jacobian the benchmark times is the step Jacobian."""
    from diffgym.resources import asset_path
    sc = bench.scenario("ur5", asset_path("ur5.urdf"))
    q, v = sc.q0, np.array([0.1, -0.2, 0.3, 0.0, 0.2, -0.1])
    tau = sc.control(q, v)
    _, _, jac = sc.sim.step(q, v, tau, jacobian=True)
    fd = bench.fd_step_jacobian(sc.sim, q, v, tau)
    exact = np.hstack([jac.state, jac.control])
    assert np.abs(fd - exact).max() <= 1e-5 * np.abs(exact).max()


def test_ur5_scenario_matches_mujoco():
    """The UR5 is fixed-base with gravity compensation in both engines: held at its pose with
    zero PD error, neither moves."""
    mujoco = pytest.importorskip("mujoco")
    if not hasattr(mujoco, "MjSpec"):
        pytest.skip("MuJoCo without MjSpec")
    from diffgym.resources import asset_path
    sc = bench.scenario("ur5", asset_path("ur5.urdf"))
    sc.q0 = sc.q_ref.copy()
    m, note = bench.mujoco_model(mujoco, sc)
    assert "fixed base" in note and m.nq == m.nv == m.nu == 6
    qpos, qvel, ctrl = bench.mujoco_state(mujoco, m, sc)
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:], d.ctrl[:] = qpos, qvel, ctrl
    for _ in range(50):
        mujoco.mj_step(m, d)
    q, v = sc.q0, np.zeros(6)
    for _ in range(50):
        q, v = sc.sim.step(q, v, sc.control(q, v))
    assert np.abs(d.qpos - qpos).max() < 1e-6 and np.abs(q - sc.q_ref).max() < 1e-6


def test_scaling_table_smoke(capsys):
    """``diffgym bench --scaling`` on the smallest N: both scenes load in both engines, the rows
    are timed and the memory at load measured (a child process)."""
    from diffgym import bench_scaling as bs
    args = _args(scaling=True, max_n=4, scenes=None, load_ns=[], scaling_budget=0.05,
                 jacobian=True)
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    rows = [l.split() for l in out.splitlines() if l.split()[:2] in (["balls", "4"], ["boxes", "4"])]
    assert len(rows) == 4                  # (printed as measured, then in the table)
    for r in rows:
        assert r[2] == "24" and float(r[6]) > 0 and r[-1] != "n/a"      # nv, fwd us, load MB
    assert "forward grows like" in out
    if bench._import_mujoco() is not None:
        assert all(float(r[7]) > 0 for r in rows)                        # mj_step us
    assert bs.growth([4, 16, 64], [1.0, 4.0, 16.0]) == pytest.approx(1.0)


def test_bench_envs_table_with_workers_and_third_party(capsys):
    """``python -m diffgym.bench_envs`` on the smallest case: make_vec with 1 and 2 workers,
    Gymnasium's AsyncVectorEnv and SB3's SubprocVecEnv rows, CPU time per step of each."""
    import argparse

    from diffgym import bench_envs
    args = bench_envs.add_arguments(argparse.ArgumentParser()).parse_args(
        ["--envs", "DiffCartPole-v0", "--num-envs", "2", "--workers", "1", "2", "--env-steps", "4",
         "--blocks", "1", "--no-mujoco"])
    assert bench_envs.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    ours = [l.split() for l in lines if l.startswith("DiffCartPole-v0")]
    assert [r[2] for r in ours] == ["1", "2"]                # worker counts
    for r in ours:
        assert float(r[3]) > 0 and float(r[4]) > 0 and float(r[7]) > 0     # steps/s, +jac, CPU us
    third = {l.split()[1]: l.split() for l in lines if l.startswith("  ")}
    assert set(third) == {"Async", "Subproc"}
    for r in third.values():
        assert r[3] == "2" and float(r[4]) > 0 and float(r[8]) > 0          # one process a copy


def test_scaling_blocks_time_cpu_and_pin_blas(capsys):
    """The scaling table's blocks time CPU, not wall time (a call that sleeps 5 ms costs ~0 CPU),
    and run at least ``min_time`` CPU seconds; ``--blas-threads`` pins every loaded OpenBLAS for
    the table, prints the count it ran with and restores the previous counts afterwards."""
    import time

    from diffgym import bench_scaling as bs
    restore = bs.limit_blas_threads(1)     # (idle OpenBLAS workers spin, counted as our CPU)
    try:
        time.sleep(0.2)
        t, k = bs._block(lambda: time.sleep(0.005), 3, budget=5.0, min_time=0.0)
    finally:
        restore()
    assert k == 3 and t < 0.0025
    spin = [0]

    def work():
        for _ in range(2000):
            spin[0] += 1
    t, k = bs._block(work, 1, budget=5.0, min_time=0.01)
    assert k > 1 and t * k >= 0.01
    before = bs.blas_threads()
    restore = bs.limit_blas_threads(1)
    assert all(v == 1 for v in bs.blas_threads().values())
    restore()
    assert bs.blas_threads() == before
    args = _args(scaling=True, max_n=4, scenes=["balls"], load_ns=[], scaling_budget=0.05,
                 jacobian=False, blas_threads=1)
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert bs.blas_threads() == before
    if before:
        assert "BLAS threads 1 (" in out
