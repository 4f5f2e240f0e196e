"""Sliding-window attention in the learner: packed rows with the learner's own masks give the logprobs of a plain
transformers forward, on a Mistral-style model (every layer windowed, one mask) and a Qwen2-style model (one full
and one windowed layer, a mask per layer type) and a Gemma 2 model (alternating layers, soft-capped attention).
Without the window in the mask they differ."""

from __future__ import annotations

import pytest
import torch

from pettingllms.core.errors import ConfigError
from pettingllms.learner import PolicyLearner
from settings_support import learner_config
from pettingllms.learner.masks import AttentionLayout
from pettingllms.models.attention import register_attention

VOCAB, WINDOW = 128, 4


def mistral():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=WINDOW, pad_token_id=0)
    config._attn_implementation = register_attention()
    return MistralForCausalLM(config)


def qwen2_mixed():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=WINDOW,
                         max_window_layers=1, pad_token_id=0)
    config._attn_implementation = register_attention()
    return Qwen2ForCausalLM(config)


def gemma2_soft_capped():
    """Gemma 2: alternating sliding and full layers (a mask per layer type) and soft-capped attention logits."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=WINDOW,
                          attn_logit_softcapping=0.5, pad_token_id=0)
    config._attn_implementation = register_attention()
    model = Gemma2ForCausalLM(config)
    with torch.no_grad():  # scores large enough for the cap to matter
        for name, param in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                param.mul_(30)
    return model


def reference(model, sample) -> torch.Tensor:
    """Plain forward of prompt + response with transformers' eager attention: the model builds its own (windowed)
    masks, and nothing of ours is involved."""
    ids = torch.tensor([list(sample.prompt_ids) + list(sample.response_ids)])
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
    finally:
        model.set_attn_implementation(register_attention())
    start = len(sample.prompt_ids) - 1
    picked = logits[start:start + len(sample.response_ids)]
    return torch.log_softmax(picked, dim=-1).gather(1, torch.tensor(sample.response_ids)[:, None]).squeeze(1)


def samples(make_sample):
    prompt = list(range(10, 22))  # longer than the window, so the window matters
    return [make_sample(prompt, [30, 31, 32, 33, 34, 35], index=0),
            make_sample(prompt, [40, 41, 42, 43, 44], index=1),  # packed into the same row
            make_sample([7, 8, 9], [50, 51, 52, 53, 54, 55, 56], index=2)]


@pytest.mark.parametrize("build, per_layer", [(mistral, False), (qwen2_mixed, True), (gemma2_soft_capped, True)],
                         ids=["mistral", "qwen2-mixed", "gemma2"])
def test_learner_logprobs_equal_a_plain_forward_with_the_window(build, per_layer, make_sample):
    model = build()
    learner = PolicyLearner(model, learner_config(total_steps=1))
    assert learner.forward_pass.attention == AttentionLayout(window=WINDOW, per_layer_type=per_layer)
    batch = samples(make_sample)
    got = learner.compute_logprobs(batch)
    for sample, values in zip(batch, got):
        assert torch.allclose(torch.tensor(values), reference(model, sample), atol=1e-5)
    learner.forward_pass.attention = AttentionLayout()  # the old behaviour: the packed mask without the window
    unwindowed = learner.compute_logprobs(batch)
    assert max(abs(a - b) for a, b in zip(unwindowed[0], reference(model, batch[0]).tolist())) > 1e-3


def test_models_without_a_window_pass_their_mask_unchanged(make_model):
    assert AttentionLayout.of(make_model(0)) == AttentionLayout()


def test_mixed_windows_without_per_layer_masks_are_refused(monkeypatch):
    from pettingllms.learner import masks

    monkeypatch.setattr(masks, "_takes_per_layer_masks", lambda base: False)
    with pytest.raises(ConfigError, match="mixes sliding-window and full-attention layers"):
        AttentionLayout.of(qwen2_mixed())


@pytest.mark.parametrize("build", [mistral, qwen2_mixed, gemma2_soft_capped], ids=["mistral", "qwen2-mixed", "gemma2"])
def test_the_transformers_engine_and_the_learner_agree_on_windowed_models(build, make_sample):
    """The engine decodes with a KV cache, left padding and rows leaving the batch; the learner packs the K samples
    of a prompt into one row. Both must apply the window the same way: the rollout check depends on it."""
    import dataclasses

    from pettingllms.core.types import GenerationRequest, SamplingParams
    from pettingllms.rollout.hf_engine import HFEngine

    class Codec:
        eos_token_ids = frozenset({1})
        pad_token_id = 0

        def decode(self, ids):
            return ""

    model = build()
    prompts = [tuple(range(10, 22)), tuple(range(30, 35))]  # longer and shorter than the window: left padding
    requests = [GenerationRequest(f"r{i}", p, 3, SamplingParams(temperature=1.0, max_tokens=8))
                for i, p in enumerate(prompts)]
    samples = []
    for prompt, result in zip(prompts, HFEngine(model, Codec(), seed=0).generate(requests)):
        for completion in result.completions:
            samples.append(dataclasses.replace(make_sample(prompt, completion.token_ids, index=len(samples)),
                                               response_logprobs=completion.logprobs))
    assert max(len(s.response_ids) for s in samples) > WINDOW
    learner_values = PolicyLearner(model, learner_config(total_steps=1)).compute_logprobs(samples)
    for sample, values in zip(samples, learner_values):
        assert torch.allclose(torch.tensor(values), torch.tensor(sample.response_logprobs), atol=1e-5)


@pytest.mark.parametrize("setting, message", [
    ({"layer_types": ["full_attention", "linear_attention"]}, r"\['linear_attention'\] layers"),
    ({"attention_chunk_size": 8}, "chunked attention"),
])
def test_layer_kinds_masks_cannot_express_are_refused(make_model, setting, message):
    model = make_model(0)
    for key, value in setting.items():
        setattr(model.config, key, value)
    with pytest.raises(ConfigError, match=message):
        PolicyLearner(model, learner_config(total_steps=1))
