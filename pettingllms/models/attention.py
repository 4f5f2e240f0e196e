"""A grouped-query SDPA attention function for transformers models, registered as ``pettingllms_sdpa``.

transformers' own "sdpa" path copies keys and values ``num_key_value_groups`` times (``repeat_kv``)
whenever an attention mask is present, which is always the case with padded batches. For SmolLM2
(9 query heads, 3 kv heads) that triples the KV memory traffic of every decode step: on the 2-core CPU
machine one decode attention over 300 cached tokens took 6x longer than handing the grouped K/V to
``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)``, which gives the same values
(and, measured, the same gradients). Masks are built exactly as for "sdpa" (``sdpa_mask``).

Attention-logit soft-capping (Gemma 2: ``tanh(scores / cap) * cap`` before the softmax) is not something SDPA can
do, and transformers' own "sdpa" silently drops it; a model that asks for it (``softcap``) gets the explicit
computation below, which matches transformers' eager attention. Attention sinks (gpt-oss's ``s_aux``) are refused.

Given a FlexAttention ``BlockMask`` instead of a dense mask (the learner with ``optim.attention=flex``,
``learner/masks.py``), the same function runs ``flex_attention``: grouped K/V as they are, soft-capping as a score
modification, and only the blocks the mask lets any query see (measured on an H100 over a packed 4-branch tree row of
8,192 tokens, forward and backward: 1.85 ms against 16.3 ms for the masked SDPA, ``benchmarks/gpu_probe.py``).
On CUDA it is compiled once per process (torch.compile: the kernel is generated for the mask's sparsity; shapes
become dynamic after the first new length). FlexAttention has no backward on CPU.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

ATTENTION_NAME = "pettingllms_sdpa"


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [B, Hq, Q, D]; key, value [B, Hkv, K, D] (Hq a multiple of Hkv); attention_mask [B, 1, Q, K]
    (bool, True = attend) or None. Returns (attn_output [B, Q, Hq, D], None) like transformers' sdpa."""
    if is_block_mask(attention_mask):
        return flex_attention_call(query, key, value, attention_mask, scaling=scaling, softcap=kwargs.get("softcap"),
                                   dropout=dropout, sinks=kwargs.get("s_aux")), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # SDPA's is_causal only when no mask was built (an unpadded prefill); a decode step attends to all.
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError(
            f"{ATTENTION_NAME} does not implement attention sinks (s_aux, gpt-oss); this model cannot be trained with "
            f"pettingllms' attention"
        )
    if kwargs.get("softcap") is not None:
        output = softcapped_attention(query, key, value, attention_mask, float(kwargs["softcap"]),
                                      scaling=scaling, causal=causal, dropout=dropout)
        return output.transpose(1, 2).contiguous(), None
    gqa = key.shape[1] != query.shape[1]
    restricted = query.device.type == "cuda" and attention_mask is not None
    if restricted and gqa:
        # On CUDA, SDPA's grouped-query mode runs only on flash attention (no arbitrary mask) or the math kernel,
        # which materialises [B, H, Q, K] scores: with a mask, expand K/V to every query head so that the
        # memory-efficient kernel qualifies (more K/V memory, no quadratic scores).
        groups = query.shape[1] // key.shape[1]
        key, value, gqa = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1), False
    with sdpa_backends(query.device.type, attention_mask is not None):
        output = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=dropout,
            scale=scaling,
            is_causal=causal,
            enable_gqa=gqa,
        )
    return output.transpose(1, 2).contiguous(), None


def masked_sdpa_backends() -> list:
    """The SDPA kernels allowed for an explicit mask on CUDA: memory-efficient attention, else the math kernel.

    Not cuDNN attention: with torch 2.13 on H100, SDPA can pick it for an explicit mask, and its backward has a known
    NaN bug for some sequence lengths (pytorch#196678); a NaN gradient then costs a step (see the learner's
    ``max_nonfinite_grad_steps``). Flash attention takes no arbitrary mask, so it is not a candidate here anyway.
    """
    from torch.nn.attention import SDPBackend

    return [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa_backends(device_type: str, has_mask: bool):
    """A context restricting SDPA to ``masked_sdpa_backends`` on CUDA with an explicit mask; else no restriction."""
    import contextlib

    if device_type != "cuda" or not has_mask:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(masked_sdpa_backends())


def softcapped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    softcap: float,
    *,
    scaling: float | None,
    causal: bool,
    dropout: float = 0.0,
) -> torch.Tensor:
    """softmax(tanh(q k^T * scaling / softcap) * softcap + mask) v, in transformers' eager order (softmax in fp32).

    query [B, Hq, Q, D]; key, value [B, Hkv, K, D]; attention_mask [B, 1, Q, K] bool (True = attend) or additive
    float, or None (then ``causal`` says whether to apply a causal mask). Returns [B, Hq, Q, D].
    """
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is None and causal:
        q_len, k_len = query.shape[2], key.shape[2]
        attention_mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = F.dropout(probs, p=dropout, training=dropout > 0)
    return torch.matmul(probs, value)


def register_attention() -> str:
    """Register the attention and mask functions with transformers (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, grouped_sdpa_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME


def use_grouped_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switch a loaded model (or peft model) to ``pettingllms_sdpa``; ``load_model`` already does this."""
    name = register_attention()
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    target.set_attn_implementation(name)
    return model


def is_block_mask(mask: object) -> bool:
    from torch.nn.attention.flex_attention import BlockMask

    return isinstance(mask, BlockMask)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def _flex_for(device_type: str):
    """``flex_attention``, compiled once per process on CUDA (eager FlexAttention materialises every score: CPU
    forwards only, for reference)."""
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled_flex() if device_type == "cuda" else flex_attention


def flex_attention_call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask, *,
                        scaling: float | None, softcap: float | None = None, dropout: float = 0.0,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """query [B, Hq, Q, D]; key, value [B, Hkv, K, D]; block_mask a FlexAttention BlockMask over (B, Q, K).
    Returns [B, Q, Hq, D] like ``grouped_sdpa_attention``."""
    if sinks is not None:
        raise NotImplementedError(f"{ATTENTION_NAME} does not implement attention sinks (s_aux, gpt-oss)")
    if dropout:
        raise NotImplementedError(f"{ATTENTION_NAME}: FlexAttention takes no attention dropout (got {dropout})")
    score_mod = _softcap_mod(float(softcap)) if softcap is not None else None
    # Autocast leaves q/k/v in the projections' dtype; FlexAttention wants one dtype for all three.
    dtype = query.dtype
    output = _flex_for(query.device.type)(
        query, key.to(dtype), value.to(dtype), score_mod=score_mod, block_mask=block_mask, scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return output.transpose(1, 2).contiguous()


def _softcap_mod(cap: float):
    """FlexAttention's ``score_mod`` for attention-logit soft-capping: ``tanh(score / cap) * cap``."""

    def score_mod(score, b, h, q, kv):
        return torch.tanh(score / cap) * cap

    return score_mod
