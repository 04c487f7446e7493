"""diffgym: Gymnasium environments on a differentiable simulator with unrelaxed frictional contact."""
from .forward import Contact, SimulationError, Simulator, SolverWarning, StepInfo
from .model import ModelError, SimModel
from .gradcheck import GradientReport, JacobianMismatchError, check_step_jacobians

__version__ = "0.1.0"

__all__ = ["Simulator", "StepInfo", "Contact", "SimModel", "ModelError", "SimulationError",
           "SolverWarning", "__version__", "check_step_jacobians", "GradientReport",
           "JacobianMismatchError"]


def _mount_envs() -> None:
    """In a checkout, ``envs/`` sits beside ``diffgym/``; a wheel installs it as diffgym/envs."""
    import importlib.util
    import os
    import sys

    if importlib.util.find_spec("diffgym.envs") is not None:
        return
    envs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "envs")
    init = os.path.join(envs, "__init__.py")
    if os.path.isfile(init):
        spec = importlib.util.spec_from_file_location("diffgym.envs", init, submodule_search_locations=[envs])
        module = importlib.util.module_from_spec(spec)
        sys.modules["diffgym.envs"] = module
        spec.loader.exec_module(module)


_mount_envs()

from .vector import DiffVectorEnv, make_vec  # noqa: E402  (after diffgym.envs is mounted)

__all__ += ["make_vec", "DiffVectorEnv"]
