"""``pettingllms train``: compose the Hydra config, build the trainer, train."""

from __future__ import annotations

import logging
import sys
from typing import Sequence

from pettingllms.core import PettingLLMsError


def parse_args(argv: Sequence[str]) -> tuple[str, str | None, list[str]]:
    """Split ``--config-name X`` / ``--config-dir D`` from Hydra overrides."""
    name, directory, overrides = "train", None, []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("--config-name", "-cn"):
            name = args.pop(0)
        elif arg.startswith("--config-name="):
            name = arg.split("=", 1)[1]
        elif arg in ("--config-dir", "-cd"):
            directory = args.pop(0)
        elif arg.startswith("--config-dir="):
            directory = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    return name, directory, overrides


def run_training(config_name: str = "train", overrides: Sequence[str] = (), config_dir: str | None = None):
    from pettingllms.config.load import compose, to_schema
    from pettingllms.trainer.trainer import Trainer

    cfg = to_schema(compose(config_name, overrides, config_dir))
    trainer = Trainer(cfg)
    results = trainer.fit()
    return trainer, results


def train_command(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    name, directory, overrides = parse_args(argv)
    try:
        trainer, _ = run_training(name, overrides, directory)
    except PettingLLMsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"run directory: {trainer.run_dir}")
    return 0
