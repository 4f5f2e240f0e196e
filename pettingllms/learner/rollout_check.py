"""The rollout check: does the engine that sampled a batch sample from the policy the learner trains?

Before the first optimiser step of an update, the learner's raw (temperature 1) log-probs of the sampled tokens are
compared with the engine's (``RolloutAgreement``, tallied by the first pass over the batch), and ``RolloutCheck``
stops the run when they disagree by more than ``algorithm.rollout_check.max_kl``, so a mismatched batch never moves
the weights (docs/training.md, "Precision and the rollout check").
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from pettingllms.core.errors import RolloutMismatchError
from pettingllms.learner.data_parallel import DataParallel


class RolloutAgreement:
    """Per stream (adapter, or None for a full model): sums over response tokens that the engine reported a logprob
    for, of |logprob_engine - logprob_learner| and of the k3 estimate of KL(engine || learner).

    Both logprobs are the raw ones (temperature 1, no top-k/top-p): the quantity both engines report, so equal
    weights give equal values whatever the sampling settings. k3 = exp(d) - 1 - d with d = learner - engine: each
    term is >= 0, and its mean estimates the KL under the engine's samples.
    """

    def __init__(self) -> None:
        self.tokens: dict[Any, float] = defaultdict(float)
        self.abs_diff: dict[Any, float] = defaultdict(float)
        self.k3: dict[Any, float] = defaultdict(float)

    def add(self, stream: str | None, learner: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> None:
        """learner, engine, mask: (N, T); mask 1.0 on tokens with an engine logprob (failed samples excluded)."""
        with torch.no_grad():
            # float64 and expm1: k3 ~ d^2 / 2 is far below float32's resolution of exp(d) - 1 for the small d of
            # matching weights (d ~ 1e-7 would give exactly 0 and hide a 1e-4 drift's 5e-9 among rounding).
            mask = mask.double()
            diff = (learner.double() - engine.double()) * mask
            self.tokens[stream] += float(mask.sum())
            self.abs_diff[stream] += float(diff.abs().sum())
            self.k3[stream] += float(((torch.expm1(diff) - diff) * mask).sum())

    def merge_ranks(self, data_parallel: DataParallel, streams: Sequence[str | None]) -> None:
        """Sums over every data-parallel rank (a collective; every rank must call it with the same streams)."""
        if not data_parallel.is_distributed:
            return
        flat = [v for s in streams for v in (self.tokens[s], self.abs_diff[s], self.k3[s])]
        total = iter(data_parallel.all_reduce_sum(flat))
        for stream in streams:
            self.tokens[stream], self.abs_diff[stream], self.k3[stream] = next(total), next(total), next(total)

    def of(self, stream: str | None) -> tuple[float, float, float] | None:
        """(tokens, mean |diff|, mean k3) of a stream, or None when it had no token with an engine logprob."""
        tokens = self.tokens.get(stream, 0.0)
        if tokens <= 0:
            return None
        return tokens, self.abs_diff[stream] / tokens, self.k3[stream] / tokens

    def metrics(self, streams: Sequence[str | None]) -> dict[str, float]:
        out: dict[str, float] = {}
        seen = [(s, v) for s in streams if (v := self.of(s)) is not None]
        if not seen:
            return out
        tokens = sum(v[0] for _, v in seen)
        out["rollout/logprob_abs_diff"] = sum(v[0] * v[1] for _, v in seen) / tokens
        out["rollout/kl_k3"] = sum(v[0] * v[2] for _, v in seen) / tokens
        out["rollout/tokens"] = tokens
        for stream, (count, diff, k3) in seen:
            if stream is not None:
                out[f"adapter/{stream}/rollout/logprob_abs_diff"] = diff
                out[f"adapter/{stream}/rollout/kl_k3"] = k3
        return out


@dataclass(frozen=True)
class RolloutCheck:
    """One policy's check: the KL limit (``max_kl`` 0 disables it), its ranks, its streams and its name."""

    max_kl: float
    data_parallel: DataParallel
    streams: Sequence[str | None]
    policy: str | None = None

    def __call__(self, agreement: RolloutAgreement) -> None:
        """Merge the agreement over ranks (every rank takes the same decision) and stop on a mismatch."""
        agreement.merge_ranks(self.data_parallel, self.streams)
        limit = self.max_kl
        if limit <= 0:
            return
        for stream in self.streams:
            figures = agreement.of(stream)
            if figures is None or figures[2] <= limit:
                continue
            tokens, abs_diff, k3 = figures
            where = f"policy {self.policy!r}" if self.policy else "this policy"
            if stream is not None:
                where += f", adapter {stream!r}"
            raise RolloutMismatchError(
                f"{where}: the rollout engine's logprobs disagree with the learner's on the same {tokens:.0f} tokens "
                f"(mean |delta logprob| {abs_diff:.4f}, k3 KL {k3:.4f} > algorithm.rollout_check.max_kl={limit:g}), "
                f"so the engine is not sampling from the policy being trained. Likely causes: a weight sync that did "
                f"not reach the engine (see timing/sync_s), an adapter delivered under another agent's name (L2), or "
                f"a precision mismatch between engine and learner (dtype, kernels). The update was not applied. "
                f"Raise the threshold only after ruling these out"
            )
