"""Training configuration: YAML validated into typed dataclasses.

    cfg = load_config("configs/cartpole_shac.yaml", overrides=["shac.actor_lr=1e-3", "seed=2"])

An unknown key, a value of the wrong type or a missing file raises :class:`ConfigError` naming
the dotted key (and the file). Overrides are ``dotted.key=value`` with the value read as YAML
(``1e-3``, ``[64, 64]``, ``true``).
"""
from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key and the file."""


@dataclass
class EnvConfig:
    id: str = "DiffCartPole-v0"
    num_envs: int = 64
    kwargs: dict = field(default_factory=dict)      # passed to gym.make
    episode_steps: int | None = None                # None: the environment's default
    num_workers: int | None = None                  # processes stepping the copies (None: make_vec's default)


@dataclass
class PPOConfig:
    """stable-baselines3 PPO settings (n_steps is the horizon per environment)."""
    n_steps: int = 240
    batch_size: int = 3840
    n_epochs: int = 5
    learning_rate: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    net_arch: list = field(default_factory=lambda: [64, 64])
    log_std_init: float = 0.0
    normalize_obs: bool = True          # VecNormalize: running mean/std of the observations
    normalize_reward: bool = True       # VecNormalize: rewards scaled by the discounted-return std
    lr_schedule: str = "constant"       # or "linear" (to 0 at total_env_steps)
    target_kl: float | None = None      # stop an update's epochs early past this KL (SB3)


@dataclass
class SHACConfig:
    horizon: int = 32
    actor_lr: float = 1e-2
    critic_lr: float = 1e-3
    lam: float = 0.95
    gamma: float = 0.99
    target_alpha: float = 0.2
    critic_iterations: int = 16
    critic_minibatches: int = 4
    actor_mlp: list = field(default_factory=lambda: [64, 64])
    critic_mlp: list = field(default_factory=lambda: [64, 64])
    grad_norm: float = 1.0
    obs_norm: bool = True
    lr_schedule: str = "linear"
    betas: list = field(default_factory=lambda: [0.7, 0.95])
    actor_log_std_init: float = -1.0
    reward_scale: float = 1.0
    bound_coef: float = 0.0
    # the step Jacobians the actor's gradient flows through (diffgym.sim.gradient_modes): "exact",
    # "smooth" or "long_range", or a mapping such as {mode: smooth, rho: 1.0e-3}
    gradient: str | dict = "exact"


@dataclass
class TrainConfig:
    algo: str = "shac"                 # "shac" or "ppo"
    env: EnvConfig = field(default_factory=EnvConfig)
    seed: int = 0
    total_env_steps: int = 1_000_000
    eval_episodes: int = 5
    checkpoint_every: int = 10         # iterations
    log_every: int = 1
    gif: bool = True
    run_dir: str | None = None
    device: str = "cpu"
    ppo: PPOConfig = field(default_factory=PPOConfig)
    shac: SHACConfig = field(default_factory=SHACConfig)

    def __post_init__(self):
        _validate(self)


_POSITIVE = {"total_env_steps", "log_every", "env.num_envs", "ppo.n_steps", "ppo.batch_size", "ppo.n_epochs",
             "shac.horizon", "shac.critic_minibatches"}
_NONNEGATIVE = {"eval_episodes", "checkpoint_every", "ppo.learning_rate", "shac.actor_lr", "shac.critic_lr",
                "ppo.ent_coef", "ppo.vf_coef", "ppo.max_grad_norm", "shac.grad_norm", "shac.bound_coef",
                "shac.critic_iterations"}
_UNIT = {"ppo.gamma", "ppo.gae_lambda", "shac.gamma", "shac.lam", "shac.target_alpha"}
_CHOICES = {"algo": ("shac", "ppo"), "ppo.lr_schedule": ("constant", "linear"),
            "shac.lr_schedule": ("constant", "linear")}


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _validate(cfg: "TrainConfig") -> None:
    """Value checks beyond types; each error names the dotted key."""
    for key, choices in _CHOICES.items():
        if _get(cfg, key) not in choices:
            raise ConfigError(f"{key}: must be one of {list(choices)}, got {_get(cfg, key)!r}")
    for key in _POSITIVE:
        if _get(cfg, key) < 1:
            raise ConfigError(f"{key}: must be >= 1, got {_get(cfg, key)!r}")
    for key in _NONNEGATIVE:
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key}: must be >= 0, got {_get(cfg, key)!r}")
    for key in _UNIT:
        if not 0.0 <= _get(cfg, key) <= 1.0:
            raise ConfigError(f"{key}: must be in [0, 1], got {_get(cfg, key)!r}")
    from diffgym.sim.gradient_modes import gradient_mode
    try:
        mode = gradient_mode(cfg.shac.gradient)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"shac.gradient: {exc}") from None
    if "gradient" in cfg.env.kwargs:
        try:
            other = gradient_mode(cfg.env.kwargs["gradient"])
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"env.kwargs.gradient: {exc}") from None
        if other != mode and cfg.algo == "shac":
            raise ConfigError(f"env.kwargs.gradient ({other}) contradicts shac.gradient ({mode}); "
                              "set shac.gradient only")
    if not cfg.shac.reward_scale > 0:
        raise ConfigError(f"shac.reward_scale: must be > 0, got {cfg.shac.reward_scale!r}")
    if cfg.env.episode_steps is not None and cfg.env.episode_steps < 1:
        raise ConfigError(f"env.episode_steps: must be >= 1 (or null for the environment's default), "
                          f"got {cfg.env.episode_steps!r}")
    nw = cfg.env.num_workers
    if nw is not None and (not isinstance(nw, int) or isinstance(nw, bool) or nw < 1):
        raise ConfigError(f"env.num_workers: must be an integer >= 1 (or null for one per core), got {nw!r}")
    for key in ("ppo.net_arch", "shac.actor_mlp", "shac.critic_mlp"):
        v = _get(cfg, key)
        if not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in v):
            raise ConfigError(f"{key}: expected a list of positive layer widths, got {v!r}")
    if len(cfg.shac.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in cfg.shac.betas):
        raise ConfigError(f"shac.betas: expected two Adam betas in [0, 1), got {cfg.shac.betas!r}")
    if not (cfg.device == "cpu" or cfg.device.startswith("cuda")):
        raise ConfigError(f"device: expected 'cpu' or 'cuda[:N]', got {cfg.device!r}")
    if any(not isinstance(k, str) for k in cfg.env.kwargs):
        raise ConfigError(f"env.kwargs: keys must be strings, got {list(cfg.env.kwargs)!r}")
    if cfg.algo == "ppo":
        samples = cfg.ppo.n_steps * cfg.env.num_envs
        if cfg.ppo.batch_size > samples:
            raise ConfigError(f"ppo.batch_size: {cfg.ppo.batch_size} exceeds the {samples} samples of an "
                              f"iteration (ppo.n_steps={cfg.ppo.n_steps} x env.num_envs={cfg.env.num_envs})")
        if cfg.ppo.target_kl is not None and cfg.ppo.target_kl <= 0:
            raise ConfigError(f"ppo.target_kl: must be > 0 or null, got {cfg.ppo.target_kl!r}")


def _check_type(value: Any, tp: Any, key: str, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None:
                    return None
                continue
            try:
                return _check_type(value, arg, key, where)
            except ConfigError as exc:
                errors.append(exc)
        raise ConfigError(f"{where}{key}: expected {tp}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return _build(tp, value, key + ".", where)
    if tp is float:
        if isinstance(value, str):           # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}{key}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, str):           # 1e6 in YAML 1.1 is a string
            try:
                value = float(value.replace("_", ""))
            except ValueError:
                pass
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise ConfigError(f"{where}{key}: expected an integer, got {value!r}")
        return int(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}{key}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}{key}: expected a string, got {value!r}")
        return value
    if tp is list or origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}{key}: expected a list, got {value!r}")
        return list(value)
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}{key}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def _build(cls, data: dict, prefix: str = "", where: str = ""):
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        import difflib
        close = difflib.get_close_matches(str(unknown[0]), sorted(names), n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        raise ConfigError(f"{where}unknown key {prefix}{unknown[0]!s}{hint}; valid keys at this level: "
                          f"{sorted(names)}")
    kwargs = {k: _check_type(v, hints[k], prefix + k, where) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (dotted keys: shac.actor_lr=1e-3)")
        key, raw = item.split("=", 1)
        if len(raw) > MAX_YAML_BYTES:
            raise ConfigError(f"override {key}: the value is longer than {MAX_YAML_BYTES} characters")
        value = yaml_load(raw, where=f"override {key}: cannot read value {raw[:80]!r}: ")
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key}: {p} is not a section")
        node[parts[-1]] = value
    return data


# Limits of the YAML reader: a configuration is a few hundred values, so these refuse only
# hostile or broken files (an alias "billion laughs" bomb, thousands of nested brackets, a
# multi-megabyte file) before they can hang or crash the reader or the training behind it.
MAX_YAML_BYTES = 1 << 20            # 1 MiB
MAX_YAML_DEPTH = 64                 # nested mappings / sequences
MAX_YAML_NODES = 20_000             # values, every alias counted at its expanded size
MAX_YAML_ALIASES = 1_000            # *alias references


class _YAMLLimitError(yaml.YAMLError):
    pass


class _Limits:
    """The composer with the limits above, checked while the document is composed (before any
    Python object is built): the nesting depth, the number of aliases, and a running count of
    the values composed so far with every alias counted at its expanded size (counted, never
    materialized), so a hostile document stops after at most MAX_YAML_NODES events. Errors give
    the dotted key path and the line. Mixed into a loader before its parser."""

    def _init_limits(self):
        self._path: list[str] = []
        self._sizes: dict[int, int] = {}        # id(node) -> expanded size (nodes kept alive by the tree)
        self._aliases = 0
        self._count = 0

    def _where(self) -> str:
        key = ".".join(p for p in self._path if p).replace(".[", "[")
        if len(key) > 100:
            key = f"{key[:60]}...{key[-30:]}"
        return f"at {key}" if key else "at the top level"

    def _too_many(self, line: int):
        how = " once its aliases are expanded (an alias bomb?)" if self._aliases else ""
        return _YAMLLimitError(f"more than {MAX_YAML_NODES} values {self._where()}{how} (line {line + 1})")

    def compose_node(self, parent, index):
        if isinstance(index, yaml.ScalarNode):
            self._path.append(str(index.value))
        elif isinstance(index, int):
            self._path.append(f"[{index}]")
        else:                                   # the root, or a mapping key
            self._path.append("" if parent is None else "<key>")
        try:
            if self.check_event(yaml.AliasEvent):
                self._aliases += 1
                event = self.peek_event()
                if self._aliases > MAX_YAML_ALIASES:
                    raise _YAMLLimitError(f"more than {MAX_YAML_ALIASES} aliases (*{event.anchor}) "
                                          f"{self._where()} (line {event.start_mark.line + 1})")
                target = self.anchors.get(event.anchor)
                if target is not None and id(target) not in self._sizes:
                    raise _YAMLLimitError(f"alias *{event.anchor} {self._where()} refers to a value that "
                                          f"contains it (line {event.start_mark.line + 1})")
                node = yaml.composer.Composer.compose_node(self, parent, index)
                self._count += self._sizes.get(id(node), 1)
                if self._count > MAX_YAML_NODES:
                    raise self._too_many(event.start_mark.line)
                return node
            if len(self._path) > MAX_YAML_DEPTH + 1:
                mark = self.peek_event().start_mark
                raise _YAMLLimitError(f"nesting deeper than {MAX_YAML_DEPTH} levels {self._where()} "
                                      f"(line {mark.line + 1})")
            node = yaml.composer.Composer.compose_node(self, parent, index)
            if isinstance(node, yaml.SequenceNode):
                size = 1 + sum(self._sizes[id(n)] for n in node.value)
            elif isinstance(node, yaml.MappingNode):
                size = 1 + sum(self._sizes[id(k)] + self._sizes[id(v)] for k, v in node.value)
            else:
                size = 1
            self._count += 1
            if size > MAX_YAML_NODES or self._count > MAX_YAML_NODES:
                raise self._too_many(node.start_mark.line)
            self._sizes[id(node)] = size
            return node
        finally:
            self._path.pop()


class _LimitedLoader(_Limits, yaml.SafeLoader):
    """The pure-Python reader (PyYAML without libyaml)."""

    def __init__(self, stream):
        yaml.SafeLoader.__init__(self, stream)
        self._init_limits()

    def fetch_flow_collection_start(self, TokenClass):
        # the scanner looks far ahead inside brackets: refuse deep [[[... before it gets slow
        if self.flow_level >= MAX_YAML_DEPTH:
            mark = self.get_mark()
            raise _YAMLLimitError(f"brackets nested deeper than {MAX_YAML_DEPTH} levels "
                                  f"(line {mark.line + 1}, column {mark.column + 1})")
        super().fetch_flow_collection_start(TokenClass)


if getattr(yaml, "__with_libyaml__", False):
    class _LimitedCLoader(_Limits, yaml.composer.Composer, yaml.cyaml.CParser, yaml.constructor.SafeConstructor,
                          yaml.resolver.Resolver):
        """libyaml's parser (fast, not recursive) under the Python composer with the limits."""

        def __init__(self, stream):
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._init_limits()
else:                                       # pragma: no cover
    _LimitedCLoader = _LimitedLoader


