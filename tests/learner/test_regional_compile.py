"""``optim.compile``: the decoder layers' forward compiled for the learner's passes (``models/compile.py``).

The compiled learner gives the eager learner's log-probs and gradients: a full model, LoRA adapters switching
under bf16 autocast, gradient checkpointing around the compiled layers, and the Qwen3-1.7B replica's architecture
(grouped K/V, q/k norms) with the chunked head. One compiled graph serves every layer and every micro-batch length;
outside the learner's passes the layers run their own forward, so the transformers engine that generates with the
same module is never compiled. FlexAttention inside the compiled layers is a CUDA path (inductor's CPU template for
it fails to build in torch 2.13, and FlexAttention cannot train on CPU anyway): refused here, measured by
``benchmarks/gpu_learner.py``'s ``compiled`` case.

Lanes: every test that compiles is in the slow lane (inductor's first compile in a process costs 30-45 s on the
2-core CPU, each variant seconds more, which ``make test`` cannot spare); the refusals stay in the default lane, and
CI's benchmark lane compiles too (``benchmarks/learner_compile.py --quick``: the same log-probs as eager layers)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._dynamo.utils import counters

from pettingllms.core.errors import ConfigError
from pettingllms.learner import PolicyLearner
from pettingllms.models.layers import decoder_layers
from settings_support import kl_penalty, learner_config
from test_flex_attention import _qwen3_replica
from test_learner_packing import tree_samples

ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0, 1.5, -0.7]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from nothing (graphs of another test's model would be reused and not counted)."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _update(model, compiled: bool, samples, **config):
    learner = PolicyLearner(model, learner_config(total_steps=1, compile=compiled, **config),
                            adapter_names=tuple(getattr(model, "peft_config", {})))
    logprobs = learner.compute_logprobs(samples)
    metrics = learner.accumulate_gradients(samples, ADVANTAGES[:len(samples)])
    return logprobs, metrics, _grads(model)


@pytest.mark.slow
def test_log_probs_and_gradients_equal_the_eager_learners_with_one_graph_for_every_layer_and_length(make_model,
                                                                                                   make_sample):
    """Two layers and micro-batches of several lengths and row counts, no-grad and training passes: the layer's
    code is compiled once per grad mode and row-count kind (dynamo specialises a dimension of size 1), never once per
    layer or per length, and gives the eager learner's numbers."""
    samples = tree_samples(make_sample, seed=1)
    eager = _update(make_model(0), False, samples, micro_batch_max_tokens=40)  # several micro-batches
    model = make_model(0)
    compiled = _update(model, True, samples, micro_batch_max_tokens=40)
    assert len(decoder_layers(model)) == 2
    assert 1 <= counters["stats"]["unique_graphs"] <= 2 * 2  # (no grad, training) x (one row, several rows)
    for got, expected in zip(compiled[0], eager[0]):
        assert len(got) == len(expected) > 0
        assert got == pytest.approx(expected, abs=1e-5)
    assert compiled[1]["pg_loss"] == pytest.approx(eager[1]["pg_loss"], rel=1e-5)
    assert eager[2].keys() == compiled[2].keys()
    for name in eager[2]:
        torch.testing.assert_close(compiled[2][name], eager[2][name], rtol=1e-4, atol=1e-7, msg=name)
    for layer in decoder_layers(model):  # outside the passes every layer has its own forward again
        assert "forward" not in vars(layer)
    # and dynamo has the settings it had: the raised limit and the failure at it hold inside the passes only
    assert torch._dynamo.config.recompile_limit == 8 and torch._dynamo.config.fail_on_recompile_limit_hit is False


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-4), ("bfloat16", 1e-2)])
def test_lora_adapters_switching_under_each_compute_dtype(make_lora_model, make_sample, dtype, tolerance):
    samples = [dataclasses.replace(s, adapter="alice" if i % 2 else "bob", agent="alice" if i % 2 else "bob")
               for i, s in enumerate(tree_samples(make_sample, seed=2))]
    eager = _update(make_lora_model(0), False, samples, dtype=dtype)
    compiled = _update(make_lora_model(0), True, samples, dtype=dtype)
    assert counters["stats"]["unique_graphs"] >= 2  # one variant per adapter at least
    moved = [name for name in eager[2] if eager[2][name].norm() > 0]
    assert any("alice" in name for name in moved) and any("bob" in name for name in moved)
    for name in moved:  # bf16: the same kernels in a different order, agreement to bf16's precision
        error = (compiled[2][name] - eager[2][name]).norm() / eager[2][name].norm()
        assert error < tolerance, (name, float(error))


