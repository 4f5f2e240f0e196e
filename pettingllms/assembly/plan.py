"""Build every part of a run from the typed config, and check inputs before any compute starts."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from pettingllms.algo.grpo import AdvantageConfig
from pettingllms.assembly.construct import accepted_options, check_options, construct
from pettingllms.config.frozen import thaw
from pettingllms.config.graph import acting_graph
from pettingllms.config.specialization import AgentPlan, PolicyPlan, plan_run
from pettingllms.assembly.memory import MemoryPlan, check_gpu_memory, planned_utilizations
from pettingllms.assembly.no_effect import no_effect
from pettingllms.assembly.opponent_pool import OpponentPool, check_pool, full_policies, slot_adapters, snapshot_policy
from pettingllms.config.schema import AgentServerConfig, Config, EvalRunConfig
from pettingllms.core import Agent, ConfigError, Env, PettingLLMsError, Problem, PromptTooLongError
from pettingllms.core.registry import make_agents
from pettingllms.core.program import AgentProgram
from pettingllms.core.registry import find_env_class, get_agent_class, import_modules
from pettingllms.learner import KLPenalty, LearnerConfig
from pettingllms.learner.sharding import FSDPOptions
from pettingllms.models import LoraSpec
from pettingllms.rollout.executor import AgentSpec
from pettingllms.rollout.executor import ExecutorConfig
from pettingllms.rollout.engine import ChatCodec
from pettingllms.runtime.layout import WorkerLayout, resolve_layout
from pettingllms.runtime.placement import local_cpus, share_cpus
from pettingllms.runtime.spec import WorkerSpec

log = logging.getLogger("pettingllms.assembly")
PREFLIGHT_PROBLEMS = 64  # training problems whose first prompts are checked against max_prompt_length


@dataclass
class RunPlan:
    env: Env
    policies: dict[str, PolicyPlan]
    agents: dict[str, AgentPlan]
    agent_specs: dict[str, AgentSpec]
    executor_config: ExecutorConfig
    advantage_config: AdvantageConfig
    worker_specs: list[WorkerSpec]
    memory: MemoryPlan | None = None  # the GPU memory plan (assembly/memory.py); None when no policy uses GPUs
    # agents.<role>.server: the policy name its spec routes to ("server:<role>") -> (the agent's own policy, whose
    # chat template renders its prompts; the server's settings)
    servers: dict[str, tuple[str, AgentServerConfig]] = dataclasses.field(default_factory=dict)
    pool: OpponentPool | None = None  # training: the opponent pool (self_play.*; size 0 when off); None in evaluation
    notes: tuple[str, ...] = ()  # settings with no effect in this run (assembly/no_effect.py)

    def resolved(self, directories: Mapping[str, str | Path] | None = None) -> "RunPlan":
        """The plan with every worker spec's model directory stored, resolved once per policy per run: the step
        where a run really starts (training, evaluation, export), never a dry run's plan. ``directories`` (policy ->
        directory) are taken as they are; any other policy's model is resolved here: an unknown model fails with
        ConfigError, the packaged model converts once."""
        directories = directories or {}
        specs = [dataclasses.replace(spec, model_dir=str(directories[spec.base_policy]))
                 if spec.base_policy in directories else spec.resolved() for spec in self.worker_specs]
        return dataclasses.replace(self, worker_specs=specs)


def build_env(cfg: Config) -> Env:
    """The env of ``env.name`` built with ``env.max_turns`` and ``env.options`` (checked against its constructor)."""
    imports = list(cfg.env.imports)
    import_modules(imports, "env.imports")  # a user's module may register its envs before lookup
    env_cls = find_env_class(cfg.env.name, imports)
    options = thaw(cfg.env.options)
    check_options(env_cls, options, "env.options", elsewhere=_agent_option_keys(env_cls), reserved={
        "max_turns": f"set env.max_turns={options.get('max_turns')} instead (the run passes it to the env)"})
    what = f"env {cfg.env.name!r}" if ":" in cfg.env.name else f"env {cfg.env.name!r} ({env_cls.__name__})"
    turns = {"max_turns": cfg.env.max_turns} if cfg.env.max_turns > 0 else {}  # 0: the class's own default
    shown = f"env.max_turns={cfg.env.max_turns}" + ("" if turns else " (the env's own default)")
    if getattr(env_cls, "takes_config_agents", False):  # an agent program's agents are what env.agents names
        turns["agents"] = list(cfg.env.agents or [])
    return construct(env_cls, what, f"{shown}, env.options={options}", **turns, **options)


def _agent_option_keys(env_cls: type) -> dict[str, list[str]]:
    """Option -> the ``agents.<role>.options`` keys of the env's own agents that take it: an agent's option given
    in ``env.options`` (``one_shot`` for math) is then refused pointing at where it goes."""
    keys: dict[str, list[str]] = {}
    for role, name in getattr(env_cls, "agent_classes", {}).items():
        try:
            agent_cls = get_agent_class(name)
        except (PettingLLMsError, ImportError):  # a broken agent class is reported when the agents are built
            continue
        for option in accepted_options(agent_cls, positional=1):
            keys.setdefault(option, []).append(f"agents.{role}.options.{option}")
    return keys


def plan(cfg: Config, *, check_memory: bool = True) -> RunPlan:
    """Env, agents, policies and worker specs. With GPUs, also the GPU memory plan: logged, and a run that cannot
    fit its GPUs is refused here, before anything loads (``check_memory=False`` skips it; evaluation configs, which
    train nothing, always do)."""
    env = build_env(cfg)
    env_roles = env.graph.agents
    env.graph = acting_graph(cfg.env, env.graph, f"env {cfg.env.name!r}")
    left_out = [role for role in env_roles if role not in env.graph.agents]
    if left_out:
        log.info("env.agents: %s act; %s of env %r do not", list(env.graph.agents), left_out, cfg.env.name)
    policies, agents = plan_run(cfg, env_roles, env.graph.agents)
    behaviours = make_agents(
        env,
        classes={r: a.cls for r, a in agents.items() if a.cls},
        options={r: a.options for r, a in agents.items()},
        build=_build_agent,
    )
    agent_specs = {
        role: AgentSpec(behaviours[role], served_policy(role) if a.server else a.policy, a.train_sampling,
                        a.val_sampling, None if a.server else _adapter_of(a, policies[a.policy]), a.trainable)
        for role, a in agents.items()
    }
    servers = {served_policy(role): (a.policy, a.server) for role, a in agents.items() if a.server}
    served_only = sorted(name for name, p in policies.items() if p.agents and all(agents[r].server for r in p.agents))
    if served_only:  # such a policy would load a whole model and engine for its chat template alone
        raise ConfigError(f"{served_only} would serve only agents that a server plays "
                          f"({sorted(r for n in served_only for r in policies[n].agents)}), loading a model just for its "
                          "chat template; point those agents at a policy another agent uses (agents.<role>.policy; "
                          "under L3 every agent gets its own, so use L1 or L2 with a served agent)")
    pool = None
    if not isinstance(cfg, EvalRunConfig):  # evaluation plays no pool (its own model.opponent instead)
        sp = cfg.self_play
        check_pool(sp.pool_size, agent_specs, isinstance(env, AgentProgram))
        pool = OpponentPool(sp.pool_size, sp.snapshot_every, sp.live_prob, agent_specs, cfg.training.seed)
    executor_config = executor_config_of(cfg)
    if isinstance(env, AgentProgram) and executor_config.mode != "trajectory" and not isinstance(cfg, EvalRunConfig):
        raise ConfigError(f"env {cfg.env.name!r} runs an agent program, which cannot be forked (tree sampling copies an "
                          "env's state at each turn): set rollout.mode=trajectory")
    advantage_config = AdvantageConfig(
        norm_by_std=cfg.algorithm.norm_adv_by_std,
        filter=cfg.algorithm.filter,
        filter_ratio=cfg.algorithm.filter_ratio,
        unit=executor_config.advantage_unit,  # the samples' maker says what counts once in a group
    )
    pooled_full = full_policies(agent_specs) if pool is not None and pool.enabled else []
    worker_specs = worker_specs_of(cfg, policies, pooled_full)
    memory = check_gpu_memory(cfg, worker_specs) if check_memory and not isinstance(cfg, EvalRunConfig) else None
    sized = planned_utilizations(memory)  # engine_options.gpu_memory_utilization=auto, sized by the plan
    worker_specs = [dataclasses.replace(spec, engine_options={**spec.engine_options,
                                                              "gpu_memory_utilization": sized[spec.policy]})
                    if spec.policy in sized else spec for spec in worker_specs]
    return RunPlan(env, policies, agents, agent_specs, executor_config, advantage_config, worker_specs, memory,
                   servers=servers, pool=pool, notes=tuple(no_effect(cfg, env.graph.agents)))


def executor_config_of(cfg: Config) -> ExecutorConfig:
    """The rollout's settings from the config (the executor has no defaults of its own)."""
    return ExecutorConfig(
        mode=cfg.rollout.mode,
        branching=cfg.rollout.branching,
        select=cfg.rollout.select,
        alpha=cfg.reward.alpha,
        non_finite=cfg.reward.non_finite,
        playouts=cfg.rollout.playouts,
        streaming=cfg.rollout.streaming,
        streaming_wait_s=cfg.rollout.streaming_wait_s,
        max_prompt_length=cfg.training.max_prompt_length,
        max_response_length=cfg.training.max_response_length,
    )


