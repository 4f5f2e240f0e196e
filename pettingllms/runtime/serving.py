"""Serving a policy: its chat codec, its rollout engine, and the weights pushed into that engine.

The one home for it, used by ``PolicyWorker`` (training: every engine host of a worker group) and by
``pettingllms eval`` (one engine per policy in the evaluating process), so an evaluation serves a policy exactly as
training does by construction. Everything starts from the policy's ``WorkerSpec`` with its model directory
resolved once per run (``WorkerSpec.resolved``): codecs, engines and loaders take that directory.

Engines (``make_engine``):
- the transformers engine (``HFEngine``) over a module: the learner's own in a one-rank worker (an update is
  visible at once), else a full copy kept for the engine (beside an FSDP shard; eval's loaded model);
- vLLM (``VLLMEngine``) with its own copy of the weights, started from the model directory (``vllm_options``).

Weights (``push_weights`` decides what moves; ``EngineSync`` how, and when the engine sleeps):
- the transformers engine over the learner's own module: nothing moves and ``push`` reports 0 seconds;
- a transformers engine over its own full copy (beside an FSDP shard): the full tensors are copied into it;
- the vLLM engine (recognised by its ``sync_weights`` method) holds its own copy of the weights. The trained
  tensors go to it from memory: a full model's weights through ``sync_weights`` (names of the Hugging Face
  checkpoint, streamed in bounded chunks, cast to the engines' dtype), under LoRA each trained adapter through
  ``add_adapter`` (peft's tensors and config), since the base weights never change. ``timing/sync_s``;
- a rank without an engine (FSDP ranks that host none) still takes part in the stream's all-gathers.
When: after every update (the worker), and once at start wherever the engine's weights differ from the model
directory's (fresh LoRA adapters; a resumed or evaluated checkpoint): ``initial_push_needed``.

Colocation on a GPU: when the engine was built with sleep mode (CUDA only) it frees its GPU memory while the
learner trains (``release_for_update``: level 2 for a full model, whose weights are resent anyway; level 1 under
LoRA, base weights parked in host memory). After the update, on every rank, the learner's caching allocator gives
back what it kept reserved (the update's activations and logits) before any engine wakes: vLLM's engine core is
another process and cannot take memory that PyTorch's cache holds here. The order in ``push``:
1. ``release_accelerator_cache`` (every rank);
2. the weights: a full model's are woken by ``sync_weights`` only when its first chunk is ready to load (the
   embedding and the first decoder layer gathered), so after every rank of the group has released its cache (step
   1 comes before the first all-gather on every rank); LoRA adapters are small and go after
   ``wake_up(["weights"])``;
3. the allocator's cache is released again (the stream's gathered tensors) and ``wake_up(["kv_cache"])`` comes
   last, so the engine never holds both the KV cache and a stale copy of the weights.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from pettingllms.core import ConfigError
from pettingllms.models.lora import adapter_tensors
from pettingllms.rollout.vllm.footprint import DEFAULT_GPU_MEMORY_UTILIZATION
from pettingllms.runtime.spec import WorkerSpec, engine_seed

# Fraction of its GPU(s) a colocated vLLM engine takes (weights + KV cache) unless engine_options say otherwise.
# The rest holds the learner's resident state (its FSDP shard, gradients, optimizer state) while the engine is
# awake; the engine sleeps during updates. A policy on a share of one GPU scales it by its share.
VLLM_GPU_MEMORY_FRACTION = DEFAULT_GPU_MEMORY_UTILIZATION

# engine_options.gpu_memory_utilization=auto: the largest budget with which the GPU memory plan fits (training).
AUTO_UTILIZATION = "auto"

# The LoRA ranks vLLM accepts for max_lora_rank (vLLM 0.28-0.32 refuse any other value at start-up).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


# ---------------------------------------------------------------------------------------------------- the codec
def policy_codec(spec: WorkerSpec, tokenizer: str | Path | None = None):
    """The policy's chat codec (with its ``chat_template_kwargs``): from its model directory, or from
    ``tokenizer``: a model spec, or a tokenizer-only directory or hub id (a served model, an export without one)."""
    from pettingllms.models import HFChatCodec

    if tokenizer is None:
        return HFChatCodec.from_pretrained(spec.directory, spec.chat_template_kwargs)
    return tokenizer_codec(str(tokenizer), spec.chat_template_kwargs)


def tokenizer_codec(source: str, chat_template_kwargs: Mapping | None = None):
    """The chat codec of a model spec, or of a tokenizer-only directory or hub id (no weights needed)."""
    from pettingllms.models import ALIASES, HFChatCodec

    path = Path(source).expanduser()
    has_weights = path.is_dir() and any(any(path.glob(pattern)) for pattern in ("*.safetensors", "*.bin"))
    if source in ALIASES or has_weights:
        return HFChatCodec.from_pretrained(source, chat_template_kwargs)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path if path.is_dir() else source)
    except Exception as exc:  # missing files, hub errors, offline cache misses: all mean "no tokenizer here"
        raise ConfigError(f"cannot load a tokenizer from {source!r}: {type(exc).__name__}: {exc}. Set "
                          "model.tokenizer to a local model or tokenizer directory") from exc
    tokenizer.padding_side = "left"
    return HFChatCodec(tokenizer, chat_template_kwargs=chat_template_kwargs)


# ---------------------------------------------------------------------------------------------------- engines
def served_engine(url: str, model: str, codec: Any, *, api_key_env: str | None, prompt_format: Any,
                  vllm_extras: Any, timeout_s: float, max_retries: int, max_concurrency: int | None = None) -> Any:
    """A bounded client over an OpenAI-compatible server (``rollout/openai_engine.py``) whose prompts ``codec`` renders:
    a served agent's in training, the served model's in eval. The key is read from the environment variable
    ``api_key_env`` (never from the config); the caller checks the server (``check_server``) once it can close it."""
    from pettingllms.rollout.openai_engine import OpenAICompletionsEngine

    eos = codec.tokenizer.eos_token_id
    limits = {"max_concurrency": max_concurrency} if max_concurrency is not None else {}
    return OpenAICompletionsEngine(
        url, model, codec.tokenizer, int(eos) if eos is not None else min(codec.eos_token_ids),
        api_key=os.environ.get(api_key_env) if api_key_env else None,
        prompt_format=str(getattr(prompt_format, "value", prompt_format)), vllm_extras=vllm_extras,
        timeout_s=timeout_s, max_retries=max_retries, **limits)


def make_engine(spec: WorkerSpec, model: Any, codec: Any, engine_index: int = 0, autocast: bool = False,
                colocated: bool = True, engines_on_gpu: int = 1) -> Any:
    """Engine ``engine_index`` of the policy: the transformers engine over ``model`` (the learner's own module in a
    one-process worker, else a full copy kept for the engine), or vLLM with its own copy of the weights, started
    from the spec's model directory.

    autocast: the transformers engine runs its forwards under bf16 autocast (over the learner's fp32 master weights).
    colocated: the engine shares its GPU with the policy's learner (training); eval's engines have no learner.
    engines_on_gpu: vLLM engines of different policies started on the same GPU by one process (eval).
    """
    seed = engine_seed(spec.seed, engine_index)
    if spec.engine == "hf":
        from pettingllms.rollout.hf_engine import HFEngine

        options = dict(spec.engine_options)
        if autocast:
            options.setdefault("autocast_dtype", torch.bfloat16)
        return HFEngine(model, codec, seed=seed, **options)
    if spec.engine == "vllm":
        from pettingllms.rollout.vllm import VLLMEngine

        return VLLMEngine(spec.directory, tensor_parallel_size=spec.layout.tensor_parallel, seed=seed,
                          codec=codec, **vllm_options(spec, colocated, engines_on_gpu))
    raise ConfigError(f"unknown engine {spec.engine!r} for policy {spec.policy!r}: use 'hf' or 'vllm'")


def vllm_options(spec: WorkerSpec, colocated: bool = True, engines_on_gpu: int = 1) -> dict[str, Any]:
    """The vLLM engine's keywords: the policy's dtype, LoRA slots for every adapter (``max_lora_rank`` rounded up to
    a rank vLLM accepts), and the multiprocessing executor for TP > 1 (inside a Ray actor vLLM would otherwise pick
    its Ray executor and try to reserve GPUs the actor already holds). Colocated with a learner (training), also
    sleep mode (on GPU), its share of the GPU, and unseeded requests on GPUs. Not colocated, ``engines_on_gpu``
    engines of one process (eval's policies, all on its GPU) split the same budget. ``engine_options`` win; their
    ``llm_options`` reach ``vllm.LLM`` at any TP size."""
    options: dict[str, Any] = {"dtype": spec.dtype}
    if colocated:
        share = spec.layout.gpus_per_rank if 0 < spec.layout.gpus_per_rank < 1 else 1.0
        options.update(enable_sleep_mode=True, gpu_memory_utilization=round(VLLM_GPU_MEMORY_FRACTION * share, 4),
                       # A seed per request puts vLLM's sampler on its slow row-by-row path: on GPUs,
                       # throughput first (engine_options.reproducible=true for exactly resumable draws).
                       reproducible=not spec.layout.uses_gpus)
    elif engines_on_gpu > 1:
        # vLLM refuses to start an engine when the GPU's free memory is below its budget (gpu_memory_utilization x
        # the whole GPU): with 0.5 each, the engine started second would find less than half the GPU free.
        options["gpu_memory_utilization"] = round(VLLM_GPU_MEMORY_FRACTION / engines_on_gpu, 4)
    if spec.lora is not None:
        options.update(enable_lora=True, max_loras=max(1, len(spec.adapters)),
                       max_lora_rank=vllm_lora_rank(spec.lora.rank, spec.policy))
    llm_options = dict(spec.engine_options.get("llm_options") or {})
    if spec.layout.tensor_parallel > 1:
        llm_options.setdefault("distributed_executor_backend", "mp")
    if llm_options:
        options["llm_options"] = llm_options
    # gpu_memory_utilization=auto is sized by the run's GPU memory plan, which writes the number into the training
    # spec (assembly/memory.py::planned_utilizations); anywhere else (an evaluation of that run) the default stands.
    return {**options, **{k: v for k, v in spec.engine_options.items()
                          if k != "llm_options" and not (k == "gpu_memory_utilization" and v == AUTO_UTILIZATION)}}


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


def close_engine(engine: Any) -> None:
    """Stop an engine's own processes (vLLM); engines without any need nothing."""
    close = getattr(engine, "close", None)
    if callable(close):
        close()


# ---------------------------------------------------------------------------------------------------- weights
def initial_push_needed(spec: WorkerSpec, trained: bool) -> bool:
    """Whether a new engine needs the model's weights before it generates: engines load the base model from the
    model directory, so a full model already matches unless ``trained`` weights were loaded into it (a checkpoint);
    fresh or loaded LoRA adapters exist only in the module until they are sent."""
    return bool(spec.lora_names) or trained


def push_weights(sync: "EngineSync", model: torch.nn.Module, spec: WorkerSpec, trained_only: bool) -> None:
    """Hand ``model``'s weights to the engine behind ``sync``: what moves is decided here, how in ``EngineSync``.

    trained_only: the tensors an update changes (all of a full model; the unfrozen adapters under LoRA), else every
    weight (start-up, a restored checkpoint). A full model travels in the engines' dtype (every rank casts its shard
    before the all-gather, so the collective is the same on every rank and moves half the bytes for fp32 master
    weights); names and global shapes go first, for the engine's check. Under FSDP a collective on every rank.
    """
    if not sync.needs_weights:
        return  # the engine generates with the learner's own module
    from pettingllms.learner.weights import full_weights, weight_shapes
    from pettingllms.models.load import parse_dtype

    names = weight_names(model, spec, trained_only)
    dtype = None if spec.lora_names else parse_dtype(spec.dtype)
    sync.push(full_weights(model, names, dtype=dtype), weight_shapes(model, names))


def weight_names(model: torch.nn.Module, spec: WorkerSpec, trained_only: bool) -> list[str]:
    """The parameters of ``model`` that go to an engine: all of a full model, the adapters under LoRA; with
    ``trained_only`` the frozen agents' adapters stay out (an update never changes them)."""
    from pettingllms.learner.weights import trained_parameter_names

    return trained_parameter_names(model, spec.lora_names, spec.frozen if trained_only else ())


def add_adapter_folders(engine: Any, folders: Mapping[str, Path]) -> None:
    """Register exported LoRA adapter folders (peft ``save_pretrained``) in a vLLM engine, as they are."""
    for name, folder in folders.items():
        engine.add_adapter(name, folder)


def engine_owns_weights(engine: Any) -> bool:
    """True for an engine with its own copy of the weights (it has ``sync_weights``), such as vLLM."""
    return callable(getattr(engine, "sync_weights", None))


def release_accelerator_cache() -> int:
    """Give the CUDA caching allocator's unused blocks back to the device; returns the bytes released (0 on CPU).

    ``gc.collect`` first: tensors of the update still referenced from reference cycles keep their blocks.
    """
    gc.collect()
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return 0
    reserved = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    return max(0, reserved - torch.cuda.memory_reserved())


def device_memory(phase: str) -> dict[str, float]:
    """``memory/<phase>_*`` metrics: GB (1e9 bytes, the memory plan's unit) this process has allocated and reserved on
    its GPU, and GB in use on the whole device (vLLM's engine processes included); empty on CPU."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    free, total = torch.cuda.mem_get_info()
    return {f"memory/{phase}_allocated_gb": torch.cuda.memory_allocated() / 1e9,
            f"memory/{phase}_reserved_gb": torch.cuda.memory_reserved() / 1e9,
            f"memory/{phase}_device_used_gb": (total - free) / 1e9}


class EngineSync:
    """Moves trained weights into one policy's engine and schedules its sleep around updates.

    engine: the rank's rollout engine, or None on a rank that hosts none.
    adapter_configs: under LoRA, each adapter's peft ``LoraConfig`` (``model.peft_config``); empty otherwise.
    engine_model: a transformers engine's own full copy of the model (FSDP groups), refreshed by copying.
    group_barrier: waits for every rank of the worker group, where an engine spans several ranks' GPUs (TP > 1: its
        shards and KV cache live beside the peers' learners, and vLLM sizes and checks memory device-wide). Every
        rank then passes it once the engine is asleep, before any learner trains, and once every rank has released
        its cache after the weight stream, before the KV cache wakes. Every rank calls ``release_for_update`` and
        ``push`` together (the stream is a collective).
    """

    def __init__(self, engine: Any, adapter_configs: Mapping[str, Any] | None = None,
                 engine_model: torch.nn.Module | None = None,
                 group_barrier: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.group_barrier = group_barrier
        self.adapter_configs = dict(adapter_configs or {})
        self.engine_model = engine_model
        self.owns_weights = engine is not None and engine_owns_weights(engine)
        self.sleeps = self.owns_weights and bool(getattr(engine, "sleep_enabled", False))
        self.memory: dict[str, float] = {}  # device memory after each phase of the last push (GPU only)
        self.timings: dict[str, float] = {}  # seconds of each part of the last push
        self._asleep = False

    @property
    def needs_weights(self) -> bool:
        """False only for an engine that generates with the learner's own module (nothing to stream)."""
        return self.engine is None or self.owns_weights or self.engine_model is not None

    def release_for_update(self) -> None:
        """Free the engine's accelerator memory for the learner (a no-op without sleep mode)."""
        if self.sleeps and not self._asleep:
            self.engine.sleep(level=1 if self.adapter_configs else 2)
            self._asleep = True
        if self.group_barrier is not None:
            self.group_barrier()  # no peer's learner grows before the engine's shards on its GPU sleep

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
             shapes: Mapping[str, Sequence[int]] | None = None) -> float:
        """Load the learner's trained tensors into the engine; returns the seconds it took (0 when it shares them).

        named_tensors: ``(name, tensor)`` pairs from the learner's module: every parameter of a full model, or
        (at least) the trained adapters' LoRA weights. The stream is always consumed to its end (under FSDP it is
        a collective). shapes: the stream's names and global shapes, checked against a vLLM engine's checkpoint
        before anything is gathered.
        """
        started = time.perf_counter()
        released = release_accelerator_cache()
        self.memory = {"memory/cache_released_gb": released / 1e9, **device_memory("after_release")}
        # The sync's parts, so a slow sync names its slow part: the cache release, the weights' wake (vLLM wakes them
        # right before the first chunk loads), their transfer, and the KV cache's wake.
        self.timings = {"timing/sync_release_s": time.perf_counter() - started}
        if not self.needs_weights or self.engine is None:
            _drain(named_tensors)
            # A peer of a TP engine's host (engine None) meets the host below: the host of a TP engine is always
            # vLLM (TP > 1 is a vLLM setting), which needs the weights.
            if self.group_barrier is not None:
                release_accelerator_cache()  # the stream's gathered tensors, before the host wakes the KV cache
                self.group_barrier()
            return 0.0
        started = weights_started = time.perf_counter()
        wake_weights = 0.0
        if self.engine_model is not None:
            from pettingllms.learner.weights import load_weights_into

            load_weights_into(self.engine_model, named_tensors)
        elif self.adapter_configs:
            # The base weights never change under LoRA: only the adapters go to the engine.
            adapters = adapter_tensors(named_tensors, self.adapter_configs)
            if self._asleep:
                waking = time.perf_counter()
                self.engine.wake_up(["weights"])
                wake_weights = time.perf_counter() - waking
            for name, tensors in adapters.items():
                self.engine.add_adapter(name, tensors, config=self.adapter_configs[name])
        else:
            if shapes is not None and callable(getattr(self.engine, "check_weights", None)):
                try:
                    self.engine.check_weights(shapes)
                except Exception:
                    _drain(named_tensors)  # the other ranks are gathering it
                    raise
            self.engine.sync_weights(named_tensors)  # wakes sleeping weights right before its first chunk loads
            wake_weights = float(getattr(self.engine, "last_wake_seconds", 0.0) or 0.0)
        self.memory.update(device_memory("after_weights"))
        woken = time.perf_counter()
        self.timings["timing/sync_wake_weights_s"] = wake_weights
        self.timings["timing/sync_weights_s"] = max(0.0, woken - weights_started - wake_weights)
        if self._asleep or self.group_barrier is not None:
            # The stream refilled this process's cache with gathered full tensors: give them back before the KV
            # cache (the largest allocation of the step) is taken by the engine's process.
            release_accelerator_cache()
        if self.group_barrier is not None:
            self.group_barrier()  # every peer has given its gathered tensors back too
        if self._asleep:
            self.engine.wake_up(["kv_cache"])
            self._asleep = False
            self.memory.update(device_memory("after_wake"))
        self.timings["timing/sync_wake_s"] = time.perf_counter() - woken
        return time.perf_counter() - started


def _drain(named_tensors: Iterable[Any]) -> None:
    for _ in named_tensors:  # an FSDP stream is a collective: take part in it anyway
        pass


def peft_adapter_configs(model: torch.nn.Module, adapter_names: Iterable[str]) -> dict[str, Any]:
    """Each adapter's peft ``LoraConfig`` from a peft model (empty for a plain model or no names)."""
    configs = getattr(model, "peft_config", None) or {}
    return {name: configs[name] for name in adapter_names if name in configs}
