# The two commands of the README:
#   make demo   installs kubeinfer into .venv and generates text with the built-in demo model
#   make test   installs the test extras (and Debian's prometheus when missing) and runs the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --quiet --disable-pip-version-check

.PHONY: install install-test demo test test-all crds

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is pinned first, explicitly: a looser requirement would pull gigabytes of CUDA packages.
install: $(BIN)/python
	$(PIP) torch==2.13.0
	$(PIP) -e .

install-test: $(BIN)/python
	$(PIP) torch==2.13.0
	$(PIP) -e '.[test]'
	@command -v prometheus >/dev/null || { apt-get update -qq && apt-get install -y -qq prometheus >/dev/null; } \
	  || echo "warning: could not install Debian's prometheus; the tests that need it will be skipped"

demo: install
	$(BIN)/kubeinfer generate --model demo --prompt "Kubernetes is" --max-tokens 32

test: install-test
	$(BIN)/python -m pytest

# Everything, the slow tests included.
test-all: install-test
	$(BIN)/python -m pytest -m "not gpu"
