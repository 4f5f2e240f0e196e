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
