"""The paired-seed statistics of benchmarks/learning_claims.py, against distributions counted by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _paired import (  # noqa: E402
    bootstrap_means, decide, paired_bootstrap, paired_differences, percentile_interval,
)


def grouped(distribution):
    """(mean, weight) pairs summed per mean, means rounded so 1/3 + 1/3 + 1/3 and 1.0 meet."""
    out: dict[float, int] = {}
    for mean, weight in distribution:
        out[round(mean, 9)] = out.get(round(mean, 9), 0) + weight
    return out


def test_two_values_give_the_three_resample_means_with_binomial_weights():
    # resamples of [0, 1]: (0,0) mean 0, (0,1) and (1,0) mean 1/2, (1,1) mean 1
    assert grouped(bootstrap_means([0.0, 1.0])) == {0.0: 1, 0.5: 2, 1.0: 1}


def test_three_values_count_every_one_of_the_27_resamples():
    # [0, 0, 3]: the mean is k, where k is how many of the 3 draws hit the 3: C(3,k) 1^k 2^(3-k) resamples each
    assert grouped(bootstrap_means([0.0, 0.0, 3.0])) == {0.0: 8, 1.0: 12, 2.0: 6, 3.0: 1}


def test_eight_seeds_enumerate_all_8_to_the_8_resamples_as_6435_multisets():
    distribution = bootstrap_means([0.25] * 8)
    assert len(distribution) == 6435  # C(15, 8)
    assert sum(weight for _, weight in distribution) == 8 ** 8
    assert percentile_interval(distribution, 0.95) == (0.25, 0.25)


def test_percentile_interval_is_the_inverse_distribution_function_at_both_tails():
    # [0, 0, 3]: F(0) = 8/27, F(1) = 20/27, F(2) = 26/27 (0.963), F(3) = 1
    distribution = bootstrap_means([0.0, 0.0, 3.0])
    assert percentile_interval(distribution, 0.95) == (0.0, 3.0)  # 0.975 > 26/27: the top needs the 3
    assert percentile_interval(distribution, 0.80) == (0.0, 2.0)  # 0.9 <= 26/27
    # [0, 1]: F(0) = 1/4 reaches the 0.25 tail exactly, so the low end is 0 and the high end (0.75) is 1/2
    assert percentile_interval(bootstrap_means([0.0, 1.0]), 0.5) == (0.0, 0.5)
    # [1, 2, 3]: the smallest resample mean (1, weight 1 of 27) already covers the 2.5% tail
    assert percentile_interval(bootstrap_means([1.0, 2.0, 3.0]), 0.95) == (1.0, 3.0)
    with pytest.raises(ValueError, match="level"):
        percentile_interval(bootstrap_means([0.0, 1.0]), 95)


def test_beyond_the_exact_size_a_seeded_sample_approximates_the_same_distribution():
    values = [0.0] * 10 + [1.1]  # 11 values: the mean is 0.1 k, k ~ Binomial(11, 1/11)
    drawn = bootstrap_means(values, resamples=50_000, seed=3)
    assert drawn == bootstrap_means(values, resamples=50_000, seed=3)
    assert sum(weight for _, weight in drawn) == 50_000
    share_zero = grouped(drawn)[0.0] / 50_000
    assert share_zero == pytest.approx((10 / 11) ** 11, abs=0.01)  # 0.3505


def test_paired_bootstrap_pairs_seeds_and_reports_the_interval_of_the_mean_difference():
    at = {0: 0.5, 1: 0.5, 2: 0.8}
    base = {0: 0.5, 1: 0.5, 2: 0.2, 3: 1.0}  # seed 3 has no partner and is left out
    assert paired_differences(at, base) == pytest.approx({0: 0.0, 1: 0.0, 2: 0.6})
    result = paired_bootstrap(at, base, level=0.95)
    # differences [0, 0, 0.6]: as [0, 0, 3] scaled by 0.2, so resample means 0, 0.2, 0.4, 0.6 with weights 8, 12, 6, 1
    assert result["pairs"] == 3 and result["mean"] == pytest.approx(0.2)
    assert (result["low"], result["high"]) == (0.0, pytest.approx(0.6))
    assert paired_bootstrap(at, base, level=0.8)["high"] == pytest.approx(0.4)
    assert (result["above"], result["equal"], result["below"]) == (1, 2, 0)
    with pytest.raises(ValueError, match="no seed"):
        paired_bootstrap({0: 1.0}, {1: 1.0})


def test_decision_rule_needs_the_whole_interval_on_one_side_of_zero_and_every_pre_registered_seed():
    above = paired_bootstrap({0: 2.0, 1: 3.0, 2: 4.0}, {0: 1.0, 1: 1.0, 2: 1.0})  # differences 1, 2, 3: [1, 3]
    assert decide(above, 3, "at_grpo", "trajectory") == "at_grpo better"
    below = paired_bootstrap({0: 1.0, 1: 1.0, 2: 1.0}, {0: 2.0, 1: 3.0, 2: 4.0})
    assert decide(below, 3, "at_grpo", "trajectory") == "trajectory better"
    straddles = paired_bootstrap({0: 0.5, 1: 0.5, 2: 0.8}, {0: 0.5, 1: 0.5, 2: 0.2})  # [0, 0.6]: 0 is inside
    assert decide(straddles, 3, "at_grpo", "trajectory") == "not separated"
    assert decide(above, 8, "at_grpo", "trajectory") == "no decision: 3 of 8 paired seeds"
