#!/usr/bin/env bash
# Make .venv-trl (at the repository root) for the TRL side of benchmarks/trl_compare.py.
#   bash benchmarks/trl/setup.sh            # uses python3.11 (or $PYTHON)
# torch must be the CPU build. Where pip is configured with a local wheel folder (PIP_FIND_LINKS, as on the
# project's CPU machines) that folder provides it; otherwise the PyTorch CPU index is added.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VENV_TRL:-$ROOT/.venv-trl}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
REQUIREMENTS="$ROOT/benchmarks/trl/requirements.txt"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
EXTRA=()
if [ -z "${PIP_FIND_LINKS:-}" ]; then
    EXTRA=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${EXTRA[@]}" -r "$REQUIREMENTS"
"$VENV/bin/python" - <<'PY'
import torch, transformers, trl
assert not torch.version.cuda, f"the TRL venv needs the CPU torch build, got CUDA {torch.version.cuda}"
print(f"TRL venv ready: trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
PY
