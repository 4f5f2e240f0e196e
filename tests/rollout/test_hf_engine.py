"""HFEngine on the tiny random SmolLM2: exact ids, logprobs, sampling settings, seeds, adapters, eos, errors."""

import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from pettingllms.core.errors import ConfigError  # noqa: E402
from pettingllms.core.types import FINISH_ERROR, FINISH_LENGTH, FINISH_STOP  # noqa: E402
from pettingllms.core.types import GenerationRequest, SamplingParams  # noqa: E402
from pettingllms.models import HFChatCodec, LoraSpec, load_model, resolve_model, use_adapter  # noqa: E402
from pettingllms.rollout.engine import RolloutEngine  # noqa: E402
from pettingllms.rollout.hf_engine import HFEngine  # noqa: E402
from pettingllms.rollout.sampling import draw, sampling_probs  # noqa: E402



@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One thread: the tiny model gains nothing from more, and a shared 2-core machine makes them contend."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
PLAIN = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=12)


@pytest.fixture(scope="module")
def tiny_path():
    return resolve_model("tiny-random-smollm2")


@pytest.fixture(scope="module")
def codec(tiny_path):
    return HFChatCodec.from_pretrained(tiny_path)


@pytest.fixture(scope="module")
def model(tiny_path):
    return load_model(tiny_path)


@pytest.fixture(scope="module")
def prompts():
    """Raw prompts of different lengths (so batches are left-padded) with varied greedy continuations."""
    generator = torch.Generator().manual_seed(7)
    return [tuple(torch.randint(3, 49152, (length,), generator=generator).tolist()) for length in (5, 11, 3, 8)]


def request(rid, prompt, n=1, sampling=GREEDY, adapter=None):
    return GenerationRequest(rid, tuple(prompt), n, sampling, adapter)


