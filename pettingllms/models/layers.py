"""The transformer blocks of a loaded model: the units FSDP shards and regional compilation compiles."""

from __future__ import annotations

from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a transformers model (or a peft model around one), in model order.

    Found by the class names transformers lists in ``_no_split_modules`` (e.g. ``LlamaDecoderLayer``), also once
    FSDP2 has sharded them (``fully_shard`` swaps a module's class for a subclass of its own, ``FSDPLlamaDecoderLayer``).
    These are the natural FSDP units: one all-gather per block.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    return [module for module in model.modules() if any(cls.__name__ in names for cls in type(module).__mro__)]
