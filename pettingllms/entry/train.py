"""``pettingllms train``: compose the Hydra config, build the trainer, train.

    pettingllms train [--config-name NAME] [--config-dir DIR] [--multirun|-m] [--dry-run|--rehearse] [key=value ...]

``--multirun`` expands sweeps with Hydra's own override grammar and its basic sweeper (the cartesian product of
``key=a,b``, ``key=range(1,4)`` and ``key=choice(a,b)``, in command-line order), checks that every combination
composes, then trains them one after another, each in its own directory
``<training.log_dir>/multirun/<date>/<time>/<job>/``, and ends with a table of the runs (also kept, one JSON line
per job, in ``jobs.jsonl`` there). Every job's config is composed and its run planned (env, agents, policies,
data files) before the first one trains. ``--dry-run`` prints the resolved config, the run plan and where the
data comes from (with ``-m``: every job), checks all of it, and trains nothing. ``--help`` prints the options,
configs, config groups and the keys users set most. ``--rehearse`` rehearses the run on this machine: its plan and
GPU placement, then real steps with tiny replicas of its models (``entry/rehearse.py``).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Sequence

from pettingllms.core import ConfigError, PettingLLMsError, StoppedBySignal
from pettingllms.entry import console_logging
# a run from a config (also what tests, benchmarks and the rehearsal import from here)
from pettingllms.entry.run import check_run, load_config, run_checks, run_training, train  # noqa: F401

log = logging.getLogger("pettingllms.entry")
MULTIRUN_FLAGS = ("--multirun", "-m")
DRY_RUN_FLAG = "--dry-run"


HELP_FLAGS = ("--help", "-h")


def parse_args(argv: Sequence[str]) -> tuple[str, str | None, list[str]]:
    """Split ``--config-name X`` / ``--config-dir D`` from Hydra overrides."""
    name, directory, overrides = "train", None, []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("--config-name", "-cn", "--config-dir", "-cd"):
            if not args:
                raise ConfigError(f"{arg} needs a value")
            value = args.pop(0)
            if arg in ("--config-name", "-cn"):
                name = value
            else:
                directory = value
        elif arg.startswith("--config-name="):
            name = arg.split("=", 1)[1]
        elif arg.startswith("--config-dir="):
            directory = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    return name, directory, overrides


def split_flags(argv: Sequence[str]) -> tuple[bool, bool, list[str]]:
    """(multirun, dry_run, the remaining arguments)."""
    rest = [a for a in argv if a not in MULTIRUN_FLAGS and a != DRY_RUN_FLAG]
    return any(a in MULTIRUN_FLAGS for a in argv), DRY_RUN_FLAG in argv, rest


REHEARSE_FLAG = "--rehearse"


# ----------------------------------------------------------------------------------------------------- sweeps
def expand_sweep(overrides: Sequence[str]) -> list[list[str]]:
    """One override list per job: Hydra's BasicSweeper expansion of ``overrides`` (parsed by Hydra's grammar)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        (jobs,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    except HydraException as exc:
        hint = " (glob() sweeps are not supported: list the options, e.g. +experiment=a,b)" if "glob" in str(
            overrides) else ""
        raise ConfigError(f"cannot expand the sweep {list(overrides)}: {exc}{hint}") from exc
    return [list(job) for job in jobs]


def swept_keys(jobs: Sequence[Sequence[str]]) -> list[str]:
    """Override keys whose value differs between jobs, in command-line order."""
    values: dict[str, set[str]] = {}
    for job in jobs:
        for override in job:
            key, _, value = override.partition("=")
            values.setdefault(key, set()).add(value)
    return [k for k, v in values.items() if len(v) > 1]


@dataclass
class JobOutcome:
    job: int
    overrides: list[str]
    status: str  # ok | failed
    run_dir: str | None = None
    error: str | None = None
    seconds: float = 0.0
    steps: int = 0
    headline: dict[str, float] = field(default_factory=dict)


def headline_metrics(run_dir: Path) -> tuple[int, dict[str, float]]:
    """(last step, latest values): mean agent reward, train success and each benchmark's validation success."""
    from pettingllms.trainer.plots import REWARD, SUCCESS, collect_series, read_summary

    rows = read_summary(run_dir)
    latest = {key: values[-1] for key, (_, values) in collect_series(rows).items()}
    out = {}
    rewards = [v for k, v in latest.items() if re.match(REWARD.train, k)]
    if rewards:
        out["reward"] = fmean(rewards)
    for key in sorted(latest):
        if re.match(SUCCESS.train, key) or re.match(SUCCESS.validation, key):
            out[key] = latest[key]
    return max(int(r["step"]) for r in rows), out


def load_job(config_name: str, job: Sequence[str], index: int, config_dir: str | None = None):
    """A sweep job's config; its errors name the job."""
    try:
        return load_config(config_name, job, config_dir)
    except PettingLLMsError as exc:
        raise type(exc)(f"multirun job {index} ({' '.join(job) or 'no overrides'}): {exc}") from exc


def run_multirun(config_name: str, overrides: Sequence[str], config_dir: str | None = None,
                 dry_run: bool = False) -> list[JobOutcome]:
    """Train every combination of the sweep in turn. Every job is composed (validated) before the first trains."""
    from pettingllms.assembly.run_dirs import new_run_dir
    from pettingllms.config.frozen import evolve

    jobs = expand_sweep(overrides)
    configs = [load_job(config_name, job, index, config_dir) for index, job in enumerate(jobs)]
    log_dirs = {c.training.log_dir for c in configs}
    if len(log_dirs) > 1:
        raise ConfigError(f"training.log_dir cannot be swept (got {sorted(log_dirs)}): jobs go under one "
                          "<log_dir>/multirun/<date>/<time>/<job>/")
    resumes = {c.training.resume for c in configs} - {"auto", "none", ""}
    if resumes:
        raise ConfigError(f"training.resume={sorted(resumes)[0]!r} cannot be combined with --multirun: every job "
                          "would continue the same checkpoint. Sweep fresh runs (resume=auto or none)")
    plans = []
    for index, (job, cfg) in enumerate(zip(jobs, configs)):  # every job is planned before the first one trains
        try:
            plans.append(check_run(cfg))
        except PettingLLMsError as exc:
            raise type(exc)(f"multirun job {index} ({' '.join(job) or 'no overrides'}): {exc}") from exc
    keys = swept_keys(jobs)
    if dry_run:
        print(f"multirun: {len(jobs)} job(s) from config {config_name!r}; swept: {keys or 'nothing'}; every job's "
              f"config, plan and data checked")
        for index, (job, lines) in enumerate(zip(jobs, plans)):
            print(f"  job {index}: {' '.join(job) or '(no overrides)'}")
            print("\n".join("    " + line for block in lines for line in block.splitlines()))
        return []

    root = new_run_dir(log_dirs.pop(), "multirun", shared=all(c.training.share_run_dir for c in configs))
    outcomes = []
    for index, (job, cfg) in enumerate(zip(jobs, configs)):
        job_dir = root / str(index)
        cfg = evolve(cfg, {"training.log_dir": str(job_dir)})
        print(f"\n=== multirun job {index + 1}/{len(jobs)}: {' '.join(job) or '(no overrides)'}", flush=True)
        started = time.perf_counter()
        outcome = JobOutcome(index, job, "ok")
        try:
            train(cfg)
        except Exception as exc:  # one failed job must not lose the others; the table and exit code report it
            log.exception("multirun job %d failed", index)
            outcome.status, outcome.error = "failed", f"{type(exc).__name__}: {exc}"
        outcome.seconds = round(time.perf_counter() - started, 1)
        run_dirs = sorted(p.parent for p in job_dir.glob("*/*/*/config.yaml"))
        if run_dirs:
            outcome.run_dir = str(run_dirs[-1])
            try:
                outcome.steps, outcome.headline = headline_metrics(run_dirs[-1])
            except PettingLLMsError:
                pass  # the job failed before it logged a step: its error says why
        outcomes.append(outcome)
        with (root / "jobs.jsonl").open("a") as fh:
            fh.write(json.dumps(asdict(outcome)) + "\n")
    print(format_outcomes(outcomes, keys, root))
    return outcomes


def format_outcomes(outcomes: Sequence[JobOutcome], keys: Sequence[str], root: Path) -> str:
    metrics = sorted({k for o in outcomes for k in o.headline})
    header = ["job", "status", *keys, "steps", "time_s", *metrics, "run_dir"]
    rows = [header]
    for o in outcomes:
        values = dict(override.partition("=")[::2] for override in o.overrides)
        rows.append([str(o.job), o.status, *(values.get(k, "") for k in keys), str(o.steps), f"{o.seconds:.0f}",
                     *(f"{o.headline[m]:.3f}" if m in o.headline else "-" for m in metrics),
                     o.run_dir or "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"\nmultirun summary: {len(outcomes)} job(s), {sum(o.status == 'ok' for o in outcomes)} ok ({root})"]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines += [f"  job {o.job} failed: {o.error}" for o in outcomes if o.error]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- command
def train_command(argv: Sequence[str]) -> int:
    console_logging()
    multirun, dry_run, rest = split_flags(argv)
    rehearsal = REHEARSE_FLAG in rest
    rest = [a for a in rest if a != REHEARSE_FLAG]
    try:
        name, directory, overrides = parse_args(rest)
        if any(a in HELP_FLAGS for a in overrides):
            from pettingllms.entry.help import help_text

            print(help_text("train", name, directory, [o for o in overrides if o not in HELP_FLAGS]))
            return 0
        if rehearsal and (multirun or dry_run):
            raise ConfigError("--rehearse rehearses one run: drop --multirun and --dry-run")
        if multirun:
            outcomes = run_multirun(name, overrides, directory, dry_run)
            return 0 if all(o.status == "ok" for o in outcomes) else 1
        if dry_run:
            return dry_run_command(name, overrides, directory)
        if rehearsal:
            from pettingllms.entry.rehearse import rehearse_command

            return rehearse_command(name, overrides, directory)
        trainer, _ = run_training(name, overrides, directory)
    except StoppedBySignal as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return exc.exit_code
    except PettingLLMsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # e.g. where the run's train.log holds the traceback
            print(f"  {note}", file=sys.stderr)
        return 2
    print(f"run directory: {trainer.run_dir}")
    return 0


def dry_run_command(name: str, overrides: Sequence[str], directory: str | None) -> int:
    """Print the resolved config, the plan, the data and the models; train nothing. Errors are the trainer's own."""
    from pettingllms.config.load import to_yaml

    cfg = load_config(name, overrides, directory)
    summary, problems = run_checks(cfg)
    print(to_yaml(cfg))
    print("\n".join(summary))
    if problems:
        print(f"dry run: {len(problems)} problem(s) stop this run; nothing was trained", file=sys.stderr)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    print("dry run: config, plan and data checked, every model found and its chat template tried (or its download or "
          "conversion said above); nothing was trained")
    return 0
