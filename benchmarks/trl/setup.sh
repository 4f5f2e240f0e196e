#!/usr/bin/env bash
# Make .venv-trl (at the repository root) for the TRL side of benchmarks/trl_compare.py.
#   bash benchmarks/trl/setup.sh            # uses python3.11 (or $PYTHON)
# torch must be the CPU build. Where pip is configured with a local wheel folder (PIP_FIND_LINKS, as on the
# project's CPU machines) that folder provides it; otherwise the PyTorch CPU index is added. uv installs, as in the
# other lanes' venvs (scripts/lane_venv.sh): pip's resolver took minutes here on every fresh clone (CI's).
# Idempotent: a finished install leaves a stamp of its requirements.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VENV_TRL:-$ROOT/.venv-trl}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
REQUIREMENTS="$ROOT/benchmarks/trl/requirements.txt"
STAMP="$VENV/.pettingllms-trl-installed"

log() { echo "trl/setup: $*"; }
# shellcheck source=../../scripts/lane_venv.sh
source "$ROOT/scripts/lane_venv.sh"

want_stamp() { sha256sum "$REQUIREMENTS" | cut -d' ' -f1; }

lane_venv_create
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(want_stamp)" ]]; then
    log "already installed in $VENV"
    exit 0
fi
EXTRA=()
if [ -z "${PIP_FIND_LINKS:-}" ]; then
    EXTRA=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi
lane_install ${EXTRA[@]+"${EXTRA[@]}"} -r "$REQUIREMENTS"
"$VENV/bin/python" - <<'PY'
import torch, transformers, trl
assert not torch.version.cuda, f"the TRL venv needs the CPU torch build, got CUDA {torch.version.cuda}"
print(f"TRL venv ready: trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
PY
want_stamp > "$STAMP"
