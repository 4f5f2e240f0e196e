#!/usr/bin/env bash
# Evaluate a model, a trainer checkpoint or a served model on benchmarks: pass@k, per-agent and per-turn success.
# Settings: pettingllms/configs/eval.yaml (docs/evaluation.md). Every argument is passed on as a Hydra override, e.g.
#   bash scripts/evaluate/evaluate.sh                                                 # embedded default, math + code
#   bash scripts/evaluate/evaluate.sh model.checkpoint=logs/math/2026-11-02/10-00-00  # a trainer run's latest checkpoint
#   bash scripts/evaluate/evaluate.sh base_models.policy_0.path=Qwen/Qwen3-1.7B env.benchmark=[math/AIME24] \
#     eval.n=8 eval.k=[1,8] eval.temperature=0.6 eval.top_p=0.95
#   bash scripts/evaluate/evaluate.sh model.server_url=http://localhost:8000/v1 model.served_name=Qwen/Qwen3-1.7B \
#     base_models.policy_0.path=Qwen/Qwen3-1.7B                                      # a vLLM/sglang server
#
# Environment:
#   CONFIG_NAME  the config in pettingllms/configs/ (default: eval)
#   PYTHON       interpreter (default: .venv/bin/python if present, else python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

exec "$PYTHON" -m pettingllms.cli eval --config-name "${CONFIG_NAME:-eval}" "$@"
