"""``pettingllms check-env``: the conformance checker (``core/checker.py``) over named or all registered envs, built
with the options given (``--option KEY=VALUE`` or ``env.options.KEY=VALUE``, typed as Hydra overrides type them)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def conformance_report(env, seed: int = 0, name: str | None = None):
    """The checks that fit ``env``: an agent program's (``rollout/program.py::check_program``: it runs as a whole),
    else the conformance checker's (``core/checker.py``)."""
    from pettingllms.core.checker import check_env
    from pettingllms.core.program import AgentProgram
    from pettingllms.rollout.program import check_program

    if isinstance(env, AgentProgram):
        return check_program(env, seed=seed, name=name)
    return check_env(env, seed=seed, name=name)


def check_env_command(argv: Sequence[str]) -> int:
    from pettingllms.assembly.construct import check_options
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
            missing = _missing_package(env_cls)
            if args.all and missing:  # an optional library's env: said, not failed (naming it alone fails)
                print(f"check-env {name}: SKIPPED (needs the {missing!r} package, not installed here)")
                continue
            turns = {"max_turns": args.max_turns} if args.max_turns else {}
            # The options as a run checks them: a misspelled one is refused here too, not silently passed on.
            check_options(env_cls, options, "env.options", reserved={"max_turns": "pass --max-turns instead"})
            env = env_cls(**turns, **options)
            report = conformance_report(env, seed=args.seed, name=name)
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


def _missing_package(env_cls: type) -> str | None:
    """The package an env class ``requires`` (an optional library's env) when it is not installed, else None."""
    import importlib.util

    package = getattr(env_cls, "requires", None)
    return package if package and importlib.util.find_spec(package) is None else None


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
