"""Shared fixtures."""
import pinocchio as pin
import pytest


@pytest.fixture
def data_sizes(monkeypatch):
    """The nv of every pinocchio Data created while the test runs (a whole-model Data is cubic
    in nv: scenes of many trees must make only per-group ones, diffgym.sim.trees)."""
    sizes = []
    orig = pin.Model.createData

    def spy(model):
        sizes.append(model.nv)
        return orig(model)
    monkeypatch.setattr(pin.Model, "createData", spy)
    return sizes
