"""The GPU memory plan's fixes: the changes of a run's settings that lower the worst GPU's peak, each with the
value that fits where there is one, and the vLLM budget ``gpu_memory_utilization=auto`` gets (the largest
that fits, less a margin). Each change is tried by recomputing the phases (``assembly/memory_phases.py``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pettingllms.assembly.memory_phases import PolicyInput, engine_short, gpu_plans, with_twins, without_pools_of
from pettingllms.core.errors import ConfigError

LOGPROB_CHUNK_FIX = 1024  # the chunk the plan offers: 0.6 GB of fp32 logits per copy at Qwen3's vocabulary
# gpu_memory_utilization=auto: never above this (vLLM's own default is 0.9), and this much under the largest budget
# that fits, for what the plan does not count (fragmentation, a library's workspace).
AUTO_MAX_UTILIZATION = 0.9
AUTO_MARGIN = 0.03


@dataclass(frozen=True)
class Fix:
    overrides: str  # what to add to the command line
    peak: float  # the worst GPU's peak with it
    fits: bool


def _evaluate(policies: Sequence[PolicyInput], gpu_bytes: float) -> tuple[float, bool]:
    plans = gpu_plans(policies, gpu_bytes)
    return max(plan.peak for plan in plans), all(plan.fits for plan in plans)


def _tokens(policy: PolicyInput, budget: int) -> PolicyInput:
    tokens = max(budget, policy.longest_sample)
    return dataclasses.replace(policy, micro_batch_max_tokens=budget, learner=policy.learner.with_tokens(tokens))


def _learner(policy: PolicyInput, **changes: Any) -> PolicyInput:
    return dataclasses.replace(policy, learner=dataclasses.replace(policy.learner, **changes))


def fixes(policies: Sequence[PolicyInput], gpu_bytes: float) -> list[Fix]:
    """Each change that lowers the worst GPU's peak, alone, with the value that fits where there is one; sorted by
    the peak it leaves (the most effective first). When none fits alone, all of them together come last."""
    found: list[Fix] = []
    trained = [p for p in policies if p.learner.trainable]

    def add(text: str, changed: Sequence[PolicyInput]) -> None:
        peak, fits = _evaluate(changed, gpu_bytes)
        found.append(Fix(text, peak, fits))

    current = min((p.micro_batch_max_tokens for p in trained), default=0)
    longest = max((p.longest_sample for p in trained), default=0)
    if trained and current > longest:
        # Below the longest sample (max_prompt_length + max_response_length) a forward still holds that sample.
        fitting = _largest(longest, current - 1, lambda n: _evaluate([_tokens(p, n) for p in policies], gpu_bytes)[1])
        if fitting is not None:
            budget = max(longest, fitting // 256 * 256) if fitting >= 512 else fitting
            add(f"optim.micro_batch_max_tokens={budget}", [_tokens(p, budget) for p in policies])
        else:
            add(f"optim.micro_batch_max_tokens={longest} (no lower: one sample of training.max_prompt_length + "
                "max_response_length tokens is one forward)", [_tokens(p, longest) for p in policies])
    if any(not p.learner.gradient_checkpointing for p in trained):
        add("optim.gradient_checkpointing=true", [_learner(p, gradient_checkpointing=True) for p in policies])
    if any(not p.learner.logprob_chunk_tokens for p in trained):
        add(f"optim.logprob_chunk_tokens={LOGPROB_CHUNK_FIX} (the LM head's fp32 logits {LOGPROB_CHUNK_FIX} tokens at "
            "a time)", [_learner(p, logprob_chunk_tokens=LOGPROB_CHUNK_FIX) for p in policies])
    whole = [p for p in trained if p.gpus >= 1]
    if whole:
        step = math.lcm(*(p.tensor_parallel for p in whole))
        start = int(max(p.gpus for p in whole))
        choices = [g for g in range(start + step, max(64, 8 * start) + 1, step)]
        fitting = _smallest(choices, lambda g: _evaluate(_with_gpus(policies, g), gpu_bytes)[1])
        gpus = fitting if fitting is not None else choices[-1]
        tried = "" if fitting is not None else ", the most tried"
        add(f"GPU_num={gpus} (resources.gpus_per_policy={gpus}{tried}: more FSDP ranks, smaller shards)",
            _with_gpus(policies, gpus))
    elif any(0 < p.gpus < 1 for p in trained):
        add("GPU_num=1 (a GPU of its own for every policy)", _with_gpus(policies, 1))
    full = [p for p in trained if not p.learner.lora]
    if full:
        changed = without_pools_of([_lora(p) if p in full else p for p in policies], {p.name for p in full})
        names = ", ".join(p.name for p in full)
        add(f"specialization=L2 (LoRA rank 16 on {names}, one adapter per agent; or base_models.<policy>.lora."
            "rank=16 for one shared adapter)", changed)
    # One fix per base_models.<key> (an L3 copy policy_<agent> is set through the entry it copies), changing every
    # policy that key configures, as the override would.
    pooled = {p.snapshot_of for p in policies if p.snapshot_of}
    configured = list({p.config_name: p for p in policies if not p.snapshot_of}.values())  # L3 copies are alike
    for p in configured:
        if any(q.name in pooled for q in policies if q.config_name == p.config_name):
            continue  # its opponent pool's engine is one GPU's: tensor parallelism is refused there
        if p.gpus >= 1 and p.gpus % (2 * p.tensor_parallel) == 0 and engine_short(p, gpu_bytes):
            tp = p.tensor_parallel * 2
            while p.gpus % (2 * tp) == 0 and engine_short(dataclasses.replace(p, tensor_parallel=tp), gpu_bytes):
                tp *= 2
            add(f"base_models.{p.config_name}.tensor_parallel={tp} (vLLM's weights split over {tp} GPUs: room for "
                "its KV cache)", with_twins(policies, p, pools=False, tensor_parallel=tp))
    for p in configured:
        if p.longest_sample and p.max_model_len > p.longest_sample and engine_short(p, gpu_bytes):
            add(f"++base_models.{p.config_name}.engine_options.max_model_len={p.longest_sample} (vLLM reserves room "
                f"for one sequence of {p.max_model_len} tokens; this run's prompt + response is at most "
                f"{p.longest_sample})", with_twins(policies, p, max_model_len=p.longest_sample))
    for key in dict.fromkeys(p.config_name for p in trained if not p.learner.cpu_offload):
        mine = [q for q in trained if q.config_name == key]
        enable = "" if all(q.learner.sharded for q in mine) else f"base_models.{key}.fsdp.enabled=true "
        changed = [_learner(q, cpu_offload=True, sharded=True) if q in mine else q for q in policies]
        add(f"{enable}base_models.{key}.fsdp.cpu_offload=true (weights, gradients, AdamW state in host "
            "memory; slower)", changed)
    for p in configured:
        utilization = _utilization(policies, p, gpu_bytes)
        if utilization is not None and utilization != p.utilization:
            add(f"++base_models.{p.config_name}.engine_options.gpu_memory_utilization={utilization:g} (vLLM's "
                "budget: less KV cache)", with_twins(policies, p, utilization=utilization))
    found.sort(key=lambda fix: (not fix.fits, fix.peak))
    if found and not any(fix.fits for fix in found):
        together = _all_together(policies, gpu_bytes)
        peak, fits = _evaluate(together, gpu_bytes)
        found.append(Fix("all of these together (LoRA, checkpointing, chunked logits, CPU offload, the smallest "
                         "micro-batch)", peak,
                         fits))
    return found


def _largest(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in [low, high] with fits(n) (fits is monotone: true up to some n), or None."""
    if high < low or not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _smallest(choices: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    for choice in choices:
        if fits(choice):
            return choice
    return None


def _with_gpus(policies: Sequence[PolicyInput], gpus: int) -> list[PolicyInput]:
    """Whole-GPU (and shared-GPU) trained policies with ``gpus`` GPUs each: one FSDP rank per GPU."""
    out = []
    for p in policies:
        if p.gpus <= 0 or not (p.learner.trainable or p.snapshot_of):
            out.append(p)
            continue
        share = p.utilization / p.gpus if p.gpus < 1 else p.utilization
        if p.snapshot_of:  # an opponent-pool worker: one rank, the GPUs of one of its policy's engines
            out.append(dataclasses.replace(p, gpus=1.0, utilization=share))
            continue
        sharded = gpus > 1 or p.learner.sharded
        out.append(dataclasses.replace(p, gpus=float(gpus), utilization=share,
                                       learner=dataclasses.replace(p.learner, world_size=gpus, sharded=sharded)))
    return out


def _lora(policy: PolicyInput, rank: int = 16) -> PolicyInput:
    from pettingllms.core.choices import DEFAULT_LORA_TARGET_MODULES

    return _learner(policy, lora_rank=rank, lora_targets=tuple(DEFAULT_LORA_TARGET_MODULES), adapters=1,
                    trained_adapters=1, reference_copy=False)


def size_auto_engines(policies: Sequence[PolicyInput], gpu_bytes: float | None) -> list[PolicyInput]:
    """Each policy with ``gpu_memory_utilization=auto`` gets the largest budget (two decimals, at most
    ``AUTO_MAX_UTILIZATION``) with which every GPU fits, less ``AUTO_MARGIN`` for what the plan does not see; one
    that cannot fit at any budget keeps the default, and the plan's refusal names the fixes. Needs the GPU's size."""
    policies = list(policies)
    auto = [p.name for p in policies if p.auto_utilization]
    if not auto:
        return policies
    if gpu_bytes is None:
        raise ConfigError(f"engine_options.gpu_memory_utilization=auto (policies {auto}) sizes vLLM from the GPU "
                          "memory plan, which needs the GPU's size: set resources.gpu_memory_gb (or run where the "
                          "GPU is visible)")
    for index, policy in enumerate(policies):
        if not policy.auto_utilization:
            continue
        best = _utilization(policies, policy, gpu_bytes, ceiling=AUTO_MAX_UTILIZATION)
        if best is not None and best - AUTO_MARGIN > 0:
            policies[index] = dataclasses.replace(policy, utilization=round(best - AUTO_MARGIN, 2))
    return policies


def _utilization(policies: Sequence[PolicyInput], policy: PolicyInput, gpu_bytes: float,
                 ceiling: float = 0.95) -> float | None:
    """A gpu_memory_utilization (two decimals) for ``policy`` with which every GPU fits, or None."""
    def with_value(value: float) -> list[PolicyInput]:
        return with_twins(policies, policy, utilization=value)

    candidates = [v / 100 for v in range(round(ceiling * 100), 0, -1)]
    for value in candidates:  # the largest that fits: the most KV cache
        if _evaluate(with_value(value), gpu_bytes)[1]:
            return value
    return None


def _all_together(policies: Sequence[PolicyInput], gpu_bytes: float) -> list[PolicyInput]:
    out = []
    policies = without_pools_of(policies, {p.name for p in policies if p.learner.trainable and not p.learner.lora})
    for p in policies:
        if p.learner.trainable:
            p = _tokens(p, 1)
            p = _learner(p, gradient_checkpointing=True, cpu_offload=True, sharded=True,
                         logprob_chunk_tokens=p.learner.logprob_chunk_tokens or LOGPROB_CHUNK_FIX)
            if not p.learner.lora:
                p = _lora(p)
        out.append(p)
    return out
