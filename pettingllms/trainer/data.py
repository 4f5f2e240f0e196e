"""Where problems come from, and a resumable cursor over them.

Training problems come from ``data/<domain>/train/<env.dataset>.parquet`` or, for envs that generate their
tasks, from ``env.procedural_problems("train", n)``. Validation benchmarks come from
``data/<domain>/test/<name>.parquet`` or the env's "test" split. A missing file is an error that names the
loader command that makes it; nothing falls back to a default puzzle.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pettingllms.core import DataError, Env, Problem

PROCEDURAL_TRAIN_SIZE = 100_000  # generated problems per epoch when an env makes its own tasks
PROCEDURAL_TEST_SIZE = 50


def dataset_path(data_root: str | Path, domain: str, split: str, name: str) -> Path:
    return Path(data_root) / domain / split / f"{name}.parquet"


def load_problems(path: Path, domain: str, name: str) -> list[Problem]:
    """Rows of a parquet file as problems with stable ids ``<name>/<row>`` (or the row's ``id`` column)."""
    if not path.is_file():
        raise DataError(
            f"dataset file {path} does not exist. Make it with: "
            f"python scripts/dataprocess/load_{domain}.py (see docs/datasets.md)"
        )
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    if not rows:
        raise DataError(f"dataset file {path} is empty")
    return [Problem(str(row.get("id", f"{name}/{i}")), row) for i, row in enumerate(rows)]


def training_problems(env: Env, data_root: str, dataset: str | None) -> list[Problem]:
    if dataset is None:
        return list(env.procedural_problems("train", PROCEDURAL_TRAIN_SIZE))
    domain = getattr(env, "domain", "misc")
    return load_problems(dataset_path(data_root, domain, "train", dataset), domain, dataset)


def benchmark_problems(env: Env, data_root: str, benchmark: str, limit: int = 0) -> list[Problem]:
    """The first ``limit`` problems (0 = all) of a benchmark; "procedural" uses the env's own test split."""
    if benchmark in ("", "procedural"):
        return list(env.procedural_problems("test", limit or PROCEDURAL_TEST_SIZE))
    domain = getattr(env, "domain", "misc")
    problems = load_problems(dataset_path(data_root, domain, "test", benchmark), domain, benchmark)
    return problems[:limit] if limit > 0 else problems


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
