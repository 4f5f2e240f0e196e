"""``optim.attention=flex``: the learner's packed rows through FlexAttention with block masks made from the rows'
``visible_until`` columns. The block mask is the dense mask element for element (packed tree rows, prompt tries,
padding, sliding windows), and
the log-probs equal the masked SDPA's, on a tiny Llama and on the Qwen3-1.7B replica's architecture (grouped K/V,
q/k norms). FlexAttention has no backward on CPU: training with it here is refused with the fix; its gradients are
checked on a GPU (``benchmarks/gpu_probe.py``, ``benchmarks/gpu_learner.py``)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from pettingllms.core.errors import ConfigError
from pettingllms.learner import PolicyLearner
from pettingllms.learner.batching import build_batch
from pettingllms.learner.masks import AttentionLayout, tree_mask_mod
from settings_support import learner_config
from test_learner_packing import SAMPLE_SETS, tree_samples


def _dense_from_mask_mod(batch, window):
    rows, length = batch.visible_until.shape
    mask_mod = tree_mask_mod(batch.visible_until, batch.position_ids, window)
    return create_mask(mask_mod, rows, 1, length, length, device="cpu")


@pytest.mark.parametrize("shape", SAMPLE_SETS)
@pytest.mark.parametrize("window", [None, 3])
def test_the_block_mask_is_the_dense_mask(make_sample, window, shape):
    samples = SAMPLE_SETS[shape](make_sample)  # tree rows of 4 branches or prompt tries, unshared rows, padding
    batch = build_batch(samples)
    assert batch.num_rows == (4 if shape == "tree_nodes" else 2) and bool((batch.visible_until == -1).any())
    expected = AttentionLayout(window=window).masks(batch.attention_mask, batch.position_ids)
    flex_batch = build_batch(samples, dense_mask=False)  # what the learner builds for flex
    assert flex_batch.attention_mask is None and torch.equal(flex_batch.visible_until, batch.visible_until)
    assert torch.equal(_dense_from_mask_mod(flex_batch, window), expected)


def test_per_layer_type_windows_give_one_block_mask_per_type(make_sample):
    batch = build_batch(tree_samples(make_sample))
    masks = AttentionLayout(window=3, per_layer_type=True).block_masks(batch.visible_until, batch.position_ids)
    assert set(masks) == {"full_attention", "sliding_attention"}
    full, sliding = masks["full_attention"], masks["sliding_attention"]
    assert full.shape == sliding.shape == (4, 1, *batch.attention_mask.shape[-2:])


def _qwen3_replica():
    from transformers import AutoConfig, AutoModelForCausalLM

    from pettingllms.models.replicas import replica_config

    config = dict(replica_config("Qwen/Qwen3-1.7B", "tiny"))
    config.pop("architectures", None)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).float()


@pytest.mark.parametrize("shape", SAMPLE_SETS)
@pytest.mark.parametrize("architecture", ["llama", "qwen3_replica"])
def test_log_probs_equal_the_masked_sdpa(make_model, make_sample, architecture, shape):
    model = make_model(0) if architecture == "llama" else _qwen3_replica()
    vocab = model.config.vocab_size
    samples = SAMPLE_SETS[shape](make_sample)
    if architecture == "qwen3_replica":
        assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped K/V
        assert vocab >= 256
    sdpa = PolicyLearner(model, learner_config(total_steps=1, attention="sdpa")).compute_logprobs(samples)
    flex = PolicyLearner(model, learner_config(total_steps=1, attention="flex")).compute_logprobs(samples)
    for got, expected in zip(flex, sdpa):
        assert len(got) == len(expected) > 0
        assert got == pytest.approx(expected, abs=1e-5)


def test_auto_is_sdpa_on_cpu_and_flex_refuses_to_train_here(make_model, make_sample):
    samples = tree_samples(make_sample)
    auto = PolicyLearner(make_model(0), learner_config(total_steps=1, attention="auto"))
    assert auto.forward_pass.flex is False
    flex = PolicyLearner(make_model(0), learner_config(total_steps=1, attention="flex"))
    assert flex.forward_pass.batch(samples).attention_mask is None  # no L x L mask is built for FlexAttention
    with pytest.raises(ConfigError, match="no backward on CPU.*optim.attention=auto"):
        flex.accumulate_gradients(samples, [1.0] * len(samples))


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="optim.attention"):
        learner_config(total_steps=1, attention="flash")
