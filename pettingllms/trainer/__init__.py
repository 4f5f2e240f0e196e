"""The training loop and what it needs around it: data, metrics, checkpoints, run directory, tracking."""
