"""Turn ``Sample``s into model inputs, and split work into mini-batches and token-budget micro-batches.

Prefix packing. In tree mode the K branches of a (turn, agent) node share one prompt; across nodes, turns and
episodes an agent's prompts share their first tokens too (its system prompt and the task; in trajectory mode the K
episodes of a problem share everything up to their first different turn). On the quickstart task a prompt is ~14 times
longer than a response. Instead of one row per sample (each prompt repeated whole), the samples of a *packing unit*
share one row laid out as the token trie of their prompts, each response a leaf under its own prompt::

    common prefix | rest of prompt A | response A1 | response A2 | rest of prompt B | response B1 | padding

The trie is written depth first (prompts in sorted order), so every node's descendants are the columns right after
it, and one integer per column says who may see it: column ``c`` is visible to the columns ``c .. visible_until[c]``,
its own later tokens and its whole subtree. A token therefore attends to exactly the tokens before it in its own
sample's sequence (prompt, then its response). Position ids are each token's position in that sequence, so every
response token gets exactly the logits it would get in its own row (tested to float tolerance), gradients through a
shared prefix add up as they would over separate rows, and a forward costs the trie's tokens plus the responses
instead of every prompt whole. A sample whose prompt shares nothing is simply a row of one.

Response-aligned tensors (``response_ids``, ``response_mask``, ``advantages``, log-probabilities) are (N, T), one
row per *sample* with column j = response token j, so they line up with verl's loss functions unchanged.
Token ids are the sample's exact ids; nothing is re-tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from pettingllms.core.types import Sample
from pettingllms.learner.packing import lay_out_row, learner_temperature, pack_by_prefix


@dataclass(frozen=True)
class PolicyBatch:
    """N samples packed into R rows of L tokens; T = longest response (at least 1).

    input_ids, position_ids: (R, L) int64.
    attention_mask: (R, 1, L, L) bool, True where a query position may attend to a key position. Padding
        positions attend to themselves only, so no softmax row is empty (an empty row would give NaN). None when
        the batch is built for FlexAttention (``dense_mask=False``), which reads ``visible_until`` instead.
    visible_until: (R, L) int64, the same mask as one integer per column (``learner/packing.py``): column c is
        visible to the columns c .. visible_until[c]; -1 for padding, which sees itself only. ``tree_mask`` (and
        ``learner/masks.py`` for FlexAttention) builds the mask from it.
    sample_rows: (N,) int64, the packed row holding each sample.
    logit_columns: (N, T) int64, the row column whose logits predict response token j (the last prompt column
        for j = 0, shared by every response of that prompt); 0 beyond the response.
    head_columns: (C,) int64, the sorted row columns whose logits some response token needs: the LM head runs on
        these only (``logits_to_keep``), not on the prompts' other tokens.
    logit_index: (N, T) int64, ``logit_columns`` as positions in ``head_columns`` (0 beyond the response).
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
    visible_until: torch.Tensor
    sample_rows: torch.Tensor
    logit_columns: torch.Tensor
    head_columns: torch.Tensor
    logit_index: torch.Tensor
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

    def to(self, device: torch.device) -> "PolicyBatch":
        return PolicyBatch(**{name: None if getattr(self, name) is None else getattr(self, name).to(device)
                              for name in self.__dataclass_fields__})


def tree_mask(visible_until: torch.Tensor) -> torch.Tensor:
    """(R, 1, L, L) bool attention mask of packed rows: query q sees key kv when kv <= q <= visible_until[kv];
    padding (-1) sees itself only."""
    length = visible_until.shape[-1]
    columns = torch.arange(length, device=visible_until.device)
    queries, keys = columns.view(length, 1), columns.view(1, length)
    seen = (keys <= queries) & (queries <= visible_until.unsqueeze(1))  # (R, L, L)
    return (seen | (keys == queries)).unsqueeze(1)


