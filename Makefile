# Two commands for a newcomer: `make lab` runs the main job, `make test` the tests.
# Each creates or refreshes the virtual environment in .venv when needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tether-installed

.PHONY: lab test venv system clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

# bubblewrap (the sandbox for model-written code) and Chromium (the report test), when missing and root on Debian
system:
	@bash scripts/system-packages.sh

lab: $(STAMP) system
	$(BIN)/tether lab

test: $(STAMP) system
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs
