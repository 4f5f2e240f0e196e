"""What one training iteration measured: sums over micro-batches (and over FSDP ranks) turned into step metrics.
(The rollout-learner agreement has its own unit, ``learner/rollout_check.py``.)"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Mapping, Sequence

from pettingllms.algo.losses import ObjectiveParts
from pettingllms.core.types import Sample
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


def step_metrics(
    samples: Sequence[Sample],
    by_stream: Mapping[str | None, Sequence[int]],
    skipped: Mapping[str, int],
    kl_coefs: Mapping[str | None, float],
    lr: float,
    optimizer_steps: int,
    adapter_names: Sequence[str],
    tally: StepTally,
) -> dict[str, float]:
    """What the step trained on (sequences, tokens, optimizer steps, what was skipped), at which LR and KL
    coefficient; under LoRA also per adapter, with its gradient norm."""
    metrics: dict[str, float] = {
        "lr": lr,
        "num_sequences": float(sum(len(i) for i in by_stream.values())),
        "num_tokens": float(sum(len(samples[i].response_ids) for idx in by_stream.values() for i in idx)),
        "num_optimizer_steps": float(optimizer_steps),
        "kl_coef": (sum(kl_coefs.values()) / len(kl_coefs)) if kl_coefs else 0.0,
        **{key: float(value) for key, value in skipped.items()},
    }
    for name in adapter_names:
        indices = by_stream.get(name, ())
        prefix = f"adapter/{name}/"
        metrics[prefix + "num_sequences"] = float(len(indices))
        metrics[prefix + "num_tokens"] = float(sum(len(samples[i].response_ids) for i in indices))
        metrics[prefix + "grad_norm"] = tally.stream_grad_norm(name)
        if name in kl_coefs:
            metrics[prefix + "kl_coef"] = kl_coefs[name]
    return metrics
