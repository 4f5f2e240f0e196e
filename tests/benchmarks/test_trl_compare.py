"""benchmarks/trl_compare.py's own parts: the TRL configurations it measures, how it picks the headline, and
our side's prompt token counts (the harness crashed there before writing any result)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import trl_compare  # noqa: E402


@pytest.mark.parametrize("problems, generations", [(4, 8), (2, 2), (3, 5)])
def test_every_trl_configuration_is_one_generation_round_and_one_optimizer_update(problems, generations):
    configurations = trl_compare.trl_configurations(problems, generations)
    assert len({c["name"] for c in configurations}) == len(configurations)
    for c in configurations:
        grpo = c["grpo"]
        # TRL generates once per update when the rows of one update are the B x K completions of one round.
        assert grpo["per_device_train_batch_size"] * grpo["gradient_accumulation_steps"] == problems * generations
        assert "steps_per_generation" not in grpo and "num_iterations" not in grpo
    by_name = {c["name"]: c["grpo"] for c in configurations}
    # The recommended one is TRL's defaults as they are (gradient checkpointing and bf16 left to TRL).
    assert set(by_name["trl_defaults"]) == {"per_device_train_batch_size", "gradient_accumulation_steps"}
    # The candidates for the fastest cover no checkpointing in one batch, in micro-batches of K rows, and bf16.
    assert by_name["one_batch_fp32"] == {"per_device_train_batch_size": problems * generations,
                                         "gradient_accumulation_steps": 1, "bf16": False,
                                         "gradient_checkpointing": False}
    assert by_name["micro_batches_fp32"]["per_device_train_batch_size"] == generations
    assert by_name["micro_batches_bf16"]["bf16"] is True


def test_the_workload_arguments_are_shared_and_the_configuration_decides_the_rest():
    args = trl_compare.parse_args(["--problems", "3", "--generations", "4", "--max-tokens", "16"])
    configurations = trl_compare.trl_configurations(args.problems, args.generations)
    grpo = [trl_compare.trl_grpo_args(args, c) for c in configurations]
    shared = {"num_generations": 4, "max_completion_length": 16, "beta": 0.0, "top_k": 0, "top_p": 1.0,
              "temperature": 1.0, "learning_rate": trl_compare.LEARNING_RATE, "lr_scheduler_type": "constant"}
    for g, c in zip(grpo, configurations):
        assert shared.items() <= g.items() and c["grpo"].items() <= g.items()


def _result(name, seconds, error=None):
    timed = [{"seconds": s, "mean_completion_length": 10.0, "clipped_ratio": 0.5} for s in seconds]
    return {"name": name, "ready": {"threads": 2, "prompt_lengths": [5]}, "warm_up": {"seconds": 99.0},
            "timed": timed, "error": error}


def test_the_headline_is_the_fastest_configuration_that_completed():
    summaries = [trl_compare.configuration_summary(_result("a", [30.0, 10.0, 20.0])),
                 trl_compare.configuration_summary(_result("oom", [1.0], error="RuntimeError: can't allocate")),
                 trl_compare.configuration_summary(_result("b", [15.0, 16.0, 17.0]))]
    assert [s["step_s_median"] for s in summaries] == [20.0, None, 16.0]  # medians of the timed steps only
    assert trl_compare.fastest(summaries)["name"] == "b"  # the failed one's partial step does not count
    with pytest.raises(RuntimeError, match="oom: RuntimeError: can't allocate"):
        trl_compare.fastest([summaries[1]])


def test_tokens_per_step_counts_every_completion_with_its_own_prompt():
    # Two prompts of 10 and 20 tokens, K=3 completions of 5 tokens on average: 3 x (30 + 2 x 5).
    assert trl_compare.tokens_per_step([10, 20], 3, 5.0) == 120.0


def test_our_side_counts_prompt_tokens_with_the_policys_codec(tmp_path):
    """On main this raised AttributeError ('PolicyGroup' object has no attribute 'workers') after the last step,
    before any result was written."""
    from transformers import AutoTokenizer

    from pettingllms.models import resolve_model

    args = trl_compare.parse_args(["--quick"])
    rows = trl_compare.problems(args.problems)
    ours = trl_compare.OurSide(args, rows, tmp_path, steps=1)
    try:
        messages = ours.prompt_messages(rows)
        lengths = ours.prompt_lengths(messages)
    finally:
        ours.close()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
    expected = [len(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)["input_ids"])
                for m in messages]
    assert lengths == expected and min(lengths) > 50  # the reasoner's one-shot prompt, not an empty chat


def test_the_standalone_comparison_relates_step_times_and_tokens():
    in_harness = trl_compare.configuration_summary(_result("fast", [30.0, 30.0, 30.0]))
    alone = trl_compare.configuration_summary(_result("fast/harness_prompts", [24.0, 24.0, 24.0]))
    short = {**trl_compare.configuration_summary(_result("fast/short_prompts", [8.0, 8.0, 8.0])),
             "prompt_lengths": [1]}
    c = trl_compare.standalone_comparison(in_harness, alone, short, generations=2)
    assert c["alone_over_in_harness"] == 0.8 and c["harness_over_short_prompts"]["step_s"] == 3.0
    # 2 x (5 + 10) tokens against 2 x (1 + 10): every completion carries its own prompt.
    assert c["tokens_per_step"] == {"harness_prompts": 30.0, "short_prompts": 22.0}
    assert "x0.80" in trl_compare.comparison_notes(c)[0]


FAKE_WORKER = '''
import json, os, sys
run = json.load(open(sys.argv[1]))
print("TRL_READY " + json.dumps({"name": run["name"], "threads": 2, "prompt_lengths": [3]}), flush=True)
for step in range(run["steps"]):
    if "--standalone" not in sys.argv:
        assert sys.stdin.readline().strip() == "go"
    if run["name"] == "killed":
        os.kill(os.getpid(), 9)  # as the kernel's OOM killer does
    if run["name"] == "too_big":
        print("TRL_FAILED " + json.dumps({"name": run["name"], "error": "RuntimeError: can't allocate"}), flush=True)
        sys.exit(1)
    print("TRL_STEP " + json.dumps({"seconds": 1.0 + step, "mean_completion_length": 4.0, "clipped_ratio": 0.0}),
          flush=True)
print("TRL_DONE " + json.dumps({"name": run["name"], "peak_rss_gb": 0.5}), flush=True)
'''


@pytest.mark.parametrize("standalone", [False, True])
def test_a_failed_or_killed_configuration_is_recorded_and_the_next_ones_still_run(tmp_path, monkeypatch, standalone):
    """The worker protocol against real subprocesses, one per configuration, one failing as a run over the memory
    cap does and one killed as the OOM killer does."""
    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    monkeypatch.setattr(trl_compare, "TRL_PYTHON", Path(sys.executable))
    monkeypatch.setattr(trl_compare, "TRL_WORKER", worker)
    args = trl_compare.parse_args(["--repeats", "2", "--model", "tiny-random-smollm2"])
    ours = []
    results = {}
    for name in ["first", "too_big", "killed", "last"]:
        run = {"name": name, "grpo": {}, "prompts": [], "solutions": []}
        results[name] = trl_compare.measure_configuration(
            args, run, tmp_path, None if standalone else (lambda: ours.append(1)), standalone=standalone)
    assert [t["seconds"] for t in results["first"]["timed"]] == [2.0, 3.0]  # after the warm-up step
    assert results["first"]["peak_rss_gb"] == 0.5 and results["first"]["error"] is None
    assert results["too_big"]["error"] == "RuntimeError: can't allocate"
    assert "exited (code -9) (SIGKILL" in results["killed"]["error"]
    assert results["last"]["error"] is None and len(results["last"]["timed"]) == 2
    assert len(ours) == (0 if standalone else 4)  # one of our steps per configuration whose trainer was built
