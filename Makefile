# One venv, installed from this repo's own files: exactly the pins of requirements/cpu.lock
# (tools/lock.py; the worker image installs requirements/gpu.lock, the same versions of
# everything our code imports). torch 2.13.0+cpu resolves to the local CPU wheel.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.deps-stamp

.PHONY: install lock test test-fast test-slow demo serve bench lint clean

$(STAMP): pyproject.toml client/pyproject.toml requirements/cpu.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-deps -r requirements/cpu.lock
	$(BIN)/pip install -q --no-deps -e . -e ./client
	touch $(STAMP)

install: $(STAMP)

# Re-resolve the dependency set after changing pyproject.toml (needs the registry).
lock: $(STAMP)
	$(BIN)/python tools/lock.py

# The 25 slowest tests are listed at the end: CI's time budget for this target (.ci/run) is
# spent where that list says.
test: $(STAMP)
	HUMANLINE_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q -m "not gpu" --timeout 900 --durations=25

test-fast: $(STAMP)
	HUMANLINE_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q -m "not slow and not gpu" --timeout 300

demo: $(STAMP)
	$(BIN)/python examples/demo.py

serve: $(STAMP)
	$(BIN)/humanline-server serve

bench: $(STAMP)
	$(BIN)/python benchmarks/sync_overhead.py --quick

# The rules live in pyproject.toml ([tool.ruff], [tool.mypy]; the client's ruff rules in
# client/pyproject.toml). LINT_PATHS narrows it: make lint LINT_PATHS="api worker".
# RUFF_ONLY_PATHS get ruff but not mypy (not type-clean); RUFF_ONLY_PATHS= drops them.
LINT_PATHS ?= contract trainer reports tools api models worker storage client
RUFF_ONLY_PATHS ?= tests benchmarks examples migrations
lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS) $(RUFF_ONLY_PATHS)
	$(BIN)/mypy $(filter-out client,$(LINT_PATHS)) $(if $(filter client,$(LINT_PATHS)),client/humanline_client)

clean:
	rm -rf $(VENV) .pytest_cache .humanline
