"""Recorded facts of the real hub checkpoints the project names, and shape-faithful random replicas of them.

The GPU defaults (``Qwen/Qwen3-1.7B``; ``Qwen/Qwen3-8B`` in the docs; ``Qwen/Qwen3-0.6B``;
``meta-llama/Llama-3.1-8B-Instruct``) cannot be downloaded here, yet CPU tests must exercise the code paths that
depend on their shape and quirks: Qwen3's per-head ``q_norm``/``k_norm``, Qwen3-0.6B's attention width being twice
its hidden size, tied embeddings whose checkpoint still stores ``lm_head.weight`` (Qwen3-0.6B and -1.7B; Qwen3-8B
and Llama are untied), the exact shard layout, special token ids and the chat template with its
``enable_thinking`` switch.

- ``facts/<name>.json`` holds each model's facts as data: the hub ``config.json`` verbatim, the generation
  config, the safetensors layout (every stored tensor's name, shape, dtype and file; file sizes; total_size),
  the tokenizer facts (its ``tokenizer_config.json`` verbatim, chat template included) and what could not be
  verified. ``recorded_facts`` / ``recorded_config`` read them (a GPU memory planner sizes models offline with
  ``recorded_config``).
- ``build_replica`` writes a Hugging Face model folder with the same architecture class, config quirks, tensor
  names, shard files, index and tokenizer behaviour, and seeded random bf16 weights: ``size="full"`` at the
  recorded shapes (every shard file then has the real file's byte size), ``size="tiny"`` at a shape of tens
  of MB that builds and loads in seconds (see ``tiny_config``).
- The tiny replica of each recorded model is a built-in alias, ``tiny-replica-<name>`` (e.g.
  ``tiny-replica-qwen3-1.7b``), built once into the model cache like ``tiny-random-smollm2``.
- ``python -m pettingllms.models.replicas <hub id> <dest> --size full`` builds a full-size replica (on a GPU
  machine: 16 GB of disk for an 8B model; one shard is held in memory at a time).

The tokenizer cannot be the real one (no hub access): it is the packaged SmolLM2 BPE with the real special
tokens at the real ids, filler tokens so that the vocabulary has the real size, and the real
``tokenizer_config.json`` (chat template, eos/pad/bos, class), so chat rendering and special-token ids match.
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from pettingllms.core.atomic import atomic_directory
from pettingllms.core.errors import ConfigError
from pettingllms.models import aliases
from pettingllms.core.choices import DTYPE_BYTES

FACTS_DIR = Path(__file__).resolve().parent / "facts"
SIZES = ("tiny", "full")
REPLICA_FORMAT = 1
"""Bumped whenever the bytes a replica is built from change, so cached alias copies are rebuilt."""
TINY_PREFIX = "tiny-replica-"
TINY_HEAD_DIM = 64
"""vLLM's CPU attention supports head sizes 32, 64, 80, 96, 112, 128, ...; 64 keeps the tiny trunk small."""
TINY_KV_HEADS = 1
TINY_MIN_LAYERS = 2
INIT_STD = 0.02
_CHUNK = 1 << 24  # elements drawn at a time, so a 600M-element embedding never needs an fp32 copy
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_INDEX = "model.safetensors.index.json"
_SAFETENSORS_METADATA = {"format": "pt"}

