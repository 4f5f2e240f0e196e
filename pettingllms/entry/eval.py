"""``pettingllms eval``: compose ``pettingllms/configs/eval.yaml`` with Hydra overrides, evaluate, print the summary."""

from __future__ import annotations

import sys
from typing import Sequence

from pettingllms.core import PettingLLMsError
from pettingllms.entry.train import HELP_FLAGS, parse_args
from pettingllms.entry import console_logging


def run_eval(config_name: str = "eval", overrides: Sequence[str] = (), config_dir: str | None = None,
             print_table: bool = True):
    from pettingllms.config.frozen import evolve
    from pettingllms.config.load import compose, to_schema
    from pettingllms.config.schema import EvalRunConfig
    from pettingllms.core import ConfigError
    from pettingllms.eval.run_settings import override_keys
    from pettingllms.eval.runner import run_evaluation

    cfg = to_schema(compose(config_name, overrides, config_dir))
    if not isinstance(cfg, EvalRunConfig):
        raise ConfigError(f"config {config_name!r} is not an evaluation config: its defaults must start with "
                          "pettingllms_eval_schema (or the eval config), as pettingllms/configs/eval.yaml does")
    keys = override_keys(overrides)
    if "env.name" in keys and not any(k == "env.benchmark" or k.startswith("env.benchmark.") for k in keys):
        # eval.yaml's benchmarks are math's and code's: an env named on the command line is evaluated on its own
        cfg = evolve(cfg, {"env.benchmark": []})
    # a checkpoint's run supplies every setting the command line leaves open (pettingllms/eval/run_settings.py)
    return run_evaluation(cfg, print_table=print_table, user_keys=keys)


def eval_command(argv: Sequence[str]) -> int:
    console_logging()
    try:
        name, directory, overrides = parse_args(["--config-name", "eval", *argv])  # a later --config-name wins
        if any(a in HELP_FLAGS for a in overrides):
            from pettingllms.entry.help import help_text

            print(help_text("eval", name, directory, [o for o in overrides if o not in HELP_FLAGS]))
            return 0
        result = run_eval(name, overrides, directory)
    except PettingLLMsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"run directory: {result.run_dir}")
    return 0
