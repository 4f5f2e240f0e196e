"""The unbiased pass@k estimator against hand-computed values, the binomial definition, and bad input."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest

from pettingllms.eval.passk import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 2 / 5),  # pass@1 is the fraction correct
    (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
    (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
    (5, 2, 4, 1.0),  # n - c = 3 < k: every 4-subset holds a correct sample
    (10, 1, 5, 1 / 2),  # 1 - C(9,5)/C(10,5) = 1 - 126/252
    (4, 1, 2, 1 / 2),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (1, 1, 1, 1.0),
    (1, 0, 1, 0.0),
])
def test_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_no_correct_sample_is_zero_and_all_correct_is_one():
    for n in (1, 3, 16):
        for k in range(1, n + 1):
            assert pass_at_k(n, 0, k) == 0.0
            assert pass_at_k(n, n, k) == 1.0


def test_product_form_equals_the_binomial_definition():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(comb(n - c, k), comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)


def test_stable_where_binomials_are_huge():
    n, c, k = 2000, 3, 1000  # C(2000, 1000) has ~600 digits
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_monotone_in_k_and_c():
    n = 8
    for c in range(n + 1):
        values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
        assert values == sorted(values)
    assert [pass_at_k(n, c, 3) for c in range(n + 1)] == sorted(pass_at_k(n, c, 3) for c in range(n + 1))


@pytest.mark.parametrize("n, c, k, message", [
    (4, 1, 5, "1 <= k <= n"),  # k > n
    (4, 1, 0, "1 <= k <= n"),
    (4, 5, 1, r"\[0, n=4\]"),  # more correct than samples
    (4, -1, 1, r"\[0, n=4\]"),
    (0, 0, 1, "at least one sample"),
    (4.0, 1, 1, "integer"),
    (4, True, 1, "integer"),
])
def test_bad_input_is_a_clear_error(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


def test_mean_over_problems():
    assert mean_pass_at_k([(4, 0), (4, 4), (4, 2)], 1) == pytest.approx((0 + 1 + 0.5) / 3)
    assert mean_pass_at_k([(4, 1), (4, 2)], 2) == pytest.approx((0.5 + (1 - 1 / 6)) / 2)
    with pytest.raises(ValueError, match="empty"):
        mean_pass_at_k([], 1)
