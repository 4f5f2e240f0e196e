"""The GPU memory plan's printout: per GPU, every term in GB with where it comes from, each phase, the peak and
the headroom, and what the plan assumes (``--dry-run`` prints it; every GPU run logs it)."""

from __future__ import annotations

from typing import Sequence

from pettingllms.assembly.memory_fixes import AUTO_MARGIN
from pettingllms.assembly.memory_phases import (ALLOCATOR_RESERVE, ENGINE_PROCESS_BYTES, GB, LEARNER_PROCESS_BYTES,
                                                GpuPlan, PolicyMemory, gb)
from pettingllms.learner.footprint import GATHERED_LAYERS, STRANDED_CACHE_SHARE
from pettingllms.models.shape import parameter_count
from pettingllms.rollout.vllm.footprint import vllm_batch

def assumptions() -> list[str]:
    """What the plan assumes, printed under it."""
    released = (
        "between the update and the engine's wake-up the learner empties its CUDA cache "
        "(serving.release_accelerator_cache): the sync and the rollout hold its resident state only, and without "
        f"FSDP a full fine-tune's cache kept after release ({STRANDED_CACHE_SHARE:g} x its AdamW state, which the "
        "release cannot return)"
    )
    return [
        "per GPU, GB = 1e9 bytes; worst-case micro-batch: one packed row of the whole token budget, every position "
        "a logit",
        "activations counted op by op for Llama/Qwen layers; attention (optim.attention): the memory-efficient SDPA "
        "kernel with the learner's mask and grouped K/V expanded to every query head, or FlexAttention with a block "
        "mask and grouped K/V (models/attention.py), no O(L^2) scores either way; checked against CPU updates "
        "(benchmarks/memory_plan_check.py) and CUDA updates of Qwen3-1.7B on an H200 and an H100 "
        "(benchmarks/gpu_learner.py: the allocated peak at 0.96-1.00 of the estimate)",
        f"FSDP2 keeps {GATHERED_LAYERS} layers gathered (computing + prefetched) and the root (embedding, head) "
        "from its forward to its backward; its reduce-scatter buffers come after the logits' peak",
        f"outside PyTorch's allocator and vLLM's budget: learner process {LEARNER_PROCESS_BYTES / GB:.2f} GB, vLLM "
        f"process {ENGINE_PROCESS_BYTES / GB:.2f} GB (CUDA context, cuBLAS, NCCL, CUDA graphs; the learner's "
        "and vLLM's measured on an H200); the update adds the caching allocator's reserve above its allocated "
        f"peak ({ALLOCATOR_RESERVE:.0%}, the largest measured on an H200 rounded up)",
        "vLLM holds its whole budget when awake (weights, KV cache, its activations) and nothing while asleep "
        "(level 2 full model, level 1 LoRA: weights and KV cache leave the GPU)",
        "vLLM starts only when its budget, less its weights and its start-up profile (one forward of "
        "max_num_batched_tokens tokens and the sampler's logits of max_num_seqs rows, vllm.LLM's defaults for the "
        "GPU's size unless llm_options sets them), holds one max_model_len sequence of KV cache; the profile counted "
        "is a floor (older samplers' float32 copies, CUDA graphs and memory outside torch come off the KV cache too)",
        released,
        "weight sync: one full tensor gathered at a time on the GPU; a full model on one GPU sends its chunks (engine "
        "option sync_chunk_mb) over CUDA IPC, each chunk and the bucket it is packed into on the GPU; LoRA adapters "
        "and tensor-parallel engines go through host shared memory",
    ]


def _line(label: str, value: float, note: str = "", indent: int = 4) -> str:
    text = f"{' ' * indent}{label:<{30 - indent}}{value / GB:>8.2f} GB"
    return f"{text}   {note}" if note else text


def format_plan(plans: Sequence[GpuPlan], gpu_source: str, unplanned: Sequence[str] = ()) -> str:
    """The per-GPU table: every term in GB with where it comes from, the phases, the peak and the headroom."""
    gpu_bytes = plans[0].gpu_bytes if plans else None
    size = f"{gb(gpu_bytes)} per GPU ({gpu_source})" if gpu_bytes is not None else \
        f"GPU size unknown ({gpu_source}): needs only, nothing checked"
    lines = [f"GPU memory plan, per GPU: {size}"]
    for plan in plans:
        lines += _format_gpu(plan)
    lines += [f"  {text}" for text in unplanned]
    lines.append("  assumptions:")
    lines += [f"    - {text}" for text in assumptions()]
    return "\n".join(lines)


