"""The learner's attention masks, sliding windows included.

The learner passes transformers its own 4-D masks (``learner/batching.py`` packs the K branches of a tree node into
one row), and transformers uses a 4-D mask as given. So a model with sliding-window attention (Mistral, Phi-3,
Gemma 2/3, Qwen2 with ``use_sliding_window``) must get the window inside the mask, or its learner logprobs differ
from the engine's, which applies the window. ``AttentionLayout`` reads the model's config once:

- no window (Llama, Qwen3 by default, ...): the packed causal mask as it is;
- every layer windowed, one mask for all layers (Mistral, Phi-3): the mask with the window applied;
- window on some layers (``config.layer_types``: Gemma 2/3, Qwen2 with ``max_window_layers``): one mask per layer type,
  ``{"full_attention": ..., "sliding_attention": ...}``, which these models' forwards accept;
- a model that mixes layer types but whose forward takes one mask only cannot be trained correctly: refused with
  a message, when the learner is built; so are layer types other than full and sliding attention (chunked
  attention, linear attention, Mamba), which packed rows and 4-D masks cannot express.

The window is measured in position ids, not row columns: in a packed row a response restarts at ``len(prompt)``,
and a token attends to the keys at most ``window - 1`` positions before it (transformers' ``kv > q - window``).

With ``optim.attention=flex`` the same masks are FlexAttention block masks (``block_masks``), made from the rows'
``visible_until`` columns rather than the dense mask: the attention kernel then skips every block no query of it may
see (a packed tree row's responses never see each other, nor do the branches of its prompt trie: 78% of the blocks
of a 4-branch row of 8,192 tokens).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from pettingllms.core.errors import ConfigError

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class AttentionLayout:
    window: int | None = None  # None: no layer is windowed
    per_layer_type: bool = False  # pass a dict of masks per layer type

    @classmethod
    def of(cls, model: nn.Module) -> "AttentionLayout":
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = base.config
        window = getattr(config, "sliding_window", None)
        layer_types = getattr(config, "layer_types", None)
        if getattr(config, "attention_chunk_size", None):
            raise ConfigError(
                f"{type(base).__name__} uses chunked attention (attention_chunk_size={config.attention_chunk_size}); "
                f"the learner's packed attention masks apply full and sliding-window attention only, so its "
                f"logprobs would not match the engine's"
            )
        if layer_types is not None:
            types = set(layer_types)
            others = sorted(types - {FULL, SLIDING})
            if others:
                raise ConfigError(
                    f"{type(base).__name__} has {others} layers; the learner packs several responses into one row "
                    f"and keeps them apart with attention masks, which handle full and sliding-window attention "
                    f"only (a recurrent or chunked layer would see across them), so it cannot train this model"
                )
            if SLIDING not in types or not window:
                return cls()
            if not _takes_per_layer_masks(base):
                if types == {SLIDING}:
                    return cls(window=int(window))
                raise ConfigError(
                    f"{type(base).__name__} mixes sliding-window and full-attention layers, and its forward takes one "
                    f"attention mask for all of them: the learner cannot apply the window ({window}) where the model "
                    f"does, so its logprobs would not match the engine's. Use a model without mixed windows, or one "
                    f"whose transformers implementation takes per-layer-type masks"
                )
            return cls(window=int(window), per_layer_type=True)
        return cls(window=int(window)) if window else cls()

    def masks(self, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """attention_mask: (R, 1, L, L) bool, True = attend; position_ids: (R, L). Returns what the forward takes."""
        if self.window is None:
            return attention_mask
        distance = position_ids.unsqueeze(2) - position_ids.unsqueeze(1)  # (R, L, L): query pos - key pos
        windowed = attention_mask & (distance < self.window).unsqueeze(1)
        # A padding row attends to itself only (distance 0): it stays non-empty.
        if self.per_layer_type:
            return {FULL: attention_mask, SLIDING: windowed}
        return windowed

    def block_masks(self, visible_until: torch.Tensor, position_ids: torch.Tensor):
        """``masks`` as FlexAttention block masks: visible_until, position_ids (R, L) (``PolicyBatch``). Returns a
        BlockMask, or ``{layer type: BlockMask}`` as ``masks`` does."""
        if self.window is None:
            return tree_block_mask(visible_until, position_ids, None)
        windowed = tree_block_mask(visible_until, position_ids, self.window)
        if self.per_layer_type:
            return {FULL: tree_block_mask(visible_until, position_ids, None), SLIDING: windowed}
        return windowed


def tree_mask_mod(visible_until: torch.Tensor, position_ids: torch.Tensor, window: int | None):
    """FlexAttention's ``mask_mod`` for packed rows, equal to ``build_batch``'s dense mask (and ``masks``' window):
    query q sees key kv when kv <= q <= visible_until[kv]; padding (-1) sees itself only."""

    def mask_mod(b, h, q, kv):
        allowed = (kv <= q) & (q <= visible_until[b, kv])
        if window is not None:
            allowed = allowed & (position_ids[b, q] - position_ids[b, kv] < window)
        return allowed | (q == kv)

    return mask_mod


def tree_block_mask(visible_until: torch.Tensor, position_ids: torch.Tensor, window: int | None):
    from torch.nn.attention.flex_attention import create_block_mask

    rows, length = visible_until.shape
    return create_block_mask(tree_mask_mod(visible_until, position_ids, window), rows, None, length, length,
                             device=visible_until.device)


def _takes_per_layer_masks(base: nn.Module) -> bool:
    """Whether the decoder's forward accepts ``{layer type: mask}`` (transformers' ``causal_mask_mapping``)."""
    decoder = getattr(base, "model", base)
    try:
        source = inspect.getsource(type(decoder).forward)
    except (OSError, TypeError):
        return False
    return "causal_mask_mapping" in source and "isinstance" in source
