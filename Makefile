# Two commands do all the set-up on a fresh machine: `make demo`, `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
AZURITE_VERSION := 3.37.0
AZURITE := .cache/azurite/node_modules/.bin/azurite-blob

.PHONY: demo test lint bench bench-quick tour clean install

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e ".[test,bench]"
	touch $(STAMP)

# Azurite (the Azure Blob emulator the tests use) from npm; Node from Debian if missing.
$(AZURITE):
	command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq nodejs npm)
	npm install --prefix .cache/azurite --no-audit --no-fund --loglevel=error azurite@$(AZURITE_VERSION)
	touch $(AZURITE)

install: $(STAMP) $(AZURITE)

demo: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python examples/quickstart.py

test: $(STAMP) $(AZURITE)
	$(BIN)/ruff check .
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

# `make bench ARGS="--only small_writes"`; `make bench-quick` is every scenario at smoke scale.
bench: $(STAMP) $(AZURITE)
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python -m benchmarks.run $(ARGS)

bench-quick: ARGS += --quick
bench-quick: bench

tour: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python examples/build_tour.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info .cache/azurite
