"""Prefix packing changes the cost of a forward, never its values: log-probs, entropies and gradients equal those
of one row per sample (and verl's ``logprobs_from_logits`` on plain single-sequence forwards), for the K branches of
tree nodes and for prompts that share only a prefix (turns, episodes and problems behind one system prompt)."""

import pytest
import torch

from pettingllms.algo.verl_adapter import logprobs_from_logits
from pettingllms.learner import PolicyLearner
from settings_support import learner_config


def tree_samples(make_sample, seed=0):
    """Two tree nodes of 4 branches sharing a prompt each, plus two unshared samples; lengths vary."""
    generator = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(1, 256, (n,), generator=generator).tolist()

    samples = []
    for node, prompt_len in enumerate((9, 6)):
        prompt = ids(prompt_len)
        for branch in range(4):
            samples.append(make_sample(prompt, ids(2 + 2 * branch + node), index=len(samples)))
    samples.append(make_sample(ids(5), ids(4), index=len(samples)))
    samples.append(make_sample(ids(7), ids(1), index=len(samples)))
    return samples


def trie_samples(make_sample, seed=0):
    """Multi-turn prompts behind one system prompt, as trajectory episodes make them: two problems; per problem two
    episodes whose turn-2 prompts extend their turn-1 prompt (its response and an observation appended), a turn-1
    prompt sampled twice (a shared prompt), and one unrelated sample. Rows then hold several distinct prompts."""
    generator = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(1, 256, (n,), generator=generator).tolist()

    system, samples = ids(12), []
    for _problem in range(2):
        first = system + ids(3)
        for _episode in range(2):
            response = ids(3)
            samples.append(make_sample(first, response, index=len(samples)))
            samples.append(make_sample(first + response + ids(2), ids(4), index=len(samples)))
        samples.append(make_sample(first, ids(2), index=len(samples)))
    samples.append(make_sample(ids(6), ids(3), index=len(samples)))
    return samples


SAMPLE_SETS = {"tree_nodes": tree_samples, "prompt_tries": trie_samples}


def test_trie_samples_put_several_prompts_in_one_row(make_sample):
    from pettingllms.learner.packing import pack_by_prefix

    samples = trie_samples(make_sample)
    units = pack_by_prefix(samples)
    assert len(units) == 2 and len({samples[i].prompt_ids for i in units[0]}) == 6  # 2 turn-1 + 4 turn-2 prompts


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("shape", SAMPLE_SETS)
def test_packed_log_probs_equal_one_forward_per_sample_and_verl(make_model, make_sample, shape):
    samples = SAMPLE_SETS[shape](make_sample)
    model = make_model(0)
    got = PolicyLearner(model, learner_config(total_steps=1)).compute_logprobs(samples)
    with torch.no_grad():
        for sample, values in zip(samples, got):
            ids = torch.tensor([list(sample.prompt_ids) + list(sample.response_ids)])
            p = len(sample.prompt_ids)
            logits = model(ids).logits[0, p - 1 : -1].float()
            expected = logprobs_from_logits(logits, torch.tensor(sample.response_ids))
            assert values == pytest.approx(expected.tolist(), abs=1e-5)


@pytest.mark.parametrize("shape", SAMPLE_SETS)
@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_packed_and_unpacked_updates_give_the_same_gradient_and_metrics(make_model, make_sample, entropy_coeff,
                                                                        shape):
    samples = SAMPLE_SETS[shape](make_sample, seed=1)
    advantages = [1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0, 1.5, -0.7, 0.3][: len(samples)]
    grads, metrics = [], []
    for pack in (True, False):
        model = make_model(0)
        config = learner_config(total_steps=1, pack_shared_prompts=pack, entropy_coeff=entropy_coeff)
        metrics.append(PolicyLearner(model, config).accumulate_gradients(samples, advantages))
        grads.append(_grads(model))
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6, msg=name)
    for key in ("pg_loss", "entropy"):
        assert metrics[0][key] == pytest.approx(metrics[1][key], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("shape", SAMPLE_SETS)
def test_packing_holds_under_grouped_query_attention_and_a_small_token_budget(make_sample, shape):
    """The attention our model loader installs (pettingllms_sdpa, GQA without repeat_kv) takes the 4-D mask too;
    a budget smaller than a node splits it into several rows (each repeating the prompt) with the same values."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from pettingllms.models.attention import use_grouped_attention

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    model = use_grouped_attention(LlamaForCausalLM(config))
    samples = SAMPLE_SETS[shape](make_sample, seed=2)
    results = [
        PolicyLearner(model, learner_config(total_steps=1, pack_shared_prompts=pack, micro_batch_max_tokens=budget))
        .compute_logprobs(samples)
        for pack, budget in ((False, 4096), (True, 4096), (True, 20))
    ]
    for values in results[1:]:
        for got, expected in zip(values, results[0]):
            assert got == pytest.approx(expected, abs=1e-5)
