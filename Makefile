# Two commands: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# KServe, the real v2 (Open Inference Protocol) server of tests/test_v2_kserve.py, in its own environment: its
# pins (protobuf<7, pandas<3, python-dateutil<3) conflict with .venv's
KSERVE_VENV := .venv-kserve
KSERVE_STAMP := $(KSERVE_VENV)/.installed

.PHONY: demo test test-all test-fast test-gpu lint venv venv-kserve clean mutation results-check

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned, so pip takes the local CPU build instead of a CUDA one
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

$(KSERVE_STAMP): tests/v2server/requirements.txt
	test -x $(KSERVE_VENV)/bin/python || $(PYTHON) -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/python -m pip install -q --upgrade pip
	$(KSERVE_VENV)/bin/python -m pip install -q -r tests/v2server/requirements.txt
	touch $(KSERVE_STAMP)

venv-kserve: $(KSERVE_STAMP)

demo: $(STAMP)
	$(VENV)/bin/stealkit demo --out runs/demo

# `make test` deselects the tests marked slow (about 3 minutes on 2 idle cores), except in CI (CI=true or 1),
# where it runs every test; `make test-all` runs every test anywhere
SLOW := $(if $(filter true 1 yes,$(CI)),,-m 'not slow')

test: $(STAMP) $(KSERVE_STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q $(SLOW)

test-all: $(STAMP) $(KSERVE_STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q

test-fast: $(STAMP) $(KSERVE_STAMP)
	$(PY) -m pytest -q -m 'not slow'

# the GPU tier (tests marked gpu; skipped where torch sees no CUDA device): see docs/gpu.md
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu -rs

# every README figure and every docs/results.md table that committed rows give, regenerated from results/rows/
results-check: $(STAMP)
	PYTHONPATH=src $(PY) benchmarks/results_tables.py --check

# mutation testing of the guarded modules (docs/mutation.md); not part of `make test`. MODULES=ledger base ...
mutation: $(STAMP)
	OMP_NUM_THREADS=1 PYTHONPATH=src $(PY) tools/mutation.py $(MODULES)

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(VENV)/bin/lint-imports

clean:
	rm -rf runs .pytest_cache .ruff_cache