def teacher_forced_logprobs(model, prompt, response):
    """log_softmax(raw logits) at each response token, recomputed from scratch without padding."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    predicted = logits[len(prompt) - 1 : -1]
    return torch.log_softmax(predicted, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)


def hf_greedy(model, prompt, max_new_tokens, eos_ids, pad_id):
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([list(prompt)]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(eos_ids),
            pad_token_id=pad_id,
        )
    return out[0, len(prompt) :].tolist()


def test_engine_implements_the_protocol(model, codec):
    assert isinstance(HFEngine(model, codec), RolloutEngine)


def test_text_is_the_decoded_ids_and_every_token_has_a_logprob(model, codec, prompts):
    chat = codec.encode_chat([{"role": "user", "content": "Say something."}])
    results = HFEngine(model, codec, seed=1).generate([request("chat", chat, n=3, sampling=PLAIN)])
    assert [r.request_id for r in results] == ["chat"]
    for completion in results[0].completions:
        assert completion.text == codec.decode(completion.token_ids)
        assert len(completion.logprobs) == len(completion.token_ids) > 0
        assert all(lp <= 0.0 for lp in completion.logprobs)
        assert all(0 <= t < 49152 for t in completion.token_ids)


def test_logprobs_equal_a_teacher_forced_recomputation(model, codec, prompts):
    filtered = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, max_tokens=9)
    requests = [
        request("plain", prompts[0], n=3, sampling=PLAIN),
        request("greedy", prompts[1], n=1, sampling=GREEDY),
        request("filtered", prompts[2], n=2, sampling=filtered),
    ]
    for result, req in zip(HFEngine(model, codec, seed=3).generate(requests), requests):
        assert len(result.completions) == req.n
        for completion in result.completions:
            expected = teacher_forced_logprobs(model, req.prompt_ids, completion.token_ids)
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, rtol=0, atol=1e-4)


def test_per_request_n_and_max_tokens_are_honoured(model, codec, prompts):
    settings = [(1, 1), (3, 4), (5, 9), (2, 6)]
    requests = [
        request(f"r{i}", prompts[i], n=n, sampling=SamplingParams(temperature=1.0, max_tokens=m))
        for i, (n, m) in enumerate(settings)
    ]
    results = HFEngine(model, codec, seed=0).generate(requests)
    assert [r.request_id for r in results] == ["r0", "r1", "r2", "r3"]
    for result, (n, max_tokens) in zip(results, settings):
        assert len(result.completions) == n
        for completion in result.completions:
            if completion.finish_reason == FINISH_LENGTH:
                assert len(completion.token_ids) == max_tokens
            else:  # a random model can still hit eos by chance
                assert completion.finish_reason == FINISH_STOP and len(completion.token_ids) <= max_tokens


def test_greedy_equals_transformers_generate(model, codec, prompts):
    results = HFEngine(model, codec).generate([request(f"g{i}", p) for i, p in enumerate(prompts)])
    continuations = set()
    for result, prompt in zip(results, prompts):
        expected = hf_greedy(model, prompt, GREEDY.max_tokens, codec.eos_token_ids, codec.pad_token_id)
        assert list(result.completions[0].token_ids) == expected
        continuations.add(tuple(expected))
    assert len(continuations) == len(prompts), "prompts must lead to different continuations to test anything"


def test_top_k_1_equals_greedy(model, codec, prompts):
    engine = HFEngine(model, codec, seed=5)
    greedy = engine.generate([request("g", prompts[1], n=1)])[0].completions[0]
    for temperature in (1.0, 0.5):
        top1 = SamplingParams(temperature=temperature, top_k=1, max_tokens=GREEDY.max_tokens)
        for completion in engine.generate([request("k1", prompts[1], n=3, sampling=top1)])[0].completions:
            assert completion.token_ids == greedy.token_ids
            torch.testing.assert_close(torch.tensor(completion.logprobs), torch.tensor(greedy.logprobs))


def _all_ids(results):
    return [c.token_ids for r in results for c in r.completions]


def test_same_rng_state_reproduces_sampling_exactly(model, codec, prompts):
    requests = [request("a", prompts[0], n=4, sampling=PLAIN), request("b", prompts[3], n=2, sampling=PLAIN)]
    engine = HFEngine(model, codec, seed=11)
    state = engine.get_rng_state()
    first = engine.generate(requests)
    second = engine.generate(requests)
    assert _all_ids(first) != _all_ids(second), "the generator advances between calls"
    engine.set_rng_state(state)
    assert engine.generate(requests) == first
    assert HFEngine(model, codec, seed=11).generate(requests) == first
    assert _all_ids(HFEngine(model, codec, seed=12).generate(requests)) != _all_ids(first)


def test_requests_that_repeat_a_prompt_share_one_prefill_and_sample_as_one_request_with_n(model, codec, prompts):
    """The K episodes of a problem ask with one prompt at their first turn (trajectory and independent modes): one
    prefill row serves them all, and they sample exactly as one request with n = K does."""
    repeated = [request(f"e{i}", prompts[1], sampling=PLAIN) for i in range(3)]
    repeated.append(request("other", prompts[0], sampling=PLAIN))
    as_one = [request("all", prompts[1], n=3, sampling=PLAIN), request("other", prompts[0], sampling=PLAIN)]
    shapes = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    try:
        got = HFEngine(model, codec, seed=3).generate(repeated)
    finally:
        hook.remove()
    assert shapes[0] == (2, len(prompts[1]))  # the prefill: one row per distinct prompt
    expected = HFEngine(model, codec, seed=3).generate(as_one)
    assert [r.request_id for r in got] == ["e0", "e1", "e2", "other"]
    assert [c for r in got[:3] for c in r.completions] == list(expected[0].completions)
    assert got[3] == expected[1]


def test_sampling_never_touches_the_global_rng(model, codec, prompts):
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    HFEngine(model, codec, seed=1).generate([request("a", prompts[0], n=2, sampling=PLAIN)])
    assert torch.equal(torch.rand(2), expected)


@pytest.fixture(scope="module")
def lora_model(tiny_path):
    torch.manual_seed(0)
    model = load_model(tiny_path, lora=LoraSpec(rank=4, alpha=8.0), adapter_names=("alice", "bob"))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator))
    return model


def test_each_adapter_generates_with_its_own_weights(lora_model, codec, prompts):
    names = ("alice", "bob", None)
    requests = [request(str(name), prompts[1], adapter=name) for name in names]
    requests.append(request("alice-again", prompts[0], adapter="alice"))
    results = HFEngine(lora_model, codec).generate(requests)
    assert [r.request_id for r in results] == ["alice", "bob", "None", "alice-again"]
    outputs = {name: result.completions[0] for name, result in zip(names, results)}
    assert len({o.token_ids for o in outputs.values()}) == 3, "different weights, different greedy paths"
    for req, result in zip(requests, results):
        completion = result.completions[0]
        with use_adapter(lora_model, req.adapter):
            expected = teacher_forced_logprobs(lora_model, req.prompt_ids, completion.token_ids)
            reference = hf_greedy(lora_model, req.prompt_ids, GREEDY.max_tokens, codec.eos_token_ids, 0)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, rtol=0, atol=1e-4)
        assert list(completion.token_ids) == reference


def test_one_call_decodes_every_adapters_rows_together(lora_model, codec, prompts):
    """An L2 call holding every agent's requests is one batch (one model call per decode step), not one decode loop
    per adapter; each row still gets its own adapter's greedy tokens (as generating it alone gives)."""
    requests = [request(str(name), prompts[1], n=2, adapter=name) for name in ("alice", "bob", None)]
    engine = HFEngine(lora_model, codec)
    calls = []
    hook = lora_model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        results = engine.generate(requests)
    finally:
        hook.remove()
    longest = max(len(c.token_ids) for r in results for c in r.completions)
    assert len(calls) == longest  # the prefill gives the first token, then one call per further token
    for req, result in zip(requests, results):
        alone = engine.generate([req])[0].completions[0]
        assert [c.token_ids for c in result.completions] == [alone.token_ids] * 2
        torch.testing.assert_close(torch.tensor(result.completions[0].logprobs), torch.tensor(alone.logprobs),
                                   rtol=0, atol=1e-5)


