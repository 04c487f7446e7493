"""DiffPush-v0 (issue 16): the solver stage (``sim.last.method``) of every simulator step over
ramped pushes to 8 targets around the box (200 environment steps each: the rod placed behind
the box, its pose target moved to the point just behind the target as in
tests/test_envs_manip.py's ramped push), unconverged steps, and the CPU time
(``time.process_time``) an environment step.

    python scripts/push_stages.py

For A/B runs of two code versions run it alternately in separate processes."""
import collections, time, warnings, numpy as np, gymnasium as gym
import diffgym
print(diffgym.__file__)
def state(e, rod_xy, rod_yaw, target):
    x = np.zeros(e.state_size)
    x[0:2] = np.asarray(rod_xy) - e._rod_offset
    x[2] = rod_yaw
    x[3:6] = [0, 0, 0.05]
    x[6:10] = [0, 0, 0, 1]
    x[e.nq + e.nv:] = target
    return x
meth = collections.Counter(); unconv = 0; cpu = 0.0; nsteps = 0
warnings.simplefilter("ignore")
for ang in np.linspace(0, 2 * np.pi, 8, endpoint=False):
    target = np.array([0.27 * np.cos(ang + 0.38), 0.27 * np.sin(ang + 0.38)])
    env = gym.make("DiffPush-v0", target=tuple(target)); env.reset(seed=0); e = env.unwrapped
    orig = e.sim.step
    def step(*a, **k):
        global unconv
        out = orig(*a, **k); meth[e.sim.last.method] += 1; unconv += not e.sim.last.converged
        return out
    e.sim.step = step
    u = target / np.linalg.norm(target); yaw = np.arctan2(u[1], u[0]); start = -0.12 * u
    e.set_state(state(e, start, yaw, tuple(target)))
    goal = target - 0.07 * u
    for k in range(200):
        g = start + min(1.0, k / 120) * (goal - start)
        t0 = time.process_time()
        env.step(np.array([g[0] / e.WORKSPACE, g[1] / e.WORKSPACE, yaw / np.pi]))
        cpu += time.process_time() - t0; nsteps += 1
print(dict(meth), 'unconverged', unconv, 'cpu ms/env step %.3f' % (1e3 * cpu / nsteps))
