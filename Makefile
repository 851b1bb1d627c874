# The two commands: `make run` starts the daemon in the foreground, `make test` runs every test
# (after `make lint`); `make test-fast` is the edit-test loop (no subprocess daemons, no soak).
# All create the virtual environment and install the project into it when needed.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-fast lint bench bench-quick bench-full bench-foundation clean schema

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/eurekamem serve $(ARGS)

test: lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Layers are pytest markers given by tests/conftest.py (unit, trio, e2e, soak; see pyproject.toml).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not e2e and not soak" $(PYTEST_ARGS)

# mypy reads the packages through build/typecheck/eurekamem/, symlinks to the folders that
# pyproject's package-dir installs under those names (strictness per package: pyproject.toml).
TYPECHECK := build/typecheck/eurekamem

lint: $(STAMP)
	$(BIN)/ruff check .
	mkdir -p $(TYPECHECK)
	ln -sfn ../../../eurekamem_pkg/__init__.py $(TYPECHECK)/__init__.py
	for package in protocol client daemon cli; do ln -sfn ../../../$$package $(TYPECHECK)/$$package; done
	$(BIN)/mypy -p eurekamem.protocol -p eurekamem.client -p eurekamem.daemon -p eurekamem.cli

# The benchmark suite (bench/suite.py): report.md, report.json and PNG plots in bench/results/<timestamp>/.
# matplotlib (the `bench` extra) is installed when it can be; without it the suite runs and says so.
BENCH_STAMP := $(VENV)/.bench-stamp

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,bench]' || echo "bench: matplotlib not installed; no plots"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python bench/suite.py $(ARGS)

bench-quick: $(BENCH_STAMP)
	$(BIN)/python bench/suite.py --quick $(ARGS)

bench-full: $(BENCH_STAMP)
	$(BIN)/python bench/suite.py --full $(ARGS)

# The foundation's socket benchmark alone (round trip, pipelining, 32 durable clients, the disk).
bench-foundation: $(STAMP)
	$(BIN)/python bench/run.py $(ARGS)

schema: $(STAMP)
	$(BIN)/python -m eurekamem.protocol._schema > protocol/schema.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
