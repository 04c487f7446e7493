"""diffgym.envs: the differentiable Gymnasium environments (installed as ``diffgym.envs``).

Importing diffgym registers the ids below with Gymnasium; each also has a vector entry point
(``gym.make_vec(id, n, vectorization_mode="vector_entry_point")`` or ``diffgym.make_vec``).
"""
import functools

import gymnasium as gym

ENV_IDS = {
    "DiffCartPole-v0": "diffgym.envs.cartpole:DiffCartPoleEnv",
    "DiffHopper-v0": "diffgym.envs.hopper:DiffHopperEnv",
    "DiffGo1-v0": "diffgym.envs.go1:DiffGo1Env",
    "DiffPush-v0": "diffgym.envs.push:DiffPushEnv",
    "DiffBilliards-v0": "diffgym.envs.billiards:DiffBilliardsEnv",
}


def register_all() -> None:
    for env_id, entry in ENV_IDS.items():
        if env_id not in gym.registry:
            from diffgym.vector import vector_entry_point
            gym.register(env_id, entry_point=entry,
                         vector_entry_point=functools.partial(vector_entry_point, env_id))


register_all()
