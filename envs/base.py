"""The shared base of the differentiable environments.

An environment is a :class:`diffgym.Simulator` plus four small pieces written by each subclass
as smooth numpy functions with their derivatives: the starting state, how an action becomes
generalized forces, the observation and the reward. Everything else lives here: action checks
and scaling, frame skipping, the episode clock, divergence handling, rendering and the exact
Jacobian of a whole environment step, chained from the simulator's analytical step Jacobians.

State. ``get_state()`` returns ``x = [q (nq), v (nv), extra (n_extra)]`` as float64. Its first
``n_diff`` extra entries are differentiable (for example the previous action); the rest are
constants of the episode (for example a target position). Derivatives use tangent coordinates
(pinocchio's q (+) dq), so ``n_x = 2 nv + n_diff``; :meth:`DiffEnv.tangent_map` converts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import pinocchio as pin

from diffgym.sim.forward import SimulationError, Simulator
from diffgym.sim.gradient_modes import gradient_mode
from diffgym.resources import asset_path

_add = np.add.reduce
_minimum, _maximum = np.minimum, np.maximum


@dataclass
class EnvJacobian:
    """Total derivatives of one environment step (tangent coordinates, see the module doc)."""

    state_state: np.ndarray    # d x_next / d x        (n_x, n_x)
    state_action: np.ndarray   # d x_next / d a        (n_x, n_a)
    reward_state: np.ndarray   # d r / d x             (n_x,)
    reward_action: np.ndarray  # d r / d a             (n_a,)
    obs_state: np.ndarray      # d obs_next / d x_next (n_obs, n_x)


def _quat_tangent(quat: np.ndarray) -> np.ndarray:
    """d(q (x) exp(w/2)) / dw at w = 0 for a unit quaternion stored (x, y, z, w): (4, 3)."""
    x, y, z, w = quat
    return 0.5 * np.array([[w, -z, y], [z, w, -x], [-y, x, w], [-x, -y, -z]])


@dataclass
class _Scratch:
    """Stands for a pinocchio Data or GeometryData in a pickled environment."""

    kind: str


def wrap_angle(a):
    """Wrap to (-pi, pi]."""
    return np.pi - np.mod(np.pi - a, 2.0 * np.pi)


class DiffEnv(gym.Env):
    """Base class. Subclasses set the class attributes and implement the ``_`` hooks below.

    Hooks (all numpy, float64; ``x`` is the full state of the module doc):

    - ``_reset_state(rng) -> x``: the starting state.
    - ``_forces(x, a) -> (tau, dtau_dx, dtau_da)``: generalized forces (nv,) for the scaled-free
      action ``a`` in [-1, 1]; ``dtau_dx`` (nv, n_x) or None when tau does not depend on x.
      The default maps the action through the model's actuators (gear x ctrlrange bound).
    - ``_extra_next(x, a) -> (e, de_dx, de_da)``: the next differentiable extras (only when
      ``n_diff > 0``; the default keeps them).
    - ``_observe(x) -> (obs, dobs_dx)``.
    - ``_reward(x_next, a) -> (r, terms, dr_dx_next, dr_da)``: terms are reported in info.
    - ``_terminated(x) -> bool``.

    While a plain ``step`` runs, ``self._derivs`` is False: the hooks may then skip building
    their derivative outputs (return None for them), which that step does not read. It is True
    otherwise (``step_with_jacobian``, and any direct call of a hook).
    """

    metadata = {"render_modes": ["rgb_array", "human"], "render_fps": 30}
    asset: str = ""
    frame_skip: int = 1
    episode_steps: int = 1000
    n_diff: int = 0          # differentiable extras (after q, v)
    n_const: int = 0         # constant extras of an episode (after the differentiable ones)
    obs_dim: int = 0
    camera: dict | None = None
    _derivs: bool = True     # (the hooks' derivatives are read: see above)

    def __init__(self, render_mode: str | None = None, episode_steps: int | None = None,
                 frame_skip: int | None = None, width: int = 320, height: int = 240,
                 sim_options: dict | None = None, gradient=None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, "
                             f"got {render_mode!r}")
        if episode_steps is not None:
            if int(episode_steps) < 1:
                raise ValueError(f"episode_steps must be >= 1, got {episode_steps!r}")
            self.episode_steps = int(episode_steps)
        if frame_skip is not None:
            if int(frame_skip) < 1:
                raise ValueError(f"frame_skip must be >= 1, got {frame_skip!r}")
            self.frame_skip = int(frame_skip)
        if render_mode == "human":
            try:
                import pygame  # noqa: F401
            except ImportError:
                raise gym.error.DependencyNotInstalled(
                    "render_mode='human' shows the environment in a window drawn with pygame, which is "
                    "not installed: pip install 'diffgym[human]' (or pygame); or use "
                    "render_mode='rgb_array' (frames as arrays) or `diffgym record ID OUT.gif`") from None
        self.render_mode = render_mode
        self._window = None
        options = dict(sim_options or {})
        if gradient is not None:
            if "gradient" in options:
                raise ValueError("gradient given both as an argument and in sim_options; give it once")
            # checked before the model loads: a bad mode names itself, not the asset
            options["gradient"] = gradient_mode(gradient)
        self.sim = self._make_sim(**options)
        self.nq, self.nv = self.sim.nq, self.sim.nv
        self.n_a = self._action_dim()
        self.n_x = 2 * self.nv + self.n_diff
        self.state_size = self.nq + self.nv + self.n_diff + self.n_const
        self.dt = self.sim.dt * self.frame_skip
        self.metadata = dict(self.metadata, render_fps=int(round(1.0 / self.dt)))
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self.n_a,), dtype=np.float32)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.obs_dim,), dtype=np.float64)
        self._width, self._height = int(width), int(height)
        self._renderer = None
        self._x: np.ndarray | None = None
        self._elapsed = 0
        self._quat_rows = self._find_quaternions()
        self._B = self._actuator_matrix()

    @property
    def gradient(self):
        """The gradient mode of the step Jacobians (``gym.make(id, gradient="smooth")``, a mapping
        such as ``{"mode": "smooth", "rho": 1e-3}`` or a ``diffgym.sim.gradient_modes`` instance)."""
        return self.sim.gradient

    # -- construction hooks -------------------------------------------------------------------
    def _make_sim(self, **options) -> Simulator:
        return Simulator.from_file(asset_path(self.asset), **options)

    def _action_dim(self) -> int:
        return len(self.sim.sm.actuators)

    def _actuator_matrix(self) -> np.ndarray:
        """tau = B a for a in [-1, 1]: gear times the upper control bound of each actuator."""
        B = np.zeros((self.nv, len(self.sim.sm.actuators)))
        for k, act in enumerate(self.sim.sm.actuators):
            bound = 1.0 if act.ctrlrange is None else max(abs(act.ctrlrange[0]), abs(act.ctrlrange[1]))
            B[act.idx_v, k] = act.gear * bound
        return B

    def _find_quaternions(self) -> list[tuple[int, int, str]]:
        """(idx_q, idx_v, kind) of every joint whose configuration is not its tangent."""
        out = []
        for j in range(1, self.sim.model.njoints):
            jm = self.sim.model.joints[j]
            kind = jm.shortname()
            if kind in ("JointModelFreeFlyer", "JointModelSpherical"):
                out.append((jm.idx_q, jm.idx_v, kind))
            elif jm.nq != jm.nv:
                raise NotImplementedError(f"joint {self.sim.model.names[j]!r} of type {kind} "
                                          "has no tangent map in DiffEnv")
        return out

    # -- subclass hooks (defaults) ------------------------------------------------------------
    def _reset_state(self, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def _forces(self, x: np.ndarray, a: np.ndarray):
        return self._B @ a, None, self._B

    def _extra_next(self, x: np.ndarray, a: np.ndarray):
        n0 = self.nq + self.nv
        return x[n0:n0 + self.n_diff].copy(), None, None

    def _observe(self, x: np.ndarray):
        raise NotImplementedError

    def _reward(self, x_next: np.ndarray, a: np.ndarray):
        raise NotImplementedError

    def _terminated(self, x: np.ndarray) -> bool:
        return False

    # -- state ----------------------------------------------------------------------------------
    def get_state(self) -> np.ndarray:
        self._require_reset()
        return self._x.copy()

    def set_state(self, x) -> None:
        x = np.asarray(x, dtype=float)
        if x.shape != (self.state_size,):
            raise ValueError(f"{type(self).__name__}.set_state: state must have shape "
                             f"({self.state_size},), got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{type(self).__name__}.set_state: state has NaN/inf at "
                             f"{np.flatnonzero(~np.isfinite(x)).tolist()}")
        self._x = x.copy()
        self.sim.reset_warmstart()

    def snapshot(self) -> dict:
        """Everything this environment carries from one step to the next, for an exact resume:
        the state, the step count of the episode, the reset RNG and the contact solver's warm
        start. ``restore`` puts it back."""
        return {"state": self.get_state(), "elapsed": int(self._elapsed),
                "np_random": self.np_random.bit_generator.state,
                "warm_start": self.sim.warm_start_state()}

    def restore(self, snap: dict) -> None:
        missing = {"state", "elapsed", "np_random"} - set(snap)
        if missing:
            raise KeyError(f"{type(self).__name__}.restore: snapshot lacks {sorted(missing)}")
        self.set_state(snap["state"])
        self._elapsed = int(snap["elapsed"])
        self.np_random.bit_generator.state = snap["np_random"]
        self.sim.set_warm_start_state(snap.get("warm_start"))   # (absent in old checkpoints)

    def tangent_map(self, x=None) -> np.ndarray:
        """P (state_size, n_x) with x (+) dx = x + P dx to first order (zero rows for constants)."""
        x = self._x if x is None else np.asarray(x, dtype=float)
        P = np.zeros((self.state_size, self.n_x))
        nq, nv = self.nq, self.nv
        P[:nq, :nv] = self._config_tangent(x[:nq])
        P[nq:nq + nv, nv:2 * nv] = np.eye(nv)
        P[nq + nv:nq + nv + self.n_diff, 2 * nv:] = np.eye(self.n_diff)
        return P

    def integrate_state(self, x, dx) -> np.ndarray:
        """x (+) dx: the state moved by the tangent vector dx (n_x,); constants unchanged."""
        x, dx = np.asarray(x, dtype=float), np.asarray(dx, dtype=float)
        nq, nv, n0 = self.nq, self.nv, self.nq + self.nv
        out = x.copy()
        out[:nq] = pin.integrate(self.sim.model, x[:nq], dx[:nv])
        out[nq:n0] += dx[nv:2 * nv]
        out[n0:n0 + self.n_diff] += dx[2 * nv:]
        return out

    def state_difference(self, x0, x1) -> np.ndarray:
        """The tangent vector dx (n_x,) with x0 (+) dx = x1 (constants ignored)."""
        x0, x1 = np.asarray(x0, dtype=float), np.asarray(x1, dtype=float)
        nq, nv, n0 = self.nq, self.nv, self.nq + self.nv
        return np.concatenate([pin.difference(self.sim.model, x0[:nq], x1[:nq]), x1[nq:n0] - x0[nq:n0],
                               x1[n0:n0 + self.n_diff] - x0[n0:n0 + self.n_diff]])

    def _config_tangent(self, q: np.ndarray) -> np.ndarray:
        if not self._quat_rows:
            return np.eye(self.nq)
        P = np.zeros((self.nq, self.nv))
        quat_q, quat_v = set(), set()
        for iq, iv, kind in self._quat_rows:
            if kind == "JointModelFreeFlyer":
                quat = q[iq + 3:iq + 7]
                P[iq:iq + 3, iv:iv + 3] = pin.Quaternion(quat[3], *quat[:3]).toRotationMatrix()
                P[iq + 3:iq + 7, iv + 3:iv + 6] = _quat_tangent(quat)
                quat_q.update(range(iq, iq + 7))
                quat_v.update(range(iv, iv + 6))
            else:
                P[iq:iq + 4, iv:iv + 3] = _quat_tangent(q[iq:iq + 4])
                quat_q.update(range(iq, iq + 4))
                quat_v.update(range(iv, iv + 3))
        rest_q = [i for i in range(self.nq) if i not in quat_q]
        rest_v = [i for i in range(self.nv) if i not in quat_v]
        P[rest_q, rest_v] = 1.0
        return P

    # -- gymnasium API --------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        x = np.asarray(self._reset_state(self.np_random), dtype=float)
        if x.shape != (self.state_size,):
            raise RuntimeError(f"{type(self).__name__}._reset_state returned shape {x.shape}, "
                               f"expected ({self.state_size},)")
        self._x = x
        self._elapsed = 0
        self.sim.reset_warmstart()
        obs, _ = self._observe(self._x)
        if self.render_mode == "human":
            self._show()
        return obs, {}

    def step(self, action):
        obs, r, term, trunc, info, _ = self._step(action, jacobian=False)
        return obs, r, term, trunc, info

    def step_with_jacobian(self, action):
        """``step`` plus the :class:`EnvJacobian` of this step (analytical, no differences)."""
        return self._step(action, jacobian=True)

    def render(self):
        if self.render_mode == "human":
            self._show()
            return None
        if self.render_mode != "rgb_array":
            raise RuntimeError(f"render() needs render_mode='rgb_array' or 'human' (got {self.render_mode!r})")
        return self._frame()

    def _frame(self) -> np.ndarray:
        self._require_reset()
        if self._renderer is None:
            from diffgym.render import Camera, Renderer
            cam = Camera(**self.camera) if self.camera else None
            self._renderer = Renderer(self.sim, width=self._width, height=self._height, camera=cam)
        return self._renderer.render(self._x[:self.nq], **self._render_kwargs())

    def _render_kwargs(self) -> dict:
        return {}

    def _show(self) -> None:
        """render_mode='human': draw the current frame in a pygame window at the env's rate."""
        import pygame
        frame = self._frame()
        if self._window is None:
            pygame.display.init()
            pygame.display.set_caption(f"diffgym {self.spec.id if self.spec else type(self).__name__}")
            self._window = (pygame.display.set_mode((frame.shape[1], frame.shape[0])), pygame.time.Clock())
        screen, clock = self._window
        pygame.event.pump()
        screen.blit(pygame.surfarray.make_surface(np.ascontiguousarray(frame.swapaxes(0, 1))), (0, 0))
        pygame.display.flip()
        clock.tick(self.metadata["render_fps"])

    def close(self) -> None:
        if getattr(self, "_window", None) is not None:
            import pygame
            pygame.display.quit()
            self._window = None
        super().close()

    # -- pickling and copying -------------------------------------------------------------------
    # The simulator pickles itself (rebuilt from its model file, warm start kept); the RNG, the
    # state and the episode clock are plain attributes. The renderer and a human-mode window are
    # rebuilt on the next render().
    # pinocchio Data / GeometryData held by a subclass (scratch for its own kinematics) are
    # rebuilt empty from the simulator's models.
    def __getstate__(self):
        d = dict(self.__dict__)
        d["_renderer"] = None
        d["_window"] = None
        for k, v in d.items():
            if isinstance(v, pin.GeometryData):
                d[k] = _Scratch("geometry")
            elif isinstance(v, pin.Data):
                d[k] = _Scratch("data")
        return d

    def __setstate__(self, d) -> None:
        self.__dict__.update(d)
        for k, v in d.items():
            if isinstance(v, _Scratch):
                setattr(self, k, self.sim.model.createData() if v.kind == "data"
                        else pin.GeometryData(self.sim.geom_model))

    # -- the step -------------------------------------------------------------------------------
    def _require_reset(self) -> None:
        if self._x is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() before step()/get_state()")

    def _check_action(self, action, inside: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """(the action clipped to [-1, 1], 1.0 where it was inside and 0.0 where clipped) with
        its checks; ``inside=False`` (a plain step: only the Jacobian reads it) gives None."""
        try:
            a = np.asarray(action, dtype=float)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{type(self).__name__}: action must be an array of {self.n_a} real "
                            f"numbers, got {type(action).__name__}") from exc
        if a.shape != (self.n_a,):
            if a.size == self.n_a and a.ndim <= 2:
                a = a.reshape(self.n_a)
            else:
                raise ValueError(f"{type(self).__name__}: action must have shape ({self.n_a},), "
                                 f"got {a.shape}")
        s = float(_add(a))              # (finite when every entry is: the full test then only)
        if s - s != 0.0 and not np.all(np.isfinite(a)):
            raise ValueError(f"{type(self).__name__}: action has NaN/inf at index "
                             f"{np.flatnonzero(~np.isfinite(a)).tolist()}: {a}")
        # (np.clip's Python wrapper costs more than the two ufuncs; the same values)
        clipped = _minimum(_maximum(a, -1.0), 1.0)
        if not inside:
            return clipped, None
        return clipped, (clipped == a).astype(float)        # (1: a inside [-1, 1])

    def _step(self, action, jacobian: bool):
        self._derivs = jacobian        # (a plain step: the hooks may skip their derivatives)
        try:
            return self._step_body(action, jacobian)
        finally:
            self._derivs = True

    def _step_body(self, action, jacobian: bool):
        self._require_reset()
        a, inside = self._check_action(action, jacobian)
        x = self._x
        nq, nv, nd = self.nq, self.nv, self.n_diff
        n0 = nq + nv
        if jacobian:
            Jxx = np.eye(self.n_x)
            Jxa = np.zeros((self.n_x, self.n_a))
        first = True
        diverged = False
        xk = x
        # (the default forces depend on the action only: the same for every substep, and the
        # substeps then need no full state in between)
        fixed = self._forces(x, a) if type(self)._forces is DiffEnv._forces else None
        q, v = x[:nq], x[nq:n0]            # (views of x, which no step writes to)
        for _ in range(self.frame_skip):
            tau, dtau_dx, dtau_da = fixed if fixed is not None else self._forces(xk, a)
            try:
                if jacobian:
                    q1, v1, sj = self.sim.step(q, v, tau, jacobian=True)
                else:
                    q1, v1 = self.sim.step(q, v, tau)
            except SimulationError:
                diverged = True
                break
            if jacobian:
                F = np.zeros((self.n_x, self.n_x))
                F[:nv, :nv], F[:nv, nv:2 * nv] = sj.dq_dq, sj.dq_dv
                F[nv:2 * nv, :nv], F[nv:2 * nv, nv:2 * nv] = sj.dv_dq, sj.dv_dv
                Ftau = np.vstack([sj.dq_dtau, sj.dv_dtau])           # (2nv, nv)
                if nd:
                    F[2 * nv:, 2 * nv:] = np.eye(nd)
                if dtau_dx is not None:
                    F[:2 * nv] += Ftau @ dtau_dx
                Fa = np.zeros((self.n_x, self.n_a))
                Fa[:2 * nv] = Ftau @ dtau_da
                if first:                    # (Jxx = I, Jxa = 0: skip an n_x^3 product by I)
                    Jxx, Jxa, first = F, Fa, False
                else:
                    Jxx = F @ Jxx
                    Jxa = F @ Jxa + Fa
            q, v = q1, v1
            if fixed is None:                # (the forces of the next substep read its state)
                xk = xk.copy()
                xk[:nq], xk[nq:n0] = q1, v1
        if xk is x:
            xk = x.copy()
            xk[:nq], xk[nq:n0] = q, v
        if nd and not diverged:
            e, de_dx, de_da = self._extra_next(x, a)
            xk[n0:n0 + nd] = e
            if jacobian:
                # the extras depend on the state and action at the start of the step
                Jxx[2 * nv:] = 0.0 if de_dx is None else de_dx
                Jxa[2 * nv:] = 0.0 if de_da is None else de_da
        if diverged:
            xk = x.copy()
        self._x = xk
        self._elapsed += 1
        obs, dobs = self._observe(xk)
        r, terms, dr_dxn, dr_da = self._reward(xk, a)
        info: dict[str, Any] = dict(terms)
        info["diverged"] = diverged
        terminated = bool(diverged or self._terminated(xk))
        truncated = bool(self._elapsed >= self.episode_steps and not terminated)
        if self.render_mode == "human":
            self._show()
        if not jacobian:
            return obs, float(r), terminated, truncated, info, None
        if diverged:
            Jxx[:], Jxa[:] = 0.0, 0.0
        Jxa = Jxa * inside                       # clipped action components have no effect
        dr_da = np.asarray(dr_da, dtype=float) * inside
        jac = EnvJacobian(
            state_state=Jxx, state_action=Jxa,
            reward_state=dr_dxn @ Jxx,
            reward_action=dr_da + dr_dxn @ Jxa,
            obs_state=dobs)
        return obs, float(r), terminated, truncated, info, jac