def test_unknown_adapter_is_a_configuration_error(lora_model, model, codec, prompts):
    with pytest.raises(ConfigError, match="carol"):
        HFEngine(lora_model, codec).generate([request("x", prompts[0], adapter="carol")])
    with pytest.raises(ConfigError, match="alice"):
        HFEngine(model, codec).generate([request("x", prompts[0], adapter="alice")])


def _stop_at(codec, token):
    return HFChatCodec(codec.tokenizer, eos_token_ids=set(codec.eos_token_ids) | {token})


def test_eos_stops_a_row_and_the_other_rows_carry_on_unchanged(model, codec, prompts):
    long_prompt, short_prompt = prompts[1], prompts[2]  # 11 and 3 tokens: the short one is left-padded
    greedy_long = HFEngine(model, codec).generate([request("l", long_prompt)])[0].completions[0]
    ids = greedy_long.token_ids
    # Stop at the latest token that first appears there (a random model tends to repeat itself).
    stop_at = max(i for i in range(len(ids) - 1) if ids[i] not in ids[:i])
    engine = HFEngine(model, _stop_at(codec, ids[stop_at]))

    results = engine.generate([request("long", long_prompt), request("short", short_prompt)])
    stopped = results[0].completions[0]
    assert stopped.finish_reason == FINISH_STOP
    assert stopped.token_ids == ids[: stop_at + 1], "the eos token is kept"
    assert stopped.logprobs == pytest.approx(greedy_long.logprobs[: stop_at + 1], abs=1e-5)

    # The short row lost its batch-mate (and the padding only it needed) mid-way; it must match a solo
    # run exactly, ids and logprobs.
    carried = results[1].completions[0]
    alone = engine.generate([request("short", short_prompt)])[0].completions[0]
    assert carried.token_ids == alone.token_ids and len(carried.token_ids) > stop_at + 1
    torch.testing.assert_close(torch.tensor(carried.logprobs), torch.tensor(alone.logprobs), rtol=0, atol=1e-4)
    expected = teacher_forced_logprobs(model, short_prompt, carried.token_ids)
    torch.testing.assert_close(torch.tensor(carried.logprobs), expected, rtol=0, atol=1e-4)


def test_small_budgets_split_batches_and_samples_without_changing_results(model, codec, prompts):
    requests = [request(f"r{i}", p, n=3) for i, p in enumerate(prompts)]
    roomy = HFEngine(model, codec).generate(requests)
    tight_engine = HFEngine(model, codec, max_batch_tokens=24, max_batch_rows=2)
    units = [unit for i, r in enumerate(requests) for unit in tight_engine._units(i, r)]
    assert len(tight_engine._plan_batches(units)) == 12, "24 tokens fit one row: every sample runs alone"
    tight = tight_engine.generate(requests)
    assert [[c.token_ids for c in r.completions] for r in tight] == [
        [c.token_ids for c in r.completions] for r in roomy
    ]
    for a, b in zip(tight, roomy):
        for x, y in zip(a.completions, b.completions):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), rtol=0, atol=1e-4)


def test_a_bad_prompt_fails_alone(model, codec, prompts, caplog):
    requests = [request("ok", prompts[0]), request("bad", (5, 10**6), n=2), request("ok2", prompts[1])]
    with caplog.at_level(logging.ERROR):
        results = HFEngine(model, codec).generate(requests)
    assert [c.finish_reason for c in results[1].completions] == [FINISH_ERROR, FINISH_ERROR]
    assert all(c.failed and c.token_ids == () for c in results[1].completions)
    assert not results[0].completions[0].failed and not results[2].completions[0].failed
    assert "bad" in caplog.text


class _Poisoned(torch.nn.Module):
    """Wraps a model; raises on any forward whose input contains the poison token."""

    def __init__(self, inner, poison):
        super().__init__()
        self.inner, self.poison = inner, poison
        self.config = inner.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, **kwargs):
        if bool((input_ids == self.poison).any()):
            raise RuntimeError("poisoned batch")
        return self.inner(input_ids=input_ids, **kwargs)


