"""What a vLLM engine holds on its GPU, in arithmetic: its KV cache per token, its batch limits and the start-up
profile it takes from its budget before sizing the KV cache. The memory plan (``assembly/memory.py``) composes these
with the learner's footprint; nothing here imports vLLM."""

from __future__ import annotations

from pettingllms.models.shape import ModelShape, parameter_count

# vLLM's share of its GPU when nothing sets one (engine_options.gpu_memory_utilization): the engine's default, the
# serving layer's and the memory plan's (one number, here)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.5

GIB = 2**30
# vLLM sizes its KV cache from what is left of its budget after a profile run at start (vLLM v1's worker,
# determine_available_memory): budget - weights - the profile's activation peak - memory outside torch (and, from
# vLLM 0.21, an estimate of its CUDA graphs). The profile is one forward of max_num_batched_tokens tokens and a
# sampler run over min(max_num_seqs, those tokens) rows of logits. vllm.LLM's defaults for the two (its engine
# arguments, offline use): 16384 tokens and 1024 sequences on GPUs of 70 GiB or more (A100s excepted: these count
# as larger here, which overstates an 80 GB A100's profile floor by 0.64 GB for Qwen3-1.7B, 1.10 GB for
# Llama-3.1-8B), else 8192 and 256.
VLLM_BATCH_DEFAULTS = ((70 * GIB, 16384, 1024), (0.0, 8192, 256))  # (GPU of at least, tokens, sequences)


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int, tensor_parallel: int) -> int:
    """KV cache per token on one GPU of a TP group: keys and values of every layer; kv heads split over TP (each GPU
    keeps at least one)."""
    heads = max(1, shape.kv_heads // tensor_parallel)
    return 2 * shape.layers * heads * shape.head_dim * dtype_bytes


def vllm_batch(gpu_bytes: float | None, batched_tokens: int = 0, max_seqs: int = 0) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of a vLLM engine: the ones set (``llm_options``), else vllm.LLM's
    defaults for the GPU's size (the smaller GPU's when unknown)."""
    for least, tokens, seqs in VLLM_BATCH_DEFAULTS:
        if (gpu_bytes or 0.0) >= least:
            return batched_tokens or tokens, max_seqs or seqs
    raise AssertionError("VLLM_BATCH_DEFAULTS ends with a row for any GPU")


def engine_profile_bytes(shape: ModelShape, dtype_bytes: int, tensor_parallel: int, batched_tokens: int,
                         max_seqs: int) -> float:
    """The least vLLM's start-up profile holds beside its weights, which it takes from its budget before sizing the
    KV cache: the forward of ``batched_tokens`` tokens at its widest point, one MLP (the residual stream, the normed
    input and the attention output, the gate/up projections' output and the activation's, the MLP's split over TP),
    and the sampler's logits (model dtype, the whole vocabulary) of min(max_seqs, batched_tokens) rows. Older vLLM
    samplers add float32 copies (sorting for top-k/top-p: up to about 14x these logits' bytes), so this is a floor:
    what every version holds, which makes a start it refuses certain to fail."""
    forward = dtype_bytes * batched_tokens * (3 * shape.hidden + 3 * shape.intermediate / tensor_parallel)
    logits = dtype_bytes * min(max_seqs, batched_tokens) * shape.vocab
    return forward + logits


def vllm_profile_bytes(shape: ModelShape, dtype_bytes: int, tensor_parallel: int, gpu_bytes: float | None,
                       batched_tokens: int = 0, max_seqs: int = 0) -> float:
    """``engine_profile_bytes`` at an engine's batch on a GPU of ``gpu_bytes`` (``vllm_batch``)."""
    tokens, seqs = vllm_batch(gpu_bytes, batched_tokens, max_seqs)
    return engine_profile_bytes(shape, dtype_bytes, tensor_parallel, tokens, seqs)


def vllm_kv_room(shape: ModelShape, dtype_bytes: int, tensor_parallel: int, utilization: float, gpu_bytes: float,
                 batched_tokens: int = 0, max_seqs: int = 0) -> float:
    """What a vLLM engine's budget leaves for its KV cache on each GPU after its weights and its start-up profile:
    an upper bound (memory outside torch and, from vLLM 0.21, CUDA graphs come off it too)."""
    weights = parameter_count(shape) * dtype_bytes / tensor_parallel
    profile = vllm_profile_bytes(shape, dtype_bytes, tensor_parallel, gpu_bytes, batched_tokens, max_seqs)
    return utilization * gpu_bytes - weights - profile


def ipc_sync_bytes(chunk_mb: float, transport: str, tensor_parallel: int, full_model: bool) -> float:
    """What a full-model weight sync over CUDA IPC (``rollout/vllm/ipc.py``) holds on the GPU beyond the tensor being
    gathered and the layer being assembled: the chunk's cast tensors and the bucket they are packed into (the worker
    copies out one tensor at a time). 0 where the sync goes through host shared memory: LoRA (adapters, not a full
    sync), tensor parallelism, or ``sync_transport=shared_memory``. ``auto`` counts as IPC, the path a GPU takes."""
    if not full_model or tensor_parallel != 1 or transport == "shared_memory":
        return 0.0
    return 2 * chunk_mb * 2**20
