"""Building a policy's rollout engine on the rank that hosts it."""

from __future__ import annotations

import os
from typing import Any, Sequence

from pettingllms.core import ConfigError
from pettingllms.runtime.spec import WorkerSpec, engine_seed

# Fraction of its GPU(s) a colocated vLLM engine takes (weights + KV cache) unless engine_options say otherwise.
# The rest holds the learner's resident state (its FSDP shard, gradients, optimizer state) while the engine is
# awake; the engine sleeps during updates. A policy on a share of one GPU scales it by its share.
VLLM_GPU_MEMORY_FRACTION = 0.5

# The LoRA ranks vLLM accepts for max_lora_rank (vLLM 0.28-0.32 refuse any other value at start-up).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def make_engine(spec: WorkerSpec, model: Any, codec: Any, engine_index: int, autocast: bool = False) -> Any:
    """Engine ``engine_index`` of the policy: the transformers engine over ``model`` (the learner's own module in a
    one-process worker, else a full copy kept for the engine), or vLLM with its own copy of the weights.

    autocast: the transformers engine runs its forwards under bf16 autocast (over the learner's fp32 master weights).
    """
    seed = engine_seed(spec.seed, engine_index)
    if spec.engine == "hf":
        import torch

        from pettingllms.rollout.hf_engine import HFEngine

        options = dict(spec.engine_options)
        if autocast:
            options.setdefault("autocast_dtype", torch.bfloat16)
        return HFEngine(model, codec, seed=seed, **options)
    if spec.engine == "vllm":
        from pettingllms.models import resolve_model
        from pettingllms.rollout.vllm import VLLMEngine

        return VLLMEngine(resolve_model(spec.model_path), tensor_parallel_size=spec.layout.tensor_parallel, seed=seed,
                          codec=codec, **vllm_options(spec))
    raise ConfigError(f"unknown engine {spec.engine!r} for policy {spec.policy!r}: use 'hf' or 'vllm'")


def vllm_options(spec: WorkerSpec) -> dict[str, Any]:
    """The vLLM engine's keywords: colocated with the learner (sleep mode on GPU), the policy's dtype, LoRA slots
    for every adapter (``max_lora_rank`` rounded up to a rank vLLM accepts), unseeded requests on GPUs, and the
    multiprocessing executor for TP > 1 (inside a Ray actor vLLM would otherwise pick its Ray executor and try to
    reserve GPUs the actor already holds). ``engine_options`` win; their ``llm_options`` reach ``vllm.LLM`` at any
    TP size."""
    share = spec.layout.gpus_per_rank if 0 < spec.layout.gpus_per_rank < 1 else 1.0
    options: dict[str, Any] = {"enable_sleep_mode": True, "dtype": spec.dtype,
                               "gpu_memory_utilization": round(VLLM_GPU_MEMORY_FRACTION * share, 4),
                               # A seed per request puts vLLM's sampler on its slow row-by-row path: on GPUs,
                               # throughput first (engine_options.reproducible=true for exactly resumable draws).
                               "reproducible": not spec.layout.uses_gpus}
    if spec.lora is not None:
        options.update(enable_lora=True, max_loras=max(1, len(spec.adapters)),
                       max_lora_rank=vllm_lora_rank(spec.lora.rank, spec.policy))
    llm_options = dict(spec.engine_options.get("llm_options") or {})
    if spec.layout.tensor_parallel > 1:
        llm_options.setdefault("distributed_executor_backend", "mp")
    if llm_options:
        options["llm_options"] = llm_options
    return {**options, **{k: v for k, v in spec.engine_options.items() if k != "llm_options"}}


def vllm_lora_rank(rank: int, policy: str = "policy") -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds adapters of rank ``rank`` (r=4 -> 8, r=48 ->
    64): an adapter's rank may be below the engine's maximum, never above it."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ConfigError(f"base_models.{policy}.lora.rank={rank} is above the largest LoRA rank vLLM serves "
                      f"({VLLM_LORA_RANKS[-1]}); use a rank of at most {VLLM_LORA_RANKS[-1]}")


def engine_visible_devices(own: Sequence[str], peers: Sequence[Sequence[str]]) -> str:
    """CUDA_VISIBLE_DEVICES for an engine host: its own GPU first (the learner's ``cuda:0``), then its TP peers'.

    own: the GPU ids Ray assigned this rank; peers: those of the other ranks of its TP group, in rank order.
    """
    devices: list[str] = []
    for ids in (own, *peers):
        for device in ids:
            if device not in devices:
                devices.append(str(device))
    return ",".join(devices)


def expose_tp_group_gpus(devices: str) -> None:
    """Make the TP group's GPUs visible to this process (and vLLM's worker processes) before CUDA starts.

    Ray gives every rank exactly its own GPU; the host of a TP=T engine needs all T. Must run before anything
    initialises CUDA in this process; vLLM then spawns its T workers (``VLLM_WORKER_MULTIPROC_METHOD=spawn``: CUDA
    cannot be re-initialised in a forked child) on devices 0..T-1.
    """
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
