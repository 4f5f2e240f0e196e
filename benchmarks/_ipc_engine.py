"""The receiving side of ``gpu_probe.py``'s weight-transfer probe, in its own module so that a spawned process can
import it (a benchmark loaded from its file path, as the test lane does, is not importable by name)."""

from __future__ import annotations

import torch


def receive(conn, process, timeout_s: float = 120.0):
    """The next message from ``process``, or an error naming its exit code if it died or stayed silent."""
    waited = 0.0
    while not conn.poll(1.0):
        waited += 1.0
        if not process.is_alive():
            raise RuntimeError(f"the receiving process exited with code {process.exitcode}")
        if waited >= timeout_s:
            raise TimeoutError(f"the receiving process sent nothing for {timeout_s:.0f} s")
    return conn.recv()


def engine_side(conn, device_index: int, mode: str, specs: list[tuple[str, tuple[int, ...]]]) -> None:
    """Map the two buckets once (CUDA IPC handles, or shared-memory file descriptors), then copy each message's
    tensors out of its bucket into this process's own weights, as a weight loader does; reply with the bucket's
    index once it may be refilled, and with each weight's checksum at the end."""
    device = torch.device("cuda", device_index) if device_index >= 0 else torch.device("cpu")
    weights = {name: torch.empty(shape, dtype=torch.bfloat16, device=device) for name, shape in specs}
    buckets = [rebuild(*args) for rebuild, args in conn.recv()]
    conn.send("ready")
    while True:
        message = conn.recv()
        if message is None:
            break
        index, entries = message
        bucket = buckets[index]
        for name, offset, numel in entries:
            source = bucket[offset:offset + numel * 2].view(torch.bfloat16).view(weights[name].shape)
            weights[name].copy_(source, non_blocking=mode == "shm")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        conn.send(index)
    conn.send({name: float(t.float().sum()) for name, t in weights.items()})


def project_receiver(conn) -> None:
    """The trainer's own IPC path, receiving side (``pettingllms/rollout/vllm/ipc.py``, as its worker extension
    uses it): for each message of plain data (the handle as ``share_handle`` made it, the bucket's size, the layout
    rows), map the bucket with ``open_handle``, copy each tensor out of ``unpack_bucket``'s views, let go of the
    mapping, and reply with each tensor's checksum; None ends it."""
    from pettingllms.rollout.vllm.ipc import open_handle, unpack_bucket

    while (message := conn.recv()) is not None:
        handle, size, layout = message
        bucket = open_handle(handle, size)
        copies = [(name, view.clone()) for name, view in unpack_bucket(bucket, [tuple(row) for row in layout])]
        torch.cuda.current_stream().synchronize()
        del bucket
        conn.send({name: float(t.float().sum()) for name, t in copies})
