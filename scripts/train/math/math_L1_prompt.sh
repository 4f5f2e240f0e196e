#!/usr/bin/env bash
# math, L1: both agents share one policy and differ by role prompt. Settings: pettingllms/configs/math.yaml (docs/environments/math.md).
# Extra arguments are Hydra overrides, e.g. a CPU smoke run:
#   bash scripts/train/math/math_L1_prompt.sh base_models.policy_0.path=smollm2-135m-instruct training.total_training_steps=2
set -euo pipefail
CONFIG_NAME=math
DEFAULTS=(
  "training.experiment_name=math_L1_prompt"
  "specialization=L1"
)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