def yaml_load(text: str, where: str = "", loader_class=None):
    """One YAML document read safely (plain data only) within the reader's limits."""
    loader = (loader_class or _LimitedCLoader)(text)
    try:
        return loader.get_single_data()
    except _YAMLLimitError as exc:
        raise ConfigError(f"{where}refused: {exc}") from None
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):      # (PyYAML >= 6.0.4 stops deep nesting first)
            mark = getattr(exc, "problem_mark", None)
            line = f" (line {mark.line + 1})" if mark is not None else ""
            raise ConfigError(f"{where}refused: nesting deeper than {MAX_YAML_DEPTH} levels"
                              f"{line}") from None
        raise ConfigError(f"{where}not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def read_yaml_mapping(path: str) -> dict:
    """A YAML file whose top level is a mapping (an empty file is {}); errors name the file."""
    try:
        size = os.path.getsize(path)
        if size > MAX_YAML_BYTES:
            raise ConfigError(f"{path}: refused: {size} bytes, more than the {MAX_YAML_BYTES} a "
                              "configuration may have")
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(f"{path}: refused: more than the {MAX_YAML_BYTES} bytes a configuration may have")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
    data = yaml_load(text, where=f"{path}: ")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def _did_you_mean(name: str, choices) -> str:
    import difflib
    close = difflib.get_close_matches(str(name), sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _constructor_params(creator) -> set[str] | None:
    """The keyword arguments ``creator`` (an environment class or factory) accepts; a class's
    ``**kwargs`` are followed up its bases. None when it takes arbitrary keywords."""
    import inspect
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    inits = ([k.__dict__["__init__"] for k in creator.__mro__ if "__init__" in k.__dict__]
             if inspect.isclass(creator) else [creator])
    names: set[str] = set()
    for init in inits:
        if init is object.__init__:
            return None
        try:
            params = list(inspect.signature(init).parameters.values())
        except (TypeError, ValueError):
            return None
        if inspect.isclass(creator) and params:
            params = params[1:]                        # self
        names |= {p.name for p in params if p.kind in kinds}
        if not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
            return names
    return None


def check_env(cfg: TrainConfig, where: str = "") -> None:
    """``env.id`` is a registered diffgym environment and its constructor accepts every key of
    ``env.kwargs`` (and ``env.episode_steps``), checked before anything is created; errors name
    the key and suggest the closest valid name."""
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    import diffgym  # noqa: F401  (registers the ids)
    import diffgym.envs  # noqa: F401
    from diffgym.envs.base import DiffEnv
    env_id = cfg.env.id
    from diffgym.envs import ENV_IDS
    ours = sorted(set(ENV_IDS) | {i for i, spec in gym.registry.items()
                                  if isinstance(spec.entry_point, str)
                                  and spec.entry_point.startswith("diffgym.")})
    if env_id not in gym.registry:
        raise ConfigError(f"{where}env.id: unknown environment {env_id!r}{_did_you_mean(env_id, gym.registry)}; "
                          f"diffgym's environments: {', '.join(ours)}")
    spec = gym.registry[env_id]
    try:
        creator = spec.entry_point
        if isinstance(creator, str):
            creator = load_env_creator(creator)
        elif hasattr(creator, "_cls"):       # diffgym's ids: the env class inside its TimeLimit
            creator = creator._cls()
    except Exception as exc:           # noqa: BLE001
        raise ConfigError(f"{where}env.id: {env_id} is registered but its entry point {spec.entry_point!r} "
                          f"cannot be loaded: {type(exc).__name__}: {exc}") from None
    if not (isinstance(creator, type) and issubclass(creator, DiffEnv)):
        raise ConfigError(f"{where}env.id: {env_id} is not a differentiable diffgym environment (training "
                          f"needs diffgym's DiffEnv API); diffgym's environments: {', '.join(ours)}")
    params = _constructor_params(creator)
    if params is None:
        return
    for key in cfg.env.kwargs:
        if key not in params:
            valid = sorted(params - {"episode_steps"})
            raise ConfigError(f"{where}env.kwargs.{key}: {env_id} has no parameter {key!r}"
                              f"{_did_you_mean(key, valid)}; its parameters: {', '.join(valid)}")
    if cfg.env.episode_steps is not None and "episode_steps" not in params:
        raise ConfigError(f"{where}env.episode_steps: {env_id} takes no episode length")


def config_from_dict(data: dict, overrides: list[str] | None = None, where: str = "",
                     check_environment: bool = True) -> TrainConfig:
    """A validated :class:`TrainConfig` (``check_environment``: also :func:`check_env`)."""
    data = apply_overrides(dict(data or {}), overrides or [])
    cfg = _build(TrainConfig, data, "", where)
    if check_environment:
        check_env(cfg, where)
    return cfg


def load_config(path: str | os.PathLike, overrides: list[str] | None = None) -> TrainConfig:
    """Read and validate a YAML training config (errors name the key and the file)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        from diffgym.resources import configs_dir
        alt = os.path.join(str(configs_dir()), path)
        if os.path.isfile(alt):
            path = alt
        else:
            raise ConfigError(f"config file not found: {path}")
    return config_from_dict(read_yaml_mapping(path), overrides, where=f"{path}: ")


def config_to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
