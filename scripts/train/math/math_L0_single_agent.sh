#!/usr/bin/env bash
# math, L0: the reasoner alone (multi-turn self-refinement), one policy. Settings: pettingllms/configs/math.yaml (docs/environments/math.md).
# Extra arguments are Hydra overrides, e.g. a CPU smoke run:
#   bash scripts/train/math/math_L0_single_agent.sh base_models.policy_0.path=smollm2-135m-instruct training.total_training_steps=2
set -euo pipefail
CONFIG_NAME=math
DEFAULTS=(
  "training.experiment_name=math_L0_single_agent"
  "specialization=L0" "env.agents=[reasoner]"
)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
