#!/usr/bin/env bash
# L1: tool agent + plan agent on 4x4 Sudoku, one shared policy, roles differ by prompt.
# Extra arguments are Hydra overrides, e.g. on CPU:
#   bash scripts/train/game/sudoku_L1_prompt.sh base_models.policy_0.path=smollm2-135m-instruct training.total_training_steps=2 \
#     training.train_batch_size=1 rollout.branching=2 training.max_response_length=32 training.val_freq=0
CONFIG_NAME=sudoku
DEFAULTS=(
  "specialization=L1"
  "training.experiment_name=sudoku_L1_prompt"
)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
