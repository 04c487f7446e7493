"""Vectorized environments: N copies with batched step Jacobians, in this process or spread
over worker processes.

``diffgym.make_vec("DiffHopper-v0", num_envs=16, seed=0)`` (or Gymnasium's
``gym.make_vec(id, 16, vectorization_mode="vector_entry_point")``) returns a
:class:`DiffVectorEnv`, a ``gymnasium.vector.VectorEnv`` with

- batched Box spaces, float64 observations, actions in [-1, 1];
- same-step autoreset: the observation row of an environment whose episode ended this step is
  already its reset observation; ``info["final_obs"]`` (N, n_obs) holds the last observation of
  every row (the terminal one where ``info["_final_obs"]`` is set) and ``info["final_state"]``
  (N, state_size) the matching states;
- ``step_with_jacobian(actions)``: the same step plus a :class:`BatchedJacobian` whose arrays
  have a leading N axis; a done row's Jacobian is that of the step that ended its episode;
- ``get_state()`` / ``set_state(X)``, ``snapshot()`` / ``restore(snaps)`` over all copies,
  ``tangent_maps()``, ``observe()``, and Gymnasium's ``call`` / ``get_attr`` / ``set_attr``.

**Worker processes.** ``num_workers`` (default: :func:`default_num_workers`) splits the copies
in that many contiguous blocks stepped in parallel: block 0 by this process (which would
otherwise wait), every other block by a worker process. A worker builds its own environments
from the id, the keyword arguments and the seeds it is sent (nothing simulated is pickled);
actions, observations, rewards, flags, states and Jacobians go through one block of shared
memory, so a vector step costs one small message to and from each worker (plus the info dicts).
Every copy performs exactly the operations it would perform alone, so the same seeds and
actions give bit-identical trajectories and Jacobians with any number of workers.
``num_workers=1`` keeps every copy in this process (``venv.envs`` then lists them; with workers
the copies are reachable through the methods above).

Workers are daemonic and stop on ``close()`` (also called by ``with``, garbage collection and
at interpreter exit); a worker whose parent dies notices within a second (end of its pipe, or
its parent process id changing) and exits. An exception inside a worker is re-raised in the
parent as :class:`VectorEnvError` naming the copy (its index in the batch), the worker and the
worker's traceback; the original exception is its ``__cause__`` when it could be pickled. (With
``num_workers=1`` the original exception propagates, with a note naming the copy.)

Start method: ``start_method=None`` is multiprocessing's default for the platform ("fork" on
Linux up to Python 3.13, as Gymnasium's ``AsyncVectorEnv``): workers start in milliseconds and
need no ``if __name__ == "__main__":`` guard. A forked worker runs only numpy, pinocchio and
the compiled kernels, never torch, so the threads torch may hold in the parent do not matter.
``"spawn"`` and ``"forkserver"`` (which preloads diffgym in its server) work too; like any
spawned process they need the main guard in a script.
"""
from __future__ import annotations

import atexit
import math
import multiprocessing as mp
import os
import pickle
import signal
import traceback
import weakref
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

