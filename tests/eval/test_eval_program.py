"""``pettingllms eval`` of an agent program (``env.name=program``): the program's test tasks run through the gateway,
over the local engine and over a served model (``model.server_url``: the gateway's policy client is then the
OpenAI-compatible client engine, so a program's chat calls become the server's completion requests), with per-agent
rewards and pass@k in the summary and every episode's calls in the records."""

from __future__ import annotations

import pytest

from completions_server import CompletionsServer
from eval_support import check_records_against_summary, read_jsonl
from pettingllms.entry.eval import run_eval

pytest.importorskip("openai", reason="the programs extra")

PROGRAM = ["base_models.policy_0.path=tiny-random-smollm2", "env.name=program",
           "env.options.program=pettingllms.envs.program.example", "env.agents=[solver,checker]", "specialization=L1",
           "env.max_val_problems=3", "eval.max_tokens=6"]


def _calls_per_sample(result) -> list[list[str]]:
    summary = result.summary
    (bench,) = summary["benchmarks"].values()
    records = read_jsonl(result.run_dir / bench["records"])
    assert len(records) == 3
    return [[step["agent"] for step in sample["steps"]] for record in records for sample in record["samples"]]


def test_a_program_is_evaluated_on_the_local_engine(tmp_path):
    result = run_eval("eval", [*PROGRAM, f"eval.log_dir={tmp_path}"], print_table=False)
    check_records_against_summary(result.run_dir, result.summary)
    assert _calls_per_sample(result) == [["solver", "checker"]] * 3  # each run's calls, in the order it made them


def test_a_program_is_evaluated_against_a_served_model(tmp_path, tiny_engine, tiny_codec):
    with CompletionsServer(tiny_engine, tiny_codec.tokenizer, name="tiny-random-smollm2") as server:
        result = run_eval("eval", [*PROGRAM, f"model.server_url={server.url}", f"eval.log_dir={tmp_path}"],
                          print_table=False)
    summary = result.summary
    assert summary["model"]["policies"]["policy_0"]["engine"] == "openai"
    assert summary["server"]["policy_0"]["requests"] == 6 and summary["server"]["policy_0"]["failed_requests"] == 0
    assert len(server.bodies) == 1 + 6  # the start-up probe, then one completion per program call
    check_records_against_summary(result.run_dir, summary)
    assert _calls_per_sample(result) == [["solver", "checker"]] * 3
