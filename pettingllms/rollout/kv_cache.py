"""The transformers engine's KV cache: preallocated per batch, written one position per step, compacted as rows
finish (rows dropped, and left padding no remaining row needs trimmed)."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One full-attention layer's KV cache in buffers [B, Hkv, capacity, D] that a step writes into.

    transformers' DynamicLayer concatenates the whole cache with each new token (a full copy per step);
    here a step writes one column. ``keys``/``values`` are views of the filled part, as transformers
    expects. ``compact`` drops rows and leading columns in one copy.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        rows, heads, _, _ = key_states.shape
        self._key_buffer = key_states.new_empty((rows, heads, self.capacity, key_states.shape[-1]))
        self._value_buffer = value_states.new_empty((rows, heads, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append key/value states [B, Hkv, new, D]; return all cached keys, values [B, Hkv, T, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:  # more than planned: grow (never happens in the engine)
            self._reallocate(torch.arange(self._key_buffer.shape[0]), lead=0, capacity=2 * end)
        self._key_buffer[:, :, self.length : end] = key_states
        self._value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self._refresh_views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.compact(indices, lead=0)

    def compact(self, rows: torch.Tensor, lead: int) -> None:
        """Keep only ``rows`` (indices into the batch) and drop the first ``lead`` positions."""
        if self.is_initialized:
            self._reallocate(rows, lead=lead, capacity=self._key_buffer.shape[-2] - lead)

    def _reallocate(self, rows: torch.Tensor, *, lead: int, capacity: int) -> None:
        filled = self.length - lead
        for name in ("_key_buffer", "_value_buffer"):
            old = getattr(self, name)
            new = old.new_empty((rows.numel(), old.shape[1], capacity, old.shape[-1]))
            new[:, :, :filled] = old[rows, :, lead : self.length]
            setattr(self, name, new)
        self.length = filled
        self._refresh_views()

    def _refresh_views(self) -> None:
        self.keys = self._key_buffer[:, :, : self.length]
        self.values = self._value_buffer[:, :, : self.length]


def new_kv_cache(config, capacity: int) -> DynamicCache:
    """A DynamicCache whose full-attention layers are PreallocatedLayer(capacity); other layer kinds
    (sliding windows) keep transformers' own classes."""
    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def keep_rows(cache: DynamicCache, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Keep ``rows`` of the batch in the cache and the attention mask; also drop leading columns that
    are padding for every kept row, when every layer supports it (PreallocatedLayer).

    mask [B, T] matches the cache's T positions; rows [B'] indices. Returns the new mask [B', T - lead].
    Position ids are passed explicitly, so dropping all-padding columns changes nothing but the work.
    """
    mask = mask[rows]
    lead = int((mask == 0).all(dim=0).long().cumprod(dim=0).sum())
    if lead and cache.layers and all(isinstance(layer, PreallocatedLayer) for layer in cache.layers):
        for layer in cache.layers:
            layer.compact(rows, lead)
        return mask[:, lead:]
    cache.batch_select_indices(rows)
    return mask
