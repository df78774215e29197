# The two commands of the quick start are `make demo` and `make test`. Both build what a fresh
# machine lacks: the venv (.venv), buf (.tools), and the dev control plane (~/.cache/).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUF_VERSION := 1.75.0
BUF := .tools/node_modules/.bin/buf

.PHONY: image crds test-tools venv tools proto proto-check lint typecheck buf-lint buf-breaking pytest test demo bench control-plane clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

$(BUF):
	mkdir -p .tools
	npm install --silent --no-audit --no-fund --prefix .tools @bufbuild/buf@$(BUF_VERSION)

tools: venv $(BUF)

# Regenerate manifests/crds/ from orchestrator/api/.
crds: venv
	$(PY) -m orchestrator.api.crd manifests/crds

# Regenerate fleetupgrade/ (the Python stubs) from proto/.
proto: venv
	PYTHON=$(PY) scripts/gen-proto
	PYTHON=$(PY) scripts/gen-legacy-proto

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

typecheck: venv
	$(VENV)/bin/mypy orchestrator plugins

buf-lint: $(BUF)
	$(BUF) lint

# Compares proto/ with the previous commit's (FILE rules); skipped where there is no history.
buf-breaking: $(BUF)
	@if git rev-parse -q --verify HEAD~1 >/dev/null && git cat-file -e HEAD~1:buf.yaml 2>/dev/null; then \
	  $(BUF) breaking --against '.git#ref=HEAD~1'; \
	else echo "buf breaking: no previous commit with buf.yaml; skipped"; fi

control-plane:
	scripts/dev-control-plane up

test-tools:
	scripts/ensure-test-tools

pytest: venv test-tools
	$(PY) -m pytest

test: tools lint typecheck buf-lint buf-breaking pytest

# Build the container image here (buildah + a base made with mmdebstrap); prints its size.
image: venv
	scripts/build-image

demo: tools
	scripts/demo

bench: venv
	$(PY) -m benchmarks.run_all

# The adversarial simulation beyond `make test`: SEEDS histories from START (replay one with
# `python -m tests.sim --seed N`).
SEEDS ?= 10000
START ?= 0
.PHONY: simulate
simulate: venv
	$(PY) -m tests.sim --seeds $(SEEDS) --start $(START) --workers 2

clean:
	-scripts/dev-control-plane down
	rm -rf .dev
