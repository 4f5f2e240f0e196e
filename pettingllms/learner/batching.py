"""Turn ``Sample``s into padded tensors, and split work into mini-batches and token-budget micro-batches.

Layout: each row is ``prompt_ids + response_ids`` right-padded to the longest row. Response-aligned tensors
(``response_mask``, ``advantages``, log-probabilities) are (B, T) with column j = response token j, so they
line up with verl's loss functions. Token ids are the sample's exact ids; nothing is re-tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from pettingllms.core.types import Sample


@dataclass(frozen=True)
class PolicyBatch:
    """B right-padded sequences. L = longest prompt+response, T = longest response (at least 1).

    input_ids, attention_mask, position_ids: (B, L) int64. attention_mask is 1 on real tokens.
    prompt_lengths, response_lengths: (B,) int64.
    response_ids: (B, T) int64, 0 on padding.
    response_mask: (B, T) float32. 1.0 on response tokens that count in the loss; 0.0 on padding, on prompt
        tokens (never present in this layout) and on every token of a failed sample.
    advantages: (B, T) float32, each sample's scalar advantage broadcast over its response, 0.0 where masked.
    rollout_log_probs: (B, T) float32, the engine's log-probabilities of the response tokens (0.0 where absent).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    prompt_lengths: torch.Tensor
    response_lengths: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    rollout_log_probs: torch.Tensor

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device) -> "PolicyBatch":
        return PolicyBatch(**{name: getattr(self, name).to(device) for name in self.__dataclass_fields__})


def build_batch(
    samples: Sequence[Sample], advantages: Sequence[float] | None = None, pad_token_id: int = 0
) -> PolicyBatch:
    """Right-pad ``samples`` into a ``PolicyBatch``. ``advantages``: one scalar per sample (zeros when None)."""
    if not samples:
        raise ValueError("build_batch needs at least one sample")
    if advantages is not None and len(advantages) != len(samples):
        raise ValueError(f"{len(advantages)} advantages for {len(samples)} samples")
    for index, sample in enumerate(samples):
        if not sample.prompt_ids:
            raise ValueError(f"sample {index} (episode {sample.episode!r}) has an empty prompt")

    num_rows = len(samples)
    seq_len = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    resp_len = max(1, max(len(s.response_ids) for s in samples))

    input_ids = torch.full((num_rows, seq_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((num_rows, seq_len), dtype=torch.long)
    response_ids = torch.zeros((num_rows, resp_len), dtype=torch.long)
    response_mask = torch.zeros((num_rows, resp_len), dtype=torch.float32)
    advantage_rows = torch.zeros((num_rows, resp_len), dtype=torch.float32)
    rollout_log_probs = torch.zeros((num_rows, resp_len), dtype=torch.float32)

    for row, sample in enumerate(samples):
        prompt, response = sample.prompt_ids, sample.response_ids
        full = list(prompt) + list(response)
        input_ids[row, : len(full)] = torch.tensor(full, dtype=torch.long)
        attention_mask[row, : len(full)] = 1
        if response:
            response_ids[row, : len(response)] = torch.tensor(response, dtype=torch.long)
        if sample.response_logprobs:
            if len(sample.response_logprobs) != len(response):
                raise ValueError(
                    f"sample {row} (episode {sample.episode!r}): {len(sample.response_logprobs)} logprobs "
                    f"for {len(response)} response tokens"
                )
            rollout_log_probs[row, : len(response)] = torch.tensor(sample.response_logprobs, dtype=torch.float32)
        if response and not sample.failed:
            response_mask[row, : len(response)] = 1.0
            if advantages is not None:
                advantage_rows[row, : len(response)] = float(advantages[row])

    # Right padding keeps real tokens at positions 0..len-1; pad positions just continue counting (masked anyway).
    position_ids = torch.arange(seq_len, dtype=torch.long).unsqueeze(0).expand(num_rows, seq_len).contiguous()
    return PolicyBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        prompt_lengths=torch.tensor([len(s.prompt_ids) for s in samples], dtype=torch.long),
        response_lengths=torch.tensor([len(s.response_ids) for s in samples], dtype=torch.long),
        response_ids=response_ids,
        response_mask=response_mask,
        advantages=advantage_rows,
        rollout_log_probs=rollout_log_probs,
    )


def pad_response_values(values: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """Stack per-sample 1-D tensors (len_i,) into (B, width), right-padded with 0.0."""
    out = torch.zeros((len(values), width), dtype=torch.float32)
    for row, value in enumerate(values):
        out[row, : value.numel()] = value.to(torch.float32)
    return out


def first_logit_column(batch: PolicyBatch) -> int:
    """The first sequence column whose logits are needed: the one predicting the earliest response token.

    Logits at column c predict the token at c + 1, so the earliest is ``min(prompt_lengths) - 1``. Running the
    LM head only from here on (``logits_to_keep``) skips most prompt positions.
    """
    return int(batch.prompt_lengths.min().item()) - 1


def gather_response_values(token_values: torch.Tensor, batch: PolicyBatch, first_label: int) -> torch.Tensor:
    """Pick each row's response-token values out of a per-label-position matrix.

    token_values: (B, K), column k holds the value for the token at sequence position ``first_label + k``.
    Returns (B, T): column j = value for response token j (position prompt_len + j); 0.0 beyond the response.
    """
    num_cols = token_values.shape[1]
    width = batch.response_mask.shape[1]
    offsets = torch.arange(width, device=token_values.device).unsqueeze(0)
    columns = (batch.prompt_lengths.to(token_values.device) - first_label).unsqueeze(1) + offsets
    columns = columns.clamp(max=num_cols - 1)
    gathered = torch.gather(token_values, 1, columns)
    valid = offsets < batch.response_lengths.to(token_values.device).unsqueeze(1)
    return torch.where(valid, gathered, torch.zeros_like(gathered))


def response_spans(batch: PolicyBatch, first_label: int) -> list[tuple[int, int]]:
    """(start column, length) of each row's response in a per-label-position matrix starting at ``first_label``.

    Slicing ``values[row, start : start + length]`` gives a view over exactly that row's response tokens.
    """
    starts = (batch.prompt_lengths - first_label).tolist()
    return list(zip(starts, batch.response_lengths.tolist()))


def micro_batches_by_tokens(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group sequence indices so that each group's padded size (rows x longest) fits ``max_tokens``.

    Indices are sorted by length, longest first (ties by index, so the result is deterministic): neighbours have
    similar lengths, which keeps padding small, and the largest forward comes first so peak memory shows early.
    A sequence longer than the budget gets a micro-batch of its own.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for index in order:
        # Sorted descending, so a group's first member is its longest and sets its padded width.
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def split_mini_batches(indices: Sequence[int], mini_batch_size: int) -> list[list[int]]:
    """Consecutive chunks of ``mini_batch_size`` indices (the last may be shorter); 0 = one chunk of all."""
    if mini_batch_size < 0:
        raise ValueError(f"mini_batch_size must be >= 0, got {mini_batch_size}")
    indices = list(indices)
    if not indices:
        return []
    if mini_batch_size == 0:
        return [indices]
    return [indices[start : start + mini_batch_size] for start in range(0, len(indices), mini_batch_size)]