# Pre-tokenizer regexes of the two tokenizer families (Qwen2/3 splits digits one by one, Llama 3 in threes).
_QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class TensorSpec:
    """One stored tensor of a checkpoint: its name, shape, safetensors dtype and the file that holds it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    file: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


# ---- recorded facts ----


@functools.lru_cache(maxsize=None)
def _facts_by_stem() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in sorted(FACTS_DIR.glob("*.json"))}


def _stem_of(model_id: str) -> str | None:
    """The facts file stem for a hub id (case-insensitive), a former hub id, a bare repo name or the stem."""
    key = str(model_id).strip().lower()
    for stem, facts in _facts_by_stem().items():
        ids = [facts["hub_id"], *facts.get("also_known_as", [])]
        names = {stem} | {i.lower() for i in ids} | {i.lower().rsplit("/", 1)[-1] for i in ids}
        if key in names:
            return stem
    return None


def known_models() -> list[str]:
    """The hub ids with recorded facts."""
    return sorted(facts["hub_id"] for facts in _facts_by_stem().values())


def recorded_facts(model_id: str) -> dict | None:
    """All recorded facts of ``model_id`` (a hub id like ``Qwen/Qwen3-1.7B``, any case), or None if unknown.

    Returns a copy the caller may change."""
    stem = _stem_of(model_id)
    return None if stem is None else copy.deepcopy(_facts_by_stem()[stem])


def recorded_config(model_id: str) -> dict | None:
    """The hub ``config.json`` of ``model_id`` as published (a copy), or None if the model is unknown."""
    facts = recorded_facts(model_id)
    return None if facts is None else facts["config"]


def _require_facts(model_id: str) -> dict:
    facts = recorded_facts(model_id)
    if facts is None:
        raise ConfigError(
            f"no recorded facts for model '{model_id}': replicas exist only for the recorded models "
            f"{known_models()} (or their aliases {sorted(replica_aliases())})"
        )
    return facts


def recorded_tensors(model_id: str) -> list[TensorSpec]:
    """The real checkpoint's stored tensors, in the order the checkpoint was written (module order)."""
    facts = _require_facts(model_id)
    return [TensorSpec(t["name"], tuple(t["shape"]), t["dtype"], t["file"]) for t in facts["weights"]["tensors"]]


# ---- shapes ----


def hf_config(config: dict):
    """A transformers config object for a config.json dict (hub-style keys such as ``torch_dtype`` accepted)."""
    from transformers import AutoConfig

    kwargs = {k: copy.deepcopy(v) for k, v in config.items()  # transformers edits nested dicts (rope) in place
              if k not in ("architectures", "model_type", "transformers_version")}
    made = AutoConfig.for_model(config["model_type"], **kwargs)
    made.architectures = list(config.get("architectures") or [])
    return made


def tensor_names_and_shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the model's state dict, in module order, from a config.json dict.

    This is the order Hugging Face writes a checkpoint in, and it names ``lm_head.weight`` even for tied
    embeddings, as the Qwen3 checkpoints store it. The model is built on the ``meta`` device: no memory is used.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(config))
    return [(name, tuple(tensor.shape)) for name, tensor in model.state_dict().items()]


