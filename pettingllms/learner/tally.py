"""What one training iteration measured: sums over micro-batches (and over FSDP ranks) turned into step metrics, and
the rollout-learner agreement (how far the engine's logprobs are from the learner's on the same tokens)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Mapping, Sequence

import torch

from pettingllms.algo.losses import ObjectiveParts
from pettingllms.learner.data_parallel import DataParallel


_TOKEN_WEIGHTED = ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "kl_token_mean", "entropy_token_mean")


class StepTally:
    """Sums of per-micro-batch values, turned into step metrics at the end."""

    def __init__(self) -> None:
        self.tokens = 0
        self.weighted: dict[str, float] = defaultdict(float)
        self.mini_batch_losses: list[float] = []
        self.kl_loss = 0.0
        self.entropy_loss = 0.0
        self.stream_tokens: dict[Any, int] = defaultdict(int)
        self.stream_kl_sum: dict[Any, float] = defaultdict(float)
        self.grad_norms: dict[Any, list[float]] = defaultdict(list)
        self.step_grad_norms: list[float] = []
        self.nonfinite_streams: list[str | None] = []  # one entry per (optimizer step, stream) with a NaN/inf norm

    def add_micro_batch(self, stream: str | None, parts: ObjectiveParts) -> None:
        n = parts.num_tokens
        self.tokens += n
        for key in _TOKEN_WEIGHTED:
            self.weighted[key] += getattr(parts, key) * n
        self.kl_loss += parts.kl_loss
        self.entropy_loss += parts.entropy_loss
        self.stream_tokens[stream] += n
        self.stream_kl_sum[stream] += parts.kl_token_mean * n

    def add_mini_batch(self, stream: str | None, pg_loss: float) -> None:
        self.mini_batch_losses.append(pg_loss)

    def merge_ranks(self, data_parallel: DataParallel, streams: Sequence[str | None]) -> None:
        """Turn this rank's sums into sums over every data-parallel rank (a collective; no-op in one process).

        Losses come out of verl multiplied by the number of ranks (it undoes FSDP's gradient averaging), so their
        sums are divided by it. Gradient norms are already global (FSDP computes them over every shard).
        """
        if not data_parallel.is_distributed:
            return
        keys = _TOKEN_WEIGHTED  # fixed, not the dict's keys: a rank that ran only padding passes has none
        flat = [float(self.tokens), self.kl_loss, self.entropy_loss, *self.mini_batch_losses]
        flat += [self.weighted[k] for k in keys]
        flat += [float(self.stream_tokens[s]) for s in streams] + [self.stream_kl_sum[s] for s in streams]
        total = iter(data_parallel.all_reduce_sum(flat))
        ranks = data_parallel.world_size
        self.tokens = int(round(next(total)))
        self.kl_loss = next(total) / ranks
        self.entropy_loss = next(total) / ranks
        self.mini_batch_losses = [next(total) / ranks for _ in self.mini_batch_losses]
        for key in keys:
            self.weighted[key] = next(total)
        for stream in streams:
            self.stream_tokens[stream] = int(round(next(total)))
        for stream in streams:
            self.stream_kl_sum[stream] = next(total)

    def add_optimizer_step(self, norms: Mapping[str | None, float]) -> None:
        """Pre-clip gradient norms of the streams in one optimizer step (disjoint parameters)."""
        for stream, norm in norms.items():
            self.grad_norms[stream].append(norm)
            if not math.isfinite(norm):
                self.nonfinite_streams.append(stream)
        self.step_grad_norms.append(math.sqrt(sum(n * n for n in norms.values())))

    def stream_kl(self, stream: str | None) -> float:
        tokens = self.stream_tokens.get(stream, 0)
        return self.stream_kl_sum[stream] / tokens if tokens else 0.0

    def stream_grad_norm(self, stream: str | None) -> float:
        norms = self.grad_norms.get(stream, [])
        return sum(norms) / len(norms) if norms else 0.0

    def summary(self) -> dict[str, float]:
        def mean_over_tokens(key: str) -> float:
            return self.weighted[key] / self.tokens if self.tokens else 0.0

        count = len(self.mini_batch_losses)
        step_norms = self.step_grad_norms
        return {
            "pg_loss": sum(self.mini_batch_losses) / count if count else 0.0,
            "pg_clipfrac": mean_over_tokens("pg_clipfrac"),
            "pg_clipfrac_lower": mean_over_tokens("pg_clipfrac_lower"),
            "ppo_kl": mean_over_tokens("ppo_kl"),
            "kl": mean_over_tokens("kl_token_mean"),
            "kl_loss": self.kl_loss / count if count else 0.0,
            "entropy": mean_over_tokens("entropy_token_mean"),
            "entropy_loss": self.entropy_loss / count if count else 0.0,
            "grad_norm": sum(step_norms) / len(step_norms) if step_norms else 0.0,
            # Optimizer steps (per stream) whose gradient was dropped for being NaN/inf: those weights did not move.
            "nonfinite_grad_steps": float(len(self.nonfinite_streams)),
        }


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
