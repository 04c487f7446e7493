"""Where the shipped models and configs live, in a wheel and in a checkout alike."""
from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _dir(name: str) -> Path:
    installed = _PKG / name            # wheel: diffgym/assets, diffgym/configs
    if installed.is_dir():
        return installed
    return _PKG.parent / name          # checkout or editable install: top-level assets/, configs/


def assets_dir() -> Path:
    return _dir("assets")


def configs_dir() -> Path:
    return _dir("configs")


def asset_path(name: str) -> str:
    """Path of a model shipped with diffgym (``cartpole.xml``), or of a known external one.

    ``hopper_gymnasium.xml`` is Gymnasium's own Hopper model file and ``go1.urdf`` / ``ur5.urdf``
    the URDFs shipped by the ``example-robot-data`` package.
    """
    if name == "hopper_gymnasium.xml":
        import gymnasium
        p = Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets" / "hopper.xml"
    elif name in ("go1.urdf", "ur5.urdf"):
        p = Path(example_robot_data_dir()) / "robots" / (
            "go1_description/urdf/go1.urdf" if name == "go1.urdf" else "ur_description/urdf/ur5_robot.urdf")
    else:
        p = assets_dir() / name
    if not p.is_file():
        raise FileNotFoundError(f"asset {name!r} not found at {p}")
    return str(p)


def example_robot_data_dir() -> str:
    """The share/example-robot-data folder installed by the example-robot-data package."""
    import sys
    for root in sys.path:
        cand = Path(root) / "cmeel.prefix" / "share" / "example-robot-data"
        if cand.is_dir():
            return str(cand)
    raise FileNotFoundError("example-robot-data is not installed (pip install example-robot-data)")
