"""Game loaders write data/<domain>/{train,test}/<name>.parquet that the trainer and the envs read back."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pettingllms.envs.plan_path.env import PlanPathEnv
from pettingllms.envs.sokoban.env import SokobanEnv
from pettingllms.envs.sudoku.env import SudokuEnv
from pettingllms.core import DataError, Problem
from pettingllms.data.games import build_splits
from pettingllms.data.problems import benchmark_problems, training_problems

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "dataprocess" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = [
    ("load_sokoban", SokobanEnv(size=6, boxes=1), ["--size", "6", "--boxes", "1"], "sokoban_6x6_b1"),
    ("load_sudoku", SudokuEnv(size=4), ["--size", "4"], "sudoku_4x4"),
    ("load_sudoku", SudokuEnv(size=9, holes=40), ["--size", "9", "--holes", "40"], "sudoku_9x9"),
    ("load_plan_path", PlanPathEnv(), [], "plan_path_10x10"),
]


@pytest.mark.parametrize("script,env,args,name", CASES)
def test_loader_writes_disjoint_splits_the_trainer_reads(tmp_path, script, env, args, name):
    paths = load_script(script).main(["--data-root", str(tmp_path), "--train-size", "30", "--test-size", "8", *args])
    assert paths["train"] == tmp_path / env.domain / "train" / f"{name}.parquet"
    train_rows = pq.read_table(paths["train"]).to_pylist()
    test_rows = pq.read_table(paths["test"]).to_pylist()
    assert len(test_rows) == 8 and 0 < len(train_rows) <= 30
    assert not {r["seed"] for r in train_rows} & {r["seed"] for r in test_rows}
    assert not {env.game.content_key(r) for r in train_rows} & {env.game.content_key(r) for r in test_rows}
    # The trainer's own reader turns rows into problems; the env plays them from the row content.
    train = training_problems(env, str(tmp_path), name)
    test = benchmark_problems(env, str(tmp_path), name)
    assert [p.problem_id for p in train] == [r["id"] for r in train_rows]
    for problem in (train[0], test[-1]):
        state = env.reset(problem, 0)
        generated = env.reset(Problem("seed-only", {"seed": problem.data["seed"]}), 0)
        assert state.board == generated.board  # the row is exactly what its seed generates
        assert not env.success(state)


def test_a_missing_dataset_is_an_error_naming_the_loader(tmp_path):
    with pytest.raises(DataError, match="load_sudoku.py"):
        training_problems(SudokuEnv(), str(tmp_path), "sudoku_4x4")


def test_training_puzzles_equal_to_test_puzzles_are_dropped(monkeypatch):
    env = PlanPathEnv()
    # Make every puzzle collide by seed parity: every training row whose key a test row shares must go.
    monkeypatch.setattr(type(env.game), "content_key", lambda self, data: str(data["seed"] % 2))
    train, test = build_splits(env, train_size=20, test_size=1)  # test seed 1e9 is even
    assert train and all(row["seed"] % 2 == 1 for row in train)


def test_a_9x9_dataset_is_played_at_its_own_size_by_a_default_env(tmp_path):
    load_script("load_sudoku").main(["--data-root", str(tmp_path), "--train-size", "2", "--test-size", "1",
                                     "--size", "9", "--holes", "30"])
    env = SudokuEnv()  # size=4 by default; the rows decide
    problem = training_problems(env, str(tmp_path), "sudoku_9x9")[0]
    solution = problem.data["solution"]
    t = env.step(env.reset(problem, 0), "plan_agent", str([list(row) for row in solution]))
    assert t.terminated and env.success(t.state)
