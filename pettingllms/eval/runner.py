"""``run_evaluation``: benchmarks x independent samples through the training stack's executor, then pass@k.

Reads top to bottom:
1. check everything that needs no model: the checkpoint (its run's settings are the defaults: ``run_settings.py``),
   settings, envs, agents, each agent's sampling, benchmark files;
2. load each policy once (or connect to its server) and check every first prompt's length;
3. per env, one ``Executor`` in validation mode (independent episodes, the eval sampling for every agent);
   per benchmark, batches of problems x ``eval.n`` samples, each batch's records appended to its JSONL file;
4. per benchmark, the summary from its records; ``summary.json`` and the tables.

Run directory: ``<eval.log_dir>[/<eval.name>]/<date>/<time>/`` with ``config.yaml``, ``eval.log``,
``records/<env>/<benchmark>.jsonl`` (one line per problem) and ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping

from tqdm import tqdm

from pettingllms.assembly.plan import check_prompts, is_served
from pettingllms.assembly.served_agents import served_agents
from pettingllms.assembly.run_dirs import new_run_dir
from pettingllms.assembly.run_log import attach_file_logger, detach_file_logger
from pettingllms.config.load import to_yaml
from pettingllms.config.schema import EvalRunConfig
from pettingllms.core import ConfigError, InfrastructureError, Problem, SamplingParams
from pettingllms.core.program import AgentProgram
from pettingllms.eval.checkpoints import read_run_config, resolve_checkpoint
from pettingllms.eval.opponents import check_opponent, is_opponent, load_opponent, merged, seatings
from pettingllms.eval.policies import LoadedPolicies, load_policies, merge_specs
from pettingllms.eval.records import benchmark_summary, problem_record, sample_record
from pettingllms.eval.report import print_summary, write_summary
from pettingllms.eval.run_settings import with_settings_of_run
from pettingllms.eval.tasks import (
    Benchmark, EnvTask, EvalSettings, agent_sampling, check_agent_names, eval_settings, plan_tasks,
)
from pettingllms.eval.trace import success_trace
from pettingllms.rollout.executor import AgentSpec, Executor, RolloutResult
from pettingllms.rollout.program import ProgramRollout, rollout_for
from pettingllms.rollout.policy_client import PolicyClient

log = logging.getLogger("pettingllms.eval")


@dataclass
class EvalResult:
    run_dir: Path
    summary: dict[str, Any]


def run_evaluation(cfg: EvalRunConfig, clients: Mapping[str, PolicyClient] | None = None,
                   print_table: bool = True, user_keys: Collection[str] = ()) -> EvalResult:
    """Evaluate ``cfg``'s model on its benchmarks. ``clients`` (policy -> client) replaces model loading.
    ``user_keys``: the keys set on the command line, which a checkpoint's run does not replace."""
    started, start = datetime.now(), time.perf_counter()
    # 1. Everything that needs no model: checkpoint, settings, envs, agents, sampling, benchmark files.
    cfg, checkpoint, tasks, from_run = prepare(cfg, user_keys)
    settings = eval_settings(cfg.eval)
    sampling = {task.env_name: task_sampling(task, settings, cfg) for task in tasks}
    # 2. The models (or the server), then every first prompt against the length limit.
    policies = _policies(cfg, tasks, settings, checkpoint, clients)
    try:
        codecs = {name: client.codec for name, client in policies.clients.items()}
        for task in tasks:
            for bench in task.benchmarks:
                check_prompts(task.plan, codecs, bench.problems, cfg.training.max_prompt_length,
                              f"benchmark {bench.key!r}")
        run_dir = new_run_dir(cfg.eval.log_dir, cfg.eval.name, now=started, shared=cfg.training.share_run_dir)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        # 3. Roll out and record, benchmark by benchmark.
        results = {}
        with _eval_log(run_dir):
            if from_run:
                log.info("settings from the run %s (a key=value on the command line overrides any): %s", checkpoint,
                         ", ".join(f"{key}={value}" for key, value in from_run.items()))
            for task in tasks:
                for seat, specs in seatings(task.plan.agent_specs, opponent=bool(cfg.model.opponent)):
                    executor = _executor(task, specs, policies, sampling[task.env_name], cfg)
                    try:
                        for bench in task.benchmarks:
                            key = bench.key if seat is None else f"{bench.key}@{seat}"
                            results[key] = run_benchmark(executor, task, bench, settings, run_dir, key, seat)
                    finally:
                        if isinstance(executor, ProgramRollout):  # an agent program's gateway
                            executor.close()
    finally:
        policies.close()
    # 4. The summary: summary.json and the tables.
    summary = {
        "run_dir": str(run_dir),
        "started": started.isoformat(timespec="seconds"),
        "elapsed_s": time.perf_counter() - start,
        "model": _model_description(cfg, tasks, policies, checkpoint),
        "settings": {"n": settings.n, "k": list(settings.ks), **_shared_sampling(sampling),
                     "seed": settings.seed, "max_prompt_length": cfg.training.max_prompt_length,
                     "agents": {role: dataclasses.asdict(s) for by_role in sampling.values()
                                for role, s in by_role.items()}},
        "from_run": from_run,
        "benchmarks": results,
    }
    servers = {policy: engine.stats.as_dict() for policy, engine in policies.engines.items() if hasattr(engine, "stats")}
    if servers:  # an OpenAI-compatible server's request counts
        summary["server"] = servers
    write_summary(run_dir, summary)
    if print_table:
        print_summary(summary)
    refuse_failed_servers(policies.engines, cfg.model.max_failed_share, run_dir)
    return EvalResult(run_dir, summary)


