"""The ``pettingllms`` command: train, eval, check-env, plot.

``train`` and ``eval`` take Hydra overrides (``key=value``), exactly like the scripts under scripts/train.
Datasets are made by the loaders ``scripts/dataprocess/load_<domain>.py`` (docs/datasets.md).

A user's module next to where the command runs (``my_envs/guess.py``) can be named in
``env.name=my_envs.guess:GuessEnv`` or ``env.imports=[my_envs.guess]``: the current directory is searched for the
modules the user names (``core/registry.py``), as with ``python -m``, and for nothing else.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

USAGE = """pettingllms <command> [args]

commands:
  train [--config-name NAME] [key=value ...]   train with AT-GRPO (Hydra overrides; --help lists the keys)
  eval [--config-name NAME] [key=value ...]    evaluate a model or checkpoint on benchmarks (pass@k)
  plot RUN_DIR [--out PNG]                     draw training curves of a run directory
  export CKPT [--out DIR] [--merge-lora]       write a checkpoint as Hugging Face folders
  check-env [--imports MOD] NAME ... | --all  run the environment conformance checker
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "check-env":
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


def check_env_command(argv: Sequence[str]) -> int:
    from pettingllms.core.checker import check_env
    from pettingllms.core.errors import PettingLLMsError
    from pettingllms.core.registry import ENVS, find_env_class, import_modules

    parser = argparse.ArgumentParser(
        prog="pettingllms check-env", description="Environment conformance checks",
        epilog="A short name registered by your own module needs the module imported first: "
               "pettingllms check-env --imports my_envs.guess guess (or env.imports=[my_envs.guess] guess, as in "
               "training)")
    parser.add_argument("names", nargs="*", help="registry names or module:Class paths")
    parser.add_argument("--all", action="store_true", help="check every registered environment")
    parser.add_argument("--imports", action="append", default=[], metavar="MODULE[,MODULE]",
                        help="modules to import first, so that they register their envs (like env.imports)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an env option, as env.options.KEY=VALUE in training (repeatable; values typed as in "
                             "Hydra overrides: game=kuhn_poker, max_invalid=3)")
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(_imports_override_as_flag(argv))
    modules = [m.strip() for value in args.imports for m in value.split(",") if m.strip()]
    try:
        import_modules(modules, "check-env --imports")
    except PettingLLMsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        options = _env_options(args.option)
    except PettingLLMsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = ENVS.names() if args.all else args.names
    if not names:
        parser.error("name at least one env, or pass --all")
    failed = []
    for name in names:
        try:
            env_cls = find_env_class(name, modules, named="{!r}", import_with="--imports {}")
            turns = {"max_turns": args.max_turns} if args.max_turns else {}
            env = env_cls(**turns, **options)
            report = check_env(env, seed=args.seed, name=name)
            print(report.format())
            ok = report.ok
        except (PettingLLMsError, ImportError, TypeError, ValueError) as exc:  # the env's own bugs are reported
            print(f"check-env {name}: FAIL\n  cannot build the env: {exc}")
            ok = False
        if not ok:
            failed.append(name)
    if failed:
        print(f"\n{len(failed)} of {len(names)} env(s) failed: {failed}", file=sys.stderr)
        return 1
    return 0


def _env_options(pairs: Sequence[str]) -> dict:
    """``["game=kuhn_poker", "max_invalid=3"]`` -> ``{"game": "kuhn_poker", "max_invalid": 3}``, typed by Hydra's
    override grammar as ``env.options.<key>=<value>`` would be in training."""
    from pettingllms.config.load import parse_overrides
    from pettingllms.core.errors import ConfigError

    options = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--option {pair!r}: give KEY=VALUE, e.g. --option game=tic_tac_toe")
        (override,) = parse_overrides([pair])
        options[override.key_or_group] = override.value()
    return options


def _imports_override_as_flag(argv: Sequence[str]) -> list[str]:
    """``env.imports=[a,b]`` (the training key, pasted) -> ``--imports a,b``; ``env.options.k=v`` -> ``--option k=v``."""
    out = []
    for arg in argv:
        if arg.startswith(("env.options.", "+env.options.", "++env.options.")):
            out += ["--option", arg.split("env.options.", 1)[1]]
        elif arg.startswith(("env.imports=", "+env.imports=", "++env.imports=")):
            out += ["--imports", arg.split("=", 1)[1].strip("[]").replace(" ", "")]
        else:
            out.append(arg)
    return out


if __name__ == "__main__":
    sys.exit(main())
