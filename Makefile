# Two commands do all the set-up on a fresh machine (Python >= 3.11 and pip only):
#   make study   -> builds .venv, installs bayesattn, runs the main job
#   make test    -> builds .venv, installs bayesattn with dev, examples, lightning and hf extras,
#                   runs lint + the test suite (including a 2-process DDP run on CPU)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: venv install test test-fast lint docs study bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -c constraints.txt -e ".[dev,examples,lightning,hf]"
	touch $@

venv install: $(VENV)/.installed

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check bayesattn tests benchmarks examples notebooks

test: $(VENV)/.installed lint
	$(PY) -m pytest -q

test-fast: $(VENV)/.installed lint  # the inner loop: everything but the slow tests (CI runs all)
	$(PY) -m pytest -q -m "not slow"

docs: $(VENV)/.installed  # the user guide + API reference, strict, into site/
	$(VENV)/bin/mkdocs build --strict

study: $(VENV)/.installed
	$(VENV)/bin/bayesattn study $(ARGS)

bench: $(VENV)/.installed
	$(PY) benchmarks/attention_speed.py
	$(PY) benchmarks/training_speed.py
	$(PY) benchmarks/interop_speed.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
