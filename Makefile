# The README's two commands: `make run` and `make test`. Both work from a fresh clone with only
# Python >= 3.11 installed: they create .venv and install the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: run test docs release soak bench utility report clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.installed-report: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[report]'
	touch $@

$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@

$(VENV)/.installed-release: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[release]'
	touch $@

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

## run: the service's main job on its embedded default (replay of UCI Adult, pan-private AC-SA),
## with its budget store in out/budget (a demo never spends the store of your own runs; a second
## `make run` composes with the first and says so at start).
run: $(VENV)/.installed
	$(BIN)/panpriv run --state-dir out/budget

## test: the whole suite, integration tests included (real Kafka-protocol broker and Prometheus,
## the documentation site built with --strict, the wheel built and installed into a fresh venv),
## after ruff (pyflakes, import order) and mypy (accounting, protocols, streamer: zero errors), on
## TEST_WORKERS processes (pytest-xdist; each test file stays on one worker, so module fixtures
## are built once; each worker starts its own broker). TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2
test: $(VENV)/.installed-test
	bash tests/install_system_deps.sh
	$(BIN)/python -m ruff check .
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

## docs: the documentation site (mkdocs.yml: docs/ and the API reference from the docstrings) into
## site/, every warning an error. (NO_MKDOCS_2_WARNING: the theme's banner about its successor.)
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

## release: the sdist and the wheel built from it into dist/, checked by twine --strict (the
## version is pyproject.toml's; docs/development.md, "Releasing").
release: $(VENV)/.installed-release
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/python -m twine check --strict dist/*

## soak: every test marked `soak` (about 35-45 minutes on the 2-core machine at load 7-10), ending
## with one figures table (tests/faults/figures.py):
## - the service: 60 kill -9 on files and 45 on the real broker, every bit of a checkpoint flipped;
## - the roles (tests/faults/test_soak_roles.py): 30 kill -9 + restart across scale-out workers and
##   coordinator (after a worker's kill, the next once a mean is published), 70 across the E-S-A
##   shuffler and analyzer; the ledger audited (records lost, learned twice, budget under-counts);
## - two processes on one state, per role with a state (the second refused with one line);
## - 500 bit flips each of analyzer.json, worker.json, an `encode --state` file and the budget store;
## - >= 10^4 fuzzed/forged messages per input topic: messages, shuffled, gradients, model
##   (tests/faults/test_soak_messages.py), and >= 10^4 fuzzed records per format;
## - a slower worker and four coordinator outages (tests/scaleout/test_scaleout_stall.py);
## - the slower memory-residue scans (d = 300 but for pan-acsa);
## - the larger or second variants of real-process tests whose first variant runs in `make test`
##   (the second Kafka client's kill cycles, longer intruder streams, more check-in rounds).
## `make test` runs the fast subset (not the role kill and message campaigns).
soak: $(VENV)/.installed-test
	bash tests/install_system_deps.sh
	$(BIN)/python -m pytest -m soak -s tests $(PYTEST_ARGS)

## bench: the performance benchmarks (each prints its side-by-side ratios, measured in one run).
PERF_BENCHMARKS := encoder glm_fast_path learners json_decode startup shuffle_gaussian_rdp iteration_accounting service ingest esa esa_checkin scaleout memory_hygiene
bench: $(VENV)/.installed-bench
	for m in $(PERF_BENCHMARKS); do $(BIN)/python -m benchmarks.$$m || exit 1; done

## utility: excess-loss tables of every learner on the shared synthetic streams and UCI Adult
## (minutes each; UTILITY_ARGS=--quick for short runs).
UTILITY_BENCHMARKS := utility_pan_acsa utility_shapes utility_pnsgd utility_shuffle utility_shuffle_gd
UTILITY_ARGS ?=
utility: $(VENV)/.installed-bench
	for m in $(UTILITY_BENCHMARKS); do $(BIN)/python -m benchmarks.$$m $(UTILITY_ARGS) || exit 1; done

## report: the README's pictures — the embedded Adult run (paced, with its hold-out scores) drawn
## by `panpriv report` into docs/img/; its budget store is its own, inside out/report-demo, so the
## pictures show one run's ε whatever ran on this machine before.
report: $(VENV)/.installed-report
	rm -rf out/report-demo
	$(BIN)/panpriv -q run --metrics-port 0 --out out/report-demo --state-dir out/report-demo/budget
	$(BIN)/panpriv report out/report-demo --to docs/img

clean:
	rm -rf $(VENV) .pytest_cache build dist site *.egg-info
