"""Broad phase and detect pass at scale, one fresh process per run (issue 16): loads a scene of
diffgym.bench_scaling (balls or boxes, N bodies), then times the detect pass alone at the initial
state (t_detect_only: median of 6; t_kernel: its compiled part, collision_kernels.detect_closed_form),
then steps (t_fwd, t_detect inside a step: medians). Memory: peak RSS above the imports (MB).

Usage: python scripts/bench_broad_phase.py SCENE N STEPS  (prints JSON lines; run the old tree with
PYTHONPATH=<old checkout> for a before / after table, alternating runs)."""
import json, resource, sys, time, warnings
import numpy as np
import diffgym
from diffgym.bench_scaling import SCENES
from diffgym.sim.forward import Simulator
from diffgym.sim import collision_driver as cd
s2 = Simulator.from_string(SCENES["balls"](2)); s2.step(s2.q0, np.zeros(s2.nv), np.zeros(s2.nv))
acc = [0.0]; cap = {}; kt = []
orig = cd.CollisionDriver.detect
_k = cd.detect_closed_form
def _kw(*a):
    t0 = time.perf_counter(); r = _k(*a); kt.append(time.perf_counter() - t0); return r
cd.detect_closed_form = _kw
class Stop(Exception): pass
def timed(self, *a, **k):
    if cap.get("grab"):
        cap["args"] = (self, a, k); raise Stop
    t0 = time.perf_counter(); out = orig(self, *a, **k); acc[0] += time.perf_counter() - t0; return out
cd.CollisionDriver.detect = timed
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
sim = Simulator.from_string(SCENES[sys.argv[1]](int(sys.argv[2])))
t_load = time.perf_counter() - t0
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
warnings.simplefilter("ignore")
# the detect pass alone, at the initial state, repeated
cap["grab"] = True
try:
    sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))
except Stop:
    pass
cap["grab"] = False
self_, a, k = cap["args"]
dts = []
for _ in range(7):
    t0 = time.perf_counter(); c = orig(self_, *a, **k); dts.append(time.perf_counter() - t0)
out = {"scene": sys.argv[1], "n": int(sys.argv[2]), "load_mb": (loaded - base) / 1024,
       "t_load": t_load, "t_detect_only": float(np.median(dts[1:])), "t_kernel": float(np.median(kt[-6:])), "contacts0": int(len(c.dist)),
       "detect_peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024}
print(json.dumps(out), flush=True)
q, v = sim.step(sim.q0, np.zeros(sim.nv), np.zeros(sim.nv))
ts, ds = [], []
for _ in range(int(sys.argv[3])):
    acc[0] = 0.0
    t0 = time.perf_counter()
    q, v = sim.step(q, v, np.zeros(sim.nv))
    ts.append(time.perf_counter() - t0); ds.append(acc[0])
out.update({"peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024,
       "t_fwd": float(np.median(ts)) if ts else None, "t_detect": float(np.median(ds)) if ds else None,
       "contacts": int(sim.last.num_contacts)})
print(json.dumps(out), flush=True)
