"""diffgym: Gymnasium environments on a differentiable simulator with unrelaxed frictional contact."""
from .sim.forward import Contact, SimulationError, Simulator, SolverWarning, StepInfo
from .sim.model import ModelError, SimModel
from .sim.unsupported import UnsupportedIgnoredWarning
from .gradcheck import GradientReport, JacobianMismatchError, check_step_jacobians
from .sim.gradient_modes import Exact, LongRange, Smooth, gradient_mode

__version__ = "0.1.0"

__all__ = ["Simulator", "StepInfo", "Contact", "SimModel", "ModelError", "SimulationError",
           "SolverWarning", "__version__", "check_step_jacobians", "GradientReport",
           "JacobianMismatchError", "Exact", "Smooth", "LongRange", "gradient_mode",
           "UnsupportedIgnoredWarning"]


def _mount_envs() -> None:
    """Import ``diffgym.envs`` (which registers the environment ids with Gymnasium).

    An installed diffgym (wheel or editable) finds it as the subpackage ``diffgym.envs``; a
    checkout used without installing (``envs/`` beside ``diffgym/`` on ``sys.path``) mounts
    ``envs/`` under that name.
    """
    import importlib
    import importlib.util
    import os
    import sys

    if "diffgym.envs" in sys.modules:
        return
    if importlib.util.find_spec("diffgym.envs") is not None:
        importlib.import_module("diffgym.envs")
        return
    envs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "envs")
    init = os.path.join(envs, "__init__.py")
    if not os.path.isfile(init):
        raise ImportError(f"diffgym: the environments package is missing (neither diffgym.envs nor {envs})")
    spec = importlib.util.spec_from_file_location("diffgym.envs", init, submodule_search_locations=[envs])
    module = importlib.util.module_from_spec(spec)
    sys.modules["diffgym.envs"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["diffgym.envs"]
        raise


_mount_envs()

from .vector import DiffVectorEnv, make_vec  # noqa: E402  (after diffgym.envs is mounted)

__all__ += ["make_vec", "DiffVectorEnv"]
