#!/usr/bin/env bash
# L3: tool agent + plan agent on Sokoban, one full model per agent (policy_tool_agent, policy_plan_agent).
# Extra arguments are Hydra overrides, e.g. on CPU:
#   bash scripts/train/game/sokoban_two_policy.sh base_models.policy_0.path=smollm2-135m-instruct training.total_training_steps=2 \
#     training.train_batch_size=1 rollout.branching=2 training.max_response_length=32 training.val_freq=0
CONFIG_NAME=sokoban
DEFAULTS=(
  "specialization=L3"
  "training.experiment_name=sokoban_L3_two_policy"
)
POLICIES=2  # one model per agent: by default each gets half of the GPUs
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