def tiny_config(config: dict, layers: int = TINY_MIN_LAYERS) -> dict:
    """The tiny replica's config: the real config with a small trunk and everything else kept.

    Kept: architecture, model type, vocabulary size (so special-token ids stay valid), tying, RoPE (theta and
    scaling), sliding-window settings, norm epsilon, biases, dtype, token ids and context length; also the
    grouped-query ratio (heads per kv head), the ratio of attention width to hidden size (2 for Qwen3-0.6B,
    1 otherwise) and the MLP expansion ratio. Changed: head_dim 64 (vLLM-CPU supported), one kv head, ``layers``
    layers, and ``max_window_layers`` scaled with the layer count.
    """
    heads, kv_heads, hidden = config["num_attention_heads"], config["num_key_value_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    if heads % kv_heads:
        raise ConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    tiny_heads = heads // kv_heads * TINY_KV_HEADS
    width_ratio = heads * head_dim / hidden
    tiny_hidden = tiny_heads * TINY_HEAD_DIM / width_ratio
    if tiny_hidden != int(tiny_hidden) or "head_dim" not in config and width_ratio != 1:
        raise ConfigError(f"cannot keep the attention-width ratio {width_ratio} at head_dim {TINY_HEAD_DIM}")
    tiny_hidden = int(tiny_hidden)
    out = dict(config)
    out.update(
        hidden_size=tiny_hidden,
        intermediate_size=round(tiny_hidden * config["intermediate_size"] / hidden),
        num_attention_heads=tiny_heads,
        num_key_value_heads=TINY_KV_HEADS,
        num_hidden_layers=layers,
    )
    if "head_dim" in config:
        out["head_dim"] = TINY_HEAD_DIM
    if "max_window_layers" in config:
        real_layers = config["num_hidden_layers"]
        out["max_window_layers"] = min(layers, round(config["max_window_layers"] * layers / real_layers))
    return out


def _real_layer(tiny_layer: int, tiny_layers: int, real_layers: int) -> int:
    """The real layer a tiny layer stands for: the middle of its equal slice of the real depth."""
    return (2 * tiny_layer + 1) * real_layers // (2 * tiny_layers)


def _tiny_names(real: list[TensorSpec], layers: int) -> list[str]:
    """The tiny checkpoint's names: the real ones, with the per-layer block repeated ``layers`` times."""
    suffixes = [m.group(2) for m in map(_LAYER.match, (t.name for t in real)) if m and m.group(1) == "0"]
    first = next(i for i, t in enumerate(real) if _LAYER.match(t.name))
    last = max(i for i, t in enumerate(real) if _LAYER.match(t.name))
    block = [f"model.layers.{i}.{suffix}" for i in range(layers) for suffix in suffixes]
    return [t.name for t in real[:first]] + block + [t.name for t in real[last + 1:]]


def _tiny_file_of(name: str, layers: int, real_layers: int, real_files: dict[str, str]) -> str:
    """A tiny tensor goes to the file its real counterpart is in (layers matched by relative depth)."""
    match = _LAYER.match(name)
    if match:
        name = f"model.layers.{_real_layer(int(match.group(1)), layers, real_layers)}.{match.group(2)}"
    return real_files[name]


def tiny_layer_count(model_id: str) -> int:
    """The fewest layers (at least 2) for which the tiny checkpoint uses every file of the real one.

    2 for the Qwen3 models; 3 for Llama-3.1-8B-Instruct, whose second shard starts at real layer 9.
    """
    facts = _require_facts(model_id)
    real = recorded_tensors(model_id)
    files = {t.file for t in real}
    real_files = {t.name: t.file for t in real}
    real_layers = facts["config"]["num_hidden_layers"]
    for layers in range(TINY_MIN_LAYERS, real_layers + 1):
        used = {_tiny_file_of(n, layers, real_layers, real_files) for n in _tiny_names(real, layers)}
        if used == files:
            return layers
    return real_layers


def replica_config(model_id: str, size: str = "tiny") -> dict:
    """The config.json a replica of ``model_id`` carries: the recorded one (full) or ``tiny_config`` of it."""
    _check_size(size)
    config = _require_facts(model_id)["config"]
    return config if size == "full" else tiny_config(config, tiny_layer_count(model_id))


def replica_plan(model_id: str, size: str = "tiny") -> list[TensorSpec]:
    """What a replica stores: every tensor's name, shape, dtype and file, in writing order; nothing is built.

    ``full`` is the recorded checkpoint. ``tiny`` has the real names (fewer layers), the tiny shapes, and each
    tensor in the file its real counterpart is in, so a tied head stored in its own last shard stays there.
    """
    _check_size(size)
    real = recorded_tensors(model_id)
    if size == "full":
        return real
    config = replica_config(model_id, "tiny")
    layers = config["num_hidden_layers"]
    real_layers = _require_facts(model_id)["config"]["num_hidden_layers"]
    real_files = {t.name: t.file for t in real}
    dtypes = {t.name: t.dtype for t in real}
    shapes = dict(tensor_names_and_shapes(config))
    names = _tiny_names(real, layers)
    if set(names) != set(shapes):
        raise ConfigError(f"tiny replica of {model_id}: recorded names and the model's state dict disagree: "
                          f"{sorted(set(names) ^ set(shapes))[:6]}")
    specs = []
    for name in names:
        real_name = name if not _LAYER.match(name) else f"model.layers.0.{_LAYER.match(name).group(2)}"
        specs.append(TensorSpec(name, shapes[name], dtypes[real_name],
                                _tiny_file_of(name, layers, real_layers, real_files)))
    order = {f: i for i, f in enumerate(dict.fromkeys(t.file for t in real))}
    return sorted(specs, key=lambda s: order[s.file])  # stable: module order within each file


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ConfigError(f"replica size must be one of {list(SIZES)}, got {size!r}")


# ---- files as the hub writes them ----


def hub_json_text(model_id: str, filename: str, size: str = "full") -> str:
    """``config.json``, ``generation_config.json`` or ``tokenizer_config.json`` serialised as the hub file is.

    The recorded indent and trailing newline reproduce the published files' byte sizes for the full config.
    """
    facts = _require_facts(model_id)
    content = {
        "config.json": lambda: replica_config(model_id, size),
        "generation_config.json": lambda: facts["generation_config"],
        "tokenizer_config.json": lambda: facts["tokenizer"]["tokenizer_config"],
    }
    if filename not in content:
        raise ConfigError(f"no recorded file {filename!r}; recorded: {sorted(content)}")
    style = facts["files"][filename]
    return json.dumps(content[filename](), indent=style["indent"], ensure_ascii=False) + (
        "\n" if style["trailing_newline"] else ""
    )


def index_json_text(specs: list[TensorSpec]) -> str:
    """``model.safetensors.index.json`` as transformers writes it (sorted keys, indent 2, trailing newline)."""
    index = {"metadata": {"total_size": sum(s.nbytes for s in specs)}, "weight_map": {s.name: s.file for s in specs}}
    return json.dumps(index, indent=2, sort_keys=True) + "\n"


def safetensors_file_bytes(specs: list[TensorSpec]) -> int:
    """The size of the safetensors file holding ``specs``: 8-byte length, JSON header padded to 8, data.

    Tensors are laid out by name (all of one dtype here), as the safetensors writer does.
    """
    header: dict = {"__metadata__": _SAFETENSORS_METADATA}
    offset = 0
    for spec in sorted(specs, key=lambda s: s.name):
        end = offset + spec.nbytes
        header[spec.name] = {"dtype": spec.dtype, "shape": list(spec.shape), "data_offsets": [offset, end]}
        offset = end
    length = len(json.dumps(header, separators=(",", ":")).encode())
    return 8 + length + (-length) % 8 + offset


# ---- building ----


def build_replica(
    model_id: str,
    dest: Path | str,
    size: str = "tiny",
    seed: int = 0,
    *,
    tokenizer_dir: Path | str | None = None,
) -> Path:
    """Write a replica of ``model_id`` into ``dest`` (atomically, replacing what was there); return ``dest``.

    size: ``tiny`` (seconds, tens of MB) or ``full`` (the recorded shapes: as much disk as the real checkpoint).
    seed: the weights are a deterministic function of (seed, tensor name).
    tokenizer_dir: a SmolLM2 model directory to take the BPE vocabulary from; default: the converted
    ``smollm2-135m-instruct`` alias (converted on first use).
    """
    _require_facts(model_id)
    _check_size(size)
    if tokenizer_dir is None:
        tokenizer_dir = aliases.smollm2_dir()
    dest = Path(dest)
    with atomic_directory(dest, replace=True) as tmp:
        write_replica(tmp, model_id, size=size, seed=seed, tokenizer_dir=Path(tokenizer_dir))
    return dest


def write_replica(dest: Path, model_id: str, *, size: str, seed: int, tokenizer_dir: Path) -> None:
    """Write config, generation config, weights (shard by shard), index and tokenizer into the directory ``dest``."""
    facts = _require_facts(model_id)
    specs = replica_plan(model_id, size)
    dest.mkdir(parents=True, exist_ok=True)
    for filename in ("config.json", "generation_config.json", "tokenizer_config.json"):
        (dest / filename).write_text(hub_json_text(model_id, filename, size), encoding="utf-8")
    _write_weights(dest, specs, seed, tied=bool(facts["config"].get("tie_word_embeddings")))
    if facts["weights"]["index_file"]:
        (dest / _INDEX).write_text(index_json_text(specs), encoding="utf-8")
    tokenizer = json.dumps(_replica_tokenizer_json(facts, tokenizer_dir), ensure_ascii=False)
    (dest / "tokenizer.json").write_text(tokenizer, encoding="utf-8")


def _write_weights(dest: Path, specs: list[TensorSpec], seed: int, *, tied: bool) -> None:
    """One file at a time, so at most one shard is ever in memory. A tied head gets the embedding's values."""
    from safetensors.torch import save_file

    by_file: dict[str, list[TensorSpec]] = {}
    for spec in specs:
        by_file.setdefault(spec.file, []).append(spec)
    for filename, group in by_file.items():
        tensors = {}
        for spec in group:
            source = "model.embed_tokens.weight" if tied and spec.name == "lm_head.weight" else spec.name
            tensors[spec.name] = _init_tensor(spec, seed, source)
        save_file(tensors, str(dest / filename), metadata=_SAFETENSORS_METADATA)
        del tensors


def _init_tensor(spec: TensorSpec, seed: int, source_name: str):
    """Norm weights are 1, biases 0, everything else N(0, 0.02) drawn from a generator seeded by (seed, name)."""
    import torch

    dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[spec.dtype]
    if spec.name.endswith("norm.weight"):
        return torch.ones(spec.shape, dtype=dtype)
    if spec.name.endswith(".bias"):
        return torch.zeros(spec.shape, dtype=dtype)
    digest = hashlib.sha256(f"{seed}:{source_name}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    out = torch.empty(spec.numel, dtype=dtype)
    for start in range(0, spec.numel, _CHUNK):
        count = min(_CHUNK, spec.numel - start)
        out[start:start + count] = torch.randn(count, generator=generator).mul_(INIT_STD).to(dtype)
    return out.view(spec.shape)


# ---- tokenizer ----


def _replica_tokenizer_json(facts: dict, tokenizer_dir: Path) -> dict:
    """SmolLM2's byte-level BPE, re-indexed to the real model's special tokens and vocabulary size.

    Regular ids 0..49151 are SmolLM2's tokens (its own special tokens renamed to unreachable placeholders);
    ids up to the real model's first special token are unreachable filler tokens (no merge produces them), so
    the vocabulary is contiguous and ``len(tokenizer)`` equals the real one; the real special tokens follow at
    their real ids with their real flags. The normaliser, pre-tokeniser and decoder follow the model family.
    """
    base_path = tokenizer_dir / "tokenizer.json"
    if not base_path.is_file():
        raise ConfigError(f"replica tokenizer: {base_path} is missing (expected the converted SmolLM2 model)")
    base = json.loads(base_path.read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(base["model"]["vocab"])
    for token in base.get("added_tokens", []):  # SmolLM2's <|im_start|> etc. must not shadow the real ones
        if vocab.get(token["content"]) == token["id"]:
            del vocab[token["content"]]
            vocab[f"<|smollm2_special_{token['id']}|>"] = token["id"]
    decoder = facts["tokenizer"]["tokenizer_config"]["added_tokens_decoder"]
    specials = {int(i): entry for i, entry in decoder.items()}
    regular = facts["tokenizer"]["regular_tokens"]
    if len(vocab) > regular:
        raise ConfigError(f"replica tokenizer: SmolLM2's {len(vocab)} tokens exceed the real {regular} regular ones")
    for token_id in range(len(vocab), regular):
        vocab[f"<|replica_filler_{token_id}|>"] = token_id
    for token_id, entry in sorted(specials.items()):
        if entry["content"] in vocab:
            raise ConfigError(f"replica tokenizer: special token {entry['content']!r} is already a regular token")
        vocab[entry["content"]] = token_id
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ConfigError("replica tokenizer: the recorded special tokens do not continue the regular ids")
    added = [{"id": token_id, "content": e["content"], "single_word": e["single_word"], "lstrip": e["lstrip"],
              "rstrip": e["rstrip"], "normalized": e["normalized"], "special": e["special"]}
             for token_id, e in sorted(specials.items())]
    family = _tokenizer_family(facts)
    ignore_merges = family.pop("_ignore_merges")
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, **family,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": ignore_merges, "vocab": vocab, "merges": base["model"]["merges"]}}


def _tokenizer_family(facts: dict) -> dict:
    """Normaliser, pre-tokeniser, post-processor and decoder in the style of the real model's tokenizer.json."""
    def byte_level(trim_offsets: bool = False, add_prefix_space: bool = False, use_regex: bool = False) -> dict:
        return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": trim_offsets,
                "use_regex": use_regex}

    def split(regex: str) -> dict:
        return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}

    if facts["config"]["model_type"] == "llama":
        bos = facts["tokenizer"]["tokenizer_config"]["bos_token"]
        bos_id = facts["tokenizer"]["bos_token_id"]
        template = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
        }
        return {"normalizer": None,
                "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(_LLAMA_SPLIT), byte_level(True)]},
                "post_processor": {"type": "Sequence", "processors": [byte_level(True), template]},
                "decoder": byte_level(True, True, True), "_ignore_merges": True}
    return {"normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(_QWEN_SPLIT), byte_level()]},
            "post_processor": byte_level(), "decoder": byte_level(), "_ignore_merges": False}


