"""Group advantages: hand-computed values, verl equivalence, and isolation of invalid rows."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from pettingllms.algo.advantage import group_stats, grpo_advantages
from pettingllms.algo.filters import keep_groups
from pettingllms.algo.grouping import group_index
from pettingllms.algo.grpo import AdvantageConfig, score_samples
from pettingllms.core import Sample


def t(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def test_hand_computed_values():
    rewards = t([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0, 3.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2, 3, 3])
    valid = torch.ones(9, dtype=torch.bool)
    adv = grpo_advantages(rewards, groups, valid, eps=0.0)
    # group 0: mean 0.5, unbiased std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866025
    expected0 = 0.5 / math.sqrt(1 / 3)
    assert adv[:4].tolist() == pytest.approx([expected0, -expected0, -expected0, expected0])
    assert adv[4:6].tolist() == [0.0, 0.0]  # zero variance
    assert adv[6].item() == 0.0  # singleton: no baseline
    # group 3: mean 2, std sqrt(2) -> +-1/sqrt(2)
    assert adv[7:].tolist() == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)])


def test_without_std_scaling_is_reward_minus_mean():
    adv = grpo_advantages(t([1.0, 0.0, 0.0, 3.0]), torch.tensor([0, 0, 1, 1]), torch.ones(4, dtype=torch.bool),
                          norm_by_std=False)
    assert adv.tolist() == pytest.approx([0.5, -0.5, -1.5, 1.5])


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_verl_on_random_inputs(seed, norm_by_std):
    gen = torch.Generator().manual_seed(seed)
    n_groups, k, length = 7, 5, 6
    rewards = torch.randn(n_groups * k, generator=gen, dtype=torch.float32)
    perm = torch.randperm(n_groups * k, generator=gen)
    group_ids = (torch.arange(n_groups * k) // k)[perm]
    mask = (torch.rand(n_groups * k, length, generator=gen) > 0.2).float()
    mask[:, 0] = 1.0
    last = mask.cumsum(-1).argmax(-1)  # reward on the last response token, as verl expects
    token_rewards = torch.zeros(n_groups * k, length)
    token_rewards[torch.arange(n_groups * k), last] = rewards
    ours = grpo_advantages(rewards, group_ids, torch.ones_like(rewards, dtype=torch.bool), norm_by_std, eps=1e-6)
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # verl's own, called as verl defines it

    theirs, _ = compute_grpo_outcome_advantage(token_level_rewards=token_rewards, response_mask=mask,
                                               index=group_ids.numpy(), epsilon=1e-6,
                                               norm_adv_by_std_in_grpo=norm_by_std)
    torch.testing.assert_close(ours[:, None] * mask, theirs, rtol=1e-5, atol=1e-5)


def test_padding_and_failed_rows_never_change_any_group():
    rewards = t([1.0, 0.0, 3.0, 2.0, 7.0])
    groups = torch.tensor([0, 0, 1, 1, 1])
    valid = torch.ones(5, dtype=torch.bool)
    valid[4] = False  # a failed generation in group 1
    base = grpo_advantages(rewards, groups, valid)
    for pad_reward in (-100.0, 0.0, 1e6):
        padded = grpo_advantages(
            torch.cat([rewards, t([pad_reward, pad_reward])]),
            torch.cat([groups, torch.tensor([0, 1])]),
            torch.cat([valid, torch.zeros(2, dtype=torch.bool)]),
        )
        torch.testing.assert_close(padded[:5], base)
        assert padded[5:].tolist() == [0.0, 0.0]
    assert base[4].item() == 0.0


def test_group_stats_are_unbiased_and_skip_invalid():
    stats = group_stats(t([1.0, 3.0, 100.0]), torch.tensor([0, 0, 0]), torch.tensor([True, True, False]))
    assert stats.count.tolist() == [2.0] and stats.mean.tolist() == [2.0]
    assert stats.std.tolist() == pytest.approx([math.sqrt(2.0)])


def test_group_index_is_dense_and_never_merges_keys():
    keys = [(0, 0, "a"), (0, 0, "b"), (1, 0, "a"), (0, 0, "a"), (1, 0, "a")]
    assert group_index(keys).tolist() == [0, 1, 2, 0, 2]


def test_filters():
    rewards = t([1, 1, 0, 1, 0, 0, 5, 6])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    stats = group_stats(rewards, groups, torch.ones(8, dtype=torch.bool))
    assert keep_groups(stats, "none").tolist() == [True] * 4
    assert keep_groups(stats, "dapo").tolist() == [False, True, False, True]
    assert keep_groups(stats, "mean", 0.5).tolist() == [True, False, False, True]  # means 1, .5, 0, 5.5
    assert keep_groups(stats, "std", 0.5).tolist() == [False, True, False, True]
    with pytest.raises(ValueError, match="unknown group filter"):
        keep_groups(stats, "uid")


def _sample(group, reward, failed=False):
    return Sample("p", "a", group[1], group, "e", "q", 0, (1,), (2,), (-1.0,), reward, failed=failed)


def test_score_samples_masks_failed_singletons_and_filtered_groups():
    samples = [
        _sample((0, 0, "a"), 1.0), _sample((0, 0, "a"), 0.0), _sample((0, 0, "a"), 9.0, failed=True),
        _sample((1, 0, "a"), 1.0), _sample((1, 0, "a"), 1.0),  # zero variance
        _sample((2, 0, "a"), 4.0),  # singleton
    ]
    plain = score_samples(samples, AdvantageConfig())
    assert plain.in_loss == [True, True, False, True, True, False]
    assert plain.advantages[0] > 0 > plain.advantages[1]
    assert plain.advantages[2:] == [0.0, 0.0, 0.0, 0.0]
    dapo = score_samples(samples, AdvantageConfig(filter="dapo"))
    assert dapo.in_loss == [True, True, False, False, False, False]
    assert dapo.metrics["groups_kept"] == 1 and dapo.metrics["samples_failed"] == 1


@pytest.mark.parametrize("method", ["std", "mean"])
def test_a_filters_quota_is_spent_on_groups_with_a_baseline_not_on_singletons(method):
    """Two groups whose other samples failed are singletons (out of the loss anyway, with std 0): ranked with the
    rest they came lowest and used up the std filter's 20% of 10 groups, and the real lowest group stayed in."""
    samples = []
    for g in range(8):  # spreads and means grow with g: group 0 is the lowest by either
        samples += [_sample((g, 0, "a"), float(g)), _sample((g, 0, "a"), 2.0 * g + 1.0)]
    for g in (8, 9):  # a singleton's one valid sample; its three others failed
        samples += [_sample((g, 0, "a"), -5.0)] + [_sample((g, 0, "a"), 0.0, failed=True) for _ in range(3)]
    scored = score_samples(samples, AdvantageConfig(filter=method, filter_ratio=0.2))
    in_loss_groups = {s.group[0] for s, kept in zip(samples, scored.in_loss) if kept}
    assert in_loss_groups == set(range(1, 8))  # floor(0.2 x 8 groups with a baseline) = 1 dropped: group 0
    assert scored.metrics["groups_kept"] == 7 and scored.metrics["samples_in_loss"] == 14


def test_a_non_finite_reward_never_reaches_the_group_statistics_silently():
    # One NaN in a group's mean would zero every member's advantage; the executor stops or drops it first.
    samples = [_sample((0, 0, "a"), 1.0), _sample((0, 0, "a"), 0.0), _sample((0, 0, "a"), math.nan)]
    with pytest.raises(ValueError, match=r"agent 'a' \(problem 'q', turn 0\) has reward nan"):
        score_samples(samples, AdvantageConfig())
    samples[2] = dataclasses.replace(samples[2], nonfinite_reward=True)  # reward.non_finite=drop: out of the group
    dropped = score_samples(samples, AdvantageConfig())
    assert dropped.in_loss == [True, True, False] and dropped.advantages[0] > 0 > dropped.advantages[1]


def test_every_filter_choice_has_its_function_in_the_registry():
    from pettingllms.algo.filters import FILTERS
    from pettingllms.core.choices import GroupFilter

    assert set(FILTERS) == set(GroupFilter.values())
