"""Paired comparisons over seeds: two methods run with the same seeds (seed s of both shares data order and
initialisation), their per-seed differences, the bootstrap distribution of the mean difference, its percentile
confidence interval, and the decision rule that reads it.

The bootstrap distribution is exact for up to ``EXACT_UP_TO`` seeds: every one of the n**n resamples is counted,
grouped by the multiset of seeds drawn (n = 8: 6,435 multisets, each with its multinomial count), so the interval has
no Monte Carlo error and no random seed of its own. Beyond that, ``resamples`` draws from a seeded generator.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from fractions import Fraction
from typing import Mapping, Sequence

EXACT_UP_TO = 10  # 10 values: 92,378 multisets (under a second); 12 would be 1.35 million


def paired_differences(a: Mapping[int, float], b: Mapping[int, float]) -> dict[int, float]:
    """``a[s] - b[s]`` for every seed ``s`` both methods have, in seed order (an unpaired seed is left out)."""
    return {seed: a[seed] - b[seed] for seed in sorted(set(a) & set(b))}


def bootstrap_means(values: Sequence[float], resamples: int = 100_000, seed: int = 0) -> list[tuple[float, int]]:
    """The bootstrap distribution of the mean of ``values``: (mean of a resample, weight) pairs, sorted by mean.

    Up to ``EXACT_UP_TO`` values it is exact: one pair per multiset of n draws with replacement, weighted by the
    number of ordered resamples giving it, n! / prod(count!), so the weights sum to n**n. Beyond, ``resamples``
    draws of n values from ``random.Random(seed)``, each of weight 1."""
    n = len(values)
    if n == 0:
        raise ValueError("the bootstrap needs at least one value")
    if n <= EXACT_UP_TO:
        out = []
        for draw in itertools.combinations_with_replacement(range(n), n):
            weight = math.factorial(n)
            for count in Counter(draw).values():
                weight //= math.factorial(count)
            out.append((math.fsum(values[i] for i in draw) / n, weight))
    else:
        rng = random.Random(seed)
        out = [(math.fsum(rng.choices(values, k=n)) / n, 1) for _ in range(resamples)]
    return sorted(out)


def percentile_interval(distribution: Sequence[tuple[float, int]], level: float) -> tuple[float, float]:
    """The central ``level`` interval of a weighted distribution (sorted (value, weight) pairs): its
    (1 - level) / 2 and (1 + level) / 2 quantiles, each the smallest value whose cumulative weight reaches that
    fraction of the total (the inverse of the distribution function; no interpolation)."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    # the level as the decimal it was written as, so 0.95 gives tails of exactly 1/40 and ties at a boundary
    # (a cumulative weight exactly at the tail) fall the same way on every machine
    tail = (1 - Fraction(str(level))) / 2
    total = sum(weight for _, weight in distribution)
    return _quantile(distribution, tail, total), _quantile(distribution, 1 - tail, total)


def _quantile(distribution: Sequence[tuple[float, int]], p: Fraction, total: int) -> float:
    cumulative = 0
    for value, weight in distribution:
        cumulative += weight
        if cumulative * p.denominator >= p.numerator * total:
            return value
    return distribution[-1][0]


def paired_bootstrap(a: Mapping[int, float], b: Mapping[int, float], level: float = 0.95) -> dict:
    """The paired comparison of ``a`` against ``b`` (per-seed values of one metric): the per-seed differences
    ``a - b``, their mean, the bootstrap percentile interval of the mean at ``level``, and how many seeds ``a``
    was above, equal to and below ``b`` on."""
    differences = paired_differences(a, b)
    if not differences:
        raise ValueError("no seed is shared by both methods: nothing to pair")
    values = list(differences.values())
    low, high = percentile_interval(bootstrap_means(values), level)
    return {"per_seed": differences, "pairs": len(values), "mean": math.fsum(values) / len(values),
            "level": level, "low": low, "high": high,
            "above": sum(v > 0 for v in values), "equal": sum(v == 0 for v in values),
            "below": sum(v < 0 for v in values)}


def decide(comparison: Mapping, needed: int, name: str, other: str) -> str:
    """The decision rule: with at least ``needed`` paired seeds, ``name`` is better when the interval of the mean
    difference (``name`` minus ``other``) lies above 0, ``other`` is better when it lies below 0, and otherwise the
    two are not separated; with fewer seeds there is no decision."""
    if comparison["pairs"] < needed:
        return f"no decision: {comparison['pairs']} of {needed} paired seeds"
    if comparison["low"] > 0:
        return f"{name} better"
    if comparison["high"] < 0:
        return f"{other} better"
    return "not separated"
