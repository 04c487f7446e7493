# `make demo` and `make test` set up a local virtual environment from the package registries
# (once, and again whenever pyproject.toml changes), then run.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

demo: $(VENV)/.installed
	$(PY) -m diffgym demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) -m diffgym bench

clean:
	rm -rf $(VENV) build *.egg-info