def refuse_failed_servers(engines: Mapping[str, Any], share: float, run_dir: Path) -> None:
    """Raise InfrastructureError when more than ``share`` of a server's requests failed: numbers made mostly of failed
    samples are not an evaluation. One line per cause, with its count and first message."""
    for policy, engine in engines.items():
        stats = getattr(engine, "stats", None)
        if stats is None or not stats.requests or stats.failed_requests / stats.requests <= share:
            continue
        causes = "\n".join(f"  {count} x {cause}: {stats.first_failure.get(cause, '')}"
                           for cause, count in sorted(stats.failures.items(), key=lambda kv: -kv[1]))
        raise InfrastructureError(f"{stats.failed_requests} of {stats.requests} requests to the server of {policy} "
                              f"failed (more than model.max_failed_share={share:g}); the summary in {run_dir} is "
                              f"made of failed samples. Causes:\n{causes}")


def prepare(cfg: EvalRunConfig, user_keys: Collection[str] = ()
            ) -> tuple[EvalRunConfig, Path | None, list[EnvTask], dict[str, str]]:
    """The config with a checkpoint's run settings, the checkpoint, every env's plan and problems, and the keys
    the run set (key -> value)."""
    check_sources(cfg)
    checkpoint, user_cfg, from_run = None, cfg, {}
    if cfg.model.checkpoint:
        checkpoint, run = resolve_checkpoint(cfg.model.checkpoint)
        settings = with_settings_of_run(cfg, read_run_config(run), user_keys, run)
        cfg, from_run = settings.config, settings.taken
    tasks = plan_tasks(cfg)
    if cfg.model.opponent:
        check_opponent(cfg.model.opponent, cfg.base_models)
    check_agent_names(user_cfg, tasks)  # not the run's own agent entries: they name the roles it trained
    return cfg, checkpoint, tasks, from_run


def task_sampling(task: EnvTask, settings: EvalSettings, cfg: EvalRunConfig) -> dict[str, SamplingParams]:
    """Every agent's sampling in ``task`` (checked: greedy agents cannot give ``eval.n > 1`` distinct samples)."""
    return {role: agent_sampling(settings, role, spec.val_sampling, cfg.training.max_response_length)
            for role, spec in task.plan.agent_specs.items()}


def check_sources(cfg: EvalRunConfig) -> None:
    """At most one of checkpoint / adapters / server: each replaces where the weights come from."""
    m = cfg.model
    chosen = [name for name, value in (("model.checkpoint", m.checkpoint), ("model.adapters", m.adapters),
                                       ("model.server_url", m.server_url)) if value]
    if len(chosen) > 1:
        raise ConfigError(f"{' and '.join(chosen)} both say where the weights come from; keep one")


def run_benchmark(executor: Executor | ProgramRollout, task: EnvTask, bench: Benchmark, settings: EvalSettings,
                  run_dir: Path, key: str | None = None, seat: str | None = None) -> dict[str, Any]:
    """Roll out every problem ``settings.n`` times, write its records, and summarise them. ``key``: the records'
    and summary's name (default ``bench.key``); ``seat``: the agent with the evaluated weights, against an opponent."""
    start = time.perf_counter()
    key = key or bench.key
    path = run_dir / "records" / f"{key}.jsonl"  # <env>/<label>[@<seat>]: a file entry's stem, never its path
    path.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    timings: dict[str, float] = defaultdict(float)
    with path.open("w") as fh, tqdm(total=len(bench.problems), desc=key, unit="problem",
                                     dynamic_ncols=True) as bar:
        for first in range(0, len(bench.problems), settings.batch_problems):
            chunk = bench.problems[first:first + settings.batch_problems]
            seeds = list(range(first, first + len(chunk)))  # the trainer's validation seeds: the problem index
            result = executor.run(chunk, seeds, validation=True, n=settings.n)
            for record in batch_records(task, key, chunk, seeds, result, settings):
                fh.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
                records.append(record)
            for name, value in result.timings.items():
                timings[name] += value
            bar.update(len(chunk))
    summary = {"env": task.env_name, "benchmark": bench.name, **({"seat": seat} if seat else {}),
               "records": str(path.relative_to(run_dir)),
               **benchmark_summary(records, settings.ks, task.plan.env.max_turns),
               "elapsed_s": time.perf_counter() - start, "timings": dict(timings)}
    log.info("%s: %s", key, {k: v for k, v in summary.items() if k.startswith("pass@")})
    return summary


