"""Keeping a policy's rollout engine on the learner's weights, and out of the learner's way on a shared GPU.

This is the one place that decides when and what is pushed to an engine after an update:
- the transformers engine (``HFEngine``) over the learner's own module (a one-rank group): an update is already
  visible to it, so nothing moves and ``push`` reports 0 seconds;
- a transformers engine over its own full copy (beside an FSDP shard): the full tensors are copied into it;
- the vLLM engine (``VLLMEngine``, recognised by its ``sync_weights`` method) holds its own copy of the weights.
  After every update the trained tensors go to it from memory: a full model's weights through ``sync_weights``
  (names of the Hugging Face checkpoint, streamed in bounded chunks), under LoRA each trained adapter through
  ``add_adapter`` (peft's tensors and config), since the base weights never change. ``timing/sync_s``;
- a rank without an engine (FSDP ranks that host none) still takes part in the stream's all-gathers.

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
import time
from typing import Any, Iterable, Mapping, Sequence

import torch

from pettingllms.models.lora import adapter_tensors


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
    """``memory/<phase>_*`` metrics: GB this process has allocated and reserved on its GPU, and GB in use on the
    whole device (vLLM's engine processes included); empty on CPU."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    free, total = torch.cuda.mem_get_info()
    return {f"memory/{phase}_allocated_gb": torch.cuda.memory_allocated() / 2**30,
            f"memory/{phase}_reserved_gb": torch.cuda.memory_reserved() / 2**30,
            f"memory/{phase}_device_used_gb": (total - free) / 2**30}


class EngineSync:
    """Moves trained weights into one policy's engine and schedules its sleep around updates.

    engine: the rank's rollout engine, or None on a rank that hosts none.
    adapter_configs: under LoRA, each adapter's peft ``LoraConfig`` (``model.peft_config``); empty otherwise.
    engine_model: a transformers engine's own full copy of the model (FSDP groups), refreshed by copying.
    """

    def __init__(self, engine: Any, adapter_configs: Mapping[str, Any] | None = None,
                 engine_model: torch.nn.Module | None = None) -> None:
        self.engine = engine
        self.adapter_configs = dict(adapter_configs or {})
        self.engine_model = engine_model
        self.owns_weights = engine is not None and engine_owns_weights(engine)
        self.sleeps = self.owns_weights and bool(getattr(engine, "sleep_enabled", False))
        self.memory: dict[str, float] = {}  # device memory after each phase of the last push (GPU only)
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

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
             shapes: Mapping[str, Sequence[int]] | None = None) -> float:
        """Load the learner's trained tensors into the engine; returns the seconds it took (0 when it shares them).

        named_tensors: ``(name, tensor)`` pairs from the learner's module: every parameter of a full model, or
        (at least) the trained adapters' LoRA weights. The stream is always consumed to its end (under FSDP it is
        a collective). shapes: the stream's names and global shapes, checked against a vLLM engine's checkpoint
        before anything is gathered.
        """
        released = release_accelerator_cache()
        self.memory = {"memory/cache_released_gb": released / 2**30, **device_memory("after_release")}
        if not self.needs_weights or self.engine is None:
            _drain(named_tensors)
            return 0.0
        started = time.perf_counter()
        if self.engine_model is not None:
            from pettingllms.learner.weights import load_weights_into

            load_weights_into(self.engine_model, named_tensors)
        elif self.adapter_configs:
            # The base weights never change under LoRA: only the adapters go to the engine.
            adapters = adapter_tensors(named_tensors, self.adapter_configs)
            if self._asleep:
                self.engine.wake_up(["weights"])
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
        self.memory.update(device_memory("after_weights"))
        if self._asleep:
            # The stream refilled this process's cache with gathered full tensors: give them back before the KV
            # cache (the largest allocation of the step) is taken by the engine's process.
            release_accelerator_cache()
            self.engine.wake_up(["kv_cache"])
            self._asleep = False
            self.memory.update(device_memory("after_wake"))
        return time.perf_counter() - started


def _drain(named_tensors: Iterable[Any]) -> None:
    for _ in named_tensors:  # an FSDP stream is a collective: take part in it anyway
        pass


def peft_adapter_configs(model: torch.nn.Module, adapter_names: Iterable[str]) -> dict[str, Any]:
    """Each adapter's peft ``LoraConfig`` from a peft model (empty for a plain model or no names)."""
    configs = getattr(model, "peft_config", None) or {}
    return {name: configs[name] for name in adapter_names if name in configs}
