# Two commands for a fresh machine with Python 3.11:
#   make run    set up .venv and run the scheduler on examples/demo-jobs.json (embedded SQLite)
#   make test   set up .venv, lint (make lint: ruff, mypy), then run every test: kernel, each distribution, conformance
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
DISTS  := $(sort $(wildcard plugins/*/pyproject.toml providers/*/pyproject.toml examples/*/pyproject.toml examples/*/*/pyproject.toml) $(filter-out tests/support/scheduler-executor-broken/% tests/support/scheduler-channel-broken/% tests/support/scheduler-authorization-testkit/% tests/support/scheduler-mutants/%,$(wildcard tests/support/*/pyproject.toml)))
DEMO_DB ?= .demo/scheduler.db
PYTEST_WORKERS ?= 2

.PHONY: install run lint test bench conformance clean

# pip's and setuptools' own output (editable-install warnings among it) goes to $(VENV)/install.log, shown on failure.
$(VENV)/.installed: pyproject.toml $(DISTS)
	@echo "setting up $(VENV): the kernel and $(words $(DISTS)) distributions, editable (log: $(VENV)/install.log)"
	@$(PYTHON) -m venv $(VENV)
	@( $(PY) -m pip install -q --disable-pip-version-check --upgrade pip \
	   && $(PY) -m pip install -q --disable-pip-version-check -e '.[test]' $(foreach d,$(DISTS),-e $(dir $(d))) \
	 ) > $(VENV)/install.log 2>&1 || { tail -n 40 $(VENV)/install.log; echo "install failed: see $(VENV)/install.log"; exit 1; }
	@touch $@

install: $(VENV)/.installed

run: install
	@rm -rf .demo && mkdir -p .demo
	$(BIN)/scheduler --db $(DEMO_DB) jobs add --file examples/demo-jobs.json
	$(BIN)/scheduler --db $(DEMO_DB) jobs list
	$(BIN)/scheduler --db $(DEMO_DB) run --duration 12s
	$(BIN)/scheduler --db $(DEMO_DB) runs list --limit 20
	$(BIN)/scheduler --db $(DEMO_DB) status
	$(BIN)/scheduler --db $(DEMO_DB) runs evidence --all

# ruff over the tree and mypy over the targets in pyproject.toml ([tool.ruff], [tool.mypy]); make test runs it first.
lint: install
	$(BIN)/ruff check --quiet .
	$(PY) -m mypy

test: install lint
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) tests $(foreach d,$(DISTS),$(if $(wildcard $(dir $(d))tests),$(dir $(d))tests))
	$(BIN)/python -m scheduler.conformance.ci

conformance: install
	$(BIN)/python -m scheduler.conformance.ci

bench: install
	$(PY) -m pip install -q --disable-pip-version-check -r bench/requirements.txt
	$(PY) -m bench

clean:
	rm -rf $(VENV) .demo build *.egg-info
