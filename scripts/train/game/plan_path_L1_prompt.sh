#!/usr/bin/env bash
# L1: tool agent + plan agent on 10x10 Plan-Path, one shared policy.
# Extra arguments are Hydra overrides, e.g. on CPU:
#   bash scripts/train/game/plan_path_L1_prompt.sh base_models.policy_0.path=smollm2-135m-instruct training.total_training_steps=2 \
#     training.train_batch_size=1 rollout.branching=2 training.max_response_length=32 training.val_freq=0
CONFIG_NAME=plan_path
DEFAULTS=(
  "specialization=L1"
  "training.experiment_name=plan_path_L1_prompt"
)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
