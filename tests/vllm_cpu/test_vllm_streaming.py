"""vLLM's engine loop (``VLLMEngine(continuous=True)``, the streaming rollout): concurrent calls share one engine,
each is answered when its own requests finish, and what comes back is what vLLM's offline ``generate`` gives: the
model's own tokens with their exact logprobs. Opt-in lane: ``make test-vllm``."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from pettingllms.core.types import SamplingParams

from conftest import CONTEXT
from test_vllm_engine import LOGPROB_ATOL, prompts, request, teacher_forced_logprobs

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(1800)]

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def continuous_engine(tiny_dir, codec):
    from pettingllms.rollout.vllm import VLLMEngine

    engine = VLLMEngine(tiny_dir, dtype="float32", seed=0, max_model_len=CONTEXT, codec=codec, continuous=True,
                        llm_options={"enforce_eager": True, "block_size": 32})
    yield engine
    engine.close()


def test_a_short_call_is_answered_while_a_long_one_is_still_generating(continuous_engine):
    long_prompt, short_prompt = prompts(2)
    finished: dict[str, float] = {}
    results = {}

    def call(name, prompt, n, sampling):
        results[name] = continuous_engine.generate([request(name, prompt, n=n, sampling=sampling)])
        finished[name] = time.monotonic()

    # The long call: greedy (the tiny model never picks eos then), to the context's end: about 200 engine steps.
    long_call = threading.Thread(target=call, args=("long", long_prompt, 1,
                                                    SamplingParams(temperature=0.0, max_tokens=200)))
    long_call.start()
    loop = continuous_engine._loop
    deadline = time.monotonic() + 60
    while loop.steps < 3 and time.monotonic() < deadline:  # the long call is generating
        time.sleep(0.01)
    call("short", short_prompt, 2, SamplingParams(temperature=1.0, max_tokens=2))
    assert "long" not in finished, "the short call waited for the long one"
    long_call.join()
    assert finished["short"] < finished["long"]
    (short,) = results["short"]
    assert short.request_id == "short" and [len(c.token_ids) for c in short.completions] == [2, 2]
    (long,) = results["long"]
    assert [len(c.token_ids) for c in long.completions] == [200]


def test_concurrent_callers_get_their_own_tokens_with_the_models_logprobs(continuous_engine, hf_model):
    batches = [[request(f"c{i}r{j}", p) for j, p in enumerate(prompts(3, seed=10 + i))] for i in range(4)]
    answers: dict[int, list] = {}

    def call(i):
        answers[i] = continuous_engine.generate(batches[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, batch in enumerate(batches):
        assert [r.request_id for r in answers[i]] == [r.request_id for r in batch]
        for req, result in zip(batch, answers[i]):
            (completion,) = result.completions
            assert len(completion.token_ids) == GREEDY.max_tokens
            expected = teacher_forced_logprobs(hf_model, req.prompt_ids, completion.token_ids)
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=LOGPROB_ATOL, rtol=0)
            # greedy: each token is the model's argmax, whoever shared the batch
            assert max(completion.logprobs) <= 0.0


def test_greedy_answers_equal_the_offline_engines(continuous_engine, engine):
    batch = [request(f"g{j}", p) for j, p in enumerate(prompts(3, seed=3))]
    offline = engine.generate(batch)
    streamed = continuous_engine.generate(batch)
    assert [c.token_ids for r in streamed for c in r.completions] == [c.token_ids for r in offline for c in r.completions]


def test_training_streams_through_the_vllm_engine_loop(tiny_dir, tmp_path):
    """`pettingllms train` with engine=vllm and rollout.streaming=true: two steps; the rollout check holds."""
    import json

    from pettingllms.entry.train import run_training

    state, _ = run_training("train", [
        f"base_models.policy_0.path={tiny_dir}", "base_models.policy_0.engine=vllm",
        "base_models.policy_0.engine_options={max_model_len:256,llm_options:{enforce_eager:true,block_size:32}}",
        "rollout.streaming=true", "env.name=toy_targets", "env.max_turns=2", "rollout.branching=2",
        "training.train_batch_size=2", "training.total_training_steps=2", "training.max_response_length=6",
        "training.val_before_train=false", "training.val_freq=100", "training.export_hf=false",
        "training.plot=false", "training.resume=none", f"training.log_dir={tmp_path}", "training.logger=[]",
        "resources.use_ray=false", "optim.lr=1e-2",
        "+agents.alice.train_sampling.max_tokens=6", "+agents.bob.train_sampling.max_tokens=6",
    ])
    assert [spec.continuous_engine for spec in state.plan.worker_specs] == [True]  # the engine loop served it
    rows = [json.loads(line) for line in (state.run_dir / "summary.log").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) >= 1 and "timing/sync_s" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert row["policy_0/actor/rollout/kl_k3"] < 0.05, row
        assert 0.0 <= row["timing/engine_idle_fraction"] < 1.0
