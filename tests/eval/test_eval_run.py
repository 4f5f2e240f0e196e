"""``pettingllms eval`` end to end: math and code benchmarks in one call, records, summary, pass@k; the server path;
scripted answers with known outcomes; and bad input that fails before any model is loaded."""

from __future__ import annotations

import json
import re

import pytest

from completions_server import CompletionsServer
from eval_support import check_records_against_summary, only_run_dir, read_jsonl
from pettingllms.core import ConfigError, DataError, RegistryError
from pettingllms.entry.eval import eval_command, run_eval

TINY = "base_models.policy_0.path=tiny-random-smollm2"


def test_cli_math_and_code_in_one_call(data_root, tmp_path, capsys):
    code = eval_command([
        TINY, f"env.data_root={data_root}", "env.benchmark=[math/basic_arithmetic,code/humaneval]",
        "env.max_val_problems=2", "env.max_turns=2", "eval.n=2", "eval.k=[1,2]", "eval.temperature=1.0",
        "eval.max_tokens=8", f"eval.log_dir={tmp_path}",
        "agents.reasoner.options.strict_boxed=true",  # random text has no \boxed{}: no math-verify pool to wait on
    ])
    out = capsys.readouterr().out
    assert code == 0
    run_dir = only_run_dir(tmp_path)
    assert f"run directory: {run_dir}" in out and "pass@2" in out and "per agent" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary["benchmarks"]) == ["math/basic_arithmetic", "code/humaneval"]
    assert {k: summary["settings"][k] for k in ("n", "k", "temperature", "max_tokens")} == {
        "n": 2, "k": [1, 2], "temperature": 1.0, "max_tokens": 8}
    assert set(summary["model"]["agents"]) == {"reasoner", "tool", "coder", "tester"}  # multi-agent workflows
    assert (run_dir / "config.yaml").is_file() and (run_dir / "eval.log").is_file()
    check_records_against_summary(run_dir, summary)
    for bench in summary["benchmarks"].values():
        assert set(bench["success_by_turn"]) == {"0", "1"} and bench["replayed_samples"] == bench["samples"] == 4
        assert bench["success_by_turn"]["1"] == pytest.approx(bench["success_rate"])
    math = summary["benchmarks"]["math/basic_arithmetic"]
    assert set(math["agents"]) == {"reasoner", "tool"} and math["agents"]["tool"]["actions"] >= 4
    record = read_jsonl(run_dir / math["records"])[0]
    step = record["samples"][0]["steps"][0]
    assert step["prompt"][-1]["role"] == "user" and isinstance(step["response"], str)
    assert {"reward", "team_reward", "local_reward", "response_tokens", "success_after", "applied"} <= set(step)
    assert 0 < step["response_tokens"] <= 8


def test_scripted_answers_give_the_designed_pass_at_k(data_root, tmp_path):
    """A scripted policy answers correctly on a designed subset of samples and turns: the records and pass@k
    must show exactly that (the real math env judges the answers)."""
    import pyarrow.parquet as pq

    from pettingllms.config.load import compose, to_schema
    from pettingllms.eval.runner import run_evaluation
    from pettingllms.rollout.policy_client import LocalPolicyClient
    from pettingllms.rollout.scripted import ScriptedEngine

    rows = pq.read_table(data_root / "math" / "test" / "basic_arithmetic.parquet").to_pylist()
    n, problems = 4, 5
    correct_final = {s: s % (n + 1) for s in range(problems)}  # problem s: samples e < s % 5 end correct

    def correct_at(slot: int, sample: int, turn: int) -> bool:
        return sample < correct_final[slot] and (turn == 1 or sample % 2 == 0)  # odd samples fix it at turn 1

    def script(prompt: str, _k: int, request) -> str:
        # request ids read "p<slot in batch>e<sample>/t<turn>/<agent>"; the problem is found by its question
        match = re.match(r"p\d+e(\d+)/t(\d+)/(\w+)", request.request_id)
        sample, turn, agent = int(match[1]), int(match[2]), match[3]
        if agent == "tool":
            return "I will not write code."
        (slot,) = [i for i, r in enumerate(rows) if f"Problem: {r['question']}" in prompt.split("<user>: ")[-1]]
        answer = rows[slot]["answer"]
        # a wrong sample gives no answer at all, so the test never waits on math-verify's process pool
        return f"The answer is \\boxed{{{answer}}}." if correct_at(slot, sample, turn) else "I do not know."

    engine = ScriptedEngine(script)
    cfg = to_schema(compose("eval", [TINY, f"env.data_root={data_root}", "env.benchmark=[math/basic_arithmetic]",
                                     f"env.max_val_problems={problems}", "env.max_turns=2", f"eval.n={n}",
                                     "eval.k=[1,2,4]", "eval.temperature=1.0", f"eval.log_dir={tmp_path}",
                                     "eval.batch_problems=2"]))
    result = run_evaluation(cfg, clients={"policy_0": LocalPolicyClient(engine, engine.codec)}, print_table=False)
    records = read_jsonl(result.run_dir / "records" / "math" / "basic_arithmetic.jsonl")
    assert [r["num_success"] for r in records] == [correct_final[s] for s in range(problems)]
    check_records_against_summary(result.run_dir, result.summary)
    bench = result.summary["benchmarks"]["math/basic_arithmetic"]
    expected_by_turn = [sum(correct_at(s, e, t) for s in range(problems) for e in range(n)) / (problems * n)
                        for t in (0, 1)]
    assert [bench["success_by_turn"][t] for t in ("0", "1")] == pytest.approx(expected_by_turn)
    assert expected_by_turn[0] < expected_by_turn[1]  # the design makes turn 1 matter
    reasoner = bench["agents"]["reasoner"]
    assert reasoner["success_after_action"] == pytest.approx(sum(expected_by_turn) / 2)
    assert reasoner["actions"] == problems * n * 2 and bench["agents"]["tool"]["local_reward_mean"] == -1.0
    assert bench["pass@4"] == pytest.approx(sum(c > 0 for c in correct_final.values()) / problems)


