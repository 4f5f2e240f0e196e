import torch

from pettingllms.learner.packing import pack_by_prefix, packed_length
from pettingllms.learner.batching import (
    build_batch,
    micro_batches_by_tokens,
    pad_response_values,
    response_token_values,
    split_mini_batches,
)


def test_build_batch_packs_shared_prompts_and_masks_only_response_tokens(make_sample):
    a = make_sample([5, 6, 7], [8, 9], index=0, logprobs=[-1.0] * 2)
    b = make_sample([5, 6, 7], [3, 4, 10], index=1, logprobs=[-1.0] * 3)  # same prompt as a: packed into a's row
    failed = make_sample([4, 4], [12], failed=True, index=2, logprobs=[-1.0])
    batch = build_batch([a, b, failed], [0.5, -2.0, 7.0], pad_token_id=0)

    assert batch.num_rows == 2 and batch.num_samples == 3
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 3, 4, 10], [4, 4, 12, 0, 0, 0, 0, 0]]
    # Each response restarts at the prompt length; padding keeps counting.
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6, 7]]
    assert batch.sample_rows.tolist() == [0, 0, 1]
    # Token j of a response is predicted at the column before it; j = 0 at the last prompt column (shared).
    assert batch.logit_columns.tolist() == [[2, 3, 0], [2, 5, 6], [1, 0, 0]]
    mask = batch.attention_mask[0, 0].int().tolist()
    assert mask[4] == [1, 1, 1, 1, 1, 0, 0, 0]  # a's 2nd token: prompt + a's first token
    assert mask[6] == [1, 1, 1, 0, 0, 1, 1, 0]  # b's 2nd token: prompt + b's first token, never a's tokens
    assert batch.attention_mask[1, 0, 5].int().tolist() == [0, 0, 0, 0, 0, 1, 0, 0]  # padding sees itself only
    # (N, T) per sample: exact ids; padding is 0 and masked; a failed sample's tokens never count.
    assert batch.response_ids.tolist() == [[8, 9, 0], [3, 4, 10], [12, 0, 0]]
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 1], [0, 0, 0]]
    assert batch.advantages.tolist() == [[0.5, 0.5, 0], [-2.0] * 3, [0, 0, 0]]
    assert batch.rollout_log_probs.tolist() == [[-1, -1, 0], [-1] * 3, [-1, 0, 0]]
    # The LM head runs on the columns some token needs (here every row shares them), not on the first prompt columns.
    assert batch.head_columns.tolist() == [1, 2, 3, 5, 6]
    assert batch.logit_index.tolist() == [[1, 2, 0], [1, 3, 4], [0, 0, 0]]


def test_response_token_values_picks_each_samples_columns(make_sample):
    batch = build_batch([make_sample([1, 2, 3], [4, 5]), make_sample([1, 2, 3], [6]), make_sample([7], [8, 9, 10])])
    assert batch.head_columns.tolist() == [0, 1, 2, 3]  # 0: the single-token prompt's last column
    # column_values[r, c] encodes (row, column) so the pick can be read back.
    column_values = batch.head_columns.float().unsqueeze(0) + torch.tensor([[0.0], [100.0]])
    got = response_token_values(column_values, batch)
    assert got[0, :2].tolist() == [2.0, 3.0]
    assert got[1, :1].tolist() == [2.0]  # the shared prompt column
    assert got[2].tolist() == [100.0, 101.0, 102.0]


def test_pack_by_prefix_groups_shared_prompts_and_splits_at_the_budget(make_sample):
    p, q = [1, 2, 3, 4], [9, 9]
    samples = [make_sample(p, [5] * 3), make_sample(q, [7]), make_sample(p, [6] * 3), make_sample(p, [8] * 3)]
    assert pack_by_prefix(samples) == [[0, 2, 3], [1]]
    # Budget 10: prompt 4 + 3 + 3 fits, the third response starts a new unit (which repeats the prompt).
    assert pack_by_prefix(samples, max_tokens=10) == [[0, 2], [1], [3]]
    assert pack_by_prefix(samples, max_tokens=1) == [[0], [1], [2], [3]]  # over-long: one sample per unit


def test_pack_by_prefix_joins_prompts_that_share_at_least_half_and_orders_them_as_a_trie(make_sample):
    system = [1, 2, 3, 4]
    samples = [
        make_sample(system + [7, 7], [5]),  # 0: shares 4 of 6 with sample 2 (its trie predecessor)
        make_sample([1, 9, 9, 9], [5]),  # 1: shares 1 of 4 with sample 3: a row of its own
        make_sample(system + [6], [5]),  # 2
        make_sample(system, [5, 5]),  # 3: a prefix of both 2 and 0
        make_sample(system + [6], [8], temperature=0.5),  # 4: another temperature, another row
    ]
    assert pack_by_prefix(samples) == [[0, 2, 3], [1], [4]]
    # Trie order 3, 2, 0: [1, 2, 3, 4] and 2 response tokens, then 1 + 1 beyond it, then 2 + 1 (the prefix once).
    assert packed_length(samples, [0, 2, 3]) == 4 + 2 + 1 + 1 + 2 + 1
    assert pack_by_prefix(samples, max_tokens=8) == [[0], [1], [2, 3], [4]]


def test_a_prompt_trie_row_lets_each_token_see_exactly_its_own_sequence(make_sample):
    """Row of three prompts sharing [1, 2] ([1, 2] itself, [1, 2, 3], [1, 2, 3] again), in trie order."""
    short = make_sample([1, 2], [10, 11], index=0)
    long_a = make_sample([1, 2, 3], [20], index=1)
    long_b = make_sample([1, 2, 3], [30, 31], index=2)
    batch = build_batch([long_a, short, long_b], units=[[0, 1, 2]])
    assert batch.input_ids.tolist() == [[1, 2, 10, 11, 3, 20, 30, 31]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 2, 3, 3, 4]]
    assert batch.visible_until.tolist() == [[7, 7, 3, 3, 7, 5, 7, 7]]
    # Samples in the given order (long_a, short, long_b): token 0 at the prompt's last column.
    assert batch.logit_columns.tolist() == [[4, 0], [1, 2], [4, 6]]
    mask = batch.attention_mask[0, 0].int().tolist()
    assert mask[3] == [1, 1, 1, 1, 0, 0, 0, 0]  # short's 2nd response token: its prompt and first token
    assert mask[4] == [1, 1, 0, 0, 1, 0, 0, 0]  # the 3 of [1, 2, 3]: the shared [1, 2], never short's response
    assert mask[5] == [1, 1, 0, 0, 1, 1, 0, 0]  # long_a's token
    assert mask[7] == [1, 1, 0, 0, 1, 0, 1, 1]  # long_b's 2nd token: its prompt and first token, never long_a's


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
