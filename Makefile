# One virtual environment (.venv), created on first use and reused; torch is a few GB, installed once.
VENV ?= .venv
PY := $(VENV)/bin/python
# A venv with pip and PyYAML is all the control plane's Go build needs to start, so `make test` starts it first.
BOOT := $(VENV)/.boot-stamp
STAMP := $(VENV)/.installed-stamp
EXAMPLE ?= examples/cartpole.yaml

.PHONY: install run test test-fast lint crd cluster cluster-down cluster-binaries bench

$(BOOT):
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip pyyaml
	touch $@

$(STAMP): pyproject.toml | $(BOOT)
	@echo "Installing into $(VENV): PyPI's torch is a CUDA build of a few GB, fetched once and reused."
	$(PY) -m pip install --progress-bar on -e '.[dev]'
	touch $@

install: $(STAMP)

## The main job: train CartPole with one trainer rank fed by 2 evaluators in sync with it, on this machine.
run: install
	$(VENV)/bin/rlightning run $(EXAMPLE)

## The whole suite in phases (tools/test_phases.py): the Go builds of the test control plane run in the
## background (niced) during pip, lint and the tests that need no cluster; every phase runs in parallel
## (pytest-xdist, TEST_WORKERS workers); at the end a table says where the time went. TEST_FLAGS=--record appends
## the figures to docs/measurements.md.
TEST_WORKERS ?= 4
TEST_FLAGS ?=
test: $(BOOT)
	$(PY) tools/test_phases.py --workers $(TEST_WORKERS) $(TEST_FLAGS)

## Everything that needs no control plane and runs in seconds.
test-fast: install
	$(VENV)/bin/pytest -m "not cluster and not slow" -n $(TEST_WORKERS)

# Tests are type-checked for what breaks when the library changes (names, imports, call arities, return
# types), not for their scaffolding: deliberately invalid arguments, fakes and monkeypatches, and attributes
# reached through torch.nn.Module.__getattr__ (typed Tensor | Module) are allowed there.
TEST_MYPY_FLAGS := --follow-imports=silent --allow-incomplete-defs --disable-error-code=arg-type --disable-error-code=assignment \
	--disable-error-code=method-assign --disable-error-code=union-attr --disable-error-code=operator \
	--disable-error-code=index --disable-error-code=override --disable-error-code=misc \
	--disable-error-code=call-overload --disable-error-code=dict-item
# Each tests/ directory is checked on its own: its modules import their neighbours by bare name, as pytest
# runs them, and several directories have a conftest.py.
TEST_DIRS := $(sort $(wildcard tests/*/))
# mypy keys its cache by the options: runs with other flags keep caches of their own, or each would
# invalidate the others' and every run would check the library again from scratch. The cache lives outside the
# checkout, like the Go caches, so a fresh clone on this machine starts warm: mypy takes an entry whose file moved
# (another clone, another venv) when the file's size and hash still match.
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/rlightning/mypy

## Ruff, mypy and the import-layer contracts (pyproject.toml); zero findings.
lint: install
	$(VENV)/bin/ruff check rlightning operator devcluster benchmarks tests examples tools
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)/lib -p rlightning -p rlightning_operator -p devcluster
	MYPYPATH=examples/custom_policy $(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)/user -p reinforce_policy  # as a user would check it
	MYPYPATH=tests/operator $(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)/benchmarks --follow-imports=silent benchmarks
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)/tools tools
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)/tests $(TEST_MYPY_FLAGS) $(wildcard tests/*.py)
	set -e; for dir in $(TEST_DIRS); do MYPYPATH=$$dir $(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)/tests $(TEST_MYPY_FLAGS) $$dir; done
	$(VENV)/bin/lint-imports

## Regenerate the CRD from the models (a test fails when the checked-in copy is stale).
crd: install
	$(VENV)/bin/rlightning crd --output crds/policygroups.rlightning.io.yaml
	cp crds/policygroups.rlightning.io.yaml charts/rlightning-operator/crds/

cluster-binaries: install
	$(PY) -m devcluster build --addon metrics-server --addon karpenter --addon keda --addon kueue

## A local control plane for trials; prints the KUBECONFIG to export.
cluster: cluster-binaries
	$(PY) -m devcluster up

cluster-down: install
	$(PY) -m devcluster down

bench: install
	$(PY) benchmarks/weight_sync.py
