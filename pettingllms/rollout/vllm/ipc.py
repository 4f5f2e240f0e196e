"""A weight sync's chunks GPU to GPU: each chunk packed into one device buffer that vLLM's worker maps with CUDA IPC.

The shared-memory path (``weights.py``) copies every tensor to host memory, writes a file, and the worker copies it
back to the GPU: 4.7 s for Qwen3-1.7B on an H200, where the learner's side took 8 ms. On one GPU (the colocated
engine, tensor parallel 1) the learner's process instead casts each tensor to the engine's dtype on the device,
packs a chunk into one ``uint8`` buffer (each tensor at an offset aligned to ``ALIGN`` bytes), and sends vLLM's
worker the buffer's CUDA IPC handle and the chunk's layout; the worker maps the buffer, views each tensor in it and
hands them to the model's own ``load_weights`` (the same layerwise reload as the shared-memory path), then lets go
of the mapping before it answers, so the sender may free or reuse the buffer.

Everything that crosses the RPC is plain data: vLLM's RPC (msgpack) carries no pickled objects, so the handle is
the tuple of ints and bytes torch's ``UntypedStorage._share_cuda_`` returns, and the layout is (name, dtype name,
shape, offset) rows. The transport is chosen once per engine by a round trip (``probe``): a small buffer with a
known pattern is sent and the worker's checksum compared; anything else (a CPU platform, tensor parallelism, a
failing probe) uses shared memory, and the engine logs which.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

ALIGN = 256  # bytes: every tensor in a bucket starts at a multiple (CUDA's allocation alignment; any dtype's)
IPC, SHARED_MEMORY = "cuda_ipc", "shared_memory"

Layout = list[tuple[str, str, tuple[int, ...], int]]  # (name, dtype name, shape, byte offset) per tensor


def _dtype(name: str):
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in a weight bucket's layout")
    return dtype


def pack_bucket(tensors: Mapping[str, Any], dtype: Any = None, device: Any = None) -> tuple[Any, Layout]:
    """One ``uint8`` buffer holding every tensor (floating ones cast to ``dtype``), on ``device`` (default: that of the
    first tensor), and its layout. Each tensor starts at an ``ALIGN``-byte boundary."""
    import torch

    if not tensors:
        raise ValueError("a weight bucket needs at least one tensor")
    device = device if device is not None else next(iter(tensors.values())).device
    layout: Layout = []
    offset = 0
    for name, tensor in tensors.items():
        cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        dtype_name, shape = str(cast).removeprefix("torch."), tuple(int(d) for d in tensor.shape)
        offset = -(-offset // ALIGN) * ALIGN
        layout.append((str(name), dtype_name, shape, offset))
        offset += ipc_bytes(dtype_name, shape)
    bucket = torch.empty(max(offset, 1), dtype=torch.uint8, device=device)
    for (name, dtype_name, shape, start), tensor in zip(layout, tensors.values()):
        view = unpack_one(bucket, dtype_name, shape, start)
        view.copy_(tensor.detach().reshape(shape))
    return bucket, layout


def unpack_one(bucket: Any, dtype_name: str, shape: Sequence[int], offset: int) -> Any:
    """The tensor at ``offset`` of ``bucket``, as a view (no copy)."""

    dtype = _dtype(dtype_name)
    size = ipc_bytes(dtype_name, shape)
    if offset < 0 or offset + size > bucket.numel():
        raise ValueError(f"a weight bucket's layout points outside it: {size} bytes at {offset} of {bucket.numel()}")
    return bucket[offset:offset + size].view(dtype).view(tuple(int(d) for d in shape))


def ipc_bytes(dtype_name: str, shape: Sequence[int]) -> int:
    """The bytes of a tensor of that dtype and shape."""
    import torch

    numel = 1
    for d in shape:
        numel *= int(d)
    return numel * torch.empty((), dtype=_dtype(dtype_name)).element_size()


def unpack_bucket(bucket: Any, layout: Layout) -> list[tuple[str, Any]]:
    """(name, view) for every tensor of the layout, in order."""
    return [(name, unpack_one(bucket, dtype_name, shape, offset)) for name, dtype_name, shape, offset in layout]


def share_handle(bucket: Any) -> tuple:
    """The CUDA IPC handle of ``bucket``'s storage as plain ints and bytes (what msgpack carries).

    Its last field, ``event_sync_required``, is cleared: every sender synchronizes the device before it shares a
    bucket, so the receiver has nothing to wait for, and torch's receiver (``_new_shared_cuda``) opens the event with
    ``cudaIpcOpenEventHandle`` and never destroys it: one event leaked per chunk, for the worker's lifetime."""
    handle = list(bucket.untyped_storage()._share_cuda_())
    handle[7] = False
    return tuple(handle)


def open_handle(handle: Sequence[Any], size: int) -> Any:
    """In another process on the same GPU: the ``uint8`` buffer behind ``handle`` (``size`` bytes)."""
    import torch

    storage = torch.UntypedStorage._new_shared_cuda(*handle)
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (size,), (1,))


PROBE_BYTES = 4096


def probe_pattern(device: Any) -> Any:
    """The probe's buffer: bytes 0..255 repeated, whose sum the worker returns."""
    import torch

    return (torch.arange(PROBE_BYTES, device=device) % 256).to(torch.uint8)


def probe_sum() -> int:
    return sum(i % 256 for i in range(PROBE_BYTES))


def choose_transport(platform: str, workers: int, probe=None) -> tuple[str, str]:
    """(transport, why). CUDA IPC only on a CUDA platform, with one engine worker (tensor and pipeline parallel 1:
    the learner and the worker share its GPU), and when ``probe()`` (a round trip through the worker) returns True;
    else shared memory."""
    if platform != "cuda":
        return SHARED_MEMORY, f"the platform is {platform!r}, not CUDA"
    if workers != 1:
        return SHARED_MEMORY, f"{workers} engine workers: all but one are on other GPUs"
    if probe is None:
        return SHARED_MEMORY, "no round trip was made"
    try:
        ok = bool(probe())
    except Exception as exc:  # a driver or container that refuses IPC: the slow path still works
        return SHARED_MEMORY, f"the CUDA IPC round trip failed ({type(exc).__name__}: {exc})"
    return (IPC, "the CUDA IPC round trip returned the pattern") if ok else (
        SHARED_MEMORY, "the CUDA IPC round trip returned another checksum")
