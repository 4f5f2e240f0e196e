"""Which samples share a forward row, and where each token sits in it: the token trie of their prompts.

Pure functions over token ids; ``learner/batching.py`` turns a row's layout into tensors.

A packing unit is a list of sample indices forwarded as one row. Its row is the trie of the unit's prompts written
depth first: prompts in sorted order, each adding only what it does not share with the prompt before it, each
followed by its own response (a leaf). Sorted order is what makes the layout depth first: the prompts that extend a
given prefix are neighbours, so a trie node's descendants are exactly the columns that follow it up to some column,
and a row's length is the sum over prompts of what each adds beyond its predecessor, plus the responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pettingllms.core.types import Sample


def learner_temperature(sample: Sample) -> float:
    """The temperature the learner scales a sample's logits by: its sampling temperature, or 1 for greedy ones."""
    return float(sample.temperature) if sample.temperature > 0 else 1.0


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    shared = 0
    for x, y in zip(a, b):
        if x != y:
            break
        shared += 1
    return shared


def trie_order(samples: Sequence[Sample], unit: Sequence[int]) -> list[int]:
    """``unit``'s indices in the row's depth-first order: by prompt ids, ties in their given order."""
    return sorted(unit, key=lambda index: tuple(samples[index].prompt_ids))


def packed_length(samples: Sequence[Sample], unit: Sequence[int]) -> int:
    """Tokens in the packed row of ``unit``: each prompt's tokens beyond its trie predecessor's, plus every response."""
    length, previous = 0, ()
    for index in trie_order(samples, unit):
        prompt = samples[index].prompt_ids
        length += len(prompt) - common_prefix_length(previous, prompt) + len(samples[index].response_ids)
        previous = prompt
    return length


def pack_by_prefix(samples: Sequence[Sample], max_tokens: int | None = None) -> list[list[int]]:
    """Indices of ``samples`` grouped into packing units whose rows share their prompts' common prefixes.

    Samples are taken in trie order (sorted prompt ids) within each sampling temperature (a row shares one). A
    sample joins the unit of the sample before it when it shares at least half of its prompt with that sample's
    prompt and the packed row still fits ``max_tokens``: the K branches of a tree node, the turns and episodes of
    one problem, the problems behind one long system prompt. Prompts that share less (a chat template's first
    tokens) start a unit of their own: a longer row costs attention quadratic in its length with dense masks, and
    would save little. A single sample longer than the cap still gets a unit of its own. Each unit lists its indices
    in ascending order, and units come in the order of their first index.
    """
    by_temperature: dict[float, list[int]] = {}
    for index, sample in enumerate(samples):
        by_temperature.setdefault(learner_temperature(sample), []).append(index)
    units: list[list[int]] = []
    for indices in by_temperature.values():
        unit: list[int] = []
        length, previous = 0, ()
        for index in trie_order(samples, indices):
            prompt, response = samples[index].prompt_ids, samples[index].response_ids
            shared = common_prefix_length(previous, prompt)
            extra = len(prompt) - shared + len(response)
            if unit and (2 * shared < len(prompt) or (max_tokens is not None and length + extra > max_tokens)):
                units.append(sorted(unit))
                unit, length, extra = [], 0, len(prompt) + len(response)
            unit.append(index)
            length += extra
            previous = prompt
        units.append(sorted(unit))
    return sorted(units, key=min)


@dataclass(frozen=True)
class RowLayout:
    """One packed row, column by column, and where each sample's tokens are in it.

    ids, positions: the row's token ids and their positions in their own sample's sequence (prompt, then response).
    visible_until: column c may be attended to by the columns c .. visible_until[c] (its own later tokens and its
        trie subtree); each token thereby attends to exactly the earlier tokens of its own sample's sequence.
    response_starts: per sample of the unit (in the unit's order), the column of its first response token.
    last_prompt_columns: per sample, the column of its prompt's last token (it predicts response token 0).
    """

    ids: list[int]
    positions: list[int]
    visible_until: list[int]
    response_starts: list[int]
    last_prompt_columns: list[int]


def lay_out_row(samples: Sequence[Sample], unit: Sequence[int]) -> RowLayout:
    """The depth-first trie row of ``unit``'s prompts, each followed by its response."""
    ids: list[int] = []
    positions: list[int] = []
    visible_until: list[int] = []
    starts: dict[int, int] = {}
    last_prompt: dict[int, int] = {}
    path: list[int] = []  # the columns of the current prompt's tokens
    previous: Sequence[int] = ()
    for index in trie_order(samples, unit):
        prompt, response = samples[index].prompt_ids, samples[index].response_ids
        shared = common_prefix_length(previous, prompt)
        del path[shared:]
        for position in range(shared, len(prompt)):
            path.append(len(ids))
            ids.append(prompt[position])
            positions.append(position)
            visible_until.append(-1)  # set below, once the prompt's subtree so far is written
        last_prompt[index] = path[-1]
        starts[index] = len(ids)
        ids.extend(response)
        positions.extend(range(len(prompt), len(prompt) + len(response)))
        end = len(ids) - 1
        visible_until.extend([end] * len(response))
        for column in path:  # the prompt's tokens are seen by everything written under them so far
            visible_until[column] = end
        previous = prompt
    return RowLayout(ids, positions, visible_until, [starts[i] for i in unit], [last_prompt[i] for i in unit])
