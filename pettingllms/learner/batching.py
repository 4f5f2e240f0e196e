"""Turn ``Sample``s into model inputs, and split work into mini-batches and token-budget micro-batches.

Shared-prompt packing. In tree mode the K branches of a (turn, agent) node share one prompt, and on the quickstart
task the prompt is 3-4 times longer than a response. Instead of one row per sample (the prompt repeated K times),
samples with the same prompt ids are *packed* into one row::

    prompt | response_1 | response_2 | ... | response_m | padding

with position ids that restart at ``len(prompt)`` for every response, and a 4-D attention mask in which a response
token sees the prompt and the earlier tokens of its own response only. Every response token therefore gets exactly
the logits it would get in its own row (tested to float tolerance), gradients through the shared prompt add up as
they would over m separate rows, and the forward costs ``P + sum(R_i)`` tokens instead of ``m * P + sum(R_i)``.
A sample whose prompt no one shares is simply a row of one.

Response-aligned tensors (``response_ids``, ``response_mask``, ``advantages``, log-probabilities) are (N, T), one
row per *sample* with column j = response token j, so they line up with verl's loss functions unchanged.
Token ids are the sample's exact ids; nothing is re-tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from pettingllms.core.types import Sample


@dataclass(frozen=True)
class PolicyBatch:
    """N samples packed into R rows of L tokens; T = longest response (at least 1).

    input_ids, position_ids: (R, L) int64.
    attention_mask: (R, 1, L, L) bool, True where a query position may attend to a key position. Padding
        positions attend to themselves only, so no softmax row is empty (an empty row would give NaN). None when
        the batch is built for FlexAttention (``dense_mask=False``), which reads ``segment_ids`` instead.
    segment_ids: (R, L) int32, the same mask as segments: 0 for the row's prompt, b + 1 for the row's b-th
        response, -1 for padding. A token attends to earlier columns of its own segment and of the prompt; padding
        to itself (``learner/masks.py`` builds FlexAttention's block mask from it).
    sample_rows: (N,) int64, the packed row holding each sample.
    logit_columns: (N, T) int64, the row column whose logits predict response token j (the last prompt column
        for j = 0, shared by every response of the row); 0 beyond the response.
    response_lengths: (N,) int64.
    response_ids: (N, T) int64, 0 on padding.
    response_mask: (N, T) float32. 1.0 on response tokens that count in the loss; 0.0 on padding and on every
        token of a failed sample.
    advantages: (N, T) float32, each sample's scalar advantage broadcast over its response, 0.0 where masked.
    rollout_log_probs: (N, T) float32, the engine's log-probabilities of the response tokens (0.0 where absent).
    rollout_mask: (N, T) float32, 1.0 where the engine reported a logprob for a token of a sample that counts.
    row_temperatures: (R,) float32, the sampling temperature of each row's samples (a row's samples share it); the
        learner's logprobs are those of ``softmax(logits / T)``, the distribution the tokens were drawn from (before
        top-k/top-p, see docs/training.md). Greedy samples (T = 0) count as T = 1.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    segment_ids: torch.Tensor
    sample_rows: torch.Tensor
    logit_columns: torch.Tensor
    response_lengths: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    rollout_log_probs: torch.Tensor
    rollout_mask: torch.Tensor
    row_temperatures: torch.Tensor

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_samples(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def first_logit_column(self) -> int:
        """The earliest column whose logits are needed; the LM head can skip every column before it."""
        valid = self.response_lengths > 0
        if not bool(valid.any()):
            return max(0, self.input_ids.shape[1] - 1)
        return int(self.logit_columns[valid, 0].min().item())

    def to(self, device: torch.device) -> "PolicyBatch":
        return PolicyBatch(**{name: None if getattr(self, name) is None else getattr(self, name).to(device)
                              for name in self.__dataclass_fields__})


def learner_temperature(sample: Sample) -> float:
    """The temperature the learner scales a sample's logits by: its sampling temperature, or 1 for greedy ones."""
    return float(sample.temperature) if sample.temperature > 0 else 1.0


def pack_by_prompt(samples: Sequence[Sample], max_tokens: int | None = None) -> list[list[int]]:
    """Indices of ``samples`` grouped into packing units: samples with identical prompt ids (and sampling
    temperature, which a row shares), in first-seen order.

    ``max_tokens`` caps a unit's packed length (prompt + its responses): a large group is split into several
    units, each repeating the prompt, so one row never outgrows the micro-batch budget (the attention mask is
    L x L). A single sample longer than the cap still gets a unit of its own.
    """
    by_prompt: dict[tuple, list[int]] = {}
    for index, sample in enumerate(samples):
        by_prompt.setdefault((tuple(sample.prompt_ids), learner_temperature(sample)), []).append(index)
    units: list[list[int]] = []
    for (prompt, _), indices in by_prompt.items():
        unit: list[int] = []
        length = len(prompt)
        for index in indices:
            extra = len(samples[index].response_ids)
            if unit and max_tokens is not None and length + extra > max_tokens:
                units.append(unit)
                unit, length = [], len(prompt)
            unit.append(index)
            length += extra
        units.append(unit)
    return units


def packed_length(samples: Sequence[Sample], unit: Sequence[int]) -> int:
    """Tokens in the packed row of ``unit``: the shared prompt once plus every response."""
    return len(samples[unit[0]].prompt_ids) + sum(len(samples[i].response_ids) for i in unit)


def build_batch(
    samples: Sequence[Sample],
    advantages: Sequence[float] | None = None,
    pad_token_id: int = 0,
    units: Sequence[Sequence[int]] | None = None,
    dense_mask: bool = True,
) -> PolicyBatch:
    """Pack ``samples`` into a ``PolicyBatch``, one row per unit of ``units`` (default: ``pack_by_prompt``).

    ``advantages``: one scalar per sample (zeros when None). Samples of one unit must share their prompt ids.
    ``dense_mask``: build the (R, 1, L, L) mask; without it (FlexAttention) only ``segment_ids`` describe the rows,
    which saves an L x L tensor per row (64 MB at 8,192 tokens) and its construction on the host.
    """
    if not samples:
        raise ValueError("build_batch needs at least one sample")
    if advantages is not None and len(advantages) != len(samples):
        raise ValueError(f"{len(advantages)} advantages for {len(samples)} samples")
    for index, sample in enumerate(samples):
        if not sample.prompt_ids:
            raise ValueError(f"sample {index} (episode {sample.episode!r}) has an empty prompt")
    units = [list(unit) for unit in (units if units is not None else pack_by_prompt(samples))]
    if sorted(i for unit in units for i in unit) != list(range(len(samples))):
        raise ValueError("units must hold every sample index exactly once")
    for unit in units:
        if any(samples[i].prompt_ids != samples[unit[0]].prompt_ids for i in unit):
            raise ValueError(f"samples {unit} do not share one prompt and cannot be packed together")
        if len({learner_temperature(samples[i]) for i in unit}) > 1:
            raise ValueError(f"samples {unit} were sampled at different temperatures and cannot share a row")

    num_rows, num_samples = len(units), len(samples)
    seq_len = max(packed_length(samples, unit) for unit in units)
    resp_len = max(1, max(len(s.response_ids) for s in samples))

    input_ids = torch.full((num_rows, seq_len), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((num_rows, seq_len), dtype=torch.long)
    segment_ids = torch.full((num_rows, seq_len), -1, dtype=torch.int32)
    # Start from "padding attends to itself"; real tokens overwrite their own rows below.
    attention_mask = torch.eye(seq_len, dtype=torch.bool).repeat(num_rows, 1, 1, 1) if dense_mask else None
    sample_rows = torch.zeros(num_samples, dtype=torch.long)
    logit_columns = torch.zeros((num_samples, resp_len), dtype=torch.long)
    response_ids = torch.zeros((num_samples, resp_len), dtype=torch.long)
    response_mask = torch.zeros((num_samples, resp_len), dtype=torch.float32)
    advantage_rows = torch.zeros((num_samples, resp_len), dtype=torch.float32)
    rollout_log_probs = torch.zeros((num_samples, resp_len), dtype=torch.float32)
    rollout_mask = torch.zeros((num_samples, resp_len), dtype=torch.float32)
    row_temperatures = torch.tensor([learner_temperature(samples[unit[0]]) for unit in units], dtype=torch.float32)
    causal = torch.ones((seq_len, seq_len), dtype=torch.bool).tril() if dense_mask else None

    for row, unit in enumerate(units):
        prompt = samples[unit[0]].prompt_ids
        plen = len(prompt)
        input_ids[row, :plen] = torch.tensor(prompt, dtype=torch.long)
        position_ids[row, :plen] = torch.arange(plen)
        if attention_mask is not None:
            attention_mask[row, 0, :plen, :plen] = causal[:plen, :plen]
        segment_ids[row, :plen] = 0
        start = plen
        for segment, index in enumerate(unit, start=1):
            sample = samples[index]
            response = sample.response_ids
            rlen = len(response)
            end = start + rlen
            sample_rows[index] = row
            if rlen:
                input_ids[row, start:end] = torch.tensor(response, dtype=torch.long)
                position_ids[row, start:end] = torch.arange(plen, plen + rlen)
                if attention_mask is not None:
                    attention_mask[row, 0, start:end, :plen] = True  # the shared prompt
                    attention_mask[row, 0, start:end, start:end] = causal[:rlen, :rlen]  # its own earlier tokens
                segment_ids[row, start:end] = segment
                # Token j is predicted at the column before it: the last prompt column for j = 0.
                logit_columns[index, 0] = plen - 1
                logit_columns[index, 1:rlen] = torch.arange(start, end - 1)
                response_ids[index, :rlen] = torch.tensor(response, dtype=torch.long)
            if sample.response_logprobs:
                if len(sample.response_logprobs) != rlen:
                    raise ValueError(
                        f"sample {index} (episode {sample.episode!r}): {len(sample.response_logprobs)} logprobs "
                        f"for {rlen} response tokens"
                    )
                rollout_log_probs[index, :rlen] = torch.tensor(sample.response_logprobs, dtype=torch.float32)
                if not sample.failed:
                    rollout_mask[index, :rlen] = 1.0
            if rlen and not sample.failed:
                response_mask[index, :rlen] = 1.0
                if advantages is not None:
                    advantage_rows[index, :rlen] = float(advantages[index])
            start = end
        # Padding positions keep counting so position ids stay within the model's range; they are never read.
        next_position = int(position_ids[row, start - 1]) + 1
        position_ids[row, start:] = torch.arange(next_position, next_position + seq_len - start)

    return PolicyBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        segment_ids=segment_ids,
        sample_rows=sample_rows,
        logit_columns=logit_columns,
        response_lengths=torch.tensor([len(s.response_ids) for s in samples], dtype=torch.long),
        response_ids=response_ids,
        response_mask=response_mask,
        advantages=advantage_rows,
        rollout_log_probs=rollout_log_probs,
        rollout_mask=rollout_mask,
        row_temperatures=row_temperatures,
    )


def response_token_values(column_values: torch.Tensor, batch: PolicyBatch, first_column: int) -> torch.Tensor:
    """Pick each sample's per-response-token values out of per-column values of the packed rows.

    column_values: (R, C, ...) where column c holds the value at row column ``first_column + c``.
    Returns (N, T, ...): entry [n, j] = the value at the column predicting sample n's response token j.
    Entries beyond a response are taken from a valid column and must be masked by the caller.
    """
    columns = (batch.logit_columns - first_column).clamp(min=0, max=column_values.shape[1] - 1)
    rows = batch.sample_rows.unsqueeze(1).expand_as(columns)
    return column_values[rows, columns]


def tempered(logits: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
    """logits (R, C, V) divided by each row's sampling temperature (the same tensor when every row has T = 1)."""
    temperatures = batch.row_temperatures.to(logits.device)
    if bool((temperatures == 1.0).all()):
        return logits
    return logits / temperatures[:, None, None]


def response_log_probs(logits: torch.Tensor, batch: PolicyBatch, first_column: int) -> torch.Tensor:
    """Log-probabilities (N, T) of each sample's response tokens; 0.0 beyond a response.

    logits: (R, C, V) for row columns ``first_column ..``. ``log p(y) = logit_y - logsumexp(logits)``, computed
    per column once and then picked per sample, so the shared last-prompt column (which predicts the first token
    of every response in the row) is normalised once, and no (N, T, V) copy of the logits is made. This equals
    verl's ``logprobs_from_logits`` on unpacked rows (tested).
    """
    log_norm = torch.logsumexp(logits, dim=-1)  # (R, C)
    columns = (batch.logit_columns - first_column).clamp(min=0, max=logits.shape[1] - 1)
    rows = batch.sample_rows.unsqueeze(1).expand_as(columns)
    picked = logits[rows, columns, batch.response_ids.to(logits.device)]
    values = picked - log_norm[rows, columns]
    return values.masked_fill(~valid_response_tokens(batch), 0.0)


def valid_response_tokens(batch: PolicyBatch) -> torch.Tensor:
    """(N, T) bool: True on each sample's real response tokens (failed samples included)."""
    width = batch.response_ids.shape[1]
    offsets = torch.arange(width, device=batch.response_ids.device).unsqueeze(0)
    return offsets < batch.response_lengths.to(batch.response_ids.device).unsqueeze(1)


def pad_response_values(values: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """Stack per-sample 1-D tensors (len_i,) into (B, width), right-padded with 0.0."""
    out = torch.zeros((len(values), width), dtype=torch.float32)
    for row, value in enumerate(values):
        out[row, : value.numel()] = value.to(torch.float32)
    return out


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
