"""A short, human-readable summary of a run plan (``pettingllms train --dry-run`` prints it)."""

from __future__ import annotations

from pettingllms.trainer.setup import RunPlan


def describe_plan(run_plan: RunPlan) -> str:
    """Env, agents -> policy/adapter, and policies (model, dtype, LoRA, engine, ranks), one line each.

    env:      arith_duo (ArithDuoEnv), max_turns 2, stages per turn: [solver] -> [checker]
    rollout:  tree, K=4, select greedy
    agent:    solver -> policy_0 (adapter shared), trainable
    policy:   policy_0: smollm2-135m-instruct, float32, LoRA r=32, engine hf, 1 rank; agents solver, checker
    """
    env = run_plan.env
    stages = " -> ".join("[" + ", ".join(stage) + "]" for stage in env.graph.stages(0))
    name = getattr(env, "registry_name", None) or type(env).__name__
    ex = run_plan.executor_config
    lines = [
        f"env:      {name} ({type(env).__module__}.{type(env).__qualname__}), max_turns {env.max_turns}, "
        f"stages per turn: {stages}",
        f"rollout:  {ex.mode}, K={ex.branching}, select {ex.select}, reward = {ex.alpha:g} x team + local",
    ]
    for role, spec in run_plan.agent_specs.items():
        adapter = f" (adapter {spec.adapter})" if spec.adapter else ""
        lines.append(f"agent:    {role} -> {spec.policy}{adapter}, {'trainable' if spec.trainable else 'frozen'}")
    for worker in run_plan.worker_specs:
        policy = run_plan.policies[worker.policy]
        lora = f"LoRA r={worker.lora.rank}" if worker.lora else "full fine-tune"
        if worker.adapters:
            lora += f" (adapters {', '.join(worker.adapters)})"
        ranks = f"{worker.num_ranks} rank{'s' if worker.num_ranks > 1 else ''}"
        if worker.fsdp is not None:
            ranks += " (FSDP2)"
        gpus = f", {worker.gpus_per_rank:g} GPU/rank" if worker.gpus_per_rank else ", CPU"
        trains = "" if worker.trainable else ", frozen"
        lines.append(f"policy:   {worker.policy}: {worker.model_path}, {worker.dtype}, {lora}, engine {worker.engine}, "
                     f"{ranks}{gpus}{trains}; agents {', '.join(policy.agents)}")
    return "\n".join(lines)
