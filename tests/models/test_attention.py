"""The grouped-query SDPA attention gives transformers' eager attention's values and gradients."""

import torch
from transformers import AutoModelForCausalLM

from pettingllms.models import load_model
from pettingllms.models.attention import ATTENTION_NAME


def _padded_batch():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 49152, (3, 17), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :6] = 0
    mask[1, :1] = 0
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def test_load_model_uses_grouped_attention_and_matches_eager(tiny_dir):
    ours = load_model(tiny_dir)
    assert ours.config._attn_implementation == ATTENTION_NAME
    eager = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="eager")
    batch = _padded_batch()
    real = batch["attention_mask"].bool()

    ours_logits = ours(**batch).logits
    eager_logits = eager(**batch).logits
    torch.testing.assert_close(ours_logits[real], eager_logits[real], rtol=0, atol=1e-5)

    ours_logits[real].logsumexp(-1).sum().backward()
    eager_logits[real].logsumexp(-1).sum().backward()
    eager_params = dict(eager.named_parameters())
    for name, param in ours.named_parameters():
        torch.testing.assert_close(param.grad, eager_params[name].grad, rtol=1e-4, atol=1e-5, msg=name)


def _gemma2(softcap: float):
    """A tiny Gemma 2 (alternating sliding and full layers) whose attention scores are large enough for the
    soft-cap to matter (random init gives scores near 0, where tanh(x / cap) * cap is x)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                          attn_logit_softcapping=softcap, pad_token_id=0)
    model = Gemma2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                param.mul_(30)
    return model


def test_attention_logit_softcapping_is_applied_as_eager_does():
    """Gemma 2 caps its attention logits; SDPA cannot, and transformers' own "sdpa" silently skips it."""
    from pettingllms.models.attention import register_attention

    model = _gemma2(softcap=0.5)
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row: the mask path as well as the unmasked one
    logits = {}
    for implementation in ("eager", register_attention(), "sdpa"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            logits[implementation] = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(logits[ATTENTION_NAME][real], logits["eager"][real], rtol=0, atol=1e-5)
    assert (logits["sdpa"][real] - logits["eager"][real]).abs().max() > 1e-2  # what skipping the cap costs


def test_attention_sinks_are_refused():
    import pytest

    from pettingllms.models.attention import grouped_sdpa_attention

    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(NotImplementedError, match="attention sinks"):
        grouped_sdpa_attention(torch.nn.Module(), q, q, q, None, s_aux=torch.zeros(2))


def test_an_explicit_mask_on_cuda_never_runs_cudnn_attention(monkeypatch):
    """On H100 with torch 2.13 SDPA can choose cuDNN attention for an explicit mask, whose backward has a NaN bug
    (pytorch#196678). The attention function restricts the kernels on CUDA whenever a mask is passed; without a
    mask, or on CPU, SDPA chooses freely. (Checked here by recording the restriction: no GPU on this machine.)"""
    import contextlib

    import torch
    from torch.nn.attention import SDPBackend

    from pettingllms.models import attention

    assert SDPBackend.CUDNN_ATTENTION not in attention.masked_sdpa_backends()
    assert SDPBackend.EFFICIENT_ATTENTION in attention.masked_sdpa_backends()
    recorded = []
    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel",
                        lambda backends: recorded.append(list(backends)) or contextlib.nullcontext())
    attention.sdpa_backends("cuda", has_mask=True).__enter__()
    assert recorded == [attention.masked_sdpa_backends()]
    for device, mask in (("cuda", False), ("cpu", True)):
        assert isinstance(attention.sdpa_backends(device, has_mask=mask), contextlib.nullcontext)
    assert len(recorded) == 1


def test_the_attention_function_asks_for_the_restriction_with_its_device_and_mask(monkeypatch):
    import contextlib

    import torch

    from pettingllms.models import attention

    asked = []
    monkeypatch.setattr(attention, "sdpa_backends", lambda device, has_mask: asked.append((device, has_mask))
                        or contextlib.nullcontext())
    module = torch.nn.Module()
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()
    attention.grouped_sdpa_attention(module, q, k, k, mask)
    attention.grouped_sdpa_attention(module, q, k, k, None)
    assert asked == [("cpu", True), ("cpu", False)]


def test_a_masked_grouped_query_call_on_cuda_expands_heads_for_the_efficient_kernel(monkeypatch):
    """SDPA's enable_gqa runs only on flash (no mask) or math on CUDA; with a mask the function expands K/V itself,
    and the result equals grouped-query attention. (CUDA is simulated: the device check is patched.)"""
    import torch
    import torch.nn.functional as F

    from pettingllms.models import attention

    calls = []
    real = F.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        calls.append((k.shape[1], kwargs["enable_gqa"]))
        return real(q, k, v, **kwargs)

    class CudaTensor(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda")

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", recording)
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril()
    expected, _ = attention.grouped_sdpa_attention(torch.nn.Module(), q, k, v, mask)
    got, _ = attention.grouped_sdpa_attention(torch.nn.Module(), q.as_subclass(CudaTensor), k, v, mask)
    assert calls == [(2, True), (4, False)]
    torch.testing.assert_close(got.as_subclass(torch.Tensor), expected)
