"""A run from its config, shared by ``pettingllms train`` (``entry/train.py``: the command line, sweeps, the dry
run) and the rehearsal (``entry/rehearse.py``): load and type the config, check everything a run needs without
starting it, and train."""

from __future__ import annotations

from typing import Sequence

from pettingllms.core import ConfigError, PettingLLMsError


def load_config(config_name: str = "train", overrides: Sequence[str] = (), config_dir: str | None = None):
    """The typed config; bad keys, values and tracker names raise ConfigError here, before anything loads."""
    from pettingllms.config.load import compose, to_schema
    from pettingllms.trainer.tracking import check_backends

    cfg = to_schema(compose(config_name, overrides, config_dir))
    check_backends(cfg.training.logger)
    return cfg


def check_run(cfg) -> list[str]:
    """``run_checks``, raising one ConfigError that lists every problem found (the multirun's check of each job)."""
    lines, problems = run_checks(cfg)
    if problems:
        raise one_error(problems)
    return lines


def one_error(problems: list[PettingLLMsError]) -> PettingLLMsError:
    """The one error that reports ``problems``: the problem itself, or a ConfigError listing them all."""
    if len(problems) == 1:
        return problems[0]
    return ConfigError("\n".join([f"{len(problems)} problems stop this run:"] +
                                  [f"  {i}. {p}" for i, p in enumerate(problems, 1)]))


def run_checks(cfg) -> tuple[list[str], list[PettingLLMsError]]:
    """Check what the run needs to start, as the trainer will, without loading weights, downloading, converting or
    starting a process: the plan (env, agents, policies, worker layout, the GPU memory plan), every row of its data,
    every policy's engine and model (here, or downloadable: what would be downloaded is said) with its chat
    template on the first prompts, the placement, the checkpoint a resume continues. Returns (the summary lines,
    every problem found): one problem never hides the next, so a login node without the model still sees the plan,
    the data and the rest. A config that cannot be planned raises, as little else can be checked without it: its
    models' paths are, and a missing one is raised beside the plan's problem."""
    from pettingllms.assembly.describe import describe_plan
    from pettingllms.assembly.plan import PREFLIGHT_PROBLEMS, cpu_budget, plan
    from pettingllms.assembly.preflight import (chat_codecs, check_engines, check_first_prompts, describe_engines,
                                                describe_models, locate_models, unplanned_model_problems)
    from pettingllms.data.problems import describe_data, preview_problems
    from pettingllms.runtime.placement import check_here

    try:
        run_plan = plan(cfg)
    except PettingLLMsError as exc:
        raise one_error([exc, *unplanned_model_problems(cfg)]) from exc
    env = run_plan.env
    problems: list[PettingLLMsError] = []

    def attempt(check, *args):
        try:
            return check(*args)
        except PettingLLMsError as exc:
            for problem in getattr(exc, "problems", [exc]):  # DataProblems: every data set's, each on its own
                if str(problem) not in map(str, problems):  # the data's listing and its preview read the same files
                    problems.append(problem)
            return None

    attempt(check_engines, run_plan)
    data = attempt(describe_data, env, cfg.env.data_root, cfg.env.dataset, cfg.env.benchmark,
                   cfg.training.train_batch_size, cfg.env.max_val_problems) or []
    sources = attempt(locate_models, cfg, run_plan)
    codecs = None if sources is None else attempt(
        chat_codecs, cfg, run_plan, {name: source.directory for name, source in sources.items()})
    previews = attempt(preview_problems, env, cfg.env.data_root, cfg.env.dataset, cfg.env.benchmark,
                       PREFLIGHT_PROBLEMS, cfg.env.max_val_problems)
    if codecs is not None and previews is not None:
        attempt(check_first_prompts, cfg, run_plan, codecs, *previews)
    placement = attempt(check_here, [spec.layout for spec in run_plan.worker_specs], cpu_budget(cfg))
    resume = attempt(resume_line, cfg)
    lines = [describe_plan(run_plan), f"placement: {placement if placement is not None else '(see the problems)'}",
             *describe_engines(run_plan), *data,
             *(describe_models(sources, codecs) if sources is not None and codecs is not None else []),
             *([resume] if resume is not None else [])]
    return lines, problems


def resume_line(cfg) -> str:
    """What the run would continue from, its files checked as a resume checks them (index, shard sizes, RNG states,
    nothing leading out of the step directory) and its config against this one's (``resume_identity``); raises
    their one-line refusal."""
    from pettingllms.config.load import to_dict
    from pettingllms.trainer.resume_identity import check_resume
    from pettingllms.trainer.run_dir import resume_point

    training = cfg.training
    point = resume_point(training.log_dir, training.experiment_name, training.resume)
    if point is None or point[1] is None:
        return "resume:   none (a fresh run directory)"
    check_resume(point[1], to_dict(cfg), auto=training.resume == "auto")
    return f"resume:   {point[1]} (its files and config checked)"


def train(cfg):
    from pettingllms.trainer.trainer import Trainer

    with Trainer(cfg) as trainer:  # released on any error, in setup or in training
        results = trainer.fit()
    return trainer, results


def run_training(config_name: str = "train", overrides: Sequence[str] = (), config_dir: str | None = None):
    return train(load_config(config_name, overrides, config_dir))
