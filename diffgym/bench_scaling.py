"""``diffgym bench --scaling``: how the step grows with the number of bodies, next to MuJoCo.

Two families of scenes, written as MJCF (both engines load the same text):

* ``balls``: a rack of N balls (radius 5 cm, 0.2 kg, free joints) on a plane, in a square grid
  whose neighbours touch (centres exactly one diameter apart), at rest: every ball rests on the
  plane and touches up to four neighbours, so the whole rack is one island of contact.
* ``boxes``: N boxes (10 cm cubes, 0.5 kg) stacked in columns of four resting face on face, the
  columns side by side on a grid 2 cm apart (N = 4: one column): N / 4 islands of four
  face-face contacts each.

Per scene and N: our forward step (``sim.step``) and MuJoCo's ``mj_step``, alternating engines
block by block (each engine continues its own trajectory from the same initial state), then
our step with ``jacobian=True`` against MuJoCo's centered ``mjd_transitionFD`` (eps 1e-6) at
states of each engine's own trajectory, again block by block. Times are CPU time
(``time.process_time``) per step, medians over blocks of at least 20 ms of our CPU each and as
many steps of MuJoCo's (``_block`` says why not wall time), after one untimed Jacobian step per
engine (kernels loading). The BLAS is pinned to one thread for the run (``--blas-threads``;
MuJoCo is single-threaded, and two OpenBLAS threads on the shared 2-core machine made the
16-ball rack's forward step 13-38 ms of CPU instead of 1.4-1.5 ms); the threads it ran with are
printed.
``growth`` is the least-squares slope of log(time) against log(N) over the N measured.
``load MB``: peak resident memory of a fresh process that imports diffgym, loads the scene and
takes one step, minus the same process's peak after the imports (so the bytes the scene costs);
the process's address space is capped, and a scene that cannot load under the cap is reported
and not timed. ``islands``: mean independent problems per step (``sim.last.islands``).

The memory table (``--load-ns``, default N = 16, 64, 256, 1000, each scene): per N a fresh
capped process loads the scene (``load MB``: peak RSS above the imports after the load) and
takes one step from rest (``peak MB``: after the step; ``load s``, ``step1 s``: their times,
the first step including the load of cached compiled kernels), and the growth exponents of both
memories over N (the issue's target: a 1,000-body scene in under 2 GB, memory about linear).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from .sim.blas import blas_threads, limit_blas_threads

NS = (4, 16, 64, 256)
LOAD_NS = (16, 64, 256, 1000)
FD_EPS = 1e-6
TARGET_GROWTH = 1.3
TARGET_AT_64 = {"balls": 10.0, "boxes": 20.0}
LOAD_TARGET_MB = 2000.0


# -- scenes ----------------------------------------------------------------------------------
def balls_mjcf(n: int, dt: float = 0.005) -> str:
    """A square-grid rack of n touching balls at rest on a plane (module docstring)."""
    r = 0.05
    side = max(1, math.ceil(math.sqrt(n)))
    bodies = []
    for i in range(n):
        x, y = (i % side) * 2 * r, (i // side) * 2 * r
        bodies.append(f'<body name="b{i}" pos="{x:.6f} {y:.6f} {r:.6f}"><freejoint/>'
                      f'<geom name="g{i}" type="sphere" size="{r}" mass="0.2"/></body>')
    return (f'<mujoco model="rack{n}"><option timestep="{dt}" gravity="0 0 -9.81"/>'
            '<default><geom friction="0.5"/></default><worldbody>'
            '<geom name="floor" type="plane" size="0 0 1"/>' + "".join(bodies)
            + "</worldbody></mujoco>")


def boxes_mjcf(n: int, dt: float = 0.005, height: int = 4, gap: float = 0.02) -> str:
    """n boxes in columns of ``height`` resting face on face, columns ``gap`` apart."""
    h = 0.05
    cols = max(1, math.ceil(n / height))
    side = max(1, math.ceil(math.sqrt(cols)))
    pitch = 2 * h + gap
    bodies = []
    for i in range(n):
        c, k = divmod(i, height)
        x, y = (c % side) * pitch, (c // side) * pitch
        bodies.append(f'<body name="b{i}" pos="{x:.6f} {y:.6f} {h + 2 * h * k:.6f}"><freejoint/>'
                      f'<geom name="g{i}" type="box" size="{h} {h} {h}" mass="0.5"/></body>')
    return (f'<mujoco model="pile{n}"><option timestep="{dt}" gravity="0 0 -9.81"/>'
            '<default><geom friction="0.5"/></default><worldbody>'
            '<geom name="floor" type="plane" size="0 0 1"/>' + "".join(bodies)
            + "</worldbody></mujoco>")


SCENES = {"balls": balls_mjcf, "boxes": boxes_mjcf}


def mujoco_state_of(mujoco, m, sim, q):
    """MuJoCo qpos of our q for scenes of MJCF free joints only (translation + ball each)."""
    qpos = m.qpos0.copy()
    model = sim.model
    b = 0
    for j in range(1, model.njoints, 2):
        jt, jr = model.joints[j], model.joints[j + 1]
        qa = int(m.jnt_qposadr[b])
        qpos[qa:qa + 3] = q[jt.idx_q:jt.idx_q + 3]
        x, y, z, w = q[jr.idx_q:jr.idx_q + 4]
        qpos[qa + 3:qa + 7] = [w, x, y, z]
        b += 1
    return qpos


# -- timing ----------------------------------------------------------------------------------
@dataclass
class ScaleRow:
    scene: str
    n: int
    nv: int = 0
    contacts: float = float("nan")
    contacts_mj: float = float("nan")
    islands: float = float("nan")
    t_fwd: float = float("nan")
    t_mj: float = float("nan")
    t_jac: float = float("nan")
    t_mjd: float = float("nan")
    nonconverged: int = 0
    steps: int = 0
    load_mb: float = float("nan")
    notes: list[str] = field(default_factory=list)

    @property
    def fwd_ratio(self) -> float:
        return self.t_fwd / self.t_mj if self.t_mj > 0 else float("nan")

    @property
    def jac_ratio(self) -> float:
        return self.t_jac / self.t_mjd if self.t_mjd > 0 else float("nan")


MIN_BLOCK_S = 0.02      # CPU seconds a timed block lasts at least (several scheduler slices)


def _block(fn, count: int, budget: float, min_time: float = MIN_BLOCK_S) -> tuple[float, int]:
    """CPU seconds (``time.process_time``) per call of fn over at least ``count`` calls and
    ``min_time`` CPU seconds; stops after ``budget`` wall seconds (>= 1 call).

    CPU time, not wall time: on a shared machine a block of a few milliseconds (5 Jacobian
    steps of a 4-ball rack: ~1.6 ms) that the scheduler preempts shows the other process's
    time slice (~4 ms) in its wall time, and as the engines' blocks alternate with a period
    close to the slice, the waits lock onto one engine's blocks: in a loaded run, all three
    Jacobian blocks of the 4-ball rack took 1.16-1.27 ms a step in wall time and 0.36-0.47 ms
    in CPU time (another run: all of MuJoCo's FD blocks took 1.19-1.22 ms wall, 0.39-0.42
    ms CPU). The ``min_time`` (on our blocks; MuJoCo's then take as many steps) spreads a
    block over several slices, so what remains of such interference (caches, a sibling
    hyperthread) falls on both engines alike. (With the BLAS pinned to one thread, the
    table's default, our CPU time is that of one thread, as MuJoCo's.)"""
    t0 = time.perf_counter()
    c0 = time.process_time()
    k = 0
    while True:
        fn()
        k += 1
        if time.perf_counter() - t0 > budget:
            break
        if k >= count and time.process_time() - c0 >= min_time:
            break
    return (time.process_time() - c0) / k, k


# -- BLAS threads (diffgym.sim.blas) ---------------------------------------------------------
def _blas_text(counts: dict) -> str:
    if not counts:
        return "BLAS threads: unknown (no OpenBLAS found, threadpoolctl not installed)"
    vals = sorted(set(counts.values()))
    return "BLAS threads " + ("/".join(map(str, vals)) if len(vals) > 1 else str(vals[0])) + (
        " (" + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ")")


def run_scene(scene: str, n: int, blocks: int = 3, steps: int = 50, jac_states: int = 5,
              warmup: int = 10, budget: float = 2.0, jacobian: bool = True) -> ScaleRow:
    from .sim.forward import Simulator, SolverWarning
    row = ScaleRow(scene, n)
    xml = SCENES[scene](n)
    sim = Simulator.from_string(xml)
    row.nv = sim.nv
    try:
        import mujoco
        m = mujoco.MjModel.from_xml_string(xml)
        d = mujoco.MjData(m)
    except ImportError:
        mujoco = None
        row.notes.append("MuJoCo n/a: not installed")
    zero = np.zeros(sim.nv)
    st = {"q": sim.q0, "v": np.zeros(sim.nv), "nc": 0, "ni": 0, "k": 0, "fail": 0}

    def ours(jac=False):
        if jac:
            st["q"], st["v"], _ = sim.step(st["q"], st["v"], zero, jacobian=True)
        else:
            st["q"], st["v"] = sim.step(st["q"], st["v"], zero)
        last = sim.last
        st["nc"] += last.num_contacts
        st["ni"] += getattr(last, "islands", float("nan"))
        st["k"] += 1
        st["fail"] += not last.converged

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverWarning)
        for _ in range(warmup):
            ours()
        if jacobian:            # (first use of the Jacobian path: its kernels load, its buffers
            ours(True)          # are made; not a cost per step)
        if mujoco is not None:
            d.qpos[:] = mujoco_state_of(mujoco, m, sim, sim.q0)
            for _ in range(warmup):
                mujoco.mj_step(m, d)
            nx = 2 * m.nv + m.na
            A = np.zeros((nx, nx))

            def mjd():
                mujoco.mjd_transitionFD(m, d, FD_EPS, True, A, None, None, None)
                mujoco.mj_step(m, d)
            if jacobian:
                mjd()
        st["nc"] = st["ni"] = st["k"] = st["fail"] = 0
        tf, tm, tj, tmd, ncm = [], [], [], [], []
        for _ in range(blocks):
            t, k = _block(ours, steps, budget)
            tf.append(t)
            row.steps += k
            if mujoco is not None:
                c0 = [0]

                def mj():
                    mujoco.mj_step(m, d)
                    c0[0] += d.ncon
                # (as many steps as ours, not min_time's: both engines cover the same span of
                # their trajectories; MuJoCo's 64-ball step took 145-150 us of CPU over its
                # first ~140 steps, 95 us after them)
                t, k2 = _block(mj, k, budget, min_time=0.0)
                tm.append(t)
                ncm.append(c0[0] / k2)
        row.contacts = st["nc"] / max(1, st["k"])
        row.islands = st["ni"] / max(1, st["k"])
        row.nonconverged = st["fail"]
        if jacobian:
            for _ in range(blocks):
                t, k = _block(lambda: ours(True), jac_states, budget)
                tj.append(t)
                if mujoco is not None:
                    t, _k = _block(mjd, k, budget, min_time=0.0)
                    tmd.append(t)
            row.nonconverged = st["fail"]
    row.t_fwd = float(np.median(tf))
    if tm:
        row.t_mj = float(np.median(tm))
        row.contacts_mj = float(np.mean(ncm))
    if tj:
        row.t_jac = float(np.median(tj))
    if tmd:
        row.t_mjd = float(np.median(tmd))
    return row


def growth(ns, ts) -> float:
    """Least-squares slope of log t against log n (nan with fewer than two finite points)."""
    pts = [(math.log(n), math.log(t)) for n, t in zip(ns, ts) if t > 0 and math.isfinite(t)]
    if len(pts) < 2:
        return float("nan")
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


# -- memory at load --------------------------------------------------------------------------
_LOAD_CHILD = r"""
import json, resource, sys, time, warnings
import numpy as np
import diffgym
from diffgym.bench_scaling import SCENES
from diffgym.sim.forward import Simulator
import pinocchio
Simulator.from_string(SCENES["balls"](2)).step  # imports of the step's modules
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
sim = Simulator.from_string(SCENES[sys.argv[1]](int(sys.argv[2])))
t_load = time.perf_counter() - t0
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
warnings.simplefilter("ignore")
t0 = time.perf_counter()
q, v = sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))
t_step = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
# the forward step (median of a few, kernels loaded) and its contacts
ts = []
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter()
    q, v = sim.step(q, v, np.zeros(sim.nv))
    ts.append(time.perf_counter() - t0)
