# Two commands a newcomer needs, each doing all its own set-up on a fresh clone:
#   make run   - install, make the tiny local model, train it with `rljob run` on the shipped example
#   make test  - install, lint, type-check and run every test
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
EXAMPLE ?= examples/arithmetic.yaml
MODEL_DIR ?= .cache/models/tiny-arith
DATA_FILE ?= .cache/data/arithmetic-train.jsonl

.PHONY: setup run test lint typecheck generate model clean e2e-real

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

model: setup
	$(BIN)/rljob make-model --task arithmetic --out $(MODEL_DIR) --data $(DATA_FILE)

run: model
	$(BIN)/rljob run $(EXAMPLE)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy api operator workers tests benchmarks

test: lint typecheck
	$(BIN)/pytest

# `kubectl apply` of examples/arithmetic-cluster.yaml on the e2e cluster's real node, to Succeeded
# (root; builds the control plane, the node's packages and the images first, each cached).
e2e-real: setup
	bash e2e/build.sh
	bash e2e/node-deps.sh
	bash e2e/images.sh deps
	nice -n 5 bash e2e/images.sh
	$(BIN)/pytest -s tests/operator/test_e2e_real.py

generate: setup
	$(BIN)/python proto/generate.py
	$(BIN)/rljob generate

clean:
	rm -rf $(VENV) .cache build *.egg-info
