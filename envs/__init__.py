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


# episode lengths registered with Gymnasium (``env.spec.max_episode_steps``): each class's default
def _episode_steps(entry: str) -> int:
    import importlib
    mod, cls = entry.split(":")
    return int(getattr(importlib.import_module(mod), cls).episode_steps)


def _sync_episode_length(env):
    """Applied by ``gym.make`` after its TimeLimit: one episode length for the wrapper and the env.

    The environments truncate their episodes themselves (so ``env.unwrapped`` and the vector
    form are exact too), and the registration carries the same length as ``max_episode_steps``
    for Gymnasium's TimeLimit, ``env.spec`` and libraries reading it. Either way of choosing the
    length through ``gym.make`` sets both: ``episode_steps=n`` (the TimeLimit follows) or
    ``max_episode_steps=n`` (the environment follows). Giving both with different values is an
    error. Returns ``env`` itself (no extra wrapper layer).
    """
    limit = env
    while isinstance(limit, gym.Wrapper) and not isinstance(limit, gym.wrappers.TimeLimit):
        limit = limit.env
    if not isinstance(limit, gym.wrappers.TimeLimit):
        return env                                   # max_episode_steps=-1: no TimeLimit
    inner = env.unwrapped
    spec = inner.spec
    default = gym.registry[spec.id].max_episode_steps if spec is not None and spec.id in gym.registry else None
    asked = (spec.kwargs or {}).get("episode_steps") if spec is not None else None
    m = int(limit._max_episode_steps)
    if asked is not None:
        if m != default and m != int(asked):
            raise ValueError(f"{spec.id}: episode_steps={asked} and max_episode_steps={m} disagree; "
                             "give the episode length once")
        limit._max_episode_steps = int(inner.episode_steps)
        limit._cached_spec = None
    else:
        inner.episode_steps = m
    return env


def register_all() -> None:
    for env_id, entry in ENV_IDS.items():
        if env_id not in gym.registry:
            from diffgym.vector import vector_entry_point
            gym.register(env_id, entry_point=entry, max_episode_steps=_episode_steps(entry),
                         vector_entry_point=functools.partial(vector_entry_point, env_id),
                         additional_wrappers=(gym.envs.registration.WrapperSpec(
                             "DiffgymEpisodeLength", "diffgym.envs:_sync_episode_length", {}),))


register_all()


def check_jacobians(env, states=None, actions=None, **kwargs):
    """Compare every Jacobian block of ``env.step_with_jacobian`` (any DiffEnv, or a Gymnasium
    wrapper of one) with central differences, at the given ``states`` (full states in the
    ``get_state()`` layout, with ``actions`` or random ones) or along an episode of random
    actions, including the simulator's blocks at every frame-skip sub-step. Returns a
    :class:`diffgym.GradientReport` naming every block, column, step and state that disagrees
    without a mode switch to explain it. Keyword arguments are those of
    :func:`diffgym.check_step_jacobians` (``steps``, ``max_states``, ``seed``, ``eps``, ``tol``,
    ``substeps``, ``raise_on_failure``...)."""
    from diffgym.gradcheck import check_step_jacobians
    return check_step_jacobians(env, states=states, actions=actions, **kwargs)
