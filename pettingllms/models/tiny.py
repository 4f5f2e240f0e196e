"""A tiny randomly initialised SmolLM2-family model for fast tests.

Same architecture family (Llama, grouped-query attention, tied embeddings, same RoPE settings and
special token ids) and the exact SmolLM2 tokenizer and chat template, with a tiny trunk: at the default
shape (hidden 64, 2 layers, 4 heads) it has about 3.2M parameters, almost all in the 49152 x 64 embedding.
Building it is deterministic given the seed. The alias ``tiny-random-smollm2`` resolves to a cached copy.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from pettingllms.core.errors import ConfigError
from pettingllms.models import aliases
from pettingllms.core.atomic import atomic_directory

DEFAULT_TINY_SHAPE = {"hidden": 64, "layers": 2, "heads": 4, "seed": 0}


def build_tiny_model(
    dest: Path | str,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    *,
    tokenizer_dir: Path | str | None = None,
) -> Path:
    """Build the tiny model into ``dest`` (atomically, replacing what was there) and return ``dest``.

    tokenizer_dir: a SmolLM2 model directory to take the tokenizer and base config from; default: the
    converted ``smollm2-135m-instruct`` alias (converted on first use).
    """
    if tokenizer_dir is None:
        tokenizer_dir = aliases.smollm2_dir()
    dest = Path(dest)
    with atomic_directory(dest, replace=True) as tmp:
        write_tiny_model(tmp, tokenizer_dir=Path(tokenizer_dir), hidden=hidden, layers=layers, heads=heads, seed=seed)
    return dest


def write_tiny_model(dest: Path, *, tokenizer_dir: Path, hidden: int, layers: int, heads: int, seed: int) -> None:
    """Write config, random weights (seeded) and tokenizer into the existing directory ``dest``."""
    if hidden % heads:
        raise ConfigError(f"tiny model: hidden ({hidden}) must be divisible by heads ({heads})")
    config = AutoConfig.from_pretrained(tokenizer_dir)
    config.hidden_size = hidden
    config.intermediate_size = 4 * hidden
    config.num_hidden_layers = layers
    config.num_attention_heads = heads
    # Grouped-query attention like SmolLM2 (9 query heads, 3 kv heads) so the same code paths run.
    config.num_key_value_heads = heads // 2 if heads % 2 == 0 else heads
    config.head_dim = hidden // heads
    config.name_or_path = f"tiny-random-smollm2-h{hidden}-l{layers}-a{heads}-s{seed}"

    with torch.random.fork_rng(devices=[]):  # never disturb the caller's global RNG
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig.from_pretrained(tokenizer_dir)
    model.save_pretrained(dest, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(dest)


def tiny_recipe() -> tuple[dict, aliases.AliasBuild]:
    """The ``tiny-random-smollm2`` alias: the default shape, with the converted SmolLM2's tokenizer."""
    source = {"builder": "build_tiny_model", **DEFAULT_TINY_SHAPE, "tokenizer": aliases.SMOLLM2_ALIAS}

    def build(dest: Path, cache_dir: Path | None) -> None:
        write_tiny_model(dest, tokenizer_dir=aliases.smollm2_dir(cache_dir), **DEFAULT_TINY_SHAPE)

    return source, build