def _build_agent(role: str, cls: type, options: dict) -> Agent:
    where = f"agents.{role}.options"
    check_options(cls, options, where, positional=1)  # the role, as the agent's name
    return construct(cls, f"agent {role!r} ({cls.__name__})", f"{where}={options}", role, **options)


SHARED_ADAPTER = "shared"
SERVED = "server:"


def served_policy(role: str) -> str:
    """The client name of the server that plays agent ``role`` (``agents.<role>.server.url``)."""
    return f"{SERVED}{role}"


def is_served(policy: str) -> bool:
    return policy.startswith(SERVED)


def _adapter_of(agent: AgentPlan, policy: PolicyPlan) -> str | None:
    """L2: the agent's own adapter. LoRA under L1/L3: the policy's one shared adapter. Otherwise none."""
    if agent.adapter is not None:
        return agent.adapter
    return next(iter(_policy_adapters(policy)), None)


def worker_specs_of(cfg: Config, policies: dict[str, PolicyPlan], pooled_full: Sequence[str] = ()) -> list[WorkerSpec]:
    """One worker spec per policy, and one opponent-pool worker per full-weight policy in ``pooled_full``
    (``pool_worker_spec``), with the CPU budget split over the ranks of all of them (``share_cpus``).

    The budget here is ``resources.num_cpus`` or this process's CPUs; a run that joins a Ray cluster (Slurm) splits
    the cluster's CPUs again once it has joined (``PolicyGroup``)."""
    specs = [_worker_spec(cfg, policy, _layout(cfg, policy)) for policy in policies.values()]
    specs += [pool_worker_spec(next(s for s in specs if s.policy == name)) for name in pooled_full]
    return share_cpus(specs, cpu_budget(cfg))


