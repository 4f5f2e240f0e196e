#!/usr/bin/env bash
# Shared launcher for scripts/train/<domain>/<variant>.sh.
#
# A variant script sets CONFIG_NAME (a file in pettingllms/configs/) and DEFAULTS (an array of Hydra overrides), then
# sources this file. Extra arguments to the variant script are passed through as Hydra overrides and win
# over DEFAULTS, e.g.
#   bash scripts/train/math/math_L1_prompt.sh base_models.policy_0.path=smollm2-135m-instruct training.total_training_steps=2
#
# Environment:
#   GPU_num               GPUs per policy (also vLLM tensor parallelism); default: the number of visible GPUs, or 0
#   CUDA_VISIBLE_DEVICES  which GPUs this run may use (honoured by torch, vLLM and Ray)
#   PYTHON                interpreter (default: .venv/bin/python if present, else python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

if [[ -z "${GPU_num:-}" ]]; then
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    IFS=',' read -r -a _gpus <<< "$CUDA_VISIBLE_DEVICES"
    GPU_num=${#_gpus[@]}
  elif command -v nvidia-smi >/dev/null 2>&1; then
    GPU_num=$(nvidia-smi -L 2>/dev/null | wc -l)
  else
    GPU_num=0
  fi
fi

GPU_OVERRIDES=()
if [[ "$GPU_num" -gt 0 ]]; then
  GPU_OVERRIDES+=("base_models.policy_0.num_gpus=$GPU_num" "base_models.policy_0.tensor_parallel=$GPU_num")
fi

exec "$PYTHON" -m pettingllms.cli train --config-name "$CONFIG_NAME" "${DEFAULTS[@]}" "${GPU_OVERRIDES[@]}" "$@"
