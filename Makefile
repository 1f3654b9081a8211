# Two commands do all the set-up on a fresh machine: `make demo`, `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench tour clean install

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e ".[test,bench]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python examples/quickstart.py

test: $(STAMP)
	$(BIN)/ruff check .
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python -m benchmarks.run

tour: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python examples/build_tour.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
