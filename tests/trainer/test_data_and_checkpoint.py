from __future__ import annotations

import os

import pytest

from pettingllms.core import DataError, Problem
from pettingllms.runtime import checkpoints as ckpt
from pettingllms.data.problems import load_problems
from pettingllms.trainer.cursor import DataCursor


def problems(n):
    return [Problem(f"p{i}") for i in range(n)]


def test_cursor_walks_shuffled_epochs_and_resumes_identically():
    cursor = DataCursor(problems(10), epoch_size=0, seed=3)
    first = [p.problem_id for p, _ in cursor.next_batch(10)]
    assert sorted(first) == [f"p{i}" for i in range(10)]  # an epoch covers every problem once
    second = [p.problem_id for p, _ in cursor.next_batch(10)]
    assert sorted(second) == sorted(first) and second != first  # reshuffled
    saved = cursor.state_dict()
    ahead = cursor.next_batch(7)
    clone = DataCursor(problems(10), epoch_size=0, seed=3)
    clone.load_state_dict(saved)
    assert clone.next_batch(7) == ahead


def test_epoch_size_limits_each_epoch_and_seeds_never_repeat():
    cursor = DataCursor(problems(100), epoch_size=5, seed=0)
    draws = cursor.next_batch(12)
    assert cursor.epoch == 2 and cursor.position == 2
    seeds = [s for _, s in draws]
    assert len(set(seeds)) == len(seeds)


def test_empty_dataset_is_an_error():
    with pytest.raises(DataError, match="empty"):
        DataCursor([], epoch_size=0, seed=0)


def test_missing_dataset_file_names_the_loader(tmp_path):
    with pytest.raises(DataError, match=r"load_math.py"):
        load_problems(tmp_path / "math" / "train" / "nope.parquet", "math", "nope")


def test_checkpoint_is_atomic_and_latest_moves_last(tmp_path):
    root = tmp_path / "checkpoints"
    ckpt.save_checkpoint(root, 1, {"step": 1}, lambda d: (d / "w").write_text("one"))
    assert ckpt.latest_checkpoint(root).name == "step_000001"

    def crash(directory):
        (directory / "w").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        ckpt.save_checkpoint(root, 2, {"step": 2}, crash)
    assert ckpt.latest_checkpoint(root).name == "step_000001"  # the pointer still names the good one
    assert sorted(os.listdir(root)) == ["latest", "step_000001"]  # no temp dir left behind
    ckpt.save_checkpoint(root, 2, {"step": 2}, lambda d: (d / "w").write_text("two"))
    latest = ckpt.latest_checkpoint(root)
    assert latest.name == "step_000002" and (latest / "w").read_text() == "two"
    assert ckpt.read_trainer_state(latest) == {"step": 2}
