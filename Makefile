# Two commands do all the set-up on a fresh machine (Python >= 3.11 and pip only):
#   make study   -> builds .venv, installs bayesattn and the study extra, runs the main job
#   make test    -> builds .venv, installs bayesattn with dev, examples, lightning, hf and cluster extras,
#                   runs lint + the test suite (including a 2-process DDP run on CPU), then
#                   `make test-arviz1`: builds .venv312 (Python 3.12, ArviZ 1.x) and runs the
#                   ArviZ-facing tests there too
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

# ArviZ 1.x needs Python >= 3.12: the first working python3.12 on PATH, in pyenv, or in /usr
PYTHON312 ?= $(shell for p in python3.12 $(HOME)/.pyenv/versions/3.12*/bin/python3.12 \
	/usr/local/bin/python3.12 /usr/bin/python3.12; do $$p -c "" 2>/dev/null && { echo $$p; break; }; done)
VENV312   ?= .venv312
ARVIZ1_TESTS := tests/diagnostics/test_arviz1.py tests/diagnostics/test_diagnostics.py \
	tests/cross_cutting/test_recommended.py::test_predictive_to_arviz_reads_any_predictor_and_loo_runs

.PHONY: venv install test test-fast test-arviz1 lint docs docs-check docs-results notebooks study bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -c constraints.txt -e ".[dev,examples,lightning,hf,cluster]"
	touch $@

venv install: $(VENV)/.installed

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check bayesattn tests benchmarks examples notebooks docs
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: $(VENV)/.study-installed lint
	BAYESATTN_EXPECT_ARVIZ_MAJOR=0 $(PY) -m pytest -q
	$(MAKE) test-arviz1

$(VENV312)/.installed: pyproject.toml constraints-arviz1.txt
	@test -n "$(PYTHON312)" || { echo "test-arviz1 needs Python 3.12: set PYTHON312=/path/to/python3.12"; exit 1; }
	$(PYTHON312) -m venv $(VENV312)
	$(VENV312)/bin/python -m pip --disable-pip-version-check -q install \
		-c constraints-arviz1.txt -e ".[examples]" pytest
	touch $@

# the ArviZ-facing tests under ArviZ 1.x (they fail, not skip, if arviz 1.x is not what runs)
test-arviz1: $(VENV312)/.installed
	BAYESATTN_EXPECT_ARVIZ_MAJOR=1 $(VENV312)/bin/python -m pytest -q $(ARVIZ1_TESTS)

test-fast: $(VENV)/.study-installed lint  # the inner loop: everything but the slow tests (CI runs all)
	$(PY) -m pytest -q -m "not slow"

docs: $(VENV)/.installed  # the user guide, notebooks, results + API reference, strict, into site/
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# the built site in headless Chromium (system package: apt-get install chromium): maths typeset,
# images shown, no request leaving the machine; screenshots + report.json in site-check/
docs-check: docs
	$(PY) docs/check_site.py site --out site-check

# a study run (STUDY=its --out folder) into studies/<date>-<kind>-<version>/: a page under Results
STUDY ?= bayesattn-study
docs-results: $(VENV)/.installed
	$(PY) docs/publish_results.py --from $(STUDY)

# re-execute every notebook at full size (one thread) and store its outputs (minutes each)
notebooks: $(VENV)/.installed
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) notebooks/execute.py

# the study extra: laplace-torch and backpack-for-pytorch declare torchvision, which last-layer
# Laplace never imports and whose wheel for the CPU torch does not import; so they go in without
# dependencies (their own are listed), then mnist1d with its dependencies
STUDY_NODEPS := laplace-torch backpack-for-pytorch curvlinops-for-pytorch asdfghjkl einops \
	unfoldNd einconv linear_operator

$(VENV)/.study-installed: $(VENV)/.installed
	$(PIP) install -c constraints.txt --no-deps $(STUDY_NODEPS)
	$(PIP) install -c constraints.txt mnist1d scikit-learn
	touch $@

# the main job on every core of the machine (--jobs: the numbers do not change, only the wall
# time); ARGS="--protocol full" for the whole protocol (three datasets, about 2 h 45 min measured
# on 2 cores); ARGS="--dataset fortunes" the token dataset alone (apt-get install fortunes).
# Stopped, it resumes: rerun the same command (the finished runs are kept)
JOBS ?= $(shell nproc 2>/dev/null || echo 1)
study: $(VENV)/.study-installed
	$(VENV)/bin/bayesattn study --jobs $(JOBS) $(ARGS)

# every benchmark writes benchmarks/results/<name>.json, rendered in docs/benchmarks.md;
# BENCH_ARGS=--quick for a smoke run
BENCHMARKS := attention_speed training_speed interop_speed predictive_speed long_sequence long_task uncertainty_cost
bench: $(VENV)/.installed
	for b in $(BENCHMARKS); do $(PY) benchmarks/$$b.py $(BENCH_ARGS) || exit 1; done

clean:
	rm -rf $(VENV) $(VENV312) build *.egg-info .pytest_cache .ruff_cache site site-check
