"""What env.dataset and env.benchmark take: a data-tree name, a local file, a hub id (the real datasets.load_dataset
path, on local folders here), a list, a weighted mixture; and missing-data errors that name only commands that
exist, which then make the missing file."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pettingllms.core import DataError, Problem
from pettingllms.data import catalog
from pettingllms.envs.math.env import MathEnv
from pettingllms.envs.sudoku.env import SudokuEnv
from pettingllms.envs.toy.env import TargetsEnv
from pettingllms.data.problems import (
    benchmark_label, benchmark_sets, describe_data, mixture, parse_spec, training_problems,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"


def write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def math_rows(prefix: str, n: int) -> list[dict]:
    return [{"id": f"{prefix}/{i}", "question": f"{prefix} {i} + 1?", "answer": str(i + 1)} for i in range(n)]


def test_a_name_reads_the_data_tree(tmp_path):
    write_parquet(tmp_path / "math" / "train" / "mine.parquet", math_rows("mine", 3))
    problems = training_problems(MathEnv(), tmp_path, "mine")
    assert [p.problem_id for p in problems] == ["mine/0", "mine/1", "mine/2"]
    assert problems[0].data["question"] == "mine 0 + 1?"


def test_a_path_is_read_as_that_file_not_mangled_into_the_data_tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_parquet(tmp_path / "data" / "x.parquet", [{"prompt": "p0"}, {"prompt": "p1"}])
    problems = training_problems(TargetsEnv(), "data", "data/x.parquet")  # was data/misc/train/data/x.parquet.parquet
    assert [(p.problem_id, p.data["prompt"]) for p in problems] == [("x/0", "p0"), ("x/1", "p1")]
    (tmp_path / "rows.jsonl").write_text('{"id": "a", "prompt": "A"}\n{"id": "b", "prompt": "B"}\n')
    assert [p.problem_id for p in training_problems(TargetsEnv(), "data", "rows.jsonl")] == ["a", "b"]
    with pytest.raises(DataError, match=r"dataset file missing.jsonl does not exist.*current directory"):
        training_problems(TargetsEnv(), "data", "missing.jsonl")


def test_a_list_concatenates_and_benchmarks_stay_apart(tmp_path):
    write_parquet(tmp_path / "math" / "train" / "a.parquet", math_rows("a", 2))
    write_parquet(tmp_path / "math" / "test" / "a.parquet", math_rows("ta", 2))
    other = write_parquet(tmp_path / "elsewhere" / "b.parquet", math_rows("b", 3))
    assert len(training_problems(MathEnv(), tmp_path, ["a", str(other)])) == 5
    sets = benchmark_sets(MathEnv(), tmp_path, ["a", str(other)], limit=2)
    assert {k: [p.problem_id for p in v] for k, v in sets.items()} == {"a": ["ta/0", "ta/1"], "b": ["b/0", "b/1"]}
    with pytest.raises(DataError, match="lists 'b' twice"):
        benchmark_sets(MathEnv(), tmp_path, [str(other), "b"])


def test_a_mixture_keeps_the_weights_without_replacement(tmp_path):
    small = [Problem(f"s{i}") for i in range(10)]
    large = [Problem(f"l{i}") for i in range(100)]
    even = mixture([small, large], [1.0, 1.0], seed=0)
    assert sum(p.problem_id.startswith("s") for p in even) == 10 and len(even) == 20  # small part binds
    skewed = mixture([large, large[:50]], [1.0, 3.0], seed=0)
    assert len(skewed) == 66 and len({p.problem_id for p in skewed[:]}) <= 66
    assert mixture([small, large], [1, 1], seed=1) != even and mixture([small, large], [1, 1], seed=0) == even
    write_parquet(tmp_path / "math" / "train" / "a.parquet", math_rows("a", 20))
    write_parquet(tmp_path / "math" / "train" / "b.parquet", math_rows("b", 4))
    mixed = training_problems(MathEnv(), tmp_path, {"a": 0.5, "b": 0.5}, seed=3)
    assert sorted(p.problem_id[0] for p in mixed) == ["a"] * 4 + ["b"] * 4
    with pytest.raises(DataError, match="weights must be"):
        parse_spec({"a": -1}, "math", tmp_path, "train")


def test_a_hub_id_goes_through_datasets_load_dataset_with_the_loaders_converter(tmp_path, monkeypatch):
    """``owner/name`` is handed to datasets.load_dataset; a local folder of that name stands in for the hub
    (HF_HUB_OFFLINE=1). POLARIS is a source the loader knows: its ``problem`` column becomes ``question``."""
    import datasets

    monkeypatch.chdir(tmp_path)
    repo = tmp_path / "POLARIS-Project" / "Polaris-Dataset-53K"
    repo.mkdir(parents=True)
    shutil.copy(FIXTURES / "hub_math" / "polaris.jsonl", repo / "train.jsonl")
    calls = []
    real = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    problems = training_problems(MathEnv(), tmp_path / "data", "POLARIS-Project/Polaris-Dataset-53K")
    assert calls == [(("POLARIS-Project/Polaris-Dataset-53K", None), {"split": "train"})]
    assert problems[0].data["question"] == "Find the number of positive divisors of 360."
    assert problems[0].data["answer"] == "24" and problems[0].problem_id == "polaris/0"

    other = tmp_path / "someone" / "arith"  # an unknown hub dataset: rows are used as they are, split by suffix
    other.mkdir(parents=True)
    (other / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    sets = benchmark_sets(MathEnv(), tmp_path / "data", ["someone/arith"])
    assert list(sets) == ["arith"] and sets["arith"][0].data == {"question": "1+1?", "answer": "2"}
    assert [p.data["answer"] for p in training_problems(MathEnv(), "data", "someone/arith:test")] == ["2"]
    with pytest.raises(DataError, match=r"cannot load hub dataset 'nobody/nothing'.*local file instead"):
        training_problems(MathEnv(), "data", "nobody/nothing")


def test_rows_without_the_columns_the_env_reads_are_named(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_text('{"problem": "1+1?", "solution": "2"}\n')
    with pytest.raises(DataError, match=r"lack column\(s\) \['question', 'answer'\].*load_math.py --from-file"):
        training_problems(MathEnv(), tmp_path, str(path))


def test_entries_that_are_nothing_are_refused(tmp_path):
    with pytest.raises(DataError, match="not a dataset name"):
        parse_spec("a b c", "math", tmp_path, "train")
    with pytest.raises(DataError, match="empty list"):
        parse_spec([], "math", tmp_path, "train")
    assert benchmark_label("math/x.parquet") == "x" and benchmark_label({"a": 1, "b": 2}) == "a+b"


# ------------------------------------------------------------------------------------- missing data: commands
def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "dataprocess" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def named_command(message: str) -> tuple[str, list[str]]:
    """The loader command an error names: (script stem, its arguments)."""
    match = re.search(r"python scripts/dataprocess/(load_\w+)\.py([^(.;]*)", message)
    assert match, message
    return match.group(1), shlex.split(match.group(2))


def run_loader(script: str, args: list[str], data_root: Path) -> None:
    """Run ``scripts/dataprocess/<script>.py args`` in-process, into ``data_root``, small, hub sources from fixtures."""
    module = load_script(script)
    extra = ["--data-root", str(data_root), "--train-size", "6", "--test-size", "3"]
    if script in ("load_math", "load_code"):  # the shared loader CLI: main(domain_spec, argv)
        module.main(module.domain_spec(), args + extra + ["--hub-cache", str(FIXTURES / f"hub_{script[5:]}")])
    else:
        module.main(args + extra)


@pytest.mark.parametrize("env, split, name", [
    (MathEnv(), "train", "gsm_symbolic"),
    (MathEnv(), "train", "polaris"),
    (MathEnv(), "test", "AIME24"),
    (SudokuEnv(), "train", "sudoku_9x9"),
    (SudokuEnv(), "test", "sudoku_4x4"),
])
def test_a_missing_file_names_the_command_that_makes_it(tmp_path, env, split, name):
    with pytest.raises(DataError) as info:
        if split == "train":
            training_problems(env, tmp_path, name)
        else:
            benchmark_sets(env, tmp_path, [name])
    message = str(info.value)
    assert f"{name}.parquet does not exist" in message
    script, args = named_command(message)
    assert (ROOT / "scripts" / "dataprocess" / f"{script}.py").is_file()
    run_loader(script, args, tmp_path)  # the named command, as written (plus a small size and the temp root)
    assert (tmp_path / env.domain / split / f"{name}.parquet").is_file()


def test_a_name_no_loader_has_points_to_the_converter_and_files():
    message = catalog.make_command("math", "train", "my_set")
    assert "No math source is named 'my_set'" in message
    assert "load_math.py --from-file FILE --name my_set --split train" in message


def test_domains_without_a_loader_name_no_script(tmp_path):
    with pytest.raises(DataError) as info:
        training_problems(TargetsEnv(), tmp_path, "nothing_here")
    assert "No loader writes 'misc' data" in str(info.value) and "scripts/" not in str(info.value)


def test_the_math_configs_missing_paper_data_offers_the_offline_set(tmp_path):
    message = catalog.make_command("math", "train", "polaris")
    assert "--sources polaris (downloads POLARIS-Project/Polaris-Dataset-53K" in message
    assert "Offline instead: python scripts/dataprocess/load_math.py, then env.dataset=gsm_symbolic" in message


def test_describe_data_checks_every_file_without_loading_hub_sets(tmp_path):
    write_parquet(tmp_path / "math" / "train" / "a.parquet", math_rows("a", 5))
    test_file = write_parquet(tmp_path / "math" / "test" / "a.parquet", math_rows("ta", 2))
    lines = describe_data(MathEnv(), tmp_path, {"a": 1, "someone/else": 1}, ["a"])
    assert lines[0].startswith("train:    mixture of 1 x") and "(5 rows)" in lines[0] and "hub dataset someone/else" in lines[0]
    assert lines[1].startswith("validate: a:")
    test_file.unlink()
    with pytest.raises(DataError, match="a.parquet does not exist"):
        describe_data(MathEnv(), tmp_path, "a", ["a"])  # the test split has no a.parquet