def pool_worker_spec(live: WorkerSpec) -> WorkerSpec:
    """The worker that plays a full-weight policy's past versions (``runtime/snapshots.py``): the same model,
    engine and CPU settings (``cpus_per_rank``, ``num_threads``), untrained, one rank with the GPUs of one of the
    policy's engines."""
    where = f"base_models.{live.policy}"
    if live.layout.tensor_parallel > 1:
        raise ConfigError(f"self_play.pool_size with {where}.tensor_parallel={live.layout.tensor_parallel}: the past "
                          "versions of a full model are played by one more engine on one GPU, which is not built for "
                          f"tensor parallelism; give the policy a LoRA adapter ({where}.lora.rank=16) to keep them as "
                          "adapters, or set self_play.pool_size=0")
    name = snapshot_policy(live.policy)
    layout = resolve_layout(name, num_gpus=live.layout.gpus_per_rank, num_ranks=1, engine=live.engine)
    return dataclasses.replace(live, policy=name, layout=layout, trainable=False, snapshot_of=live.policy, fsdp=None)


def cpu_budget(cfg: Config) -> float:
    """CPUs this run may use before it knows a Ray cluster's: ``resources.num_cpus``, else this process's CPUs."""
    return float(cfg.resources.num_cpus or local_cpus())


