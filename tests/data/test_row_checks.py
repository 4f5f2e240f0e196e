"""Every row of a dataset is checked against the columns its env declares (Env.problem_fields) before step 1 and in
``--dry-run``: the file, the row and the column are named, and nothing is converted."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pettingllms.cli import main
from pettingllms.core import DataError, Env
from pettingllms.core.registry import get_env_class
from pettingllms.data.problems import benchmark_sets, describe_data, training_problems
from pettingllms.data.row_checks import check_rows, matches
from pettingllms.envs.code.env import CodeEnv
from pettingllms.envs.math.env import MathEnv


def math_rows(n: int) -> list[dict]:
    return [{"id": f"r{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]


def write(path: Path, rows: list[dict] | None = None, table: pa.Table | None = None) -> Path:
    pq.write_table(table if table is not None else pa.Table.from_pylist(rows), path)
    return path


def with_value(n: int, row: int, column: str, value) -> list[dict]:
    rows = math_rows(n)
    rows[row][column] = value
    return rows


def bad_datasets(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, what the error must say)."""
    missing = math_rows(4)
    for row in missing:
        row.pop("answer")
    empty = pa.table({c: pa.array([], pa.string()) for c in ("id", "question", "answer")})
    (tmp / "empty.parquet").write_bytes(b"")
    (tmp / "garbage.parquet").write_bytes(b"these bytes are no parquet table\n" * 8)
    (tmp / "garbage.jsonl").write_text("{not json\n")
    return {
        "missing column": (write(tmp / "missing.parquet", missing), r"missing\.parquet: rows lack column\(s\) \['answer'\]"),
        "wrong type": (write(tmp / "ints.parquet", [{"question": "1+1?", "answer": 2}]),
                       r"ints\.parquet: row 0, column 'answer' holds int 2, but math envs read str"),
        "null at row 3": (write(tmp / "null3.parquet", with_value(5, 3, "answer", None)),
                          r"null3\.parquet: row 3, column 'answer' is null"),
        "null at row 100": (write(tmp / "null100.parquet", with_value(150, 100, "answer", None)),
                            r"null100\.parquet: row 100, column 'answer' is null"),
        "zero rows": (write(tmp / "zero.parquet", table=empty), r"zero\.parquet has zero rows"),
        "0-byte file": (tmp / "empty.parquet", r"empty\.parquet is empty \(0 bytes\)"),
        "garbage parquet": (tmp / "garbage.parquet", r"cannot read parquet file .*garbage\.parquet"),
        "garbage jsonl": (tmp / "garbage.jsonl", r"cannot read local data file .*garbage\.jsonl as json"),
    }


MATH_RUN = ["--config-name", "math", "base_models.policy_0.path=tiny-random-smollm2", "resources.use_ray=false",
            "resources.gpus_per_policy=0"]
CASES = ["missing column", "wrong type", "null at row 3", "null at row 100", "zero rows", "0-byte file",
         "garbage parquet", "garbage jsonl"]


