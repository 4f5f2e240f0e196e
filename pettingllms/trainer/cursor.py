"""A resumable cursor over the training problems: shuffled epochs, a seed per draw, two integers of state."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

from pettingllms.core import DataError, Problem


@dataclass
class DataCursor:
    """Walks shuffled epochs of ``epoch_size`` problems. Its state is two integers, saved in checkpoints."""

    problems: Sequence[Problem]
    epoch_size: int
    seed: int
    epoch: int = 0
    position: int = 0

    def __post_init__(self) -> None:
        if not self.problems:
            raise DataError("the training dataset is empty")
        if self.epoch_size is None or self.epoch_size <= 0:
            self.epoch_size = len(self.problems)
        self.epoch_size = min(self.epoch_size, len(self.problems))
        self._order = self._epoch_order(self.epoch)

    def repeats(self, batch_size: int) -> str | None:
        """What a step of ``batch_size`` problems does when the epoch is smaller: it runs into the next epoch, so
        one step holds a problem several times (separate groups, other seeds). None when the batch fits."""
        if batch_size <= self.epoch_size:
            return None
        return (f"training.train_batch_size={batch_size} is more than the {self.epoch_size} problems of an epoch "
                f"(the training data, or training.epoch_size): every step holds some problems more than once, each "
                f"a group of its own; lower training.train_batch_size or add problems")

    def next_batch(self, batch_size: int) -> list[tuple[Problem, int]]:
        """``batch_size`` (problem, seed) pairs; the seed is unique per draw, so resets never repeat."""
        batch = []
        for _ in range(batch_size):
            if self.position >= self.epoch_size:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            index = self._order[self.position]
            draw = self.epoch * self.epoch_size + self.position
            batch.append((self.problems[index], self.seed * 1_000_003 + draw))
            self.position += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._epoch_order(self.epoch)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(f"{self.seed}/epoch/{epoch}").shuffle(order)
        return order[: self.epoch_size]