def batch_records(task: EnvTask, key: str, problems: list[Problem], seeds: list[int], result: RolloutResult,
                  settings: EvalSettings) -> list[dict[str, Any]]:
    """One record per problem. The executor returns a problem's n independent episodes consecutively."""
    samples = defaultdict(list)
    for s in result.samples:
        samples[s.episode].append(s)
    if len(result.episodes) != len(problems) * settings.n:
        raise RuntimeError(f"expected {len(problems)} x {settings.n} episodes, got {len(result.episodes)}")
    env, agents = task.plan.env, {role: spec.agent for role, spec in task.plan.agent_specs.items()}
    records = []
    for slot, (problem, seed) in enumerate(zip(problems, seeds)):
        episodes = result.episodes[slot * settings.n:(slot + 1) * settings.n]
        if any(e.problem_id != problem.problem_id for e in episodes):
            raise RuntimeError(f"episodes of problem {problem.problem_id!r} are out of order")
        rows = [sample_record(e, samples[e.episode], None if isinstance(env, AgentProgram)  # nothing to replay
                              else success_trace(env, agents, problem, seed, e), env.max_turns)
                for e in episodes]
        records.append(problem_record(key, problem.problem_id, rows, settings.ks))
    return records


def _policies(cfg: EvalRunConfig, tasks: list[EnvTask], settings: EvalSettings, checkpoint: Path | None,
              clients: Mapping[str, PolicyClient] | None) -> LoadedPolicies:
    if clients is not None:
        return LoadedPolicies(dict(clients), described={p: "client given by the caller" for p in clients})
    roles = list(dict.fromkeys(role for t in tasks for role in t.plan.agents))
    specs = merge_specs([spec for t in tasks for spec in t.plan.worker_specs])
    evaluated = load_policies(cfg.model, specs, roles, settings.seed, checkpoint)
    try:
        for task in tasks:  # agents.<role>.server: agents a served model plays, beside the evaluated ones
            if task.plan.servers and not set(task.plan.servers) <= set(evaluated.clients):  # once per name
                served = served_agents(task.plan, evaluated.clients)
                evaluated = merged(evaluated, LoadedPolicies(served.clients, described=served.described,
                                                             engines=served.engines))
        if not cfg.model.opponent:
            return evaluated
        return merged(evaluated, load_opponent(cfg.model, specs, roles, settings.seed))
    except BaseException:
        evaluated.close()
        raise


def _executor(task: EnvTask, agent_specs: Mapping[str, AgentSpec], policies: LoadedPolicies,
              sampling: Mapping[str, SamplingParams], cfg: EvalRunConfig) -> Executor | ProgramRollout:
    """The trainer's executor with each agent's eval sampling (validation mode is independent episodes).
    ``agent_specs``: the task's, or a seating's against an opponent (``eval/opponents.py``)."""
    specs = {
        role: dataclasses.replace(spec, val_sampling=sampling[role],
                                  adapter=spec.adapter if is_opponent(spec.policy) or is_served(spec.policy)
                                  else policies.agent_adapters.get(role, spec.adapter))
        for role, spec in agent_specs.items()
    }
    config = dataclasses.replace(task.plan.executor_config, max_prompt_length=cfg.training.max_prompt_length,
                                 max_response_length=max(s.max_tokens for s in sampling.values()))
    return rollout_for(task.plan.env, specs, policies.clients, config)


def _shared_sampling(sampling: Mapping[str, Mapping[str, SamplingParams]]) -> dict[str, Any]:
    """Each sampling key's value if every agent has the same one, else None (then see ``settings.agents``)."""
    values = [dataclasses.asdict(s) for by_role in sampling.values() for s in by_role.values()]
    return {key: values[0][key] if all(v[key] == values[0][key] for v in values) else None for key in values[0]}


def _model_description(cfg: EvalRunConfig, tasks: list[EnvTask], policies: LoadedPolicies,
                       checkpoint: Path | None) -> dict[str, Any]:
    agents = {}
    for task in tasks:
        for role, spec in task.plan.agent_specs.items():
            agents[role] = {"policy": spec.policy, "adapter": policies.agent_adapters.get(role, spec.adapter)}
    level = cfg.specialization
    if len({a["adapter"] for a in agents.values() if a["adapter"]}) > 1 and cfg.specialization in ("L0", "L1"):
        level = "L2"  # model.adapters gave each agent its own adapter on the shared base model
    return {"specialization": level, "checkpoint": str(checkpoint) if checkpoint else None,
            **({"opponent": cfg.model.opponent} if cfg.model.opponent else {}),
            "policies": policies.described, "agents": agents}


@contextmanager
def _eval_log(run_dir: Path) -> Iterator[None]:
    """``eval.log``, written as a training run writes ``train.log`` (``assembly/run_log.py``) while the evaluation
    runs; the loggers are as they were afterwards."""
    file_log = attach_file_logger(run_dir, "eval.log")
    try:
        yield
    finally:
        detach_file_logger(file_log)
