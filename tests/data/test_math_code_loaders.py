"""Dataset loaders: offline sources into a temp data root, the hub path on fixture files (same converters),
local files, mixtures, decontamination, and errors that name the source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pettingllms.core import DataError
from pettingllms.data import code_sources, math_sources
from pettingllms.data.loader import main
from pettingllms.data.sources import decontaminate, mix, parse_weights, read_hub
from pettingllms.data.problems import dataset_path, load_problems

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"


def rows(root: Path, domain: str, split: str, name: str) -> list[dict]:
    return pq.read_table(dataset_path(root, domain, split, name)).to_pylist()


def load_math(*argv: str) -> dict:
    return main(math_sources.domain_spec(), list(argv))


def load_code(*argv: str) -> dict:
    return main(code_sources.domain_spec(), list(argv))


# ------------------------------------------------------------------------------------------- offline
def test_offline_math_default_writes_disjoint_train_and_test(tmp_path):
    load_math("--data-root", str(tmp_path), "--train-size", "40", "--test-size", "15")
    for name in ("gsm_symbolic", "basic_arithmetic"):
        train, test = rows(tmp_path, "math", "train", name), rows(tmp_path, "math", "test", name)
        assert len(test) == 15 and 0 < len(train) <= 40
        assert {"id", "question", "answer", "source"} <= set(train[0])
        assert not {r["question"] for r in train} & {r["question"] for r in test}
        assert len({r["id"] for r in train + test}) == len(train) + len(test)


def test_offline_math_rows_feed_the_math_env(tmp_path):
    from pettingllms.envs.math.env import MathEnv

    load_math("--data-root", str(tmp_path), "--sources", "basic_arithmetic", "--train-size", "5", "--test-size", "5")
    problems = load_problems(dataset_path(tmp_path, "math", "train", "basic_arithmetic"), "math", "basic_arithmetic")
    env = MathEnv()
    state = env.reset(problems[0], 0)
    answer = problems[0].data["answer"]
    assert env.step(state, "reasoner", env_action(answer)).state.reasoner.correct


def env_action(answer: str):
    from pettingllms.envs.math.env import ReasonerAgent

    return ReasonerAgent("reasoner").parse(f"\\boxed{{{answer}}}")


def test_offline_code_converts_humaneval_to_stdin_stdout(tmp_path):
    load_code("--data-root", str(tmp_path), "--limit", "6", "--humaneval-test-every", "3")
    train, test = rows(tmp_path, "code", "train", "humaneval"), rows(tmp_path, "code", "test", "humaneval")
    assert [r["id"] for r in test] == ["humaneval/0", "humaneval/3"]
    assert len(train) == 4
    row = test[0]
    assert row["test_input"][0].startswith("(") and len(row["test_input"]) == len(row["test_output"])
    assert "standard input" in row["question"] and "def " in row["solution"]


def test_humaneval_inputs_are_the_literal_candidate_calls():
    test = "def check(candidate):\n    assert candidate([1, 2], 3) == 1\n    assert candidate(x) == 2\n" \
           "    assert abs(candidate([1.5], 0) - 1) < 1e-6\n    assert candidate([1, 2], 3) == 1\n"
    assert code_sources.humaneval_inputs(test) == ["([1, 2], 3)", "([1.5], 0)"]


# ------------------------------------------------------------------------------------------- hub path
def test_hub_math_sources_on_fixtures(tmp_path):
    sources = "polaris,dapo_math,aime_past,gsm8k,AIME24,AIME25,OlympiadBench,MATH500,GSM8K"
    load_math("--data-root", str(tmp_path), "--sources", sources, "--hub-cache", str(FIXTURES / "hub_math"))
    assert [r["answer"] for r in rows(tmp_path, "math", "train", "polaris")] == ["24", "2500", "4"]
    dapo = rows(tmp_path, "math", "train", "dapo_math")
    assert len(dapo) == 2 and dapo[0]["question"] == "What is the remainder when 2^10 is divided by 7?"
    assert {r["year"] for r in rows(tmp_path, "math", "train", "aime_past")} == {1983, 2023}  # 2024 is a benchmark
    assert rows(tmp_path, "math", "test", "AIME24")[0]["answer"] == "204"
    assert rows(tmp_path, "math", "test", "AIME25")[0]["id"] == "AIME25/0"
    assert rows(tmp_path, "math", "test", "OlympiadBench")[0]["answer"] == "12"
    assert rows(tmp_path, "math", "test", "MATH500")[0]["answer"] == "\\frac{5}{6}"
    assert rows(tmp_path, "math", "train", "gsm8k")[0]["answer"] == "31"
    assert rows(tmp_path, "math", "test", "GSM8K")[0]["answer"] == "5000"


def test_hub_cache_reads_parquet_through_the_same_converter(tmp_path):
    raw = [json.loads(line) for line in (FIXTURES / "hub_math" / "polaris.jsonl").read_text().splitlines()]
    cache = tmp_path / "cache"
    cache.mkdir()
    pq.write_table(pa.Table.from_pylist(raw), cache / "polaris.parquet")
    load_math("--data-root", str(tmp_path / "data"), "--sources", "polaris", "--hub-cache", str(cache))
    assert len(rows(tmp_path / "data", "math", "train", "polaris")) == 3


def test_hub_code_sources_on_fixtures(tmp_path):
    load_code("--data-root", str(tmp_path), "--sources", "code_contests,apps_test,livecodebench",
              "--hub-cache", str(FIXTURES / "hub_code"))
    cc = rows(tmp_path, "code", "train", "code_contests")
    assert len(cc) == 1 and cc[0]["test_input"] == ["1 2\n", "5 5\n"] and "print(a+b)" in cc[0]["solution"]
    apps = rows(tmp_path, "code", "test", "apps")  # apps_test is written as test/apps.parquet
    assert len(apps) == 1 and apps[0]["test_output"] == ["9\n", "16\n"]  # the call-based problem is skipped
    lcb = rows(tmp_path, "code", "test", "livecodebench")
    assert len(lcb) == 1 and lcb[0]["test_input"] == ["2\n", "7\n"] and lcb[0]["solution"] is None


def test_hub_rows_feed_the_code_env(tmp_path):
    from pettingllms.envs.code.env import CodeAction, CodeEnv

    load_code("--data-root", str(tmp_path), "--sources", "code_contests", "--hub-cache", str(FIXTURES / "hub_code"))
    problem = load_problems(dataset_path(tmp_path, "code", "train", "code_contests"), "code", "code_contests")[0]
    env = CodeEnv(sandbox_workers=1)
    state = env.step(env.reset(problem, 0), "coder", CodeAction(problem.data["solution"])).state
    assert env.success(state)


def test_unreachable_hub_names_the_source(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"'AIME24'.*Maxwell-Jia/AIME_2024.*--hub-cache"):
        read_hub(math_sources.HUB_SOURCES["AIME24"])


def test_livecodebench_private_tests_never_unpickle_objects():
    import base64
    import pickle
    import zlib

    evil = base64.b64encode(zlib.compress(pickle.dumps(Path("/etc")))).decode()
    with pytest.raises(pickle.UnpicklingError):
        code_sources.decode_lcb_tests(evil)


# ------------------------------------------------------------------------------------------- local files, mixtures
def test_from_file_in_our_columns_and_in_a_hub_format(tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"question": "What is 2+2?", "answer": "4"}) + "\n")
    load_math("--data-root", str(tmp_path), "--from-file", str(mine), "--name", "mine", "--split", "test")
    assert rows(tmp_path, "math", "test", "mine") == [{"question": "What is 2+2?", "answer": "4", "id": "mine/0"}]
    load_math("--data-root", str(tmp_path), "--from-file", str(FIXTURES / "hub_math" / "AIME25.jsonl"),
              "--format", "AIME25", "--name", "aime25_local", "--split", "test")
    assert rows(tmp_path, "math", "test", "aime25_local")[0]["answer"] == "70"


def test_from_file_with_wrong_columns_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(SystemExit):
        load_math("--data-root", str(tmp_path), "--from-file", str(bad), "--name", "bad")
    assert "lacks column(s)" in capsys.readouterr().err


def test_unknown_source_lists_the_known_ones(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_math("--data-root", str(tmp_path), "--sources", "polarisss")
    err = capsys.readouterr().err
    assert "polarisss" in err and "polaris" in err and "gsm_symbolic" in err


def test_mixture_follows_the_weights(tmp_path):
    load_math("--data-root", str(tmp_path), "--sources", "gsm_symbolic,basic_arithmetic", "--train-size", "60",
              "--test-size", "5")
    load_math("--data-root", str(tmp_path), "--mix", "gsm_symbolic=3,basic_arithmetic=1", "--mix-name", "mixed",
              "--mix-size", "40")
    mixed = rows(tmp_path, "math", "train", "mixed")
    sources = [r["source"] for r in mixed]
    assert len(mixed) == 40 and sources.count("gsm_symbolic") == 30 and sources.count("basic_arithmetic") == 10


def test_mix_and_weights_units():
    data = {"a": [{"question": f"a{i}"} for i in range(10)], "b": [{"question": f"b{i}"} for i in range(2)]}
    out = mix(data, parse_weights("a:1,b:1"), 8, seed=0)
    assert sum(r["source"] == "a" for r in out) == 4 and sum(r["source"] == "b" for r in out) == 2  # b has only 2
    with pytest.raises(DataError):
        parse_weights("a=-1")


# ------------------------------------------------------------------------------------------- decontamination
def test_decontaminate_removes_exact_and_ngram_overlaps():
    test = [{"question": "Find the number of ordered pairs of integers x y such that x squared plus y squared is 25."},
            {"question": "What is 2 + 3?"}]
    train = [
        {"question": "what is 2+3?"},  # exact after normalisation
        {"question": "Hard one: find the number of ordered pairs of integers x y such that x squared plus y"},  # 13 words
        {"question": "What is 2 + 4?"},  # short, differs
        {"question": "Find the number of ordered pairs of integers with a product of six."},
    ]
    kept, removed = decontaminate(train, [test], n=13)
    assert [r["question"] for r in removed] == [train[0]["question"], train[1]["question"]]
    assert kept == train[2:]
    assert decontaminate(train, [test], n=None)[1] == [train[0]]  # exact only
    templated = [dict(train[1], source="gsm_symbolic")]  # procedural sets are matched exactly only
    assert decontaminate(templated, [test], n=13, exact_only_sources={"gsm_symbolic"})[1] == []


def test_loader_decontaminates_train_against_test_files(tmp_path):
    leaked = tmp_path / "leaked.jsonl"
    aime24 = json.loads((FIXTURES / "hub_math" / "AIME24.jsonl").read_text())
    leaked.write_text(json.dumps({"question": aime24["Problem"], "answer": "204"}) + "\n"
                      + json.dumps({"question": "A clean training question about primes below 30?", "answer": "10"}))
    load_math("--data-root", str(tmp_path), "--sources", "AIME24", "--hub-cache", str(FIXTURES / "hub_math"))
    result = load_math("--data-root", str(tmp_path), "--from-file", str(leaked), "--name", "leaky")
    assert result["removed"] == {"leaky": 1}
    assert [r["answer"] for r in rows(tmp_path, "math", "train", "leaky")] == ["10"]


def test_aime_past_drops_benchmark_years_even_without_text_overlap(tmp_path):
    load_math("--data-root", str(tmp_path), "--sources", "aime_past", "--hub-cache", str(FIXTURES / "hub_math"),
              "--exclude-years", "2023", "--no-decontaminate")
    assert {r["year"] for r in rows(tmp_path, "math", "train", "aime_past")} == {1983, 2024}


def test_cli_scripts_run_as_programs(tmp_path):
    for script, args in (("load_math.py", ["--sources", "basic_arithmetic", "--train-size", "3", "--test-size", "3"]),
                         ("load_code.py", ["--sources", "apps_test", "--hub-cache", str(FIXTURES / "hub_code")])):
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "dataprocess" / script), "--data-root",
                               str(tmp_path), *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "wrote" in done.stdout
    missing = subprocess.run([sys.executable, str(ROOT / "scripts" / "dataprocess" / "load_math.py"), "--data-root",
                              str(tmp_path), "--sources", "AIME24", "--hub-cache", str(tmp_path / "nowhere")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "AIME24" in missing.stderr


def test_unreachable_raw_file_source_names_its_url(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: (_ for _ in ()).throw(OSError("no network")))
    with pytest.raises(DataError, match=r"'livecodebench'.*hf://datasets/livecodebench/.*test6\.jsonl"):
        read_hub(code_sources.HUB_SOURCES["livecodebench"])


def test_code_contests_reads_only_the_columns_it_converts_from_the_hub(monkeypatch):
    """The hub rows hold every incorrect solution and the generated tests too (the hub lists the train split as about
    7.5 GB of parquet); only what the converter reads becomes Python rows."""
    import datasets

    hub_row = {"name": "p1", "description": "Add.", "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
               "private_tests": {"input": [], "output": []}, "generated_tests": {"input": ["x"], "output": ["y"]},
               "solutions": {"language": [3], "solution": ["print(sum(map(int, input().split())))"]},
               "incorrect_solutions": {"language": [3], "solution": ["print(0)"]}, "cf_rating": 800}
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list([hub_row]))
    (row,) = read_hub(code_sources.HUB_SOURCES["code_contests"])
    assert set(row) == set(code_sources.CODE_CONTESTS_COLUMNS)
    assert code_sources.convert_code_contests(row, 0)["id"] == "code_contests/p1"


def test_aime25_reads_the_problem_under_either_name_the_hub_has_used():
    for name in ("problem", "question"):
        row = math_sources.convert_aime25({name: "Find x.", "answer": "7", "id": 3}, 0)
        assert row["id"] == "AIME25/3" and "Find x." in row["question"]


def test_a_row_range_source_turns_no_hub_row_past_its_range_into_python(monkeypatch):
    """APPS test.jsonl (1.3 GB as the hub lists it), of which the source keeps rows 0-500: the rest is never
    materialised."""
    import datasets

    source = code_sources.HUB_SOURCES["apps_test"]
    stop = source.row_range[1]
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *a, **k: datasets.Dataset.from_list([{"problem_id": i} for i in range(stop + 100)]))
    assert [row["problem_id"] for row in read_hub(source)] == list(range(stop))
