#!/usr/bin/env bash
# code, L3: one full model per agent. Settings: pettingllms/configs/code.yaml (docs/environments/code.md).
# Extra arguments are Hydra overrides, e.g. a CPU smoke run:
#   bash scripts/train/code/code_L3_model.sh base_models.policy_0.path=smollm2-135m-instruct training.total_training_steps=2
set -euo pipefail
CONFIG_NAME=code
DEFAULTS=(
  "training.experiment_name=code_L3_model"
  "specialization=L3"
)
POLICIES=2  # one model per agent: by default each gets half of the GPUs
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
