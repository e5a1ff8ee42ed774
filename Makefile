# The README's two commands: `make run` and `make test`. Both work from a fresh clone with only
# Python >= 3.11 installed: they create .venv and install the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: run test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

## run: the service's main job on its embedded default (replay of UCI Adult, pan-private AC-SA).
run: $(VENV)/.installed
	$(BIN)/panpriv run

## test: the whole suite, integration tests included (real Kafka-protocol broker and Prometheus).
test: $(VENV)/.installed-test
	bash tests/install_system_deps.sh
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## bench: every benchmark in benchmarks/, each printing its side-by-side ratios.
bench: $(VENV)/.installed-bench
	for script in benchmarks/*.py; do $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