# ---- aliases ----


def tiny_alias(model_id: str) -> str:
    """The built-in alias of ``model_id``'s tiny replica, e.g. ``tiny-replica-qwen3-1.7b``."""
    stem = _stem_of(model_id)
    if stem is None:
        raise ConfigError(f"no recorded facts for model '{model_id}'; recorded models: {known_models()}")
    return TINY_PREFIX + stem


def replica_aliases() -> dict[str, aliases.AliasRecipe]:
    """alias -> recipe for the tiny replica of every recorded model (seed 0), for the alias table."""
    return {TINY_PREFIX + stem: functools.partial(_tiny_recipe, facts["hub_id"])
            for stem, facts in _facts_by_stem().items()}


def _tiny_recipe(model_id: str) -> tuple[dict, aliases.AliasBuild]:
    stem = _stem_of(model_id)
    source = {"builder": "pettingllms.models.replicas", "format": REPLICA_FORMAT, "model": model_id, "size": "tiny",
              "seed": 0, "tokenizer": aliases.SMOLLM2_ALIAS,
              "facts_sha256": hashlib.sha256((FACTS_DIR / f"{stem}.json").read_bytes()).hexdigest()}

    def build(dest: Path, cache_dir: Path | None) -> None:
        write_replica(dest, model_id, size="tiny", seed=0, tokenizer_dir=aliases.smollm2_dir(cache_dir))

    return source, build