out = {"base_kb": base, "loaded_kb": loaded, "peak_kb": peak, "nv": sim.nv, "t_load": t_load,
       "t_step": t_step, "t_fwd": float(np.median(ts)) if ts else float("nan"),
       "contacts": sim.last.num_contacts}
print(json.dumps(out), flush=True)
if sys.argv[4] == "1":      # then one step with its Jacobian (sys.argv[5]: its format)
    sim.jacobian_format = sys.argv[5]
    t0 = time.perf_counter()
    sim.step(q, v, np.zeros(sim.nv), jacobian=True)
    out["t_jac"] = time.perf_counter() - t0
    out["peak_jac_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out), flush=True)
"""


def load_memory(scene: str, n: int, limit_mb: float = 6000.0, timeout: float = 600.0,
                fwd_steps: int = 0, jacobian: bool = False, jacobian_format: str = "auto") -> dict:
    """Peak RSS (MB) a scene of n bodies adds at load and first step, in a fresh process whose
    address space is capped at ``limit_mb`` above what it needs (a run over it is reported, not
    allowed to take the machine); then the median of ``fwd_steps`` forward steps (``t_fwd``)
    and, with ``jacobian``, one step with its Jacobian (``t_jac``; ``jac_mb``: the peak after
    it, or the note why it did not complete, the forward figures kept), in
    ``jacobian_format`` (Simulator.jacobian_format: "auto" is sparse, block by block, at
    these sizes; "dense" the whole-model route)."""
    import resource

    def cap():
        lim = int((limit_mb + 1500) * 2 ** 20)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    try:
        p = subprocess.run([sys.executable, "-c", _LOAD_CHILD, scene, str(n), str(int(fwd_steps)),
                            "1" if jacobian else "0", jacobian_format], capture_output=True,
                           text=True, timeout=timeout, preexec_fn=cap, env=env)
    except subprocess.TimeoutExpired as e:
        p = subprocess.CompletedProcess(e.cmd, -1, e.stdout or "", f"timed out after {timeout:.0f} s")
        if isinstance(p.stdout, bytes):
            p.stdout = p.stdout.decode()
    lines = [ln for ln in (p.stdout or "").strip().splitlines() if ln.startswith("{")]
    if not lines:
        tail = ((p.stderr or "").strip().splitlines() or ["?"])[-1]
        return {"mb": float("nan"), "note": f"failed under a {limit_mb:.0f} MB cap: {tail[:120]}"}
    out = json.loads(lines[-1])
    note = ""
    if jacobian and "peak_jac_kb" not in out:
        tail = ((p.stderr or "").strip().splitlines() or ["?"])[-1]
        note = f"Jacobian step failed under a {limit_mb:.0f} MB cap: {tail[:100]}"
    return {"mb": (out["peak_kb"] - out["base_kb"]) / 1024.0, "nv": out["nv"], "note": note,
            "load_mb": (out["loaded_kb"] - out["base_kb"]) / 1024.0,
            "t_load": out["t_load"], "t_step": out["t_step"],
            "t_fwd": out.get("t_fwd", float("nan")), "contacts": out.get("contacts", 0),
            "t_jac": out.get("t_jac", float("nan")),
            "jac_mb": (out["peak_jac_kb"] - out["base_kb"]) / 1024.0 if "peak_jac_kb" in out
            else float("nan")}


# -- report ----------------------------------------------------------------------------------
def _f(x, spec):
    return "n/a" if not (isinstance(x, (int, float)) and math.isfinite(x)) else format(x, spec)


def format_rows(rows: list[ScaleRow]) -> str:
    head = (f"{'scene':<6} {'N':>4} {'nv':>5} {'contacts':>8} {'mj ncon':>7} {'islands':>7} "
            f"{'fwd us':>10} {'mj_step us':>10} {'fwd/mj':>7} {'jac us':>11} {'mjdFD us':>10} "
            f"{'jac/mjd':>7} {'nonconv':>7} {'load MB':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.scene:<6} {r.n:>4} {r.nv:>5} {_f(r.contacts, '.1f'):>8} "
                     f"{_f(r.contacts_mj, '.1f'):>7} {_f(r.islands, '.1f'):>7} "
                     f"{_f(r.t_fwd * 1e6, '.0f'):>10} {_f(r.t_mj * 1e6, '.1f'):>10} "
                     f"{_f(r.fwd_ratio, '.1f'):>7} {_f(r.t_jac * 1e6, '.0f'):>11} "
                     f"{_f(r.t_mjd * 1e6, '.0f'):>10} {_f(r.jac_ratio, '.2f'):>7} "
                     f"{r.nonconverged:>4}/{r.steps:<3} {_f(r.load_mb, '.0f'):>7}"
                     + (f"  {'; '.join(r.notes)}" if r.notes else ""))
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--scaling", action="store_true",
                        help="print the scaling table (racks of balls, piles of boxes, N = 4..256) "
                        "instead of the model tables")
    parser.add_argument("--max-n", type=int, default=256, help="largest N of the scaling table")
    parser.add_argument("--scenes", nargs="*", default=None, help=f"subset of {list(SCENES)}")
    parser.add_argument("--load-ns", type=int, nargs="*", default=None,
                        help=f"body counts of the load-memory table (default {list(LOAD_NS)}; "
                        "none: skip it)")
    parser.add_argument("--no-load-jacobian", dest="load_jacobian", action="store_false",
                        help="the load-memory table without its Jacobian step (peak, time)")
    parser.add_argument("--scaling-budget", type=float, default=2.0,
                        help="seconds per timed block and engine at most (at least one step)")
    parser.add_argument("--blas-threads", type=int, default=1,
                        help="threads of the loaded BLAS (OpenBLAS) during the scaling table "
                        "(default 1, as MuJoCo; 0: leave them as the environment set them)")


def main(args) -> int:
    scenes = getattr(args, "scenes", None) or list(SCENES)
    bad = [s for s in scenes if s not in SCENES]
    if bad:
        raise SystemExit(f"unknown scene(s) {bad}; choose from {list(SCENES)}")
    max_n = int(getattr(args, "max_n", 256))
    if max_n < 1:
        raise SystemExit(f"--max-n must be positive, got {max_n}")
    blocks = max(1, int(getattr(args, "repeats", 3) or 1))
    budget = float(getattr(args, "scaling_budget", 2.0))
    jac = bool(getattr(args, "jacobian", True))
    nblas = int(getattr(args, "blas_threads", 1) or 0)
    if nblas < 0:
        raise SystemExit(f"--blas-threads must be >= 0, got {nblas}")
    restore = limit_blas_threads(nblas) if nblas > 0 else None
    try:
        return _main(args, scenes, max_n, blocks, budget, jac, nblas)
    finally:
        if restore is not None:
            restore()


def _main(args, scenes, max_n, blocks, budget, jac, nblas) -> int:
    ns = [n for n in NS if n <= max_n]
    rows = []
    for s in scenes:
        for n in ns:
            # first the memory at load in a capped process: a scene that cannot be loaded is
            # reported, not allowed to take the machine's memory
            mem = load_memory(s, n)
            if not math.isfinite(mem["mb"]):
                r = ScaleRow(s, n, notes=[f"not timed: the load {mem['note']}"])
            else:
                r = run_scene(s, n, blocks=blocks, budget=budget, jacobian=jac)
            r.load_mb = mem["mb"]
            rows.append(r)
            print(format_rows([r]).splitlines()[-1], flush=True)
    print()
    print(format_rows(rows))
    print()
    print(f"times: CPU time per step, median of {blocks} blocks per engine (ours and MuJoCo "
          f"alternating, each of our blocks at least 50 steps / 5 Jacobians and "
          f"{MIN_BLOCK_S * 1e3:g} ms CPU, at most {budget:g} s, MuJoCo's as many steps); "
          f"{_blas_text(blas_threads())}"
          f"{'' if nblas else ' (as the environment set them)'}; "
          "jac = our step with jacobian=True, "
          "mjdFD = MuJoCo's centered mjd_transitionFD (eps 1e-6); contacts: ours per step "
          "(points, speculative included), MuJoCo's ncon")
    for s in scenes:
        sr = [r for r in rows if r.scene == s]
        gf = growth([r.n for r in sr], [r.t_fwd for r in sr])
        gm = growth([r.n for r in sr], [r.t_mj for r in sr])
        gj = growth([r.n for r in sr], [r.t_jac for r in sr])
        line = (f"{s}: forward grows like N^{_f(gf, '.2f')} (target <= {TARGET_GROWTH}), "
                f"mj_step like N^{_f(gm, '.2f')}, Jacobian step like N^{_f(gj, '.2f')}")
        at64 = [r for r in sr if r.n == 64]
        if at64:
            ok = at64[0].fwd_ratio <= TARGET_AT_64[s]
            line += (f"; at N=64 forward {_f(at64[0].fwd_ratio, '.1f')}x mj_step (target "
                     f"{TARGET_AT_64[s]:g}x: {'met' if ok else 'NOT met'})")
        slower = [r.n for r in sr if math.isfinite(r.jac_ratio) and not r.jac_ratio < 1.0]
        unmeasured = [r.n for r in sr if not math.isfinite(r.jac_ratio)]
        if len(unmeasured) == len(sr):
            line += "; Jacobian not measured"
        else:
            line += ("; Jacobian faster than MuJoCo's centered FD at every N measured"
                     if not slower else
                     f"; Jacobian NOT faster than MuJoCo's centered FD at N = {slower}")
            if unmeasured:
                line += f" (not measured at N = {unmeasured})"
        print(line)
    load_ns = getattr(args, "load_ns", None)
    load_ns = list(LOAD_NS) if load_ns is None else load_ns
    if load_ns:
        print()
        print("memory at load (a fresh process per scene and N: load, then one step from rest; "
              "peak RSS above the imports after the load, after that step and after one more "
              "step with its Jacobian; the first step's time, the median of 3 forward steps "
              "after it, the Jacobian step's time; the Jacobian in jacobian_format 'auto': "
              "block by block with sparse output from about 400 bodies, "
              "diffgym.sim.derivative_blocks)")
        jac_mem = bool(getattr(args, "load_jacobian", True))
        print(f"  {'scene':<6} {'N':>5} {'nv':>6} {'contacts':>8} {'load MB':>8} {'peak MB':>9} "
              f"{'jac MB':>8} {'load s':>7} {'step1 s':>7} {'fwd ms':>8} {'jac s':>7}")
        for s in scenes:
            got = []
            for n in load_ns:
                r = load_memory(s, n, fwd_steps=3, jacobian=jac_mem)
                got.append((n, r))
                verdict = ""
                if n >= 1000 and math.isfinite(r["mb"]):
                    verdict = f"  (target < {LOAD_TARGET_MB:.0f} MB: " + (
                        "met)" if r["mb"] < LOAD_TARGET_MB else "NOT met)")
                    if jac_mem:
                        verdict += ("  (Jacobian step at 1,000 bodies: "
                                    + (f"{r['jac_mb']:.0f} MB)" if math.isfinite(r["jac_mb"])
                                       else "failed)"))
                print(f"  {s:<6} {n:>5} {r.get('nv', 0):>6} {r.get('contacts', 0):>8} "
                      f"{_f(r.get('load_mb'), '.0f'):>8} {_f(r['mb'], '.0f'):>9} "
                      f"{_f(r.get('jac_mb'), '.0f'):>8} {_f(r.get('t_load'), '.2f'):>7} "
                      f"{_f(r.get('t_step'), '.2f'):>7} {_f(r.get('t_fwd', float('nan')) * 1e3, '.1f'):>8} "
                      f"{_f(r.get('t_jac'), '.2f'):>7} {r['note']}{verdict}", flush=True)
            ok = [(n, r) for n, r in got if math.isfinite(r["mb"])]
            print(f"  {s}: peak memory grows like N^"
                  f"{_f(growth([n for n, _ in ok], [r.get('load_mb', float('nan')) for _, r in ok]), '.2f')}"
                  f" at load, N^{_f(growth([n for n, _ in ok], [r['mb'] for _, r in ok]), '.2f')} "
                  "with the first step (target: about linear)")
    import pinocchio
    try:
        import mujoco
        mjv = mujoco.__version__
    except ImportError:
        mjv = "n/a"
    print(f"pinocchio {pinocchio.__version__}, mujoco {mjv}, numpy {np.__version__}, "
          f"{os.cpu_count()} cores, {_blas_text(blas_threads())}, OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')} (the memory table's children: 1)")
    return 0
