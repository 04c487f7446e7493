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


class _Entry:
    """The registered entry point of an id: the environment inside a TimeLimit of its own length.

    The environments truncate their episodes themselves (so ``env.unwrapped`` and the vector
    form are exact), and the TimeLimit around them carries the same length, so that
    ``env.spec.max_episode_steps``, Gymnasium's wrappers and libraries reading the spec (SB3)
    see it; both truncate at the same step. ``gym.make(id, episode_steps=n)`` sets both.
    (Gymnasium's own ``max_episode_steps=`` argument adds a second TimeLimit, which can only
    shorten episodes: use ``episode_steps``.) The id is registered without
    ``max_episode_steps``, otherwise Gymnasium would add its TimeLimit of the default length
    around one of another length.
    """

    def __init__(self, entry: str):
        self.entry = entry

    def _cls(self):
        import importlib
        mod, name = self.entry.split(":")
        return getattr(importlib.import_module(mod), name)

    @property
    def metadata(self):                      # (read by gym.make for the render modes)
        return self._cls().metadata

    def __call__(self, **kwargs):
        env = self._cls()(**kwargs)
        return gym.wrappers.TimeLimit(env, int(env.episode_steps))

    def __repr__(self) -> str:
        return f"{self.entry} (in a TimeLimit of its episode length)"


def register_all() -> None:
    for env_id, entry in ENV_IDS.items():
        if env_id not in gym.registry:
            from diffgym.vector import vector_entry_point
            gym.register(env_id, entry_point=_Entry(entry),
                         vector_entry_point=functools.partial(vector_entry_point, env_id))


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