def _layout(cfg: Config, policy: PolicyPlan) -> WorkerLayout:
    """A policy's worker group: ranks, GPUs, engines. Checked here, before anything loads."""
    model, where = policy.model, f"base_models.{policy.name}"
    num_gpus = model.num_gpus if model.num_gpus is not None else cfg.resources.gpus_per_policy
    layout = resolve_layout(
        policy.name,
        num_gpus=float(num_gpus),
        num_ranks=model.num_ranks,
        tensor_parallel=model.tensor_parallel,
        engine=model.engine,
        fsdp_enabled=model.fsdp.enabled,
    )
    options = _fsdp_options(model)
    if not layout.sharded and options != FSDPOptions():
        raise ConfigError(f"{where}.fsdp options need an FSDP worker group: set num_ranks > 1 or fsdp.enabled=true")
    if layout.sharded and not cfg.resources.use_ray:
        raise ConfigError(f"{where}: FSDP worker groups run as Ray actors; set resources.use_ray=true")
    if options.cpu_offload and not layout.uses_gpus:
        raise ConfigError(f"{where}.fsdp.cpu_offload needs GPU ranks; on CPU there is nothing to offload")
    if model.master_weights == "bfloat16" and model.dtype != "bfloat16":
        raise ConfigError(f"{where}.master_weights=bfloat16 needs {where}.dtype=bfloat16 (bf16 compute)")
    engine_dtype = model.engine_options.get("dtype", model.dtype)
    if layout.engine == "vllm" and layout.uses_gpus and model.lora.rank > 0 and engine_dtype in ("float32", "float"):
        # vLLM lets a float32 LoRA engine start, then its CUDA LoRA kernels assert float16/bfloat16 inputs.
        raise ConfigError(f"{where}: vLLM serves LoRA adapters on GPUs in bfloat16 or float16 only, and the engine "
                          f"would run in float32: set {where}.dtype=bfloat16 (the learner still keeps float32 "
                          "master weights)")
    return layout


def _engine_options(cfg: Config, model, layout: WorkerLayout) -> dict:
    """``base_models.<p>.engine_options``, plus vLLM's engine loop under the streaming rollout (the transformers
    engine micro-batches instead: ``rollout/batcher.py``)."""
    options = thaw(model.engine_options)
    if layout.engine == "vllm" and not isinstance(cfg, EvalRunConfig) and cfg.rollout.streaming:
        options.setdefault("continuous", True)
    return options


def _fsdp_options(model) -> FSDPOptions:
    return FSDPOptions(model.fsdp.cpu_offload, model.fsdp.reshard_after_forward)


def _policy_adapters(policy: PolicyPlan) -> tuple[str, ...]:
    """The policy's adapters: L2's one per agent; under L1/L3 with LoRA one shared by the policy's agents."""
    return policy.adapters or ((SHARED_ADAPTER,) if policy.model.lora.rank > 0 else ())


def _worker_spec(cfg: Config, policy: PolicyPlan, layout: WorkerLayout) -> WorkerSpec:
    model = policy.model
    lora = None
    if model.lora.rank > 0:
        lora = LoraSpec(model.lora.rank, model.lora.alpha, model.lora.dropout, tuple(model.lora.target_modules))
    adapters = _policy_adapters(policy)
    frozen = policy.frozen_adapters
    pool_size = 0 if isinstance(cfg, EvalRunConfig) else cfg.self_play.pool_size
    if lora and pool_size and policy.trainable:  # the opponent pool's frozen slots beside each trained adapter
        slots = slot_adapters([a for a in adapters if a not in frozen], pool_size)
        adapters, frozen = adapters + slots, frozen + slots
    return WorkerSpec(
        policy=policy.name,
        config_key=policy.config_key,
        model_path=model.path,
        learner=learner_config_of(cfg, model.dtype),
        layout=layout,
        dtype=model.dtype,
        lora=lora,
        adapters=adapters,
        frozen=frozen,
        trainable=policy.trainable,
        seed=cfg.training.seed,
        requested_threads=model.num_threads,
        requested_cpus=model.cpus_per_rank,
        engine_options=_engine_options(cfg, model, layout),
        fsdp=_fsdp_options(model) if layout.sharded else None,
        master_weights=model.master_weights,
        chat_template_kwargs=thaw(model.chat_template_kwargs),
    )


