"""A dense decoder-only model's shape from its config.json, and the parameter counts the memory plan is made of
(``assembly/memory.py``); ``model_config`` finds that config.json offline: nothing is downloaded or built."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pettingllms.core.errors import ConfigError

MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
KNOWN_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a dense decoder-only model, from its Hugging Face config.json."""

    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qk_norm: bool = False  # Qwen3: an RMSNorm over head_dim on queries and keys
    qkv_bias: bool = False  # biases on q, k, v (Qwen2 always; others with attention_bias)
    o_bias: bool = False  # a bias on o too (attention_bias, except Qwen2)
    mlp_bias: bool = False
    max_positions: int = 0

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "ModelShape":
        """Read a config.json dict. Raises ConfigError for what this arithmetic does not cover (mixture of
        experts, missing keys)."""
        text = config.get("text_config")
        if isinstance(text, Mapping) and "hidden_size" not in config:
            config = {**text, "tie_word_embeddings": config.get("tie_word_embeddings", text.get("tie_word_embeddings"))}
        moe = [key for key in MOE_KEYS if config.get(key)]
        if moe:
            raise ConfigError(f"a mixture-of-experts model ({', '.join(moe)}): the memory plan covers dense models")
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            model_type = str(config.get("model_type", ""))
            bias = bool(config.get("attention_bias", False))
            return cls(
                model_type=model_type,
                hidden=hidden,
                intermediate=int(config["intermediate_size"]),
                layers=int(config["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                vocab=int(config["vocab_size"]),
                # transformers' Llama, Mistral and Qwen config classes default to untied embeddings
                tied=bool(config.get("tie_word_embeddings", False)),
                qk_norm=model_type.startswith("qwen3"),
                qkv_bias=model_type == "qwen2" or bias,  # Qwen2: always on q, k, v; others: attention_bias
                o_bias=bias and model_type != "qwen2",
                mlp_bias=bool(config.get("mlp_bias", False)),
                max_positions=int(config.get("max_position_embeddings") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"config.json lacks what the memory plan needs ({type(exc).__name__}: {exc})") from exc


def layer_parameters(shape: ModelShape) -> int:
    """Parameters of one decoder layer: q/k/v/o (grouped-query: k and v are kv_heads x head_dim wide), Qwen3's q/k
    norms, the gated MLP (gate, up, down) and the two RMSNorms."""
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    attention = h * q + 2 * h * kv + q * h
    if shape.qkv_bias:
        attention += q + 2 * kv
    if shape.o_bias:
        attention += h
    if shape.qk_norm:
        attention += 2 * shape.head_dim
    mlp = 3 * h * i + ((2 * i + h) if shape.mlp_bias else 0)
    return attention + mlp + 2 * h


def root_parameters(shape: ModelShape) -> int:
    """Parameters outside the decoder layers: the embedding, the final norm, and the output head unless tied."""
    embedding = shape.vocab * shape.hidden
    return embedding + shape.hidden + (0 if shape.tied else embedding)


def parameter_count(shape: ModelShape) -> int:
    """All parameters (a tied head counted once), as ``sum(p.numel() for p in model.parameters())``."""
    return shape.layers * layer_parameters(shape) + root_parameters(shape)


def linear_parameters(shape: ModelShape) -> int:
    """Weights that go through a matmul (every linear layer and the output head): what autocast casts."""
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i
    return shape.layers * per_layer + shape.vocab * shape.hidden


LORA_MODULE_DIMS: dict[str, Callable[[ModelShape], tuple[int, int]]] = {
    "q_proj": lambda s: (s.hidden, s.q_dim),
    "k_proj": lambda s: (s.hidden, s.kv_dim),
    "v_proj": lambda s: (s.hidden, s.kv_dim),
    "o_proj": lambda s: (s.q_dim, s.hidden),
    "gate_proj": lambda s: (s.hidden, s.intermediate),
    "up_proj": lambda s: (s.hidden, s.intermediate),
    "down_proj": lambda s: (s.intermediate, s.hidden),
}


def lora_parameters(shape: ModelShape, rank: int, targets: Sequence[str]) -> int:
    """Parameters of one LoRA adapter: rank x (in + out) per targeted module per layer (unknown names add 0)."""
    total = 0
    for name in set(targets):
        if name in LORA_MODULE_DIMS:
            fan_in, fan_out = LORA_MODULE_DIMS[name](shape)
            total += rank * (fan_in + fan_out)
    return shape.layers * total


def model_config(path: str) -> tuple[dict | None, str]:
    """(config.json as a dict, where it came from) for a model spec, offline: a built-in alias already built, a
    local folder, the local Hugging Face cache, or the recorded facts of a known hub model
    (``pettingllms.models.replicas``). Never downloads or builds (``--dry-run`` converts nothing); (None, why) when
    none of them has it."""
    from pettingllms.models.aliases import built_alias
    from pettingllms.models.replicas import recorded_config
    from pettingllms.models.resolve import ALIASES

    text = str(path).strip()
    if text in ALIASES:
        built = built_alias(text, ALIASES[text])
        if built is None:
            return None, f"the alias {text} is not built yet (it is built once at start-up; plan it after that)"
        return _read_json(built / "config.json"), f"alias {text}"
    local = Path(text).expanduser()
    if (local / "config.json").is_file():
        return _read_json(local / "config.json"), "its config.json"
    cached = _hub_cache_config(text)
    if cached is not None:
        return _read_json(cached), "config.json in the local Hugging Face cache"
    recorded = recorded_config(text)
    if recorded is not None:
        return dict(recorded), "recorded hub config"
    return None, "no local config.json, not in the Hugging Face cache, no recorded facts (nothing is downloaded)"


def _read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def _hub_cache_config(repo_id: str) -> Path | None:
    """config.json of ``repo_id`` in the local Hugging Face hub cache, if a snapshot there has one (no network)."""
    if repo_id.count("/") != 1:
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found) if isinstance(found, str) else None
