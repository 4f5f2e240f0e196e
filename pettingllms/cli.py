"""The ``pettingllms`` command: train, eval, check-env, plot.

``train`` and ``eval`` take Hydra overrides (``key=value``), exactly like the scripts under scripts/train.
Datasets are made by the loaders ``scripts/dataprocess/load_<domain>.py`` (docs/datasets.md).

A user's module next to where the command runs (``my_envs/guess.py``) can be named in
``env.name=my_envs.guess:GuessEnv`` or ``env.imports=[my_envs.guess]``: the current directory is searched for the
modules the user names (``core/registry.py``), as with ``python -m``, and for nothing else.
"""

from __future__ import annotations

import sys
from typing import Sequence

USAGE = """pettingllms <command> [args]

commands:
  train [--config-name NAME] [key=value ...]   train with AT-GRPO (Hydra overrides; --help lists the keys)
  eval [--config-name NAME] [key=value ...]    evaluate a model or checkpoint on benchmarks (pass@k)
  plot RUN_DIR [--out PNG]                     draw training curves of a run directory
  export CKPT [--out DIR] [--merge-lora]       write a checkpoint as Hugging Face folders
  check-env [--imports MOD] [--option K=V] NAME ... | --all   run the env conformance checker
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    from pettingllms.core.native_crashes import report_native_crashes

    report_native_crashes()  # a segfault in a kernel prints every thread's stack, here and in every child
    if command == "check-env":
        from pettingllms.entry.check_env import check_env_command

        return check_env_command(rest)
    if command == "train":
        from pettingllms.entry.train import train_command

        return train_command(rest)
    if command == "eval":
        from pettingllms.entry.eval import eval_command

        return eval_command(rest)
    if command == "export":
        from pettingllms.entry.export import export_command

        return export_command(rest)
    if command == "plot":
        from pettingllms.entry.plot import plot_command

        return plot_command(rest)
    print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
