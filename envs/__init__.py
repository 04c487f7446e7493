"""diffgym.envs: the differentiable Gymnasium environments (installed as ``diffgym.envs``)."""