def test_a_request_that_crashes_the_model_fails_alone_and_is_logged(model, codec, prompts, caplog):
    poison = 4242
    engine = HFEngine(_Poisoned(model, poison), codec)
    requests = [request("ok", prompts[0]), request("poison", prompts[2] + (poison,), n=2), request("ok2", prompts[3])]
    with caplog.at_level(logging.ERROR):
        results = engine.generate(requests)
    assert [c.finish_reason for c in results[1].completions] == [FINISH_ERROR, FINISH_ERROR]
    clean = HFEngine(model, codec).generate([requests[0], requests[2]])
    for got, expected in ((results[0], clean[0]), (results[2], clean[1])):
        assert got.completions[0].token_ids == expected.completions[0].token_ids
        assert got.completions[0].logprobs == pytest.approx(expected.completions[0].logprobs, abs=1e-4)
    assert "poisoned batch" in caplog.text and "poison" in caplog.text


def test_generation_restores_train_mode_and_records_no_gradients(model, codec, prompts):
    model.train()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    try:
        HFEngine(model, codec).generate([request("a", prompts[0], n=2, sampling=PLAIN)])
        assert all(m.training for m in model.modules())
        assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
        assert all(p.grad is None for p in model.parameters())
    finally:
        model.eval()


# ---- the sampling maths, on small explicit distributions ----


def _reference_probs(scaled, k, p):
    """Straightforward full-sort top-k then top-p, one row at a time."""
    out = torch.zeros_like(scaled)
    for row in range(scaled.shape[0]):
        values, order = scaled[row].sort(descending=True)
        keep = len(values) if k[row] == 0 else int(k[row])
        probs = torch.softmax(values[:keep], -1)
        if p[row] < 1.0:
            cumulative = probs.cumsum(0) - probs
            keep = max(1, int((cumulative < p[row]).sum()))
            probs = probs[:keep] / probs[:keep].sum()
        out[row, order[: len(probs)]] = probs
    return out


@pytest.mark.parametrize("vocab", [50, 3000])  # 3000 > the nucleus candidate window: both code paths
def test_sampling_probs_match_a_plain_reference(vocab):
    generator = torch.Generator().manual_seed(0)
    scaled = torch.randn(6, vocab, generator=generator) * torch.tensor([[0.5], [4.0], [1.0], [8.0], [2.0], [0.1]])
    top_k = torch.tensor([0, 0, 7, 0, 20, 0])
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5, 0.8, 0.95])
    torch.testing.assert_close(sampling_probs(scaled, top_k, top_p), _reference_probs(scaled, top_k, top_p))


def test_draw_follows_the_distribution_and_never_picks_zero_probability():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(20000, 1)
    picks = draw(probs, torch.Generator().manual_seed(0))
    counts = torch.bincount(picks, minlength=6).float() / len(picks)
    assert counts[0] == counts[2] == counts[5] == 0
    torch.testing.assert_close(counts, probs[0], rtol=0, atol=0.015)


def test_draw_never_runs_off_the_end_onto_a_zero_probability_token(monkeypatch):
    probs = torch.tensor([[0.25, 0.75, 0.0, 0.0], [0.5, 0.0, 0.5, 0.0]])
    # u = 1.0 is the rounding worst case (u * total == total): searchsorted points past the last entry.
    monkeypatch.setattr(torch, "rand", lambda size, generator=None, dtype=None: torch.ones(size, dtype=dtype))
    assert draw(probs, torch.Generator()).tolist() == [1, 2]


def test_bfloat16_model_generates_with_float32_logprobs(tiny_path, codec, prompts):
    model = load_model(tiny_path, dtype="bfloat16")
    requests = [request("a", prompts[1], n=2, sampling=PLAIN), request("b", prompts[2], n=2, sampling=PLAIN)]
    for req, result in zip(requests, HFEngine(model, codec, seed=0).generate(requests)):
        for completion in result.completions:
            # bf16 matmuls differ in the last bits between a padded batch and a lone sequence (~2e-3 seen).
            expected = teacher_forced_logprobs(model, req.prompt_ids, completion.token_ids)
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, rtol=0, atol=2e-2)


@pytest.mark.slow
def test_packaged_smollm2_greedy_matches_generate_and_stops_at_im_end():
    path = resolve_model("smollm2-135m-instruct")
    model, codec = load_model(path), HFChatCodec.from_pretrained(path)
    questions = ["What is 2+2? Reply with just the number.", "Write a haiku about the sea."]
    greedy = SamplingParams(temperature=0.0, max_tokens=48)
    requests = [
        request(str(i), codec.encode_chat([{"role": "user", "content": q}]), sampling=greedy)
        for i, q in enumerate(questions)
    ]
    results = HFEngine(model, codec).generate(requests)
    answer = results[0].completions[0]
    assert answer.finish_reason == FINISH_STOP and answer.token_ids[-1] == 2 and "4" in answer.text
    for req, result in zip(requests, results):
        expected = hf_greedy(model, req.prompt_ids, 48, codec.eos_token_ids, codec.pad_token_id)
        assert list(result.completions[0].token_ids) == expected
