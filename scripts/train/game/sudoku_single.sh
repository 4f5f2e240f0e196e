#!/usr/bin/env bash
# L0: a single plan agent solves 4x4 Sudoku alone (no tool agent), one policy.
# Extra arguments are Hydra overrides, e.g. on CPU:
#   bash scripts/train/game/sudoku_single.sh base_models.policy_0.path=smollm2-135m-instruct training.total_training_steps=2 \
#     training.train_batch_size=1 rollout.branching=2 training.max_response_length=32 training.val_freq=0
CONFIG_NAME=sudoku
DEFAULTS=(
  "specialization=L0"
  "env.agents=[plan_agent]"
  "training.experiment_name=sudoku_L0_single"
)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
