"""Each row of an inference batch through its own LoRA adapter, in one forward (an L2 engine call serves every agent).

``per_row_adapters(model, names)`` routes row i through adapter ``names[i]`` (None: the base weights) while the
base layers run once over the whole batch. Where every LoRA layer is a plain ``peft`` linear layer with the same
rank per adapter in every layer (what ``attach_adapters`` builds), each layer computes all adapters' low-rank terms
in two matrix products, with the adapters packed side by side:

    y = base(x) + ((x @ A_packed^T) * M) @ B_packed^T

A_packed stacks every adapter's A (rank r_a rows each), B_packed every adapter's B (scaled by its alpha / r_a) along
the same columns, and M[row, column] is 1 where the column belongs to the row's adapter, else 0. That is exactly
each row's own ``B_a A_a x`` scaled, in two kernels per layer however many adapters the batch mixes (their work
grows with the sum of the adapters' ranks).
peft's own mixed-batch forward (``adapter_names=``) does one gather, two small products and one scatter per adapter
per layer, which on a CPU costs L2 generation about 70% over one shared adapter (benchmarks/lora_vs_shared.py);
it remains the path for what this packing does not cover (other LoRA variants, per-layer ranks, a LoRA bias,
per-adapter copies of whole modules).

Inference only: the packed forward never runs in train mode.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from pettingllms.core.errors import ConfigError
from pettingllms.models.lora import adapter_names, use_adapter

BASE_ROWS = "__base__"  # peft's name, in a mixed batch, for rows that use the base weights


class RowRouter:
    """What an engine passes to each forward of a batch whose rows use different adapters.

    ``forward_kwargs(names)``: the keyword arguments for a forward over rows using ``names`` (one per row, None for
    the base weights). Packed: it sets the layers' column mask and returns ``{}``; otherwise peft's
    ``{"adapter_names": [...]}``.
    """

    def __init__(self, model: nn.Module, adapters: Sequence[str]) -> None:
        self.adapters = tuple(adapters)
        self.layers = _lora_layers(model)
        self.columns = None if _has_auxiliary_modules(model) else _packed_columns(self.layers, self.adapters)
        self.mask: torch.Tensor | None = None

    @property
    def packed(self) -> bool:
        return self.columns is not None

    def forward_kwargs(self, names: Sequence[str | None]) -> dict:
        if not self.packed:
            return {"adapter_names": [BASE_ROWS if name is None else name for name in names]}
        width = sum(end - start for start, end in self.columns.values())
        mask = torch.zeros(len(names), 1, width)
        for row, name in enumerate(names):
            if name is not None:
                start, end = self.columns[name]
                mask[row, 0, start:end] = 1.0
        weight = self.layers[0].lora_A[self.adapters[0]].weight
        self.mask = mask.to(device=weight.device, dtype=weight.dtype)  # once per forward, not once per layer
        return {}

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Every LoRA layer computes with the packed weights while inside (nothing to do for peft's path)."""
        if not self.packed:
            yield
            return
        try:
            for layer in self.layers:
                a = torch.cat([layer.lora_A[name].weight for name in self.adapters])
                b = torch.cat([layer.lora_B[name].weight * layer.scaling[name] for name in self.adapters], dim=1)
                layer.forward = types.MethodType(_packed_forward(self, a, b), layer)
            yield
        finally:
            for layer in self.layers:
                vars(layer).pop("forward", None)  # back to the class's forward (peft layers have no own forward)


def _packed_forward(router: RowRouter, a: torch.Tensor, b: torch.Tensor):
    def forward(layer, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        result = layer.base_layer(x, *args, **kwargs)
        low_rank = F.linear(x.to(a.dtype), a) * router.mask
        return result + F.linear(low_rank, b).to(result.dtype)

    return forward


def _lora_layers(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.lora import LoraLayer

    return [module for module in model.modules() if isinstance(module, LoraLayer)]


def _has_auxiliary_modules(model: nn.Module) -> bool:
    """Per-adapter copies of whole modules (``modules_to_save``, trainable tokens): peft's mixed-batch forward
    routes those per row too, the packing does not."""
    from peft.utils.other import AuxiliaryTrainingWrapper

    return any(isinstance(module, AuxiliaryTrainingWrapper) for module in model.modules())


def _packed_columns(layers: list[nn.Module], adapters: Sequence[str]) -> dict[str, tuple[int, int]] | None:
    """Each adapter's columns in the packed matrices, or None where a layer cannot be packed (peft's path)."""
    from peft.tuners.lora import Linear

    ranks: dict[str, int] = {}
    for layer in layers:
        if type(layer) is not Linear or layer.lora_variant or layer.merged:
            return None
        for name in adapters:
            if name not in layer.lora_A or ranks.setdefault(name, layer.r[name]) != layer.r[name]:
                return None
            if layer.lora_bias.get(name, False):  # B's bias: not in the packed product
                return None
    columns, start = {}, 0
    for name in adapters:
        columns[name] = (start, start + ranks.get(name, 0))
        start += ranks.get(name, 0)
    return columns


@contextmanager
def per_row_adapters(model: nn.Module, names: Sequence[str | None]) -> Iterator[RowRouter | None]:
    """Route each row of an inference batch through its own adapter (None: the base weights).

    Yields None when every row names the same adapter (then this is ``use_adapter`` of it), else a ``RowRouter``
    whose ``forward_kwargs(row_names)`` each forward of the batch passes on (rows may leave the batch between
    forwards). Inference only: refused in train mode, as peft refuses ``adapter_names`` there.
    """
    distinct = set(names)
    if len(distinct) <= 1:
        with use_adapter(model, next(iter(distinct), None)):
            yield None
        return
    unknown = sorted(distinct - {None} - set(adapter_names(model)))
    if unknown:
        raise ConfigError(f"unknown LoRA adapters {unknown}; this model has {sorted(adapter_names(model))}")
    if model.training:
        raise ConfigError("per_row_adapters is for inference: call model.eval() first")
    used = sorted(n for n in distinct if n is not None)
    # Any real adapter: it enables the LoRA layers, which the mixed-batch forward needs (disabled layers skip it).
    with use_adapter(model, used[0]):
        router = RowRouter(model, used)
        with router.installed():
            yield router
