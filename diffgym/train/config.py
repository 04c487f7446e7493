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
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {key}: cannot read value {raw!r}: {exc}") from None
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key}: {p} is not a section")
        node[parts[-1]] = value
    return data


def read_yaml_mapping(path: str) -> dict:
    """A YAML file whose top level is a mapping (an empty file is {}); errors name the file."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def config_from_dict(data: dict, overrides: list[str] | None = None, where: str = "") -> TrainConfig:
    data = apply_overrides(dict(data or {}), overrides or [])
    return _build(TrainConfig, data, "", where)


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