# Fewest copies per block for the default. Not a measured crossover: a worker step costs the
# parent about 0.4 ms of CPU per vector step (hopper, N = 16, from /proc CPU times), and 8
# copies of the cheapest environment (cart-pole, ~0.1-0.3 ms a step with Jacobians) are about
# that much work, so smaller blocks would spend more on messages than they gain.
MIN_ENVS_PER_WORKER = 8


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_num_workers(num_envs: int) -> int:
    """The ``num_workers`` ``make_vec`` uses when none is given: one block of copies per core
    this process may run on (``os.sched_getaffinity``), but at least
    :data:`MIN_ENVS_PER_WORKER` copies per block; 1 (all copies in this process, no worker
    process) with a single core, fewer than ``2 * MIN_ENVS_PER_WORKER`` copies, or inside a
    daemonic process (which may not start children, e.g. a multiprocessing pool worker; a
    sweep that runs one trial per core should ask for ``num_workers=1`` anyway).

    The environment variable ``DIFFGYM_NUM_WORKERS`` (a positive integer), when set, replaces
    the rule: ``diffgym sweep`` sets it to 1 in its trial processes, which already run one per
    core.

    The rule depends on the machine, never on its momentary load, so a run's configuration
    does not change with what else is running (results are bit-identical with any number of
    workers either way). On a machine whose cores are all busy with other work, workers gain
    little or lose (``python -m diffgym.bench_envs`` measures both); pass ``num_workers=1``."""
    if mp.current_process().daemon:
        return 1
    env = os.environ.get("DIFFGYM_NUM_WORKERS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"environment variable DIFFGYM_NUM_WORKERS: expected a positive "
                             f"integer, got {env!r}")
        return min(n, max(1, int(num_envs)))
    return max(1, min(available_cores(), int(num_envs) // MIN_ENVS_PER_WORKER))


class VectorEnvError(RuntimeError):
    """An exception raised inside a worker process, re-raised in the parent.

    ``env_index`` is the copy's index in the batch (None when the failure is not tied to one
    copy), ``worker`` the worker's number and ``remote_traceback`` its formatted traceback."""

    def __init__(self, message: str, env_index: int | None = None, worker: int | None = None,
                 remote_traceback: str = ""):
        super().__init__(message)
        self.env_index, self.worker, self.remote_traceback = env_index, worker, remote_traceback


@dataclass
class BatchedJacobian:
    state_state: np.ndarray    # (N, n_x, n_x)
    state_action: np.ndarray   # (N, n_x, n_a)
    reward_state: np.ndarray   # (N, n_x)
    reward_action: np.ndarray  # (N, n_a)
    obs_state: np.ndarray      # (N, n_obs, n_x)


_JAC_FIELDS = ("state_state", "state_action", "reward_state", "reward_action", "obs_state")


def _layout(N: int, n_a: int, n_obs: int, S: int, n_x: int) -> dict[str, tuple[tuple, type]]:
    """Name -> (shape, dtype) of every per-step array of a batch, in buffer order."""
    return {
        "actions": ((N, n_a), np.float64), "obs": ((N, n_obs), np.float64),
        "state": ((N, S), np.float64), "final_obs": ((N, n_obs), np.float64),
        "final_state": ((N, S), np.float64), "rew": ((N,), np.float64),
        "state_state": ((N, n_x, n_x), np.float64), "state_action": ((N, n_x, n_a), np.float64),
        "reward_state": ((N, n_x), np.float64), "reward_action": ((N, n_a), np.float64),
        "obs_state": ((N, n_obs, n_x), np.float64),
        "term": ((N,), np.bool_), "trunc": ((N,), np.bool_),
    }


def _nbytes(layout) -> int:
    return sum(_aligned(math.prod(shape) * np.dtype(dt).itemsize) for shape, dt in layout.values())


def _aligned(n: int) -> int:
    return (n + 63) // 64 * 64


class _Batch:
    """The per-step arrays of a batch as attributes: views into one shared buffer (workers) or
    freshly allocated arrays (one vector step in this process)."""

    def __init__(self, layout, buffer=None):
        off = 0
        for name, (shape, dt) in layout.items():
            if buffer is None:
                arr = np.empty(shape, dtype=dt)
            else:
                count = math.prod(shape)
                arr = np.frombuffer(buffer, dtype=dt, count=count, offset=off).reshape(shape)
                off += _aligned(count * np.dtype(dt).itemsize)
            setattr(self, name, arr)


def _step_envs(envs, lo: int, b: _Batch, jacobian: bool) -> list[dict]:
    """Step copies ``lo, lo+1, ...`` (``envs[k]`` is copy ``lo + k``) with the actions in ``b``
    and write their rows of ``b``; returns their info dicts. The single implementation behind
    both the in-process and the worker step, so the two cannot drift apart."""
    infos = []
    i = lo
    try:
        for i, env in enumerate(envs, lo):
            o, r, te, tr, inf, jac = env._step(b.actions[i], jacobian)
            b.final_obs[i] = o
            b.final_state[i] = env._x
            b.rew[i], b.term[i], b.trunc[i] = r, te, tr
            if te or tr:
                o, _ = env.reset()
            b.obs[i] = o
            b.state[i] = env._x
            if jacobian:
                b.state_state[i] = jac.state_state
                b.state_action[i] = jac.state_action
                b.reward_state[i] = jac.reward_state
                b.reward_action[i] = jac.reward_action
                b.obs_state[i] = jac.obs_state
            infos.append(inf)
    except Exception as exc:
        exc._diffgym_env_index = i
        raise
    return infos


def _batch_info(infos: list[dict], b: _Batch) -> dict:
    info = {k: np.array([d.get(k, np.nan) for d in infos]) for k in infos[0]}
    info["final_obs"], info["final_state"] = b.final_obs, b.final_state
    info["_final_obs"] = b.term | b.trunc
    return info


# ---------------------------------------------------------------------------------------------
# Worker processes
# ---------------------------------------------------------------------------------------------
def _handle(envs, lo: int, b: _Batch, cmd: str, arg):
    """Run one command on copies ``lo, lo+1, ...`` (``envs[k]`` is copy ``lo + k``) whose rows of
    the batch ``b`` they read and write. The same function serves the worker processes and the
    block of copies the parent steps itself. An exception is tagged with the copy's index."""
    i = None
    try:
        if cmd == "step":
            return _step_envs(envs, lo, b, arg)
        if cmd == "reset":
            seeds, options = arg
            for i, env, s in zip(range(lo, lo + len(envs)), envs, seeds):
                b.obs[i] = env.reset(seed=s, options=options)[0]
                b.state[i] = env._x
            return None
        if cmd == "set_state":
            for i, env in enumerate(envs, lo):
                env.set_state(b.state[i])
            return None
        if cmd == "snapshot":
            return [env.snapshot() for env in envs]
        if cmd == "restore":
            for i, env, snap in zip(range(lo, lo + len(envs)), envs, arg):
                env.restore(snap)
                b.state[i] = env._x
            return None
        if cmd == "observe":
            return np.stack([env._observe(x)[0] for env, x in zip(envs, arg)])
        if cmd == "call":
            name, args, kwargs = arg
            out = []
            for i, env in enumerate(envs, lo):
                f = getattr(env, name)
                out.append(f(*args, **kwargs) if callable(f) else f)
            return out
        if cmd == "get_attr":
            return [getattr(env, arg) for env in envs]
        if cmd == "set_attr":
            name, values = arg
            for i, env, val in zip(range(lo, lo + len(envs)), envs, values):
                setattr(env, name, val)
            return None
        raise ValueError(f"unknown command {cmd!r}")
    except Exception as exc:
        if getattr(exc, "_diffgym_env_index", None) is None:
            exc._diffgym_env_index = i
        raise


def _worker_main(conn, buffer, layout, env_id, env_kwargs, lo, hi, inherited):
    """A worker: builds copies ``lo .. hi-1`` itself and serves commands until told to close,
    its pipe ends, or its parent process goes away."""
    for c in inherited:                # fork: ends of the parent's pipes this process holds
        c.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the parent's to handle
    ppid = os.getppid()

    def reply_error(exc, idx=None):
        try:
            cause = pickle.dumps(exc)
        except Exception:
            cause = None
        idx = getattr(exc, "_diffgym_env_index", idx)
        conn.send(("error", idx, f"{type(exc).__name__}: {exc}", traceback.format_exc(), cause))

    i = lo
    try:
        import diffgym.envs  # noqa: F401  (registers the ids)
        b = _Batch(layout, buffer)
        envs = []
        for i in range(lo, hi):
            envs.append(gym.make(env_id, **env_kwargs).unwrapped)
        conn.send(("ok", None))
    except Exception as exc:
        reply_error(exc, i)
        return
    while True:
        try:
            while not conn.poll(1.0):
                if os.getppid() != ppid:          # the parent died (we were re-parented)
                    return
            cmd, arg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if cmd == "close":
                for env in envs:
                    env.close()
                conn.send(("ok", None))
                return
            conn.send(("ok", _handle(envs, lo, b, cmd, arg)))
        except Exception as exc:
            try:
                reply_error(exc)
            except (BrokenPipeError, OSError):
                return
        except BaseException:
            return


class _WorkerPool:
    """The copies split in ``num_workers`` contiguous blocks: block 0 is stepped by this process
    (it would otherwise wait idle), block ``w >= 1`` by worker process ``w``."""

    def __init__(self, env_id, env_kwargs, num_envs, num_workers, layout, start_method, env0):
        ctx = mp.get_context(start_method)
        start_method = ctx.get_start_method()
        if start_method == "forkserver":
            ctx.set_forkserver_preload(["diffgym"])
        self.env_id, self.start_method = env_id, start_method
        self.buffer = ctx.RawArray("B", _nbytes(layout))
        self.batch = _Batch(layout, self.buffer)
        q, r = divmod(num_envs, num_workers)
        sizes = [q + (w < r) for w in range(num_workers)]
        self.bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        self.num_workers = num_workers
        self.procs, self.conns = [], []
        self.closed = False
        self.local = []
        try:
            for w in range(1, num_workers):
                parent, child = ctx.Pipe(duplex=True)
                inherited = [parent, *self.conns] if start_method == "fork" else []
                p = ctx.Process(target=_worker_main, name=f"diffgym-{env_id}-worker{w}", daemon=True,
                                args=(child, self.buffer, layout, env_id, env_kwargs,
                                      self.bounds[w], self.bounds[w + 1], inherited))
                p.start()
                child.close()
                self.procs.append(p)
                self.conns.append(parent)
            # while the workers build theirs, this process builds block 0
            self.local = [env0] + [gym.make(env_id, **env_kwargs).unwrapped
                                   for _ in range(self.bounds[1] - 1)]
            self.gather(what="building the environments")
        except BaseException:
            self.close(graceful=False)
            raise
        _live_pools.add(self)

    def rows(self, w: int) -> slice:
        return slice(self.bounds[w], self.bounds[w + 1])

    def run(self, cmd: str, args=None, what: str = "") -> list:
        """``cmd`` on every block (``args``: one argument for all, or a :class:`_PerWorker` list
        with one per block); returns the blocks' results in order, or raises the first error."""
        if self.closed:
            raise RuntimeError(f"{self.env_id} vector env: the worker processes are closed")
        per = isinstance(args, _PerWorker)
        for w, c in enumerate(self.conns, 1):
            c.send((cmd, args[w] if per else args))
        local_err = None
        try:
            out0 = _handle(self.local, 0, self.batch, cmd, args[0] if per else args)
        except Exception as exc:
            out0, local_err = None, exc
        rest = self.gather(what, first_error=local_err)
        return [out0, *rest]

    def _error(self, w, idx, msg, tb, what) -> VectorEnvError:
        pid = os.getpid() if w == 0 else self.procs[w - 1].pid
        where = (f"copy {idx}" if idx is not None
                 else f"copies {self.bounds[w]}..{self.bounds[w + 1] - 1}")
        return VectorEnvError(f"{self.env_id} vector env: {where} (worker {w}, pid {pid}) raised "
                              f"{msg}{' while ' + what if what else ''}\n--- worker traceback ---\n{tb}",
                              env_index=idx, worker=w, remote_traceback=tb)

    def gather(self, what: str = "", first_error: BaseException | None = None) -> list:
        """Every worker process's reply (all are read, so the pipes stay in step), then the first
        error (``first_error``: one raised in this process's block)."""
        err = None
        if first_error is not None:
            err = self._error(0, getattr(first_error, "_diffgym_env_index", None),
                              f"{type(first_error).__name__}: {first_error}",
                              "".join(traceback.format_exception(first_error)), what)
            err.__cause__ = first_error
        outs = []
        for w, (c, p) in enumerate(zip(self.conns, self.procs), 1):
            try:
                while not c.poll(1.0):
                    if not p.is_alive():
                        raise EOFError
                status, *payload = c.recv()
            except (EOFError, OSError):
                p.join(timeout=1.0)
                err = err or VectorEnvError(
                    f"{self.env_id} vector env: worker {w} (pid {p.pid}, copies {self.bounds[w]}.."
                    f"{self.bounds[w + 1] - 1}) died{' while ' + what if what else ''} (exit code "
                    f"{p.exitcode})", worker=w)
                outs.append(None)
                continue
            if status == "ok":
                outs.append(payload[0])
                continue
            idx, msg, tb, cause = payload
            e = self._error(w, idx, msg, tb, what)
            if cause is not None:
                try:
                    e.__cause__ = pickle.loads(cause)
                except Exception:
                    pass
            err = err or e
            outs.append(None)
        if err is not None:
            raise err
        return outs

    def close(self, graceful: bool = True) -> None:
        if self.closed:
            return
        self.closed = True
        _live_pools.discard(self)
        if graceful:
            for c in self.conns:
                try:
                    c.send(("close", None))
                except (BrokenPipeError, OSError):
                    pass
        for p in self.procs:
            p.join(timeout=5.0 if graceful else 0.0)
            if p.is_alive():
                p.terminate()
                p.join(timeout=1.0)
        for c in self.conns:
            c.close()
        for env in self.local:
            env.close()


class _PerWorker(list):
    """Marks a send() argument holding one entry per worker."""


_live_pools: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_live_pools):
        pool.close()


# ---------------------------------------------------------------------------------------------
# The vector environment
# ---------------------------------------------------------------------------------------------
class DiffVectorEnv(gym.vector.VectorEnv):
    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "render_modes": ["rgb_array"]}

    def __init__(self, env_id: str, num_envs: int, seed: int | None = None,
                 num_workers: int | None = None, start_method: str | None = None, **env_kwargs):
        if not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        if num_workers is None:
            num_workers = default_num_workers(num_envs)
        elif not isinstance(num_workers, (int, np.integer)) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive integer or None, got {num_workers!r}")
        if start_method is not None and start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method must be one of {mp.get_all_start_methods()} or None, "
                             f"got {start_method!r}")
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self.num_workers = min(int(num_workers), self.num_envs)
        if self.num_workers > 1 and mp.current_process().daemon:
            raise ValueError(f"num_workers={num_workers}: this is a daemonic process, which may "
                             "not start worker processes; use num_workers=1")
        self._pool: _WorkerPool | None = None
        self._envs: list | None = None
        e0 = gym.make(env_id, **env_kwargs).unwrapped
        if self.num_workers == 1:
            self._envs = [e0] + [gym.make(env_id, **env_kwargs).unwrapped for _ in range(self.num_envs - 1)]
        self._proto = e0           # copy 0 (in this process in both modes): the model's structure
        self.single_observation_space = e0.observation_space
        self.single_action_space = e0.action_space
        self.observation_space = gym.vector.utils.batch_space(e0.observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(e0.action_space, self.num_envs)
        self.metadata = dict(self.metadata, render_fps=e0.metadata["render_fps"])
        self.render_mode = env_kwargs.get("render_mode")
        self.spec = e0.spec
        self.n_x, self.n_a, self.state_size, self.obs_dim = e0.n_x, e0.n_a, e0.state_size, e0.obs_dim
        # True when the tangent map is [I; 0] (no quaternion in q): the torch bridge skips it
        self.identity_tangent = not e0._quat_rows
        # the gradient mode every copy's step Jacobians use (env_kwargs "gradient", passed to
        # gym.make in this process and in the workers)
        self.gradient = e0.gradient
        self._layout = _layout(self.num_envs, self.n_a, self.obs_dim, self.state_size, self.n_x)
        self._seed = seed
        self._needs_reset = True
        self.version = 0           # counts the changes of the copies' states (step, reset, set...)
        if self.num_workers > 1:
            self._pool = _WorkerPool(env_id, env_kwargs, self.num_envs, self.num_workers,
                                     self._layout, start_method, e0)

    @property
    def envs(self) -> list:
        """The copies, when they live in this process (``num_workers=1``)."""
        if self._envs is None:
            raise AttributeError(f"{self.env_id} vector env: the {self.num_envs} copies live in "
                                 f"{self.num_workers} worker processes; use get_state/set_state, "
                                 "snapshot/restore, call/get_attr/set_attr (or num_workers=1)")
        return self._envs

    # -- gymnasium API --------------------------------------------------------------------------
    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        if seed is None:
            seed = self._seed
            self._seed = None            # only the first reset uses the constructor's seed
        seeds = (list(seed) if isinstance(seed, (list, tuple, np.ndarray))
                 else [None if seed is None else int(seed) + i for i in range(self.num_envs)])
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset: {len(seeds)} seeds given for {self.num_envs} environments")
        self.version += 1
        if self._pool is None:
            obs = np.empty((self.num_envs, self.obs_dim))
            for i, (env, s) in enumerate(zip(self._envs, seeds)):
                obs[i] = env.reset(seed=s, options=options)[0]
        else:
            pool = self._pool
            pool.run("reset", _PerWorker((seeds[pool.rows(w)], options) for w in range(self.num_workers)),
                     "resetting")
            obs = pool.batch.obs.copy()
        self._needs_reset = False
        return obs, {}

    def step(self, actions):
        out = self._step(actions, jacobian=False)
        return out[:5]

    def step_with_jacobian(self, actions):
        return self._step(actions, jacobian=True)

    def _check_actions(self, actions) -> np.ndarray:
        a = np.asarray(actions, dtype=float)
        if a.shape != (self.num_envs, self.n_a):
            raise ValueError(f"{self.env_id} vector step: actions must have shape "
                             f"({self.num_envs}, {self.n_a}), got {a.shape}")
        if not np.isfinite(a).all():
            rows = np.flatnonzero(~np.isfinite(a).all(axis=1)).tolist()
            raise ValueError(f"{self.env_id} vector step: actions have NaN/inf in rows {rows}")
        return a

    def _step(self, actions, jacobian: bool):
        if self._needs_reset:
            raise RuntimeError("DiffVectorEnv: call reset() before step()")
        a = self._check_actions(actions)
        self.version += 1
        if self._pool is None:
            b = _Batch(self._layout)
            b.actions = a
            try:
                infos = _step_envs(self._envs, 0, b, jacobian)
            except Exception as exc:
                idx = getattr(exc, "_diffgym_env_index", None)
                if idx is not None:
                    exc.add_note(f"(in copy {idx} of the {self.env_id} vector env)")
                raise
            out = b
        else:
            pool = self._pool
            np.copyto(pool.batch.actions, a)
            infos = [d for part in pool.run("step", jacobian, "stepping") for d in part]
            sb = pool.batch
            out = _Batch({})
            for name in ("obs", "final_obs", "final_state", "rew", "term", "trunc"):
                setattr(out, name, getattr(sb, name).copy())
            if jacobian:
                for name in _JAC_FIELDS:
                    setattr(out, name, getattr(sb, name).copy())
        info = _batch_info(infos, out)
        if not jacobian:
            return out.obs, out.rew, out.term, out.trunc, info, None
        bj = BatchedJacobian(*(getattr(out, f) for f in _JAC_FIELDS))
        return out.obs, out.rew, out.term, out.trunc, info, bj

    # -- state ------------------------------------------------------------------------------------
    def get_state(self) -> np.ndarray:
        if self._pool is None:
            X = np.empty((self.num_envs, self.state_size))
            for i, env in enumerate(self._envs):
                env._require_reset()
                X[i] = env._x
            return X
        if self._needs_reset:
            self._proto._require_reset()      # raises: call reset() before get_state()
        return self._pool.batch.state.copy()

    def set_state(self, X) -> None:
        X = np.asarray(X, dtype=float)
        if X.shape != (self.num_envs, self.state_size):
            raise ValueError(f"set_state: states must have shape ({self.num_envs}, "
                             f"{self.state_size}), got {X.shape}")
        if not np.isfinite(X).all():
            rows = np.flatnonzero(~np.isfinite(X).all(axis=1)).tolist()
            raise ValueError(f"set_state: states have NaN/inf in rows {rows}")
        self.version += 1
        if self._pool is None:
            for env, x in zip(self._envs, X):
                env.set_state(x)
        else:
            np.copyto(self._pool.batch.state, X)
            self._pool.run("set_state", None, "setting the state")
        self._needs_reset = False

    def snapshot(self) -> list[dict]:
        """Each copy's ``snapshot()`` (state, episode step count, reset RNG, warm start)."""
        if self._pool is None:
            return [e.snapshot() for e in self._envs]
        if self._needs_reset:
            self._proto._require_reset()
        return [s for part in self._pool.run("snapshot", None, "taking a snapshot") for s in part]

    def restore(self, snaps: list[dict]) -> None:
        if len(snaps) != self.num_envs:
            raise ValueError(f"the snapshot holds {len(snaps)} environments, this vector env has "
                             f"{self.num_envs}")
        self.version += 1
        if self._pool is None:
            for e, snap in zip(self._envs, snaps):
                e.restore(snap)
        else:
            pool = self._pool
            pool.run("restore", _PerWorker(list(snaps[pool.rows(w)]) for w in range(self.num_workers)),
                     "restoring a snapshot")
        self._needs_reset = False

    def tangent_maps(self, X=None) -> np.ndarray:
        """P (N, state_size, n_x) of every copy (``DiffEnv.tangent_map``) at X (default: now)."""
        X = self.get_state() if X is None else np.asarray(X, dtype=float)
        P = np.empty((len(X), self.state_size, self.n_x))
        for i, x in enumerate(X):
            P[i] = self._proto.tangent_map(x)
        return P

    def observe(self, X=None) -> np.ndarray:
        X = self.get_state() if X is None else np.asarray(X, dtype=float)
        if self._pool is None:
            return np.stack([env._observe(x)[0] for env, x in zip(self._envs, X)])
        pool = self._pool
        return np.concatenate(pool.run("observe", _PerWorker(X[pool.rows(w)] for w in range(self.num_workers)),
                                       "observing"))

    def call(self, name: str, *args, **kwargs) -> tuple:
        """``getattr(copy, name)(*args, **kwargs)`` on every copy (an attribute's value if it is
        not callable), as Gymnasium's vector envs; the copies are the unwrapped environments."""
        self.version += 1
        if self._pool is None:
            out = []
            for env in self._envs:
                f = getattr(env, name)
                out.append(f(*args, **kwargs) if callable(f) else f)
            return tuple(out)
        return tuple(x for part in self._pool.run("call", (name, args, kwargs), f"calling {name}") for x in part)

    def get_attr(self, name: str) -> tuple:
        if self._pool is None:
            return tuple(getattr(env, name) for env in self._envs)
        return tuple(x for part in self._pool.run("get_attr", name, f"reading {name}") for x in part)

    def set_attr(self, name: str, values) -> None:
        """Set ``name`` on every copy: one value for all, or a list/tuple with one per copy."""
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr: {len(values)} values for {self.num_envs} environments")
        self.version += 1
        if self._pool is None:
            for env, v in zip(self._envs, values):
                setattr(env, name, v)
            return
        pool = self._pool
        pool.run("set_attr", _PerWorker((name, list(values[pool.rows(w)])) for w in range(self.num_workers)),
                 f"setting {name}")

    def render(self):
        return self._proto.render()       # copy 0 lives in this process in both modes

    def close_extras(self, **kwargs):
        if self._pool is not None:
            self._pool.close()
        if self._envs is not None:
            for env in self._envs:
                env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __del__(self):
        try:
            if not self.closed and getattr(self, "_pool", None) is not None:
                self._pool.close()
        except Exception:
            pass


def make_vec(env_id: str, num_envs: int = 1, seed: int | None = None, num_workers: int | None = None,
             start_method: str | None = None, **env_kwargs) -> DiffVectorEnv:
    """N copies of a diffgym environment in one :class:`DiffVectorEnv`.

    ``num_workers``: processes stepping the copies in parallel, this one included (None:
    :func:`default_num_workers`; 1: all copies in this process); ``start_method``: the
    multiprocessing start method of the worker processes. Other keywords go to ``gym.make``,
    e.g. ``gradient="smooth"`` (or ``{"mode": "smooth", "rho": 1e-3}``): the gradient mode of
    every copy (``diffgym.sim.gradient_modes``; the vector env's ``gradient`` attribute)."""
    import diffgym.envs  # noqa: F401  (registers the ids)
    if env_id not in gym.registry:
        raise gym.error.NameNotFound(f"unknown environment id {env_id!r}")
    return DiffVectorEnv(env_id, num_envs, seed=seed, num_workers=num_workers,
                         start_method=start_method, **env_kwargs)


def vector_entry_point(env_id: str, num_envs: int = 1, **env_kwargs) -> DiffVectorEnv:
    """Gymnasium's ``vector_entry_point`` for the diffgym ids (registered with functools.partial)."""
    return DiffVectorEnv(env_id, num_envs, **env_kwargs)
