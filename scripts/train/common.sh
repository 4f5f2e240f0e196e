#!/usr/bin/env bash
# Shared launcher for scripts/train/<domain>/<variant>.sh.
#
# A variant script sets CONFIG_NAME (a file in pettingllms/configs/) and DEFAULTS (an array of Hydra overrides), then
# sources this file. Extra arguments to the variant script are passed through as Hydra overrides and win
# over DEFAULTS, e.g.
#   bash scripts/train/math/math_L1_prompt.sh base_models.policy_0.path=smollm2-135m-instruct training.total_training_steps=2
#
# Environment:
#   GPU_num               GPUs per policy (every policy of the run; L3 runs one policy per agent). Default: the GPUs
#                         this run can use, split evenly over the script's POLICIES (1, or 2 for the L3 scripts):
#                         CLUSTER_GPUS when set (the Slurm launcher sets it to the whole allocation), else the
#                         devices in CUDA_VISIBLE_DEVICES, else what nvidia-smi lists, else 0 (CPU)
#   POLICIES              set by the variant script: how many policies share the GPUs by default
#   CUDA_VISIBLE_DEVICES  which GPUs this run may use (honoured by torch, vLLM and Ray)
#   REHEARSE_GPUS         with --rehearse and no GPU visible: the GPUs to rehearse the plan and placement at (8)
#   PYTHON                interpreter (default: .venv/bin/python if present, else python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

visible_gpus() {
  if [[ -n "${CLUSTER_GPUS:-}" ]]; then
    echo "$CLUSTER_GPUS"
  elif [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    local gpus
    IFS=',' read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
    echo "${#gpus[@]}"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
  else
    echo 0
  fi
}

POLICIES="${POLICIES:-1}"
REHEARSING=0
for _arg in "$@"; do [[ "$_arg" == "--rehearse" ]] && REHEARSING=1; done
if [[ -z "${GPU_num:-}" ]]; then
  _visible="$(visible_gpus)"
  if (( REHEARSING && _visible == 0 )); then
    _visible="${REHEARSE_GPUS:-8}"  # --rehearse on a machine without GPUs: plan and place as on a GPU node
  fi
  if (( _visible >= POLICIES )); then
    GPU_num=$(( _visible / POLICIES ))
  elif (( _visible > 0 )); then
    GPU_num="$(awk -v n="$POLICIES" 'BEGIN { printf "%g", 1 / n }')"  # the policies share one GPU
  else
    GPU_num=0
  fi
fi

CPU_OVERRIDES=()
if [[ "$GPU_num" == "0" ]]; then
  # No GPU: float32. On CPUs without native bf16 (AVX2 only, like the CPU dev machine) bf16 matmuls are emulated,
  # several times slower than fp32. A dtype given on the command line still wins (it comes later).
  CPU_OVERRIDES+=("base_models.policy_0.dtype=float32")
fi

exec "$PYTHON" -m pettingllms.cli train --config-name "$CONFIG_NAME" "${DEFAULTS[@]}" \
  "resources.gpus_per_policy=$GPU_num" "${CPU_OVERRIDES[@]}" "$@"
