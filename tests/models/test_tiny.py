"""The tiny random SmolLM2-family model: deterministic, small, with SmolLM2's tokenizer and template."""

import json

import torch
from safetensors.torch import load_file

from pettingllms.models import build_tiny_model, load_model, load_tokenizer
from pettingllms.models.aliases import MANIFEST


def _weights(directory):
    return load_file(str(directory / "model.safetensors"))


def test_same_seed_builds_identical_weights_and_other_seeds_differ(tmp_path, smollm2_dir):
    first = build_tiny_model(tmp_path / "a", seed=0, tokenizer_dir=smollm2_dir)
    second = build_tiny_model(tmp_path / "b", seed=0, tokenizer_dir=smollm2_dir)
    third = build_tiny_model(tmp_path / "c", seed=1, tokenizer_dir=smollm2_dir)
    a, b, c = _weights(first), _weights(second), _weights(third)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_building_does_not_touch_the_global_rng(tmp_path, smollm2_dir):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", tokenizer_dir=smollm2_dir)
    assert torch.equal(torch.rand(3), expected)


def test_alias_model_has_the_documented_shape(tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (64, 2, 4)
    assert config["num_key_value_heads"] == 2, "grouped-query attention, like SmolLM2"
    assert config["tie_word_embeddings"] and config["vocab_size"] == 49152
    assert (tiny_dir / MANIFEST).is_file()
    model = load_model(tiny_dir)
    params = sum(p.numel() for p in model.parameters())
    assert 3.1e6 < params < 3.4e6, params


def test_tiny_model_uses_the_smollm2_tokenizer_and_chat_template(tiny_dir, smollm2_dir):
    tiny, smol = load_tokenizer(tiny_dir), load_tokenizer(smollm2_dir)
    assert tiny.chat_template == smol.chat_template
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    assert tiny.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == smol.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert (tiny.eos_token_id, tiny.pad_token_id) == (smol.eos_token_id, smol.pad_token_id)
