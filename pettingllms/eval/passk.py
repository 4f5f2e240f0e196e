"""The unbiased pass@k estimator (Chen et al., 2021, "Evaluating Large Language Models Trained on Code").

With n samples of a problem of which c are correct, the probability that at least one of k samples drawn
without replacement from the n is correct is

    pass@k = 1 - C(n - c, k) / C(n, k)

computed as the product 1 - prod_{i = n-c+1}^{n} (1 - k / i), which never forms the huge binomials.
A benchmark's pass@k is the mean over its problems. Pure functions, standard library only.
"""

from __future__ import annotations

import math
from typing import Iterable


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from n samples with c correct. Requires 0 <= c <= n and 1 <= k <= n."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"pass@k needs integer n, c, k; got {name}={value!r}")
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample per problem, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"the number of correct samples must be in [0, n={n}], got c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n, the samples per problem (n={n}); raise eval.n or lower k")
    if n - c < k:
        return 1.0  # every size-k subset contains a correct sample
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems, given (n, c) per problem. Raises on an empty benchmark."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise ValueError("pass@k of an empty benchmark is undefined")
    return math.fsum(values) / len(values)
