"""Data parallelism over a policy's FSDP ranks: which samples each rank trains on, and sums over the ranks.

Every rank receives the whole batch and derives its share itself, so shares need no communication and the loss can
be normalised by the GLOBAL token count (``GlobalBatchInfo``) exactly as in a single process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from pettingllms.core.types import Sample
from pettingllms.learner.batching import split_mini_batches
from pettingllms.learner.packing import trie_order


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the data-parallel ranks of one policy (rank 0 of 1: a single process)."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"data-parallel rank {self.rank} of world size {self.world_size} is not a valid rank")

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def shares(self, samples: Sequence[Sample], indices: Sequence[int], mini_batch_size: int) -> list[list[int]]:
        """Every rank's share of ``indices``; see ``rank_shares``."""
        return rank_shares(samples, indices, mini_batch_size, self.world_size)

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum of ``values`` over the ranks (a collective). float64, so sums are exact enough."""
        if not self.is_distributed:
            return [float(v) for v in values]
        import torch.distributed as dist

        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return tensor.cpu().tolist()


SINGLE_PROCESS = DataParallel()


def rank_shares(
    samples: Sequence[Sample], indices: Sequence[int], mini_batch_size: int, world_size: int
) -> list[list[int]]:
    """Split ``indices`` (into ``samples``) between ``world_size`` ranks; returns one list per rank.

    Each mini-batch (``split_mini_batches(indices, mini_batch_size)``) is dealt out on its own, so a rank's share
    of a mini-batch is the same whether it is computed from that mini-batch or from the whole stream: the pass
    that computes old log-probs over the stream and the training passes over its mini-batches agree on who owns
    which sample. Within a mini-batch, samples are put in trie order (sorted prompt ids: the K branches of a tree
    node next to each other, and next to the prompts that share a prefix with theirs) and the list is cut into
    ``world_size`` contiguous pieces of near-equal length, so samples that share a prefix mostly land on one rank,
    where the learner can pack them into one row (``learner/packing.py``).
    A rank may get nothing from a small mini-batch (fewer samples than ranks).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for chunk in split_mini_batches(indices, mini_batch_size):
        ordered = trie_order(samples, chunk)
        for rank in range(world_size):
            start, stop = rank * len(ordered) // world_size, (rank + 1) * len(ordered) // world_size
            shares[rank].extend(ordered[start:stop])
    return shares


def padded_plan(plans: Sequence[Sequence[Any]], rank: int, padding: Any) -> list[Any]:
    """``plans[rank]`` followed by ``padding`` items up to the longest plan's length.

    FSDP ranks all-gather weights in every forward, so every rank must run as many forwards (and backwards) as
    the others; a rank with less work runs padding passes that contribute nothing.
    """
    longest = max((len(plan) for plan in plans), default=0)
    mine = list(plans[rank])
    return mine + [padding] * (longest - len(mine))