@pytest.mark.parametrize("case", CASES)
def test_the_trainers_loader_and_the_dry_runs_description_refuse_bad_data(case, tmp_path):
    path, needle = bad_datasets(tmp_path)[case]
    with pytest.raises(DataError, match=needle):
        training_problems(MathEnv(), tmp_path, str(path))
    with pytest.raises(DataError, match=needle):
        benchmark_sets(MathEnv(), tmp_path, [str(path)])
    with pytest.raises(DataError, match=needle):
        describe_data(MathEnv(), tmp_path, str(path), [])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_the_command_refuses_bad_data_before_anything_starts(case, dry_run, tmp_path, capsys):
    path, needle = bad_datasets(tmp_path)[case]
    logs = tmp_path / "logs"
    flags = ["--dry-run"] if dry_run else []
    code = main(["train", *flags, *MATH_RUN, f"env.dataset={path}", "env.benchmark=[]", f"training.log_dir={logs}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert re.search(needle, err), err
    assert not logs.exists()  # refused before the run directory, the workers or a model


def test_a_benchmark_is_checked_like_the_training_set(tmp_path, capsys):
    good = write(tmp_path / "good.parquet", math_rows(3))
    bad = write(tmp_path / "bad.parquet", with_value(5, 3, "question", ""))
    assert main(["train", "--dry-run", *MATH_RUN, f"env.dataset={good}", f"env.benchmark=[{bad}]"]) == 2
    assert "bad.parquet: row 3, column 'question' is an empty string" in capsys.readouterr().err


def test_valid_rows_load_and_the_dry_run_counts_them(tmp_path):
    path = write(tmp_path / "good.parquet", math_rows(3))
    assert [p.problem_id for p in training_problems(MathEnv(), tmp_path, str(path))] == ["r0", "r1", "r2"]
    assert describe_data(MathEnv(), tmp_path, str(path), [str(path)])[0] == f"train:    {path} (3 rows)"


def test_a_batch_larger_than_the_training_set_is_said_in_the_dry_run_and_at_the_start(tmp_path):
    from pettingllms.trainer.cursor import DataCursor

    path = write(tmp_path / "good.parquet", math_rows(3))
    lines = describe_data(MathEnv(), tmp_path, str(path), [str(path)], batch_size=4)
    assert lines[1] == ("warning:  training.train_batch_size=4 is more than the training set's 3 problems: every "
                        "step holds some problems more than once")
    assert len(describe_data(MathEnv(), tmp_path, str(path), [str(path)], batch_size=3)) == 2  # no warning
    cursor = DataCursor(training_problems(MathEnv(), tmp_path, str(path)), 0, seed=0)
    assert cursor.repeats(3) is None and "more than the 3 problems of an epoch" in cursor.repeats(4)
    batch = [problem.problem_id for problem, _ in cursor.next_batch(4)]
    assert len(set(batch)) == 3  # what the warning is about: one problem twice in the step


def test_code_rows_need_lists_of_strings(tmp_path):
    row = {"question": "print 1", "test_input": [""], "test_output": ["1\n"]}
    assert len(training_problems(CodeEnv(), tmp_path, str(write(tmp_path / "ok.parquet", [row])))) == 1
    bad = write(tmp_path / "bad.parquet", [{**row, "test_output": [1]}])
    with pytest.raises(DataError, match=r"row 0, column 'test_output' holds list \[1\], but code envs read list of str"):
        training_problems(CodeEnv(), tmp_path, str(bad))


def test_an_env_without_a_declaration_gets_the_generic_checks_only(tmp_path):
    class Free(Env):  # a user's env: no problem_fields
        graph = MathEnv.graph
        agent_classes = MathEnv.agent_classes
        domain = "mine"
        reset = step = team_reward = success = None

    path = write(tmp_path / "free.parquet", [{"anything": 1}, {"anything": None}])
    assert len(training_problems(Free(), tmp_path, str(path))) == 2
    with pytest.raises(DataError, match="has zero rows"):
        check_rows([], {}, "x.parquet", "mine envs")


def test_built_in_envs_that_read_rows_declare_them():
    declared = {name: get_env_class(name).problem_fields for name in ("math", "code", "arith_duo")}
    assert declared["math"] == {"question": str, "answer": str}
    assert set(declared["code"]) == {"question", "test_input", "test_output"}
    assert declared["arith_duo"] == {"question": str, "answer": int}


def test_types_are_never_converted():
    assert matches("2", str) and not matches(2, str) and not matches(True, int) and matches(2, float)
    assert matches(["a"], list[str]) and not matches("a", list[str]) and not matches([1], list[str])


def test_every_missing_data_set_is_named_at_once(tmp_path):
    from pettingllms.data.problems import DataProblems

    good = write(tmp_path / "good.parquet", math_rows(3))
    with pytest.raises(DataProblems) as info:
        describe_data(MathEnv(), tmp_path, str(tmp_path / "nope.parquet"),
                      [str(tmp_path / "gone1.parquet"), str(good), str(tmp_path / "gone2.parquet")])
    names = [next(n for n in ("nope", "gone1", "gone2") if n in str(p)) for p in info.value.problems]
    assert names == ["nope", "gone1", "gone2"]
    lines = describe_data(MathEnv(), tmp_path, str(good), [str(good)], max_val_problems=2)
    assert lines[-1].endswith("(3 rows), validation reads its first 2 (env.max_val_problems)")
