"""Keeping a policy's rollout engine on the learner's weights, and out of the learner's way on a shared GPU.

Two kinds of engine serve a policy:
- the transformers engine (``HFEngine``) generates with the learner's own module in the same process, so an
  update is already visible to it: there is nothing to copy and ``push`` reports 0 seconds;
- the vLLM engine (``VLLMEngine``, recognised by its ``sync_weights`` method) holds its own copy of the weights.
  After every update the trained tensors go to it from memory: a full model's weights through ``sync_weights``
  (names of the Hugging Face checkpoint); under LoRA each trained adapter through ``add_adapter`` (peft's
  tensors and config), since the base weights never change. The seconds it takes are ``timing/sync_s``.

Colocation: when the engine was built with sleep mode (CUDA only), it frees its GPU memory while the learner
trains (``release_for_update``) and takes it back in ``push``. A full model sleeps at level 2 (weights
discarded: the sync resends them all anyway); under LoRA at level 1 (base weights parked in host memory).

The order in ``push`` matters: weights first (``wake_up(["weights"])`` then the sync), KV cache last, so the
engine never holds both the cache and stale weights, and peak memory stays that of one copy of each.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

import torch

from pettingllms.models.lora import adapter_tensors

def engine_owns_weights(engine: Any) -> bool:
    """True for an engine with its own copy of the weights (it has ``sync_weights``), such as vLLM."""
    return callable(getattr(engine, "sync_weights", None))


class EngineSync:
    """Moves trained weights into one policy's engine and schedules its sleep around updates.

    engine: the policy's rollout engine (only rank 0 of an FSDP group has one; pass None on other ranks).
    adapter_configs: under LoRA, each adapter's peft ``LoraConfig`` (``model.peft_config``); empty otherwise.
    """

    def __init__(self, engine: Any, adapter_configs: Mapping[str, Any] | None = None) -> None:
        self.engine = engine
        self.adapter_configs = dict(adapter_configs or {})
        self.owns_weights = engine is not None and engine_owns_weights(engine)
        self.sleeps = self.owns_weights and bool(getattr(engine, "sleep_enabled", False))
        self._asleep = False

    def release_for_update(self) -> None:
        """Free the engine's accelerator memory for the learner (a no-op without sleep mode)."""
        if self.sleeps and not self._asleep:
            self.engine.sleep(level=1 if self.adapter_configs else 2)
            self._asleep = True

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load the learner's trained tensors into the engine; returns the seconds it took (0 when it shares them).

        named_tensors: ``(name, tensor)`` pairs from the learner's module: every parameter of a full model, or
        (at least) the trained adapters' LoRA weights. The stream is always consumed to its end.
        """
        if not self.owns_weights:
            for _ in named_tensors:  # an FSDP stream is a collective: take part in it anyway
                pass
            return 0.0
        started = time.perf_counter()
        if self._asleep:
            self.engine.wake_up(["weights"])
        if self.adapter_configs:
            # The base weights never change under LoRA: only the adapters go to the engine.
            for name, tensors in adapter_tensors(named_tensors, self.adapter_configs).items():
                self.engine.add_adapter(name, tensors, config=self.adapter_configs[name])
        else:
            self.engine.sync_weights(named_tensors)
        if self._asleep:
            self.engine.wake_up(["kv_cache"])
            self._asleep = False
        return time.perf_counter() - started


def peft_adapter_configs(model: torch.nn.Module, adapter_names: Iterable[str]) -> dict[str, Any]:
    """Each adapter's peft ``LoraConfig`` from a peft model (empty for a plain model or no names)."""
    configs = getattr(model, "peft_config", None) or {}
    return {name: configs[name] for name in adapter_names if name in configs}
