"""Turn a model spec into a local Hugging Face model directory.

A spec is one of:
- a local directory holding ``config.json`` and weights;
- a hub id (``owner/name``), fetched with ``huggingface_hub.snapshot_download`` (the HF cache is used;
  with ``HF_HUB_OFFLINE=1`` only files already cached are accepted);
- a built-in alias of the table ``ALIASES``: ``smollm2-135m-instruct`` (the packaged SmolLM2-135M-Instruct),
  ``tiny-random-smollm2`` (a tiny random model for fast tests) and ``tiny-replica-<model>`` (a tiny random
  replica of a recorded hub checkpoint, e.g. ``tiny-replica-qwen3-1.7b``; see ``pettingllms.models.replicas``),
  built once into the cache (see ``pettingllms.models.aliases``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pettingllms.core.errors import ConfigError
from pettingllms.models import aliases, replicas, tiny

ALIASES: dict[str, aliases.AliasRecipe] = {
    aliases.SMOLLM2_ALIAS: aliases.smollm2_recipe,
    aliases.TINY_ALIAS: tiny.tiny_recipe,
    **replicas.replica_aliases(),
}

# Files worth fetching from a hub repository: config, tokenizer, chat template, safetensors weights.
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "tokenizer*"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_model(spec: str | Path, cache_dir: Path | None = None) -> Path:
    """Return a local HF model directory for ``spec`` (local dir, hub id or alias).

    Raises ConfigError with what was tried and how to fix it when the model cannot be found.
    """
    text = str(spec).strip()
    if not text:
        raise ConfigError("model spec is empty: give a local model directory, a hub id or an alias " + _alias_hint())
    if text in ALIASES:
        return materialize_alias(text, cache_dir)
    path = Path(text).expanduser()
    if path.exists():
        return _checked_local_dir(path)
    if _looks_like_path(text) or not _HUB_ID.match(text):
        raise ConfigError(
            f"model directory '{text}' does not exist. Give an existing directory with config.json, "
            f"a hub id like 'HuggingFaceTB/SmolLM2-135M-Instruct', or an alias {_alias_hint()}."
        )
    return _download_from_hub(text)


def model_directory(path: str | Path) -> Path:
    """What loaders (``load_model``, the chat codec, engines) load from: ``path`` itself when it is a model
    directory (such as the one a run resolved once and stored on its worker spec), so nothing is resolved twice;
    any other spec (an alias, a hub id: scripts and tests) goes through ``resolve_model``."""
    directory = Path(path).expanduser()
    if (directory / "config.json").is_file():
        return directory
    return resolve_model(path)


def materialize_alias(alias: str, cache_dir: Path | None = None) -> Path:
    """Build the alias's directory once (atomically) and return it; later calls reuse it."""
    if alias not in ALIASES:
        raise ConfigError(f"unknown model alias '{alias}'; known aliases: {sorted(ALIASES)}")
    return aliases.build_once(alias, ALIASES[alias], cache_dir)


def _checked_local_dir(path: Path) -> Path:
    if not path.is_dir():
        raise ConfigError(f"model path '{path}' is a file, not a model directory (expected config.json inside)")
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model directory '{path}' has no config.json, so it is not a Hugging Face model directory. "
            "Point to the folder that save_pretrained wrote (config.json, *.safetensors, tokenizer files)."
        )
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ConfigError(f"model directory '{path}' has config.json but no weights (*.safetensors or *.bin)")
    return path.resolve()


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~", ".\\")) or "\\" in text or text.count("/") > 1


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _download_from_hub(repo_id: str) -> Path:
    """snapshot_download the config, tokenizer and safetensors of ``repo_id`` into the HF cache."""
    from huggingface_hub import snapshot_download

    offline = _hub_offline()
    try:
        local = Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS, local_files_only=offline))
    except Exception as exc:  # hub errors, HTTP/connection errors, cache misses: all mean "not available"
        mode = "offline (HF_HUB_OFFLINE=1): only the local HF cache was searched" if offline else "online"
        raise ConfigError(
            f"cannot get model '{repo_id}' from the Hugging Face hub [{mode}]: {type(exc).__name__}: {exc}. "
            f"Tried: a local directory named '{repo_id}' (none exists), then the hub. Fix: download the "
            "model where a network exists and set the model path to that local directory, or use a "
            f"built-in alias {_alias_hint()} that works offline."
        ) from exc
    return _checked_local_dir(local)


def _alias_hint() -> str:
    return "(" + ", ".join(repr(name) for name in sorted(ALIASES)) + ")"
