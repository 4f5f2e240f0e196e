"""A policy's weights as tensors: which ones an update changes, streaming them out whole (FSDP-aware), loading them in.

Every function that touches FSDP parameters is a collective: all ranks of the group call it, in the same order.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch
from torch import nn

from pettingllms.models.lora import adapter_parameters


def trained_parameter_names(model: nn.Module, adapter_names: Sequence[str], frozen: Sequence[str] = ()) -> list[str]:
    """Names of the parameters an update can change, in model order: every parameter of a full model, or the
    LoRA weights of the adapters that are not frozen."""
    if not adapter_names:
        return [name for name, _ in model.named_parameters()]
    trained = [adapter for adapter in adapter_names if adapter not in frozen]
    owned = {name for adapter in trained for name, _ in adapter_parameters(model, adapter)}
    return [name for name, _ in model.named_parameters() if name in owned]


@torch.no_grad()
def full_weights(model: nn.Module, names: Sequence[str] | None = None,
                 dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` for each parameter (or each one in ``names``), in model order.

    A collective under FSDP: every rank must iterate to the end, together, with the same ``dtype``. Each tensor is
    all-gathered on its own, so at most one full tensor exists at a time (an engine can load a large model layer
    by layer), and the consumer should drop it before pulling the next. dtype: floating tensors are cast to it
    first (a shard before its all-gather: half the bytes for fp32 master weights sent as bf16; the values are the
    same as casting after). Every rank receives the full tensor; consumers on other ranks simply drop it. A
    parameter that is not a DTensor (a plain module) is yielded as it is (cast when ``dtype`` says so).
    """
    from torch.distributed.tensor import DTensor

    wanted = None if names is None else set(names)
    for name, param in model.named_parameters():
        if wanted is not None and name not in wanted:
            continue
        tensor = param.detach()
        if isinstance(tensor, DTensor):
            if tensor.device.type == "cpu" and _backend() == "nccl":
                tensor = tensor.to(torch.device("cuda", torch.cuda.current_device()))  # CPU offload: gather on GPU
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            tensor = tensor.full_tensor()
        elif dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        yield name, tensor
        del tensor


def weight_shapes(model: nn.Module, names: Sequence[str] | None = None) -> dict[str, tuple[int, ...]]:
    """``{name: full shape}`` of the parameters ``full_weights`` would yield; no communication (a DTensor knows
    its global shape)."""
    wanted = None if names is None else set(names)
    return {name: tuple(param.shape) for name, param in model.named_parameters() if wanted is None or name in wanted}


def load_weights_into(module: nn.Module, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> int:
    """Copy each ``(name, tensor)`` into ``module``'s parameter of that name (cast to its dtype and device).

    Returns the number of tensors copied. An unknown name or a shape mismatch raises: the engine copy and the
    learner must be the same architecture with the same adapters.
    """
    params = dict(module.named_parameters())
    count = 0
    with torch.no_grad():
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"weight {name!r} has no parameter in the engine's model")
            target = params[name]
            if target.shape != tensor.shape:
                raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)} != engine's {tuple(target.shape)}")
            target.copy_(tensor)
            count += 1
    return count


def _backend() -> str | None:
    import torch.distributed as dist

    return dist.get_backend() if dist.is_initialized() else None
