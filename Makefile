# Two commands: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-gpu lint venv clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned, so pip takes the local CPU build instead of a CUDA one
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/stealkit demo --out runs/demo

test: $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m 'not slow'

# the GPU tier (tests marked gpu; skipped where torch sees no CUDA device): see docs/gpu.md
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu -rs

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(VENV)/bin/lint-imports

clean:
	rm -rf runs .pytest_cache .ruff_cache
