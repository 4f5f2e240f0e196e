"""A short, human-readable summary of a run plan (``pettingllms train --dry-run`` prints it)."""

from __future__ import annotations

from pettingllms.assembly.plan import RunPlan
from pettingllms.core.env import decides_who_acts
from pettingllms.core.program import AgentProgram
from pettingllms.core.registry import ENVS


def describe_plan(run_plan: RunPlan, memory: bool = True) -> str:
    """Env, agents -> policy/adapter, and policies (model, dtype, LoRA, engine, ranks), one line each; with GPUs
    (and ``memory``), the GPU memory plan after them.

    env:      arith_duo (ArithDuoEnv), max_turns 2, stages per turn: [solver] -> [checker]
    rollout:  tree, K=4, select greedy
    agent:    solver -> policy_0 (adapter shared), trainable
    policy:   policy_0: CPU: 1 process, no FSDP, 1 hf engine x TP=1, 2 CPU/rank; float32, LoRA r=32 adapters
              ['shared']; model smollm2-135m-instruct; agents solver, checker
    """
    env = run_plan.env
    stages = (f"who acts: the env's acting_agents(state), one stage a turn (of {', '.join(env.graph.agents)})"
              if decides_who_acts(env) else
              "stages per turn: " + " -> ".join("[" + ", ".join(stage) + "]" for stage in env.graph.stages(0)))
    name = ENVS.name_of(type(env)) or type(env).__name__  # as env.name would name it
    ex = run_plan.executor_config
    if isinstance(env, AgentProgram):  # its own order of calls: no turns, stages or selection
        program = getattr(env, "program", type(env).__qualname__)
        lines = [f"env:      {name} (agent program {program}), agents {', '.join(env.graph.agents)}; one run of the "
                 f"program is one episode (timeout {env.timeout_s:g} s)",
                 f"rollout:  {ex.mode}, K={ex.branching} runs per task, each agent's calls credited with its reward"]
    else:
        lines = [
            f"env:      {name} ({type(env).__module__}.{type(env).__qualname__}), max_turns {env.max_turns}, "
            f"{stages}",
            f"rollout:  {ex.mode}, K={ex.branching}, select {ex.select}, reward = {ex.alpha:g} x team + local",
        ]
    lines += describe_agents(run_plan)
    if run_plan.pool is not None and run_plan.pool.enabled:  # who plays whom, with which weights
        lines.append(f"opponents: {run_plan.pool.describe()}")
    for worker in run_plan.worker_specs:
        policy = run_plan.policies[worker.base_policy]  # a pool worker plays its policy's agents
        lines.append(f"policy:   {worker.describe()}; agents {', '.join(policy.agents)}")
    lines += [f"warning:  {note}" for note in run_plan.notes]  # settings that change nothing here
    if memory and run_plan.memory is not None:  # policies on GPUs: the per-GPU memory plan (assembly/memory.py)
        lines.append(run_plan.memory.describe())
    return "\n".join(lines)


def describe_agents(run_plan: RunPlan) -> list[str]:
    """One line per agent: the policy it uses, its LoRA adapter (L2), trainable or frozen."""
    lines = []
    for role, spec in run_plan.agent_specs.items():
        adapter = f" (adapter {spec.adapter})" if spec.adapter else ""
        if spec.policy in run_plan.servers:  # agents.<role>.server
            policy, server = run_plan.servers[spec.policy]
            model = server.model or run_plan.policies[policy].model.path
            lines.append(f"agent:    {role} -> the server {server.url} (model {model}; prompts in {policy}'s chat "
                         f"template), frozen")
            continue
        lines.append(f"agent:    {role} -> {spec.policy}{adapter}, {'trainable' if spec.trainable else 'frozen'}")
    return lines
