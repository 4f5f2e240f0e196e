"""A model in a local Hugging Face hub cache, as ``huggingface-cli download`` leaves it, without a network."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SNAPSHOT = "0" * 40


def cache_hub_model(monkeypatch, cache: Path, repo_id: str, config: dict, tokenizer_dir: Path,
                    weights: bool = True) -> Path:
    """Put ``repo_id`` into the hub cache ``cache`` (made this process's cache) with ``config`` and the tokenizer
    files of ``tokenizer_dir``; ``weights``: a safetensors stand-in holding no tensor (the dry run reads its header
    only, never the weights).
    Returns the snapshot folder."""
    import huggingface_hub.constants

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SNAPSHOT)
    (snapshot / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, snapshot / name)
    if weights:
        from safetensors.torch import save_file

        save_file({}, str(snapshot / "model.safetensors"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return snapshot
