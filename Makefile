# The two set-up commands of the README: `make run` (the Snakemake pipeline on config/default.yaml) and
# `make test` (the test suite). Both create the virtual environment first when it is missing or stale.
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CORES ?= 2
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

FASHION_MNIST := /usr/share/datasets/fashion-mnist

.PHONY: run test test-fast lint bench data clean-venv

$(STAMP): requirements.txt pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

run: $(STAMP) data
	snakemake --cores $(CORES) --configfile config/default.yaml
	snakemake --configfile config/default.yaml --report results/default/snakemake-report.html

# Fashion-MNIST from the Debian package when it is missing and apt can install it; otherwise gradcomp falls
# back to torchvision's download (or to --data-dir) and says so when neither works.
data:
	@test -d $(FASHION_MNIST) || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
		(apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1); } || \
		echo "note: could not install dataset-fashion-mnist; gradcomp will try torchvision's download"

# TRITON_INTERPRET must be in the environment before Python starts: it is read when triton.language is
# first imported (torchvision and timm import it), and it lets the Triton kernels run on CPU tensors. One
# pytest-xdist worker per core, each test file on one worker (its module fixtures built once); the 30
# slowest tests are listed at the end (where the suite's time goes).
PYTEST := TRITON_INTERPRET=1 $(PYTHON) -m pytest -q -n auto --dist loadfile --durations=30
test: $(STAMP) data lint
	$(PYTEST) tests

# The inner loop: the ops (both backends, the bad-input matrix, the oracles) and the format and policy
# specifications, about a minute on two cores.
FAST_TESTS := bad_inputs block calibration formats fp_oracle fp_quant int_quant layering luq_nm policies \
	properties_int_prune prune rng special
test-fast: $(STAMP)
	$(PYTEST) $(FAST_TESTS:%=tests/test_%.py)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

bench: $(STAMP)
	$(PYTHON) benchmarks/ops.py

clean-venv:
	rm -rf $(VENV)
