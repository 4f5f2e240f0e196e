#!/usr/bin/env bash
# L2: one base model with one LoRA adapter per agent (tool_agent, plan_agent) on a game.
# GAME picks the game: plan_path (default), sokoban or sudoku.
# Extra arguments are Hydra overrides, e.g. on CPU:
#   GAME=sudoku bash scripts/train/game/game_L2_lora.sh base_models.policy_0.path=smollm2-135m-instruct \
#     training.total_training_steps=2 training.train_batch_size=1 rollout.branching=2 training.max_response_length=32 training.val_freq=0
GAME="${GAME:-plan_path}"
case "$GAME" in
  plan_path|sokoban|sudoku) ;;
  *) echo "GAME must be plan_path, sokoban or sudoku, got '$GAME'" >&2; exit 2 ;;
esac
CONFIG_NAME="$GAME"
DEFAULTS=(
  "specialization=L2"
  "training.experiment_name=${GAME}_L2_lora"
)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
