import torch

from pettingllms.learner.batching import (
    build_batch,
    gather_response_values,
    micro_batches_by_tokens,
    pad_response_values,
    split_mini_batches,
)


def test_build_batch_right_pads_and_masks_only_response_tokens(make_sample):
    a = make_sample([5, 6, 7], [8, 9], index=0)
    b = make_sample([1, 2], [3, 4, 10, 11], index=1)
    failed = make_sample([4, 4, 4, 4], [12], failed=True, index=2)
    batch = build_batch([a, b, failed], [0.5, -2.0, 7.0], pad_token_id=0)

    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 0], [1, 2, 3, 4, 10, 11], [4, 4, 4, 4, 12, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]
    assert batch.position_ids.tolist()[0] == [0, 1, 2, 3, 4, 5]
    assert batch.prompt_lengths.tolist() == [3, 2, 4]
    assert batch.response_lengths.tolist() == [2, 4, 1]
    # (B, T): column j is response token j, exact ids; padding is 0 and masked.
    assert batch.response_ids.tolist() == [[8, 9, 0, 0], [3, 4, 10, 11], [12, 0, 0, 0]]
    assert batch.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert batch.advantages.tolist() == [[0.5, 0.5, 0, 0], [-2.0] * 4, [0, 0, 0, 0]]
    assert batch.rollout_log_probs.tolist() == [[-1, -1, 0, 0], [-1] * 4, [-1, 0, 0, 0]]


def test_gather_response_values_picks_each_rows_response_positions(make_sample):
    batch = build_batch([make_sample([1, 2, 3], [4, 5]), make_sample([1], [2, 3, 4])])
    first_label = 1  # min prompt length: the earliest response position
    # token_values[:, k] belongs to sequence position first_label + k; encode the position in the value.
    positions = torch.arange(first_label, batch.input_ids.shape[1]).float()
    token_values = positions.unsqueeze(0).repeat(2, 1) + torch.tensor([[0.0], [100.0]])
    got = gather_response_values(token_values, batch, first_label)
    assert got.tolist() == [[3.0, 4.0, 0.0], [101.0, 102.0, 103.0]]


def test_micro_batches_respect_the_padded_token_budget_and_are_deterministic():
    lengths = [5, 40, 7, 7, 12, 3, 40, 9]
    groups = micro_batches_by_tokens(lengths, max_tokens=30)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        padded = len(group) * max(lengths[i] for i in group)
        assert padded <= 30 or len(group) == 1  # an over-long sequence goes alone
    # Longest first, ties by index: similar lengths share a micro-batch.
    assert groups == [[1], [6], [4, 7], [2, 3, 0, 5]]
    assert micro_batches_by_tokens(lengths, 30) == groups
    assert micro_batches_by_tokens(lengths, 10_000) == [[1, 6, 4, 7, 2, 3, 0, 5]]


def test_split_mini_batches():
    assert split_mini_batches([3, 1, 2, 0, 4], 2) == [[3, 1], [2, 0], [4]]
    assert split_mini_batches([3, 1, 2], 0) == [[3, 1, 2]]
    assert split_mini_batches([], 2) == []


def test_pad_response_values():
    out = pad_response_values([torch.tensor([1.0, 2.0]), torch.tensor([3.0])], 3)
    assert out.tolist() == [[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]