def learner_config_of(cfg: Config, dtype: str) -> LearnerConfig:
    """One policy's optimisation settings from the config (the learner has no defaults of its own)."""
    a, o, kl = cfg.algorithm, cfg.optim, cfg.algorithm.kl
    try:
        return LearnerConfig(
            total_steps=cfg.training.total_training_steps,
            lr=o.lr,
            weight_decay=o.weight_decay,
            # A paper-sized warmup on a 2-step smoke run would be invalid: warm up over at most the whole run.
            warmup_steps=min(o.warmup_steps, cfg.training.total_training_steps),
            min_lr_ratio=o.min_lr_ratio,
            grad_clip=o.grad_clip if o.grad_clip > 0 else None,
            ppo_epochs=o.ppo_epochs,
            ppo_mini_batch_size=o.ppo_mini_batch_size,
            micro_batch_max_tokens=o.micro_batch_max_tokens,
            logprob_chunk_tokens=o.logprob_chunk_tokens,
            attention=str(o.attention),
            pack_shared_prompts=o.pack_shared_prompts,
            clip_ratio_low=a.clip_ratio_low,
            clip_ratio_high=a.clip_ratio_high,
            clip_ratio_c=a.clip_ratio_c,
            loss_agg_mode=a.loss_agg_mode,
            entropy_coeff=a.entropy_coeff,
            kl=KLPenalty(coef=kl.init_kl_coeff, type=kl.kl_type, adaptive=kl.adaptive, target=kl.kl_target,
                        horizon=kl.kl_horizon),
            dtype=dtype,
            gradient_checkpointing=o.gradient_checkpointing,
            compile=o.compile,
            max_rollout_kl=a.rollout_check.max_kl,
            tis_cap=a.tis_cap,
            max_nonfinite_grad_steps=o.max_nonfinite_grad_steps,
        )
    except ValueError as exc:
        raise ConfigError(f"optimisation settings: {exc}") from exc


def check_prompts(
    plan_: RunPlan, codecs: Mapping[str, ChatCodec], problems: Sequence[Problem], max_prompt_length: int, what: str
) -> None:
    """Fail before any compute if a first-turn prompt does not render with its policy's chat template or is already
    longer than the limit. Agents whose policy has no codec in ``codecs`` (a model not here yet) are skipped."""
    if isinstance(plan_.env, AgentProgram):
        return  # a program writes its own prompts; the gateway refuses one over the limit (HTTP 400)
    for problem in problems:
        state = plan_.env.reset(problem, 0)
        for stage in plan_.env.graph.stages(0):
            for role in stage:
                spec = plan_.agent_specs[role]
                if spec.policy not in codecs:
                    continue
                try:
                    n = len(codecs[spec.policy].encode_chat(spec.agent.observe(state, 0)))
                except Exception as exc:  # noqa: BLE001 - a template error (jinja, a role it refuses) is the user's
                    raise ConfigError(f"{what} problem {problem.problem_id!r}: agent {role!r}'s first prompt does not "
                                      f"render with {spec.policy}'s chat template: {type(exc).__name__}: {exc}") from exc
                if n > max_prompt_length:
                    raise PromptTooLongError(
                        f"{what} problem {problem.problem_id!r}: agent {role!r}'s first prompt has {n} tokens > "
                        f"training.max_prompt_length={max_prompt_length}. Raise the limit or filter the data."
                    )