@pytest.mark.slow
def test_gradient_checkpointing_around_the_compiled_layers(make_model, make_sample):
    samples = tree_samples(make_sample, seed=3)
    eager = _update(make_model(0), False, samples)
    compiled = _update(make_model(0), True, samples, gradient_checkpointing=True)
    for name in eager[2]:
        torch.testing.assert_close(compiled[2][name], eager[2][name], rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.slow
def test_the_qwen3_replica_with_the_chunked_head(make_sample):
    model = _qwen3_replica()
    samples = tree_samples(make_sample)
    config = dict(total_steps=1, attention="sdpa", logprob_chunk_tokens=16)
    eager = PolicyLearner(model, learner_config(**config, compile=False)).compute_logprobs(samples)
    compiled = PolicyLearner(model, learner_config(**config, compile=True)).compute_logprobs(samples)
    assert counters["stats"]["unique_graphs"] >= 1
    for got, expected in zip(compiled, eager):
        assert len(got) == len(expected) > 0
        assert got == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_the_engine_generating_with_the_same_module_is_not_compiled(make_model, make_sample):
    model = make_model(0)
    learner = PolicyLearner(model, learner_config(total_steps=1, compile=True))
    learner.compute_logprobs(tree_samples(make_sample))
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    with torch.no_grad():
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert counters["stats"]["unique_graphs"] == graphs


def test_a_model_without_named_decoder_layers_is_refused():
    class Bare(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

    from pettingllms.models.compile import CompiledLayers

    with pytest.raises(ValueError, match="optim.compile=false"):
        CompiledLayers(Bare())


def test_flex_attention_compiled_on_cpu_is_refused_with_the_fix(make_model):
    with pytest.raises(ConfigError, match="optim.compile=true with optim.attention=flex needs CUDA"):
        PolicyLearner(make_model(0), learner_config(total_steps=1, compile=True, attention="flex"))


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_the_kl_reference_runs_compiled_too_so_at_step_0_it_equals_the_policy_exactly(make_model, make_lora_model,
                                                                                        make_sample, lora):
    """A full model's reference is a deep copy (compiled like the policy); a LoRA policy's is the same model with its
    adapters off (through the policy's compiled layers)."""
    model = make_lora_model(0) if lora else make_model(0)
    samples = tree_samples(make_sample, seed=4)
    if lora:
        samples = [dataclasses.replace(s, adapter="alice", agent="alice") for s in samples]
    learner = PolicyLearner(model, learner_config(total_steps=1, compile=True, kl=kl_penalty(coef=0.1)),
                            adapter_names=tuple(getattr(model, "peft_config", {})))
    by_stream = {("alice" if lora else None): list(range(len(samples)))}
    policy = learner.forward_pass.log_probs_no_grad(samples, by_stream)
    reference = learner.forward_pass.log_probs_no_grad(samples, by_stream, reference=True)
    assert (learner.forward_pass.compiled_reference is not None) is (not lora)
    for i in policy:
        assert torch.equal(policy[i], reference[i])


def test_the_raised_limit_grows_with_the_adapters():
    from pettingllms.models.compile import recompile_limit

    # measured: 2 adapters needed 16 variants, 4 needed 28, 8 needed 52 (about 6 each and 4 more)
    assert all(recompile_limit(n) >= 4 + 6 * n + 4 for n in (0, 2, 4, 8, 16, 32))


def test_a_layer_whose_forward_a_hook_replaced_is_refused(make_model):
    from pettingllms.models.compile import CompiledLayers

    model = make_model(0)
    layer = decoder_layers(model)[1]
    layer.forward = lambda *args, **kwargs: type(layer).forward(layer, *args, **kwargs)
    with pytest.raises(ValueError, match="decoder layer 1 .* forward replaced"):
        CompiledLayers(model)


@pytest.mark.slow
def test_a_deep_copy_taken_inside_the_passes_runs_its_own_weights(make_model):
    import copy

    from pettingllms.models.compile import CompiledLayers

    model = make_model(0)
    compiled = CompiledLayers(model)
    ids = torch.tensor([[5, 6, 7, 8]])
    with compiled.active(), torch.no_grad():
        twin = copy.deepcopy(model)
        for p in twin.parameters():
            p.zero_()
        assert not torch.equal(twin(ids).logits, model(ids).logits)
