# DDL-CE top-level build. `make test` and `make channel` each do all their own set-up on a
# fresh machine: Debian packages (when missing), a .venv with the Python tools, and the
# project's three components installed into it.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
ROOT := $(CURDIR)
VENV := $(ROOT)/.venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMPS := .venv/.stamps
export PATH := $(VENV)/bin:$(PATH)
# The PyPI Open MPI refuses root unless told; CI and these machines run as root.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
PYTEST_ARGS ?=

DDL_SOURCES := $(shell find ddl_core -type f \( -name '*.c' -o -name '*.h' -o -name '*.py' -o -name 'CMakeLists.txt' -o -name 'pyproject.toml' \) -not -path '*/build/*')

.PHONY: all test channel venv deps lint imports clean bench help
all: test

help:
	@echo "make channel   build the conda channel, install powerai into envs/powerai, write modulefiles"
	@echo "make test      run the whole test suite (sets up everything it needs)"
	@echo "make bench     run the allreduce benchmark (2 ranks) against mpi4py"
	@echo "make lint      ruff over the Python sources, and the import contracts"
	@echo "make imports   the import contracts alone (lint-imports, .importlinter)"

# --- system packages: installed only when one is missing, so reruns cost nothing ---------
$(STAMPS)/apt: .ci/apt-packages.txt | $(STAMPS)
	@missing=$$(for p in $$(grep -v '^#' .ci/apt-packages.txt); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	    echo "== apt-get install $$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@if [ "$$(id -u)" = 0 ] && [ -c /dev/fuse ] && [ "$$(stat -c %a /dev/fuse)" != 666 ]; then \
	    echo "== chmod 0666 /dev/fuse (fuse3's default; users mount sealed env images)"; \
	    chmod 0666 /dev/fuse; fi
	@touch $@

$(STAMPS):
	@test -x $(PY) || python3 -m venv $(VENV)
	@mkdir -p $(STAMPS)

# --- Python tools into .venv ----------------------------------------------------------
$(STAMPS)/venv: .ci/requirements-dev.txt | $(STAMPS)
	@echo "== pip install -r .ci/requirements-dev.txt into .venv"
	@$(PIP) install -r .ci/requirements-dev.txt
	@touch $@

# --- the components ---------------------------------------------------------------------
$(STAMPS)/ddl_core: $(STAMPS)/venv $(DDL_SOURCES)
	@echo "== building ddl_core (libddl + Python bindings) against $$(command -v mpicc)"
	@MPICC=$(VENV)/bin/mpicc $(PIP) install --no-build-isolation --no-deps --force-reinstall ./ddl_core
	@touch $@

# horovod-ddl: Horovod's API on DDL, its own distribution (it owns the `horovod` name)
HVD_SOURCES := $(shell find ddl_core/compat/horovod -type f \( -name '*.py' -o -name 'pyproject.toml' \))
$(STAMPS)/horovod: $(STAMPS)/ddl_core $(HVD_SOURCES)
	@$(PIP) install --no-build-isolation --no-deps --force-reinstall ./ddl_core/compat/horovod
	@touch $@

# ddl-torch: the C++ c10d Backend of the `ddl` torch.distributed backend, built against
# the torch in .venv (its C++ ABI and pybind11), so after it and without build isolation.
DDL_TORCH_SOURCES := $(shell find ddl_core/compat/torch -type f \( -name '*.py' -o -name '*.cpp' -o -name 'pyproject.toml' \) -not -path '*/build/*')
$(STAMPS)/ddl_torch: $(STAMPS)/venv $(DDL_TORCH_SOURCES) | $(STAMPS)/ddl_core
	@echo "== building ddl-torch (the C++ c10d Backend) against $$($(PY) -c 'import torch; print(torch.__version__)')"
	@$(PIP) install --no-build-isolation --no-deps --force-reinstall ./ddl_core/compat/torch
	@rm -rf ddl_core/compat/torch/build
	@touch $@

$(STAMPS)/envtools: $(STAMPS)/venv envtools/pyproject.toml
	@$(PIP) install --no-build-isolation --no-deps -e ./envtools
	@touch $@

$(STAMPS)/ci: $(STAMPS)/venv ci/pyproject.toml
	@$(PIP) install --no-build-isolation --no-deps -e ./ci
	@touch $@

# tools: what only this repository's tests and benchmarks use (the emulated cluster);
# into .venv only, never into a conda recipe or a user's env
$(STAMPS)/tools: $(STAMPS)/venv tools/pyproject.toml | $(STAMPS)/ddl_core
	@$(PIP) install --no-build-isolation --no-deps -e ./tools
	@touch $@

deps: $(STAMPS)/apt $(STAMPS)/venv $(STAMPS)/ddl_core $(STAMPS)/ddl_torch $(STAMPS)/horovod $(STAMPS)/envtools $(STAMPS)/ci $(STAMPS)/tools
venv: deps

# import-linter's contracts (.importlinter): which way imports may go, checked first
imports: $(STAMPS)/venv
	@PYTHONPATH=$(ROOT)/ddl_core/src:$(ROOT)/ci/src:$(ROOT)/tools/src:$(ROOT)/envtools/src $(VENV)/bin/lint-imports --no-cache --no-logo --config .importlinter

test: deps imports
	@$(PY) -m pytest -q -rs $(PYTEST_ARGS)

channel: deps
	@$(PY) -m ci channel

bench: deps
	@$(VENV)/bin/ddlrun -n 2 $(PY) -m ddl_core.bench allreduce

lint: $(STAMPS)/venv imports
	@$(VENV)/bin/ruff check ddl_core envtools ci tools tests

clean:
	rm -rf $(VENV) ddl_core/build