def test_served_model_end_to_end(data_root, tmp_path, tiny_engine, tiny_codec):
    with CompletionsServer(tiny_engine, tiny_codec.tokenizer, name="tiny-random-smollm2") as server:
        result = run_eval("eval", [TINY, f"model.server_url={server.url}", f"env.data_root={data_root}",
                                   "env.benchmark=[math/basic_arithmetic]", "env.max_val_problems=3",
                                   "env.max_turns=1", "specialization=L0", "env.agents=[reasoner]",
                                   "eval.max_tokens=6", f"eval.log_dir={tmp_path}"], print_table=False)
    summary = result.summary
    assert summary["model"]["policies"]["policy_0"]["engine"] == "openai"
    assert summary["server"]["policy_0"] == {"requests": 3, "failed_requests": 0, "exact_token_ids": 3,
                                            "retokenized": 0, "failures": {}}
    assert len(server.bodies) == 4  # the start-up probe, then one request per problem
    check_records_against_summary(result.run_dir, summary)
    steps = [s for r in read_jsonl(result.run_dir / summary["benchmarks"]["math/basic_arithmetic"]["records"])
             for sample in r["samples"] for s in sample["steps"]]
    assert [s["agent"] for s in steps] == ["reasoner"] * 3 and all(0 < s["response_tokens"] <= 6 for s in steps)


@pytest.mark.parametrize("overrides, error, message", [
    (["env.benchmark=[math/no_such_set]"], DataError, r"no_such_set.*load_math.py.*available in .*basic_arithmetic"),
    (["env.benchmark=[no_such_env/x]"], RegistryError, "unknown env 'no_such_env'"),
    (["eval.n=2", "eval.k=[1,3]", "eval.temperature=1.0"], ConfigError, r"1 <= k <= eval.n=2; \[3\]"),
    (["eval.n=4"], ConfigError, "greedy samples would all be the same"),
    (["eval.top_p=0"], ConfigError, "top_p"),
    (["env.agents=[reasoner,typo]"], ConfigError, "'typo'.*not a role"),
    (["eval.nn=2"], ConfigError, "nn"),
    (["model.checkpoint=/no/such/run"], ConfigError, "neither a trainer run directory"),
    (["model.server_url=http://x/v1", "model.adapters=/a"], ConfigError, "keep one"),
])
def test_bad_input_fails_before_any_model_is_loaded(data_root, tmp_path, monkeypatch, overrides, error, message):
    import pettingllms.eval.policies as policies

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(policies, "load_model", no_loading)
    with pytest.raises(error, match=message):
        run_eval("eval", [TINY, f"env.data_root={data_root}", "env.benchmark=[math/basic_arithmetic]",
                          f"eval.log_dir={tmp_path}", *overrides], print_table=False)
    assert not any(tmp_path.iterdir())  # no run directory either


def test_missing_data_file_names_the_loader(tmp_path, capsys):
    code = eval_command([TINY, f"env.data_root={tmp_path}/empty", "env.benchmark=[code/humaneval]",
                         f"eval.log_dir={tmp_path}/logs"])
    assert code == 2
    assert "load_code.py" in capsys.readouterr().err and not (tmp_path / "logs").exists()
