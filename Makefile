# One virtual environment (.venv), created on first use and reused; torch is a few GB, installed once.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
EXAMPLE ?= examples/cartpole.yaml

.PHONY: install run test test-fast lint crd cluster cluster-down cluster-binaries bench

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	@echo "Installing into $(VENV): PyPI's torch is a CUDA build of a few GB, fetched once and reused."
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install --progress-bar on -e '.[dev]'
	touch $@

install: $(STAMP)

## The main job: train CartPole with 2 DDP ranks and keep 2 evaluators in sync, on this machine.
run: install
	$(VENV)/bin/rlightning run $(EXAMPLE)

## The whole suite; builds the control-plane binaries first when their cache is cold.
test: install cluster-binaries lint
	$(VENV)/bin/pytest

## Everything that needs no control plane.
test-fast: install
	$(VENV)/bin/pytest -m "not cluster"

lint: install
	$(VENV)/bin/lint-imports

## Regenerate the CRD from the models (a test fails when the checked-in copy is stale).
crd: install
	$(VENV)/bin/rlightning crd --output crds/policygroups.rlightning.io.yaml
	cp crds/policygroups.rlightning.io.yaml charts/rlightning-operator/crds/

cluster-binaries: install
	$(PY) -m devcluster build

## A local control plane for trials; prints the KUBECONFIG to export.
cluster: cluster-binaries
	$(PY) -m devcluster up

cluster-down: install
	$(PY) -m devcluster down

bench: install
	$(PY) benchmarks/weight_sync.py
