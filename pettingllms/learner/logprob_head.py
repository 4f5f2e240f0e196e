"""The LM head of the learner's forwards, chunked: the response tokens' log-probs without the fp32 logits of a whole
micro-batch (``optim.logprob_chunk_tokens``).

The dense head computes float32 logits ``(R, C, V)`` for every kept column and keeps them (and their softmax) for
the backward: at 8,192 tokens over Qwen3's 151,936-token vocabulary that is the largest term of the memory plan.
Here the head picks the hidden state that predicts each response token, then computes the logits of N tokens at a
time: log-prob ``logit_y / T - logsumexp(logits / T)``, optionally the entropy of that distribution and the raw
(temperature 1) log-prob, and drops the chunk's logits. Under autograd each chunk is checkpointed
(``torch.utils.checkpoint``): its backward recomputes its logits, so at most one chunk's logits exist at a time.

It runs *inside* the model's forward, in place of the LM head's ``forward`` (``chunked_head``), because that is where
FSDP has the head's weight gathered and where its backward hooks see the result; the module and its parameter
names are untouched (checkpoints, weight sync and LoRA see the same model). The model's output ``logits`` are then
``(1, M, 3)``: per response token (the batch's valid tokens, row-major), its log-prob, entropy and raw log-prob
(zeros for what was not asked).

The same arithmetic as the dense path (``learner/batching.py``: ``tempered``, ``response_log_probs``), per token
instead of per column; a shared prompt column (the first token of every response in a tree row) is computed once
per response. Equal to the dense path up to float rounding (tested, values and gradients).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from pettingllms.algo.verl_adapter import entropy_from_logits
from pettingllms.core.errors import ConfigError

LOG_PROB, ENTROPY, RAW = 0, 1, 2  # the columns of the head's output


@dataclass(frozen=True)
class TokenTargets:
    """What the head computes: one entry per response token (the batch's valid tokens, row-major (N, T) order)."""

    rows: torch.Tensor  # (M,) the packed row holding the token's predicting column
    columns: torch.Tensor  # (M,) that column, as its position among the kept columns (``PolicyBatch.head_columns``)
    ids: torch.Tensor  # (M,) the token
    temperatures: torch.Tensor  # (M,) the sampling temperature of the token's sample
    entropy: str  # the entropy of softmax(logits / T): "none", "grad" (with its gradient) or "detached"
    raw: bool  # also the temperature-1 log-prob (no gradient)


def plain_lm_head(model: nn.Module) -> nn.Linear:
    """The model's LM head, refused (ConfigError) where the chunked head would change what the model computes."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not nn.Linear:
        raise ConfigError(f"optim.logprob_chunk_tokens needs a plain nn.Linear LM head; {type(model).__name__}'s is "
                          f"{type(head).__name__} (a LoRA adapter on lm_head, or a custom head): set "
                          "optim.logprob_chunk_tokens=0")
    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale"):
        text_config = getattr(config, "get_text_config", lambda: config)()
        value = getattr(text_config, name, None)
        if value not in (None, 0, 1, 1.0):
            raise ConfigError(f"optim.logprob_chunk_tokens: {type(model).__name__} applies {name}={value} after its "
                              "LM head, which the chunked head does not: set optim.logprob_chunk_tokens=0")
    return head


@contextmanager
def chunked_head(head: nn.Linear, targets: TokenTargets, chunk_tokens: int) -> Iterator[None]:
    """While open, ``head`` (the model's LM head) returns the response tokens' values ``(1, M, 3)`` instead of logits."""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        return token_values(hidden, head.weight, head.bias, targets, chunk_tokens)

    head.forward = forward  # an instance attribute: nn.Module.__call__ finds it before the class's forward
    try:
        yield
    finally:
        del head.forward


def token_values(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: TokenTargets,
                 chunk_tokens: int) -> torch.Tensor:
    """(1, M, 3): log-prob, entropy and raw log-prob of each target token, ``chunk_tokens`` tokens at a time."""
    picked = hidden[targets.rows.to(hidden.device), targets.columns.to(hidden.device)]  # (M, H)
    ids = targets.ids.to(hidden.device)
    temperatures = targets.temperatures.to(hidden.device, torch.float32)
    chunks = []
    for start in range(0, picked.shape[0], chunk_tokens):
        part = slice(start, start + chunk_tokens)
        args = (picked[part], weight, bias, ids[part], temperatures[part], targets.entropy, targets.raw)
        if torch.is_grad_enabled() and (picked.requires_grad or weight.requires_grad):
            chunks.append(checkpoint(_chunk_values, *args, use_reentrant=False))
        else:
            chunks.append(_chunk_values(*args))
    values = torch.cat(chunks) if chunks else picked.new_zeros((0, 3), dtype=torch.float32)
    return values.unsqueeze(0)


def _chunk_values(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor,
                  temperatures: torch.Tensor, entropy: str, raw: bool) -> torch.Tensor:
    """One chunk's (n, 3) values. What needs no gradient comes last and under ``no_grad``: the checkpoint's
    recomputation in the backward stops once the saved tensors are back (PyTorch's early stop), so it is not paid
    twice."""
    logits = F.linear(hidden, weight, bias).float()  # (n, V), as the dense path's ``output.logits.float()``
    scaled = logits / temperatures[:, None] if bool((temperatures != 1.0).any()) else logits
    log_probs = scaled.gather(1, ids[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=-1)
    zeros = torch.zeros_like(log_probs)
    entropies = entropy_from_logits(scaled) if entropy == "grad" else zeros
    with torch.no_grad():
        if entropy == "detached":
            entropies = entropy_from_logits(scaled.detach())
        raw_values = zeros
        if raw:
            raw_values = log_probs.detach() if scaled is logits else (
                logits.gather(1, ids[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1))
    return torch.stack([log_probs, entropies, raw_values], dim=1)
