#!/usr/bin/env bash
# L1: tool agent + plan agent on 6x6 one-box Sokoban, one shared policy (K=4).
# Extra arguments are Hydra overrides, e.g. on CPU:
#   bash scripts/train/game/sokoban_L1_prompt.sh base_models.policy_0.path=smollm2-135m-instruct training.total_training_steps=2 \
#     training.train_batch_size=1 rollout.branching=2 training.max_response_length=32 training.val_freq=0
CONFIG_NAME=sokoban
DEFAULTS=(
  "specialization=L1"
  "training.experiment_name=sokoban_L1_prompt"
)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
