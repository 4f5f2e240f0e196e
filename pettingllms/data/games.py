"""Writing game datasets: ``data/<domain>/{train,test}/<name>.parquet`` from an env's own generator.

Shared by ``scripts/dataprocess/load_{sokoban,sudoku,plan_path}.py``. Train and test puzzles come from disjoint
seed spaces (train 0.., test 1e9..), and any training puzzle equal in content to a test puzzle is dropped as
well, since small boards (4x4 Sudoku) can repeat across seeds. Files are written atomically (temp, rename).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

from pettingllms.core import Problem
from pettingllms.core.atomic import atomic_file
from pettingllms.data.layout import dataset_path

# Duck-typed: any env with ``domain``, ``procedural_problems``, ``materialize`` and ``game.content_key`` (the
# game envs of pettingllms/envs/games_common/base.py). No import of ``envs`` here: the library does not depend on it.
GameEnv = Any


def problem_rows(env: GameEnv, problems: Sequence[Problem], split: str) -> list[dict[str, Any]]:
    """Plain rows (id, split, seed and the puzzle itself) for parquet."""
    rows = []
    for problem in problems:
        full = env.materialize(problem)
        rows.append({"id": problem.problem_id, "split": split, **dict(full.data)})
    return rows


def write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise ValueError(f"refusing to write an empty dataset to {path}")
    with atomic_file(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
    return path


def build_splits(env: GameEnv, train_size: int, test_size: int) -> tuple[list[dict], list[dict]]:
    """Test rows, then train rows with every puzzle that also appears in the test rows removed."""
    test = problem_rows(env, env.procedural_problems("test", test_size), "test")
    test_keys = {env.game.content_key(row) for row in test}
    train = [row for row in problem_rows(env, env.procedural_problems("train", train_size), "train")
             if env.game.content_key(row) not in test_keys]
    return train, test


def write_game_dataset(
    env: GameEnv, name: str, data_root: str | Path, train_size: int, test_size: int
) -> dict[str, Path]:
    train, test = build_splits(env, train_size, test_size)
    return {
        "train": write_parquet(train, dataset_path(data_root, env.domain, "train", name)),
        "test": write_parquet(test, dataset_path(data_root, env.domain, "test", name)),
    }


def base_parser(description: str, train_size: int, test_size: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data-root", default="data", help="root of the data tree (default: data)")
    parser.add_argument("--name", default=None, help="file name without .parquet (default: derived from the options)")
    parser.add_argument("--train-size", type=int, default=train_size)
    parser.add_argument("--test-size", type=int, default=test_size)
    return parser


def report(paths: dict[str, Path]) -> None:
    import pyarrow.parquet as pq

    for split, path in paths.items():
        print(f"{split}: {pq.read_metadata(path).num_rows} rows -> {path}")
