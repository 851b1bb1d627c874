# The two commands: `make run` starts the daemon in the foreground, `make test` runs every test.
# Both create the virtual environment and install the project into it when needed.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test bench clean schema

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/eurekamem serve $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/run.py $(ARGS)

schema: $(STAMP)
	$(BIN)/python -m eurekamem.protocol._schema > protocol/schema.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
