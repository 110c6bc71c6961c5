# Two commands a newcomer needs, each doing all its own set-up on a fresh clone:
#   make run   - install, make the tiny local model, train it with `rljob run` on the shipped example
#   make test  - install, lint, type-check and run every test
# and one for the inner loop:
#   make test-quick - unit and contract tests only: no Ray, no cluster, no real node
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
EXAMPLE ?= examples/arithmetic.yaml
MODEL_DIR ?= .cache/models/tiny-arith
DATA_FILE ?= .cache/data/arithmetic-train.jsonl
EVAL_FILE ?= .cache/data/arithmetic-eval.jsonl
# Each phase says how long it took (and, under .ci/run, adds a row to its table of phases).
PHASE := bash .ci/phase
# The tests that can share the machine run on WORKERS processes (pytest-xdist, one module per worker at a
# time, --dist loadscope: its module fixtures start once; --dist loadgroup splits every module over both
# workers under pytest 9, tests/test_distribution.py); those marked `serial` run after them, alone, the real node's
# last (its control plane, shared by its modules, stays up until that session ends: not beside the timed
# tests). JUnit files, for .ci/slowest.py.
WORKERS ?= 2
RESULTS := .cache/test-results
QUICK := not (ray or cluster or node or slow)

.PHONY: setup run run-vllm vllm-env test test-quick lint typecheck generate model clean e2e-real e2e-real-vllm images

setup: $(STAMP)

# uv installs the pins (it links torch's and CUDA's wheels from its cache, where pip lays each one out
# again); runtimes/vllm.sh builds the vLLM runtime with it too. --compile-bytecode: uv writes no .pyc by
# default, and where PYTHONDONTWRITEBYTECODE is set (as on this project's machines) nor does Python, so every
# process would compile torch's and transformers' sources again: seconds of CPU in each pool actor at every
# start (benchmarks/README.md). Compiling here pays that once, at setup.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt uv
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -c constraints.txt -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

model: setup
	$(BIN)/rljob make-model --task arithmetic --out $(MODEL_DIR) --data $(DATA_FILE) --eval-data $(EVAL_FILE)

run: model
	$(BIN)/rljob run $(EXAMPLE)

# The same example with vLLM's CPU build as the rollout engine, in vLLM's own runtime (runtimes/vllm.sh:
# built once per content hash of its pins, about 6 GB).
vllm-env: setup
	bash runtimes/vllm.sh

run-vllm: model vllm-env
	$(BIN)/rljob run examples/arithmetic-vllm.yaml --rollout-python "$$(bash runtimes/vllm.sh path)"

lint: setup
	$(PHASE) lint sh -c '$(BIN)/ruff check . && $(BIN)/ruff format --check .'

# mypy's cache lives outside the clone: a fresh checkout re-checks only the files that changed
MYPY_CACHE ?= $(HOME)/.cache/rljob/mypy

typecheck: setup
	$(PHASE) type-check $(BIN)/mypy --cache-dir $(MYPY_CACHE) api operator workers tests benchmarks

# Every pytest run goes to the end; the slowest tests and modules of all are printed after them.
test: lint typecheck
	@rm -rf $(RESULTS); status=0; \
	$(PHASE) "tests, parallel ($(WORKERS) workers)" $(BIN)/pytest -n $(WORKERS) --dist loadscope --no-loadscope-reorder -m "not serial" \
		--junitxml=$(RESULTS)/parallel.xml || status=1; \
	$(PHASE) "tests, serial" $(BIN)/pytest -m "serial and not node" --junitxml=$(RESULTS)/serial.xml || status=1; \
	$(PHASE) "tests, real node" $(BIN)/pytest -m "serial and node and not vllm_node and not quickstart" --junitxml=$(RESULTS)/node.xml || status=1; \
	$(BIN)/python .ci/slowest.py $(RESULTS)/parallel.xml $(RESULTS)/serial.xml $(RESULTS)/node.xml; \
	exit $$status

test-quick: setup
	$(PHASE) "tests, quick" $(BIN)/pytest -n $(WORKERS) -m "$(QUICK)" -q

# `kubectl apply` of examples/arithmetic-cluster.yaml on the e2e cluster's real node, to Succeeded
# (root; builds the control plane, the node's packages and the images first, each cached).
e2e-real: setup
	bash e2e/build.sh
	bash e2e/node-deps.sh
	bash e2e/images.sh deps
	nice -n 5 bash e2e/images.sh
	nice -n 5 bash e2e/images-environment-ts.sh
	$(BIN)/pytest -s tests/operator/test_e2e_real.py tests/operator/test_e2e_real_environments.py

# The same with `engine: vllm`: the rollout pods on the rollout-vllm-test image with vLLM's CPU build (a 6 GB
# environment, made once per lock hash). Not in `make test`: more than CI's budget holds.
e2e-real-vllm: setup
	bash e2e/build.sh
	bash e2e/node-deps.sh
	bash e2e/images.sh deps
	nice -n 5 bash e2e/images.sh
	nice -n 5 bash e2e/images.sh rollout-vllm-test
	$(BIN)/pytest -s -m vllm_node tests/operator/test_e2e_real_vllm.py

# The README's cluster quick start, word for word, on the e2e cluster's real node: `make images ... PUSH=1` (the
# 6 GB worker image) to the node's registry, the packaged chart, claims from a default StorageClass, the job to
# Succeeded (root). Not in `make test`: more than CI's budget holds.
e2e-quickstart: setup
	bash e2e/build.sh
	bash e2e/node-deps.sh
	bash e2e/images.sh deps
	$(BIN)/pytest -s -m quickstart tests/operator/test_e2e_quickstart.py

# The operator and worker images from docker/*.Dockerfile, built here with buildah (root, no Docker engine;
# docker/README.md), tagged with the project's version; REGISTRY=host[:port]/path PUSH=1 pushes them there
# with buildah's credentials (`buildah login`, or REGISTRY_AUTH_FILE). The worker image is about 6 GB.
REGISTRY ?=
PUSH ?=
images:
	bash e2e/images.sh deps
	bash e2e/images.sh operator
	bash e2e/images.sh worker
	@if [ -n "$(PUSH)" ]; then \
		test -n "$(REGISTRY)" || { echo "PUSH=1 needs REGISTRY=host[:port]/path, e.g. REGISTRY=ghcr.io/rljob"; exit 2; }; \
		bash e2e/images-push.sh "$(REGISTRY)" operator worker; \
	fi

generate: setup
	$(BIN)/python proto/generate.py
	$(BIN)/rljob generate

clean:
	rm -rf $(VENV) .cache build *.egg-info
