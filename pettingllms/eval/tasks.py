"""What an evaluation runs: its sampling settings, and its benchmarks grouped by env, each env planned like a
training run (``assembly.plan.plan``: agents, policies, adapters). Everything here is checked before any model
is loaded: bad settings, unknown envs or agents, missing benchmark files.

Benchmark entries (``env.benchmark``) are ``<name>`` (an entry of ``env.name``) or ``<env>/<name>`` (another env,
so one call can cover math and code). ``<name>`` is ``data/<domain>/test/<name>.parquet`` or ``procedural``.
Per env, the config is the user's with ``env.name`` replaced; ``env.options`` apply to ``env.name``'s env only;
``agents.*`` entries and ``env.agents`` are split by the roles each env has.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pettingllms.assembly.plan import RunPlan, build_env, plan
from pettingllms.config.frozen import evolve
from pettingllms.config.schema import Config, EvalConfig
from pettingllms.core import ConfigError, DataError, Problem, RegistryError, SamplingParams
from pettingllms.core.registry import ENVS, get_env_class, import_modules
from pettingllms.data.problems import (
    FILE_SUFFIXES, benchmark_entries, benchmark_label, benchmark_problems, dataset_path,
)

PROCEDURAL = "procedural"


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens")  # eval.<key>, one SamplingParams field each


@dataclass(frozen=True)
class EvalSettings:
    n: int
    ks: tuple[int, ...]
    sampling: dict[str, Any]  # the eval.* sampling keys that are set; the others are each agent's val_sampling
    seed: int
    batch_problems: int


@dataclass
class Benchmark:
    key: str  # "<env>/<name>": the name in records and the summary
    name: str
    problems: list[Problem]


@dataclass
class EnvTask:
    env_name: str
    config: Config  # the user's config for this env
    plan: RunPlan
    benchmarks: list[Benchmark]
    roles: tuple[str, ...]  # every role of the env (acting or not)


def eval_settings(e: EvalConfig) -> EvalSettings:
    """Validated sampling settings: n >= 1, 1 <= k <= n, and sampled (T > 0) when n > 1."""
    if e.n < 1:
        raise ConfigError(f"eval.n (samples per problem) must be >= 1, got {e.n}")
    ks = tuple(dict.fromkeys(int(k) for k in e.k))
    if not ks:
        raise ConfigError("eval.k is empty: list the k of pass@k to report, e.g. eval.k=[1]")
    bad = [k for k in ks if not 1 <= k <= e.n]
    if bad:
        raise ConfigError(f"eval.k={list(e.k)}: pass@k needs 1 <= k <= eval.n={e.n}; {bad} are out of range. "
                          f"Raise eval.n or drop those k.")
    if e.n > 1 and e.temperature == 0:
        raise ConfigError(f"eval.n={e.n} greedy samples would all be the same: set eval.temperature > 0 for "
                          "sampled pass@k, or eval.n=1 for greedy")
    if e.batch_problems < 1:
        raise ConfigError(f"eval.batch_problems must be >= 1, got {e.batch_problems}")
    sampling = {key: getattr(e, key) for key in SAMPLING_KEYS if getattr(e, key) is not None}
    try:
        SamplingParams(**sampling)  # the given values are checked here, the agents' ones by the config's plan
    except ValueError as exc:
        raise ConfigError(f"eval sampling settings: {exc}") from exc
    return EvalSettings(e.n, ks, sampling, e.seed, e.batch_problems)


def agent_sampling(settings: EvalSettings, role: str, val_sampling: SamplingParams,
                   max_response_length: int) -> SamplingParams:
    """One agent's sampling: the eval.* keys that are set, the agent's ``val_sampling`` for the others (its
    max_tokens capped by ``training.max_response_length``, as in the trainer's validation)."""
    values = {**{key: getattr(val_sampling, key) for key in SAMPLING_KEYS}, **settings.sampling}
    if "max_tokens" not in settings.sampling:
        values["max_tokens"] = min(values["max_tokens"], max_response_length)
    if settings.n > 1 and values["temperature"] == 0:
        raise ConfigError(f"eval.n={settings.n} greedy samples would all be the same: agent {role!r} samples at "
                          f"temperature 0 (its val_sampling); set eval.temperature > 0 for sampled pass@k, or "
                          "eval.n=1 for greedy")
    return SamplingParams(**values)


def plan_tasks(cfg: Config) -> list[EnvTask]:
    """Every env's plan and benchmark problems, in the order the benchmarks are listed."""
    import_modules(cfg.env.imports, "env.imports")  # a user's module may register envs and agents
    entries = group_benchmarks(benchmark_entries(cfg.env.benchmark), cfg.env.name)
    tasks = []
    for env_name, names in entries.items():
        env_cfg, roles = config_for_env(cfg, env_name)
        run_plan = plan(env_cfg)
        names = names or [_default_benchmark(run_plan, env_cfg)]
        benchmarks = [Benchmark(f"{env_name}/{benchmark_label(name)}", name, _problems(run_plan, env_cfg, name))
                      for name in names]
        tasks.append(EnvTask(env_name, env_cfg, run_plan, benchmarks, roles))
    return tasks


def check_agent_names(cfg: Config, tasks: Sequence[EnvTask]) -> None:
    """Every role named in ``agents.*`` or ``env.agents`` belongs to some evaluated env (catches typos)."""
    roles = {role for t in tasks for role in t.roles}
    stray = sorted((set(cfg.agents) | set(cfg.env.agents or ())) - roles)
    if stray:
        raise ConfigError(f"agent {stray[0]!r} (in agents.* or env.agents) is not a role of any evaluated env: "
                          f"{[t.env_name for t in tasks]} have roles {sorted(roles)}")


def group_benchmarks(entries: Sequence[str], default_env: str) -> dict[str, list[str]]:
    """``[a, math/b, code/c]`` -> ``{default_env: [a], math: [b], code: [c]}`` (order kept; duplicates refused).

    An empty list evaluates ``default_env`` on its default benchmark.
    """
    grouped: dict[str, list[str]] = {}
    for entry in entries:
        env_name, name = _split_env(entry, default_env)
        if not name:
            raise ConfigError(f"env.benchmark entry {entry!r} names no benchmark; use <name> or <env>/<name>")
        if benchmark_label(name) in [benchmark_label(n) for n in grouped.get(env_name, [])]:
            raise ConfigError(f"benchmark {env_name}/{name} is listed twice in env.benchmark")
        grouped.setdefault(env_name, []).append(name)
    return grouped or {default_env: []}


def _split_env(entry, default_env: str) -> tuple[str, object]:
    """``<env>/<name>`` when the part before the first ``/`` is a registered env; otherwise the whole entry is a
    benchmark of ``default_env`` (a name, a file path, a hub id ``owner/name`` or a mixture)."""
    if not isinstance(entry, str) or "/" not in entry or entry.lower().endswith(FILE_SUFFIXES):
        return default_env, entry
    prefix, name = entry.split("/", 1)
    return (prefix, name) if prefix in ENVS else (default_env, entry)


def config_for_env(cfg: Config, env_name: str) -> tuple[Config, tuple[str, ...]]:
    """The user's config with ``env.name=env_name``, its agent entries restricted to that env's roles; and
    the env's roles."""
    changes = {"env.name": env_name, "env.agents": None, "agents": {}}
    if env_name != cfg.env.name:
        changes["env.options"] = {}  # options are keyword arguments of env.name's class
        changes["env.graph"] = None  # and env.graph names env.name's agents
    if cfg.env.max_turns <= 0:
        changes["env.max_turns"] = default_max_turns(env_name)
    roles = build_env(evolve(cfg, changes)).graph.agents
    changes["agents"] = {role: a for role, a in cfg.agents.items() if role in roles}
    if cfg.env.agents is not None:
        chosen = [r for r in cfg.env.agents if r in roles]
        if not chosen:
            raise ConfigError(f"env.agents={list(cfg.env.agents)} names none of env {env_name!r}'s roles "
                              f"{list(roles)}; add one of them (e.g. env.agents=[{roles[0]}])")
        changes["env.agents"] = chosen
    return evolve(cfg, changes), tuple(roles)


def default_max_turns(env_name: str) -> int:
    """The env class's own ``max_turns`` default (``env.max_turns=0`` asks for it)."""
    env_cls = get_env_class(env_name)
    parameter = inspect.signature(env_cls.__init__).parameters.get("max_turns")
    if parameter is None or not isinstance(parameter.default, int):
        raise ConfigError(f"env {env_name!r} has no default max_turns; set env.max_turns")
    return parameter.default


def _default_benchmark(run_plan: RunPlan, cfg: Config) -> str:
    try:
        run_plan.env.procedural_problems("test", 1)
        return PROCEDURAL
    except DataError:
        raise ConfigError(f"env {cfg.env.name!r} reads its problems from files: list them in env.benchmark "
                          f"({_available(run_plan, cfg)})") from None


def _problems(run_plan: RunPlan, cfg: Config, name: str) -> list[Problem]:
    try:
        return benchmark_problems(run_plan.env, cfg.env.data_root, name, cfg.env.max_val_problems)
    except DataError as exc:
        prefix = str(name).split("/", 1)[0] if isinstance(name, str) and "/" in name else None
        if prefix is not None and not str(name).lower().endswith(FILE_SUFFIXES):
            try:  # "<x>/<y>" with no env <x>: a misspelt env, or a hub dataset that did not load; say both
                get_env_class(prefix)
            except RegistryError as unknown:
                raise RegistryError(f"benchmark {name!r}: {unknown} Read as a hub dataset of env {cfg.env.name!r} "
                                    f"instead, it failed too: {exc}") from exc
        raise DataError(f"benchmark {cfg.env.name}/{name}: {exc} ({_available(run_plan, cfg)})") from exc


def _available(run_plan: RunPlan, cfg: Config) -> str:
    domain = getattr(run_plan.env, "domain", "misc")
    folder = dataset_path(cfg.env.data_root, domain, "test", "x").parent
    names = sorted(p.stem for p in Path(folder).glob("*.parquet"))
    return f"available in {folder}: {names}" if names else f"no benchmark files in {folder} yet"
