# The two set-up commands of the README: `make run` (the Snakemake pipeline on config/default.yaml) and
# `make test` (the test suite). Both create the virtual environment first when it is missing or stale.
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CORES ?= 2
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: run test lint bench clean-venv

$(STAMP): requirements.txt pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

run: $(STAMP)
	snakemake --cores $(CORES) --configfile config/default.yaml

# TRITON_INTERPRET must be in the environment before Python starts: it is read when triton.language is
# first imported (torchvision and timm import it), and it lets the Triton kernels run on CPU tensors.
test: $(STAMP) lint
	TRITON_INTERPRET=1 $(PYTHON) -m pytest -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

bench: $(STAMP)
	$(PYTHON) benchmarks/ops.py

clean-venv:
	rm -rf $(VENV)
