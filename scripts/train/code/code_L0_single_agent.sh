#!/usr/bin/env bash
# code, L0: the coder alone (multi-turn self-refinement), one policy. Settings: pettingllms/configs/code.yaml (docs/environments/code.md).
# Extra arguments are Hydra overrides, e.g. a CPU smoke run:
#   bash scripts/train/code/code_L0_single_agent.sh base_models.policy_0.path=smollm2-135m-instruct training.total_training_steps=2
set -euo pipefail
CONFIG_NAME=code
DEFAULTS=(
  "training.experiment_name=code_L0_single_agent"
  "specialization=L0" "env.agents=[coder]"
)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
