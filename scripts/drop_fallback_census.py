"""Which contact rows still take the collision finite-difference fallback in scenes the
simulator visits: 3 drops of 6 boxes and capsules (random sizes and poses) onto a table box on
a plane, 120 steps each with ``jacobian=True``. Prints the rows by reason
(``collision_derivatives.fallback_reasons``) and by pair of kinds
(``derivatives.fallback_counts``), and whether any Jacobian was non-finite.

    python scripts/drop_fallback_census.py [--spheres]

``--spheres``: two of the six bodies are balls (sphere-capsule, sphere-box pairs as well).
"""
import sys
import numpy as np, warnings, time, diffgym
from diffgym.sim import derivatives
warnings.simplefilter("ignore")
rng = np.random.default_rng(1)
def scene(seed):
    r = np.random.default_rng(seed)
    bodies = []
    for i in range(6):
        kinds = ["box", "sphere", "capsule", "box", "capsule", "sphere"] if "--spheres" in sys.argv \
            else ["box", "box", "capsule", "box", "capsule", "box"]
        kind = kinds[i]
        geom = ('<geom type="box" size="%.3f %.3f %.3f"/>' % tuple(r.uniform(0.04, 0.1, 3)) if kind == "box"
                else '<geom type="sphere" size="0.05"/>' if kind == "sphere"
                else '<geom type="capsule" fromto="-0.08 0 0 0.08 0 0" size="0.03"/>')
        bodies.append('<body pos="%.3f %.3f %.3f" euler="%d %d %d"><freejoint/>%s</body>'
                      % (r.uniform(-0.1, 0.1), r.uniform(-0.1, 0.1), 0.15 + 0.2 * i, *r.integers(0, 360, 3), geom))
    return ('<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1" friction="0.6"/>'
            '<geom type="box" pos="0 0 0.02" size="0.3 0.3 0.02"/>%s</worldbody></mujoco>' % "".join(bodies))
tot_rows = 0; bad = 0; t0 = time.perf_counter(); steps = 0
for seed in range(3):
    sim = diffgym.Simulator.from_string(scene(seed))
    q, v = sim.q0, np.zeros(sim.nv)
    for s in range(120):
        q, v, jac = sim.step(q, v, np.zeros(sim.nv), jacobian=True)
        steps += 1
        tot_rows += sim.last.num_contacts
        if not np.isfinite(jac.state).all(): bad += 1
from diffgym.sim import collision_derivatives as CD
print("fallback rows by reason", CD.fallback_reasons)
print("steps", steps, "contact rows", tot_rows, "non-finite jac", bad, "fallback rows by kind", derivatives.fallback_counts, "%.1f s" % (time.perf_counter() - t0))