def build_batch(
    samples: Sequence[Sample],
    advantages: Sequence[float] | None = None,
    pad_token_id: int = 0,
    units: Sequence[Sequence[int]] | None = None,
    dense_mask: bool = True,
) -> PolicyBatch:
    """Pack ``samples`` into a ``PolicyBatch``, one row per unit of ``units`` (default: ``pack_by_prefix``).

    ``advantages``: one scalar per sample (zeros when None). Samples of one unit must share their sampling
    temperature; their prompts may share any prefix, or none.
    ``dense_mask``: build the (R, 1, L, L) mask; without it (FlexAttention) only ``visible_until`` describes the
    rows, which saves an L x L tensor per row (64 MB at 8,192 tokens).
    """
    if not samples:
        raise ValueError("build_batch needs at least one sample")
    if advantages is not None and len(advantages) != len(samples):
        raise ValueError(f"{len(advantages)} advantages for {len(samples)} samples")
    for index, sample in enumerate(samples):
        if not sample.prompt_ids:
            raise ValueError(f"sample {index} (episode {sample.episode!r}) has an empty prompt")
    units = [list(unit) for unit in (units if units is not None else pack_by_prefix(samples))]
    if sorted(i for unit in units for i in unit) != list(range(len(samples))):
        raise ValueError("units must hold every sample index exactly once")
    for unit in units:
        if len({learner_temperature(samples[i]) for i in unit}) > 1:
            raise ValueError(f"samples {unit} were sampled at different temperatures and cannot share a row")

    layouts = [lay_out_row(samples, unit) for unit in units]
    num_rows, num_samples = len(units), len(samples)
    seq_len = max(len(layout.ids) for layout in layouts)
    resp_len = max(1, max(len(s.response_ids) for s in samples))

    input_ids = torch.full((num_rows, seq_len), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((num_rows, seq_len), dtype=torch.long)
    visible_until = torch.full((num_rows, seq_len), -1, dtype=torch.long)
    sample_rows = torch.zeros(num_samples, dtype=torch.long)
    logit_columns = torch.zeros((num_samples, resp_len), dtype=torch.long)
    response_ids = torch.zeros((num_samples, resp_len), dtype=torch.long)
    response_mask = torch.zeros((num_samples, resp_len), dtype=torch.float32)
    advantage_rows = torch.zeros((num_samples, resp_len), dtype=torch.float32)
    rollout_log_probs = torch.zeros((num_samples, resp_len), dtype=torch.float32)
    rollout_mask = torch.zeros((num_samples, resp_len), dtype=torch.float32)
    row_temperatures = torch.tensor([learner_temperature(samples[unit[0]]) for unit in units], dtype=torch.float32)

    for row, (unit, layout) in enumerate(zip(units, layouts)):
        used = len(layout.ids)
        input_ids[row, :used] = torch.tensor(layout.ids, dtype=torch.long)
        position_ids[row, :used] = torch.tensor(layout.positions, dtype=torch.long)
        visible_until[row, :used] = torch.tensor(layout.visible_until, dtype=torch.long)
        # Padding positions keep counting so position ids stay within the model's range; they are never read.
        next_position = layout.positions[-1] + 1
        position_ids[row, used:] = torch.arange(next_position, next_position + seq_len - used)
        for index, start, last_prompt in zip(unit, layout.response_starts, layout.last_prompt_columns):
            sample = samples[index]
            response = sample.response_ids
            rlen = len(response)
            sample_rows[index] = row
            if rlen:
                # Token j is predicted at the column before it: the prompt's last column for j = 0.
                logit_columns[index, 0] = last_prompt
                logit_columns[index, 1:rlen] = torch.arange(start, start + rlen - 1)
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

    response_lengths = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.long)
    needed = logit_columns[torch.arange(resp_len).unsqueeze(0) < response_lengths.unsqueeze(1)]
    head_columns = torch.unique(needed) if needed.numel() else torch.tensor([seq_len - 1])  # sorted
    logit_index = torch.searchsorted(head_columns, logit_columns).clamp(max=head_columns.numel() - 1)
    return PolicyBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=tree_mask(visible_until) if dense_mask else None,
        visible_until=visible_until,
        sample_rows=sample_rows,
        logit_columns=logit_columns,
        head_columns=head_columns,
        logit_index=logit_index,
        response_lengths=response_lengths,
        response_ids=response_ids,
        response_mask=response_mask,
        advantages=advantage_rows,
        rollout_log_probs=rollout_log_probs,
        rollout_mask=rollout_mask,
        row_temperatures=row_temperatures,
    )


def response_token_values(column_values: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
    """Pick each sample's per-response-token values out of per-column values of the packed rows.

    column_values: (R, C, ...) where c holds the value at row column ``batch.head_columns[c]``.
    Returns (N, T, ...): entry [n, j] = the value at the column predicting sample n's response token j.
    Entries beyond a response are taken from a valid column and must be masked by the caller.
    """
    columns = batch.logit_index.to(column_values.device)
    rows = batch.sample_rows.to(column_values.device).unsqueeze(1).expand_as(columns)
    return column_values[rows, columns]


def tempered(logits: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
    """logits (R, C, V) divided by each row's sampling temperature (the same tensor when every row has T = 1)."""
    temperatures = batch.row_temperatures.to(logits.device)
    if bool((temperatures == 1.0).all()):
        return logits
    return logits / temperatures[:, None, None]


def response_log_probs(logits: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
    """Log-probabilities (N, T) of each sample's response tokens; 0.0 beyond a response.

    logits: (R, C, V) for row columns ``batch.head_columns``. ``log p(y) = logit_y - logsumexp(logits)``, computed
    per column once and then picked per sample, so a shared last-prompt column (which predicts the first token
    of every response to that prompt) is normalised once, and no (N, T, V) copy of the logits is made. This equals
    verl's ``logprobs_from_logits`` on unpacked rows (tested).
    """
    log_norm = torch.logsumexp(logits, dim=-1)  # (R, C)
    columns = batch.logit_index.to(logits.device)
    rows = batch.sample_rows.to(logits.device).unsqueeze(1).expand_as(columns)
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
