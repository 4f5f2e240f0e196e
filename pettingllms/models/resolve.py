"""Turn a model spec into a local Hugging Face model directory.

A spec is one of:
- a local directory holding ``config.json`` and weights;
- a hub id (``owner/name``), fetched with ``huggingface_hub.snapshot_download`` (the HF cache is used;
  with ``HF_HUB_OFFLINE=1`` only files already cached are accepted);
- a built-in alias of the table ``ALIASES``: ``smollm2-135m-instruct`` (the packaged SmolLM2-135M-Instruct),
  ``tiny-random-smollm2`` (a tiny random model for fast tests) and ``tiny-replica-<model>`` (a tiny random
  replica of a recorded hub checkpoint, e.g. ``tiny-replica-qwen3-1.7b``; see ``pettingllms.models.replicas``),
  built once into the cache (see ``pettingllms.models.aliases``).

``locate_model`` answers the same question without side effects (``--dry-run`` and the start of a run): where the
model's files are now, or what would be downloaded or converted, and a ConfigError when it can be neither found
locally nor downloaded.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
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
# Any of these makes a directory's tokenizer loadable (fast tokenizer, sentencepiece, BPE vocabulary).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
HUB_TIMEOUT_S = 10.0  # how long the dry run waits for the hub to say what a download would be


@dataclass(frozen=True)
class ModelSource:
    """Where a model spec's files are, found without downloading, converting or loading anything.

    directory: the folder holding its config and tokenizer now (None until downloaded or built);
    pending: what the run's start will do first ("" nothing, "download", "build"); download_bytes: the download's
    size when the hub said."""

    spec: str
    where: str
    directory: Path | None = None
    pending: str = ""
    download_bytes: int | None = None

    def describe(self) -> str:
        if self.pending == "download":
            size = f"{self.download_bytes / 1e9:.2f} GB" if self.download_bytes is not None else "size unknown"
            return f"{self.spec}: would download from the Hugging Face hub at start-up ({size})"
        return f"{self.spec}: {self.where}"


def locate_model(spec: str | Path, cache_dir: Path | None = None, timeout_s: float = HUB_TIMEOUT_S) -> ModelSource:
    """What ``resolve_model(spec)`` would use, without its side effects. Raises ConfigError when the model is
    neither here (a local directory with config, weights and tokenizer; a built alias or one that can be built;
    the local Hugging Face cache) nor downloadable (``HF_HUB_OFFLINE`` set, or the hub not answering in
    ``timeout_s``)."""
    text = str(spec).strip()
    if text in ALIASES:
        built = aliases.built_alias(text, ALIASES[text], cache_dir)
        if built is not None:
            return ModelSource(text, f"built-in alias, built in {built}", built)
        aliases.check_buildable(text, ALIASES[text], cache_dir)
        how = "converted once from the packaged GGUF" if text == aliases.SMOLLM2_ALIAS else "built once"
        return ModelSource(text, f"built-in alias, not built yet: {how} at start-up (into "
                                 f"{aliases.cache_root(cache_dir) / 'models' / text})", pending="build")
    path = Path(text).expanduser()
    if text and path.exists():
        return ModelSource(text, f"local directory {_checked_model_files(path)}", path.resolve())
    if not text or _looks_like_path(text) or not _HUB_ID.match(text):
        resolve_model(text, cache_dir)  # raises its error: empty, or a directory that does not exist
    return _locate_on_hub(text, timeout_s)


def _checked_model_files(path: Path) -> Path:
    """``_checked_local_dir`` plus the tokenizer the driver and engines load."""
    directory = _checked_local_dir(path)
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        raise ConfigError(f"model directory '{directory}' has no tokenizer (none of {list(_TOKENIZER_FILES)}); "
                          "save the tokenizer next to the model (tokenizer.save_pretrained)")
    return directory


def _locate_on_hub(repo_id: str, timeout_s: float) -> ModelSource:
    from huggingface_hub import try_to_load_from_cache

    offline = _hub_offline()
    cached = try_to_load_from_cache(repo_id, "config.json")
    problem = "it is not in the local Hugging Face cache"
    if isinstance(cached, str):
        try:
            snapshot = _checked_model_files(Path(cached).parent)
            return ModelSource(repo_id, f"in the local Hugging Face cache ({snapshot})", snapshot)
        except ConfigError as exc:  # a partial snapshot (config only): the rest would be downloaded
            problem = f"its copy in the local Hugging Face cache is incomplete ({exc})"
    fix = (f"Fix: download it where a network exists (huggingface-cli download {repo_id}) and point the key at "
           f"that directory, or use a built-in alias {_alias_hint()} that works offline.")
    if offline:
        raise ConfigError(f"cannot get model '{repo_id}': {problem}, and HF_HUB_OFFLINE=1 forbids downloading it. "
                          + fix)
    try:
        from huggingface_hub import HfApi

        info = HfApi().model_info(repo_id, files_metadata=True, timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - unreachable, unknown repo, gated: all mean "cannot download"
        raise ConfigError(f"cannot get model '{repo_id}': {problem}, and the Hugging Face hub did not give it "
                          f"within {timeout_s:g} s ({type(exc).__name__}: {str(exc)[:200]}). " + fix) from exc
    sizes = [s.size for s in info.siblings or [] if any(fnmatch.fnmatch(s.rfilename, p) for p in _HUB_PATTERNS)]
    known = sizes and all(size is not None for size in sizes)
    return ModelSource(repo_id, "on the Hugging Face hub", pending="download",
                       download_bytes=int(sum(sizes)) if known else None)


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