def _format_gpu(plan: GpuPlan) -> list[str]:
    lines = []
    head = plan.policies[0].policy
    if len(plan.policies) == 1:
        gpus = f"each of its {head.gpus:g} GPUs" if head.gpus > 1 else "its GPU"
        lines.append(f"  {head.name}: {head.model} ({head.source}); {gpus} holds:")
    else:
        lines.append(f"  one GPU shared by {', '.join(p.policy.name for p in plan.policies)}:")
    for p in plan.policies:
        lines += _format_policy(p, plan, shared=len(plan.policies) > 1)
    if plan.gpu_bytes is None:
        lines.append(_line("peak", plan.peak, f"({plan.peak_phase}); GPU size unknown: set resources.gpu_memory_gb "
                                              "to check it", 2))
    else:
        verdict = "fits" if plan.fits else "does NOT fit"
        lines.append(_line("peak", plan.peak, f"({plan.peak_phase}) of {gb(plan.gpu_bytes)}: {verdict}, headroom "
                                              f"{(plan.gpu_bytes - plan.peak) / GB:.2f} GB", 2))
    return lines


def _format_policy(p: PolicyMemory, plan: GpuPlan, shared: bool) -> list[str]:
    inp, learner, setup = p.policy, p.learner, p.policy.learner
    lines = []
    if shared:
        lines.append(f"   {inp.name}: {inp.model} ({inp.source}), {inp.gpus:g} of the GPU")
    kind = "not trained" if not setup.trainable else "full fine-tune" if not setup.lora else \
        f"LoRA r={setup.lora_rank}, {setup.adapters} adapter(s)"
    compute = {2: "bf16", 4: "fp32"}[setup.compute_bytes]
    shard = f"FSDP over {setup.world_size} ranks" if setup.sharded else "no FSDP"
    tokens = f", {setup.tokens} tokens per forward" if setup.trainable else ""
    if inp.module_on_host:  # an opponent-pool worker with vLLM: nothing of its module on the GPU
        lines.append(_line("module", 0.0, f"in host memory: {inp.snapshot_of}'s past versions are staged there on "
                                          "their way to vLLM", 4))
    else:
        lines.append(f"    learner ({kind}, {compute} compute, {shard}{tokens}):")
        lines += [_line(t.label, t.bytes, t.note, 6) for t in learner.terms]
    if setup.trainable:
        moment = max(learner.moments, key=lambda m: m.bytes)
        lines.append(_line("update peak", learner.peak, f"weights + gradients + AdamW + the {moment.label} moment "
                                                        f"({moment.bytes / GB:.2f} GB)", 6))
    room = max(0.0, p.kv_room) if plan.gpu_bytes is not None else 0.0
    tokens, seqs = vllm_batch(plan.gpu_bytes, inp.batched_tokens, inp.max_seqs)
    sized = f" (auto: the largest that fits, less {AUTO_MARGIN:g})" if inp.auto_utilization else ""
    lines.append(f"    vLLM (TP={inp.tensor_parallel}, gpu_memory_utilization {inp.utilization:g}{sized}, "
                 f"max_model_len {inp.max_model_len}):")
    budget = f"{inp.utilization:g} x the GPU" if plan.gpu_bytes is not None else "unknown GPU size: weights only"
    lines.append(_line("budget (when awake)", max(p.budget, p.engine_weights), budget, 6))
    lines.append(_line("weights", p.engine_weights, f"{parameter_count(inp.shape) / 1e9:.3g} B params x "
                                                    f"{inp.engine_bytes} B / TP {inp.tensor_parallel}", 8))
    lines.append(_line("start-up profile", p.engine_profile, f"at least: one forward of {tokens} tokens and "
                                                             f"{min(tokens, seqs)} rows of logits", 8))
    kv_room = (f"at most about {room / p.kv_per_token:,.0f} tokens" if plan.gpu_bytes is not None
               else "what the GPU leaves (unknown here)")
    lines.append(_line("KV cache", room, f"{kv_room} at {p.kv_per_token:,} B/token", 8))
    lines.append(_line("process overheads", LEARNER_PROCESS_BYTES + ENGINE_PROCESS_BYTES,
                       "learner + vLLM processes, in every phase (both measured on an H200)", 4))
    kept = "kept (resident + cache kept after release)" if learner.stranded else "resident"
    if setup.trainable:
        lines.append(_line("phase: update", p.update,
                           f"learner's update peak + {ALLOCATOR_RESERVE:.0%} allocator reserve + overheads; vLLM asleep",
                           4))
        lines.append(_line("phase: weight sync", p.sync, f"learner {kept} + vLLM weights + "
                                                         f"{p.sync_transient / GB:.2f} GB in flight + overheads", 4))
    held = "" if inp.module_on_host else f"learner {kept} + "
    lines.append(_line("phase: rollout", p.rollout, f"{held}vLLM budget + overheads", 4))
    return lines
