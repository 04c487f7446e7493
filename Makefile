# `make demo` and `make test` set up a local virtual environment from the package registries
# (once, and again whenever pyproject.toml changes), then run.
#   make demo   trains SHAC on DiffCartPole-v0 (configs/cartpole_shac.yaml) and writes the
#               learning curve, metrics and a GIF of the trained policy under runs/
#   make test   the test suite (CI runs exactly this through .ci/run), including
#               tests/test_installed.py: the built wheel installed outside the checkout
#   make bench  the benchmark tables (simulator vs MuJoCo, Jacobians, environments)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
export OPENBLAS_NUM_THREADS ?= 1
export OMP_NUM_THREADS ?= 1

.PHONY: demo test bench sim-demo clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

demo: $(VENV)/.installed
	$(PY) -m diffgym train configs/cartpole_shac.yaml --run-dir runs/demo_cartpole_shac

sim-demo: $(VENV)/.installed
	$(PY) -m diffgym demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) -m diffgym bench
	$(PY) -m diffgym.bench_envs

clean:
	rm -rf $(VENV) build *.egg-info