# ---- command line ----


def main(argv: list[str] | None = None) -> int:
    """``python -m pettingllms.models.replicas <hub id> <dest> [--size tiny|full] [--seed N]``."""
    parser = argparse.ArgumentParser(
        prog="python -m pettingllms.models.replicas",
        description="Write a random-weight replica of a recorded hub checkpoint (same config, tensor names, "
                    "shards and chat template). Recorded models: " + ", ".join(known_models()),
    )
    parser.add_argument("model_id", help="hub id, e.g. Qwen/Qwen3-8B")
    parser.add_argument("dest", help="directory to write (replaced if it exists)")
    parser.add_argument("--size", choices=SIZES, default="tiny", help="full: the real shapes (tens of GB for 8B)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer-dir", default=None, help="SmolLM2 model directory (default: the alias)")
    args = parser.parse_args(argv)
    try:
        plan = replica_plan(args.model_id, args.size)
        total = sum(s.nbytes for s in plan)
        print(f"writing a {args.size} replica of {args.model_id}: {len(plan)} tensors, {total / 1e9:.2f} GB, "
              f"{len({s.file for s in plan})} file(s) -> {args.dest}", flush=True)
        path = build_replica(args.model_id, args.dest, args.size, args.seed, tokenizer_dir=args.tokenizer_dir)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
