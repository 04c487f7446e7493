"""Your own differentiable environment, from your own MJCF, in one file (README: "Your own
environment").

A puck (a 4 cm sphere on three slide joints, so it slides without rolling) on a table with
Coulomb friction 0.3 is pushed by two horizontal motors towards a target. The environment
subclasses diffgym's DiffEnv: it supplies the model, the starting state, the observation and the
reward, each with its exact derivatives; DiffEnv does the rest (action scaling, frame skip, the
episode clock, the Jacobian of the whole step chained from the simulator's analytical step
Jacobians, rendering, snapshots). It is registered with Gymnasium and then checked with
``diffgym.envs.check_jacobians``, once with a correct reward derivative and once with a
deliberately wrong one (a factor 2 forgotten), which the checker must catch.

    python scripts/own_env_example.py            # prints both reports; exit status 0 if the
                                                 # checker passed the right derivative and
                                                 # flagged the wrong one
"""
from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np

import diffgym
import diffgym.envs
from diffgym.envs.base import DiffEnv

PUCK_XML = """
<mujoco model="puck">
  <option timestep="0.01" gravity="0 0 -9.81"/>
  <worldbody>
    <geom name="table" type="plane" size="2 2 0.1" friction="0.3"/>
    <body name="puck" pos="0 0 0.04">
      <joint name="x" type="slide" axis="1 0 0"/>
      <joint name="y" type="slide" axis="0 1 0"/>
      <joint name="z" type="slide" axis="0 0 1"/>
      <geom name="puck" type="sphere" size="0.04" mass="0.5" friction="0.3"/>
    </body>
  </worldbody>
  <actuator>
    <motor name="push_x" joint="x" gear="1" ctrlrange="-4 4"/>
    <motor name="push_y" joint="y" gear="1" ctrlrange="-4 4"/>
  </actuator>
</mujoco>
"""


class PuckToTargetEnv(DiffEnv):
    """Push a sliding puck to a target.

    State ``x = [q (3), v (3), target (2)]``: the puck's x, y, z and their velocities (the
    differentiable part, n_x = 6) and the target (a constant of the episode, n_const = 2).
    Action: two motor forces in [-1, 1] (4 N at |a| = 1, from the actuators' gear and
    ctrlrange, by DiffEnv's default ``_forces``). Observation: ``[x, y, vx, vy, tx - x,
    ty - y]``. Reward after the step: ``-|p - target|^2 - 0.01 |a|^2``.
    """

    frame_skip = 2            # two 0.01 s simulator steps per environment step
    episode_steps = 100
    obs_dim = 6
    n_const = 2               # the target, after q and v

    def __init__(self, wrong_derivative: bool = False, **kwargs):
        self.wrong_derivative = wrong_derivative
        super().__init__(**kwargs)

    # the model: any MJCF (a string here, or Simulator.from_file(path)); sim_options are the
    # simulator's keyword settings (dt, erp, tol, ...)
    def _make_sim(self, **options):
        return diffgym.Simulator.from_string(PUCK_XML, **options)

    def _reset_state(self, rng):
        x = np.zeros(self.state_size)
        x[:3] = self.sim.q0                               # resting on the table
        x[:2] += rng.uniform(-0.05, 0.05, 2)
        x[3:5] = rng.uniform(-0.2, 0.2, 2)                # sliding at the start
        x[6:8] = rng.uniform(-0.3, 0.3, 2)                # the target
        return x

    def _observe(self, x):
        p, v, target = x[0:2], x[3:5], x[6:8]
        obs = np.concatenate([p, v, target - p])
        d = np.zeros((6, self.n_x))                       # d obs / d x (tangent: n_x = 6)
        d[0, 0] = d[1, 1] = 1.0
        d[2, 3] = d[3, 4] = 1.0
        d[4, 0] = d[5, 1] = -1.0
        return obs, d

    def _reward(self, x, a):
        err = x[0:2] - x[6:8]
        dist2 = float(err @ err)
        ctrl = 0.01 * float(a @ a)
        r = -dist2 - ctrl
        dr_dx = np.zeros(self.n_x)                        # d r / d x_next
        dr_dx[0:2] = -2.0 * err
        if self.wrong_derivative:
            dr_dx[0:2] = -err                             # the bug: the factor 2 forgotten
        dr_da = -0.02 * a                                 # d r / d a
        return r, {"reward_distance": -dist2, "reward_ctrl": -ctrl}, dr_dx, dr_da


def register() -> None:
    if "PuckToTarget-v0" not in gym.registry:
        gym.register("PuckToTarget-v0", entry_point=PuckToTargetEnv,
                     max_episode_steps=PuckToTargetEnv.episode_steps)


def main(max_states: int = 20) -> int:
    register()
    good = diffgym.envs.check_jacobians(gym.make("PuckToTarget-v0"), seed=0, max_states=max_states)
    print("correct reward derivative:\n" + str(good) + "\n")
    bad = diffgym.envs.check_jacobians(gym.make("PuckToTarget-v0", wrong_derivative=True), seed=0,
                                       max_states=max_states)
    print("wrong reward derivative (factor 2 forgotten):\n" + str(bad))
    flagged = {f.block for f in bad.failures}
    ok = good.ok and not bad.ok and "reward_state" in flagged and flagged <= {"reward_state", "reward_action"}
    print("\nthe checker passed the right derivative and flagged the wrong one" if ok else
          "\nUNEXPECTED: see the reports above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
