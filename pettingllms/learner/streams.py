"""Which samples train which weights.

Under LoRA (L2) every adapter is a *stream*: its samples are forwarded with only that adapter active, its loss is
normalised over its own tokens and its gradient is clipped on its own, so an agent's update is the same whether or
not other agents' samples share the batch. Without LoRA (L0, L1, L3) there is one stream, ``None``, holding every
sample. Routing is by the fields every sample carries (policy, agent, adapter); a sample that cannot be routed is an
error that names it, never a silent skip.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from pettingllms.core.types import Sample


class Streams:
    """The streams of one policy's learner.

    adapter_names: one LoRA adapter per agent (L2) or one shared adapter; empty for a full model.
    frozen: agent or adapter names whose samples never train (and, for adapters, whose weights never move).
    policy: when given, every sample must belong to it.
    """

    def __init__(self, adapter_names: Sequence[str], frozen: Iterable[str] = (), policy: str | None = None) -> None:
        self.adapter_names = tuple(adapter_names)
        if len(set(self.adapter_names)) != len(self.adapter_names):
            raise ValueError(f"duplicate adapter names: {self.adapter_names}")
        self.frozen = frozenset(frozen)
        self.policy = policy
        self.names: tuple[str | None, ...] = self.adapter_names if self.adapter_names else (None,)

    @property
    def uses_lora(self) -> bool:
        return bool(self.adapter_names)

    def trainable(self, stream: str | None) -> bool:
        return stream not in self.frozen

    def stream_of(self, index: int, sample: Sample) -> str | None:
        where = f"sample {index} (policy {sample.policy!r}, agent {sample.agent!r}, episode {sample.episode!r})"
        if self.policy is not None and sample.policy != self.policy:
            raise ValueError(f"{where} belongs to another policy; this learner trains {self.policy!r}")
        if not self.uses_lora:
            if sample.adapter is not None:
                raise ValueError(f"{where} names adapter {sample.adapter!r} but this policy has no LoRA adapters")
            return None
        if sample.adapter is None:
            raise ValueError(
                f"{where} has no adapter; under LoRA every sample must name its agent's adapter, "
                f"one of {list(self.adapter_names)}"
            )
        if sample.adapter not in self.adapter_names:
            raise ValueError(f"{where} names unknown adapter {sample.adapter!r}; known: {list(self.adapter_names)}")
        return sample.adapter

    def is_frozen(self, sample: Sample) -> bool:
        return sample.agent in self.frozen or (sample.adapter is not None and sample.adapter in self.frozen)

    def partition(self, samples: Sequence[Sample]) -> tuple[dict[str | None, list[int]], dict[str, int]]:
        """Trainable sample indices per stream (stream order), and counts of what was skipped and why."""
        by_stream: dict[str | None, list[int]] = {stream: [] for stream in self.names}
        skipped = {"num_failed_skipped": 0, "num_frozen_skipped": 0}
        for index, sample in enumerate(samples):
            stream = self.stream_of(index, sample)
            if sample.failed or not sample.response_ids:
                skipped["num_failed_skipped"] += 1
            elif self.is_frozen(sample):
                skipped["num_frozen_skipped"] += 1
            else:
                by_stream[stream].append(index)
        return {s: idx for s, idx in by_stream.items() if idx}, skipped

    def all_streams(self, samples: Sequence[Sample]) -> dict[str | None, list[int]]:
        """Every sample with a response, per stream (frozen ones too): for log-probabilities only."""
        by_stream: dict[str | None, list[int]] = {}
        for index, sample in enumerate(samples):
            stream = self.stream_of(index, sample)
            if sample.response_ids:
                by_stream.setdefault(stream, []).append(index)
        return by_stream
