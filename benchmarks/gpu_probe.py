"""GPU probes for the fast learner step: the kernels and transfers the next changes rest on, measured on the card
before they are built into the trainer. Needs only torch (no vLLM, no Ray), so a lent machine runs it at once.

    python benchmarks/gpu_probe.py --parts attention ipc checkpoint     # a CUDA GPU
    python benchmarks/gpu_probe.py --quick                              # CPU, tiny shapes: checks the script

Each part writes ``gpu_probe_<part>.json`` as soon as it ends, so a part that runs out of time costs only itself.
Shapes are Qwen3-1.7B's (``pettingllms/models/replicas.py``: 16 query heads, 8 K/V heads of 128, 28 layers, the
stored tensors' names and shapes), the model of the shipped math scripts.

- ``attention``: one packed tree row as the learner builds it (``learner/batching.build_batch``: a 1,024-token
  prompt and K=4 responses of 1,792 tokens, 8,192 columns) through one attention layer, forward and backward in
  bf16: today's path (``models/attention.grouped_sdpa_attention``: the dense ``[1,1,L,L]`` mask, K/V repeated to
  every head so the memory-efficient kernel qualifies) against FlexAttention with a block mask made from the row's
  ``visible_until`` columns (grouped K/V, masked blocks skipped). Checks that the block mask equals the learner's dense mask element
  for element, and the outputs' and gradients' differences.
- ``ipc``: the weight sync's transfer, learner process to engine process, of every bf16 tensor of the model
  as stored (4.06 GB: 3.44 GB of weights and the tied head stored once more) in 512 MiB buckets (or the largest
  tensor), double-buffered: CUDA IPC (the buckets live on the GPU; the engine maps them once
  and copies out) against host shared memory (the bucket in ``/dev/shm``: device to host, then host to device),
  the path the trainer uses today. The engine side copies into its own preallocated weights (what a weight loader
  does) and returns checksums, compared with the sender's. Then the trainer's own path (``project_path``:
  ``rollout/vllm/ipc.py``'s ``pack_bucket``, ``share_handle``, ``open_handle``, ``unpack_bucket``, the handle sent
  as plain data), the whole model once, checksums compared: what vLLM's worker does in a sync, without vLLM.
- ``checkpoint``: ``torch.distributed.checkpoint`` of the fp32 weights and AdamW state of every stored tensor (24.4 GB on
  the GPU): one writer thread (torch's default, the trainer today), 8 writer threads, and ``async_save`` (8 threads;
  the time training is blocked, and the time until the save is complete).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from _ipc_engine import engine_side, project_receiver, receive  # noqa: E402
from _report import load_average, median, out_dir, write_result  # noqa: E402

MODEL_ID = "Qwen/Qwen3-1.7B"
PARTS = ("attention", "ipc", "checkpoint")
BUCKET_BYTES = 512 * 2**20


# ----------------------------------------------------------------------------------------------------- shapes


def model_tensors(quick: bool) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every stored tensor of the model (the tiny replica's under --quick)."""
    from pettingllms.models.replicas import replica_plan

    return [(spec.name, tuple(spec.shape)) for spec in replica_plan(MODEL_ID, "tiny" if quick else "full")]


def attention_shape(quick: bool) -> dict[str, int]:
    from pettingllms.models.replicas import replica_config

    config = replica_config(MODEL_ID, "tiny" if quick else "full")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    shape = {"q_heads": config["num_attention_heads"], "kv_heads": config["num_key_value_heads"], "head_dim": head_dim,
             "layers": config["num_hidden_layers"], "prompt": 1024, "branches": 4, "response": 1792}
    if quick:
        shape.update(prompt=24, branches=3, response=40)
    return shape


def timed(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 2) -> list[float]:
    """Seconds of each of ``repeats`` calls after ``warmup`` ones, synchronised on CUDA."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times


# ------------------------------------------------------------------------------------------------- attention


def tree_row(shape: dict[str, int]):
    """The learner's packed row for one tree node: the prompt once, then each branch's response (its dense mask,
    and the ``visible_until`` columns the learner's block mask is made from)."""
    from pettingllms.core.types import Sample
    from pettingllms.learner.batching import build_batch

    prompt = tuple(range(1, shape["prompt"] + 1))
    samples = [
        Sample(policy="p", agent="a", turn=0, group=(0, 0, "a"), episode=f"e{b}", problem_id="0", branch=b,
               prompt_ids=prompt, response_ids=tuple(range(shape["response"])),
               response_logprobs=(), reward=0.0)
        for b in range(shape["branches"])
    ]
    return build_batch(samples)


def probe_attention(device: torch.device, quick: bool, repeats: int) -> dict[str, Any]:
    """The learner's two attention paths over one packed tree row: ``grouped_sdpa_attention`` with the dense mask,
    and with the block mask ``AttentionLayout.block_masks`` makes (``models/attention.flex_attention_call``)."""
    from torch.nn.attention.flex_attention import create_mask

    from pettingllms.learner.masks import AttentionLayout, tree_mask_mod
    from pettingllms.models.attention import grouped_sdpa_attention

    shape = attention_shape(quick)
    batch = tree_row(shape)
    length = batch.input_ids.shape[1]
    visible, positions = batch.visible_until.to(device), batch.position_ids.to(device)
    dense = batch.attention_mask.to(device)
    mask_equal = bool(torch.equal(create_mask(tree_mask_mod(visible, positions, None), 1, 1, length, length,
                                              device=device), dense))
    layout = AttentionLayout()
    block_mask = layout.block_masks(visible, positions)
    mask_build_s = median(timed(lambda: layout.block_masks(visible, positions), device, 3, warmup=1))

    dtype = torch.float32 if quick else torch.bfloat16
    hq, hkv, d = shape["q_heads"], shape["kv_heads"], shape["head_dim"]
    scale = d ** -0.5
    module = type("Layer", (), {"is_causal": True})()
    backward = device.type == "cuda"  # FlexAttention has no backward on CPU: --quick compares the forward only

    def inputs(row_length: int, seed: int = 0):
        gen = torch.Generator(device="cpu").manual_seed(seed)
        return [torch.randn(*size, generator=gen).to(device, dtype) for size in
                ((1, hq, row_length, d), (1, hkv, row_length, d), (1, hkv, row_length, d), (1, row_length, hq, d))]

    q0, k0, v0, grad_out = inputs(length)

    def step(mask, tensors=None, train=True):
        q_in, k_in, v_in, g_out = tensors or (q0, k0, v0, grad_out)
        q, k, v = (t.detach().requires_grad_(train) for t in (q_in, k_in, v_in))
        out, _ = grouped_sdpa_attention(module, q, k, v, mask, scaling=scale)
        if not train:
            return (out,)
        out.backward(g_out)
        return out, q.grad, k.grad, v.grad

    compile_start = time.perf_counter()
    reference, candidate = step(dense, train=backward), step(block_mask, train=backward)
    first_call_s = time.perf_counter() - compile_start
    differences = {}
    for name, a, b in zip(("out", "dq", "dk", "dv"), reference, candidate):
        a32, b32 = a.detach().float(), b.detach().float()
        differences[name] = {"max_abs": float((a32 - b32).abs().max()),
                             "max_abs_reference": float(a32.abs().max())}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sdpa_times = timed(lambda: step(dense, train=backward), device, repeats)
    sdpa_peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    flex_times = timed(lambda: step(block_mask, train=backward), device, repeats)
    flex_peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    # Rows of other lengths and shapes, as a real step's micro-batches have: what a new length costs the compiled
    # kernel the first time (torch.compile makes the shapes dynamic after the first new one), and after.
    new_lengths = {}
    for prompt, branches, response in ((1000, 4, 1500), (700, 3, 1800), (2000, 8, 700)):
        other = tree_row(dict(shape, prompt=prompt, branches=branches, response=response) if not quick else
                         dict(shape, prompt=prompt // 40, branches=branches, response=response // 40))
        mask = layout.block_masks(other.visible_until.to(device), other.position_ids.to(device))
        tensors = inputs(other.input_ids.shape[1], seed=1)
        first = timed(lambda: step(mask, tensors, train=backward), device, 1, warmup=0)[0]
        after = median(timed(lambda: step(mask, tensors, train=backward), device, 3, warmup=0))
        new_lengths[str(other.input_ids.shape[1])] = {"first_s": first, "after_s": after}
    sdpa_s, flex_s = median(sdpa_times), median(flex_times)
    return {
        "shape": shape, "row_tokens": length, "dtype": str(dtype).replace("torch.", ""), "backward": backward,
        "block_mask_equals_learner_mask": mask_equal, "block_size": 128,
        "blocks_skipped_percent": float(block_mask.sparsity()), "block_mask_build_s": mask_build_s,
        "first_calls_s_incl_compile": first_call_s,
        "sdpa_masked_s": sdpa_times, "flex_s": flex_times,
        "sdpa_masked_s_median": sdpa_s, "flex_s_median": flex_s, "flex_over_sdpa": flex_s / sdpa_s,
        "per_update_layers_s": {"sdpa_masked": sdpa_s * shape["layers"], "flex": flex_s * shape["layers"]},
        "peak_allocated_gib": {"sdpa_masked": sdpa_peak, "flex": flex_peak},
        "differences": differences, "new_lengths": new_lengths,
    }


# ------------------------------------------------------------------------------------------------------- ipc


def _transfer_once(conn, engine, tensors: dict[str, torch.Tensor], buckets: list[torch.Tensor], device: torch.device) -> float:
    """Send every tensor through the two buckets (fill one while the other is read); seconds until all landed."""
    start = time.perf_counter()
    free = [0, 1]
    in_flight = 0
    index, entries, used = free.pop(0), [], 0

    def send(bucket_index: int, bucket_entries: list) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        conn.send((bucket_index, bucket_entries))

    for name, tensor in tensors.items():
        nbytes = tensor.numel() * 2
        if used + nbytes > buckets[0].numel():
            send(index, entries)
            in_flight += 1
            if not free:
                free.append(receive(conn, engine))
                in_flight -= 1
            index, entries, used = free.pop(0), [], 0
        view = buckets[index][used:used + nbytes].view(torch.bfloat16)
        view.copy_(tensor.reshape(-1), non_blocking=True)
        entries.append((name, used, tensor.numel()))
        used += nbytes
    send(index, entries)
    in_flight += 1
    while in_flight:
        receive(conn, engine)
        in_flight -= 1
    return time.perf_counter() - start


def probe_ipc(device: torch.device, quick: bool, repeats: int) -> dict[str, Any]:
    import torch.multiprocessing as mp
    from torch.multiprocessing.reductions import reduce_tensor

    specs = model_tensors(quick)
    gen = torch.Generator(device="cpu").manual_seed(0)
    tensors = {}
    for name, shape in specs:
        tensors[name] = (torch.randn(shape, generator=gen, dtype=torch.float32) * 0.02).to(device, torch.bfloat16)
    total_bytes = sum(t.numel() * 2 for t in tensors.values())
    largest = max(t.numel() * 2 for t in tensors.values())
    bucket_bytes = max(BUCKET_BYTES if not quick else 64 * 2**10, largest)
    expected = {name: float(t.float().sum()) for name, t in tensors.items()}
    context = mp.get_context("spawn")
    result: dict[str, Any] = {"tensors": len(tensors), "gb": total_bytes / 1e9, "bucket_mib": bucket_bytes / 2**20}
    modes = ["ipc", "shm"] if device.type == "cuda" else ["shm"]
    for mode in modes:
        if mode == "ipc":
            buckets = [torch.empty(bucket_bytes, dtype=torch.uint8, device=device) for _ in range(2)]
        else:
            buckets = [torch.empty(bucket_bytes, dtype=torch.uint8).share_memory_() for _ in range(2)]
        parent, child = context.Pipe()
        engine = context.Process(target=engine_side,
                                 args=(child, device.index if device.type == "cuda" else -1, mode, specs))
        engine.start()
        start = time.perf_counter()
        parent.send([reduce_tensor(b) for b in buckets])
        assert receive(parent, engine) == "ready"
        setup_s = time.perf_counter() - start
        times = [_transfer_once(parent, engine, tensors, buckets, device) for _ in range(repeats + 1)][1:]
        parent.send(None)
        sums = receive(parent, engine)
        engine.join(timeout=60)
        worst = max(abs(sums[name] - expected[name]) / max(1.0, abs(expected[name])) for name in expected)
        result[mode] = {"setup_s": setup_s, "seconds": times, "seconds_median": median(times),
                        "gb_per_s": total_bytes / 1e9 / median(times), "checksums_worst_relative": worst}
        del buckets
    if "ipc" in result:
        result["shm_over_ipc"] = result["shm"]["seconds_median"] / result["ipc"]["seconds_median"]
        try:  # first run on a GPU: a failure here must not lose the figures above
            result["project_path"] = probe_project_ipc(tensors, bucket_bytes)
        except Exception as exc:  # noqa: BLE001 - recorded in the part's JSON, and printed
            result["project_path"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            print(f"ipc: the trainer's own IPC path failed: {result['project_path']['error']}", flush=True)
    return result


def probe_project_ipc(tensors: dict[str, torch.Tensor], bucket_bytes: int) -> dict[str, Any]:
    """The trainer's own CUDA IPC path end to end without vLLM: the model's tensors (in fp32, cast to bf16 as a sync
    does) packed by ``pack_bucket`` a bucket at a time, each bucket's ``share_handle`` sent as plain data to a
    spawned process that maps it with ``open_handle`` and copies out of ``unpack_bucket``; its checksums against
    the sender's, and the seconds."""
    import torch.multiprocessing as mp

    from pettingllms.rollout.vllm.ipc import pack_bucket, share_handle

    chunks: list[dict[str, torch.Tensor]] = [{}]
    filled = 0  # bf16 bytes in the last chunk
    for name, tensor in tensors.items():
        if chunks[-1] and filled + tensor.numel() * 2 > bucket_bytes:
            chunks.append({})
            filled = 0
        chunks[-1][name] = tensor
        filled += tensor.numel() * 2
    expected = {name: float(t.float().sum()) for name, t in tensors.items()}
    parent, child = mp.get_context("spawn").Pipe()
    engine = mp.get_context("spawn").Process(target=project_receiver, args=(child,))
    engine.start()
    sums, start = {}, time.perf_counter()
    try:
        for chunk in chunks:
            bucket, layout = pack_bucket({name: t.float() for name, t in chunk.items()}, torch.bfloat16)
            torch.cuda.synchronize(bucket.device)  # as the engine does: the receiver waits on no event
            parent.send([list(share_handle(bucket)), int(bucket.numel()),
                         [[name, dtype, list(shape), offset] for name, dtype, shape, offset in layout]])
            sums.update(receive(parent, engine))
            del bucket
        seconds = time.perf_counter() - start
        parent.send(None)
    finally:
        engine.join(timeout=60)
        if engine.is_alive():
            engine.kill()
    worst = max(abs(sums[name] - expected[name]) / max(1.0, abs(expected[name])) for name in expected)
    return {"buckets": len(chunks), "seconds": seconds, "checksums_worst_relative": worst,
            "ok": sums.keys() == expected.keys() and worst < 1e-3}


# ------------------------------------------------------------------------------------------------ checkpoint


def probe_checkpoint(device: torch.device, quick: bool, directory: Path) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    if not dist.is_initialized():
        store = dist.FileStore(str(directory / "store"), 1)
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    specs = model_tensors(quick)
    model = {name: torch.full(shape, 0.01, dtype=torch.float32, device=device) for name, shape in specs}
    optimizer = {name: {"exp_avg": torch.full_like(t, 1e-3), "exp_avg_sq": torch.full_like(t, 1e-6)}
                 for name, t in model.items()}
    state = {"model": model, "optimizer": optimizer}
    total = 3 * sum(t.numel() * 4 for t in model.values())
    result: dict[str, Any] = {"gb": total / 1e9}

    def fresh(tag: str) -> Path:
        path = directory / tag
        shutil.rmtree(path, ignore_errors=True)
        return path

    for tag, threads in (("one_thread", 1), ("eight_threads", 8)):
        path = fresh(tag)
        start = time.perf_counter()
        dcp.save(state, storage_writer=FileSystemWriter(str(path), thread_count=threads))
        seconds = time.perf_counter() - start
        result[tag] = {"seconds": seconds, "gb_per_s": total / 1e9 / seconds}
        shutil.rmtree(path, ignore_errors=True)
        print(f"[checkpoint] {tag}: {seconds:.1f} s", flush=True)
    path = fresh("async")
    start = time.perf_counter()
    future = dcp.async_save(state, storage_writer=FileSystemWriter(str(path), thread_count=8))
    blocking = time.perf_counter() - start
    (future.result() if hasattr(future, "result") else future.upload_completion.result())
    complete = time.perf_counter() - start
    result["async_eight_threads"] = {"blocking_s": blocking, "complete_s": complete}
    print(f"[checkpoint] async: blocked {blocking:.1f} s, complete {complete:.1f} s", flush=True)
    shutil.rmtree(path, ignore_errors=True)
    # the trainer's training.async_checkpoint: a copy into host buffers kept across saves (pinned on a GPU), then the
    # copy written by a thread; training is blocked for the copy only (the first save also allocates the buffers)
    from pettingllms.learner.state import host_copy, write_staged

    buffers: dict[str, torch.Tensor] = {}
    copies = []
    for _ in range(2):
        start = time.perf_counter()
        staged = host_copy(state, buffers)
        copies.append(time.perf_counter() - start)
    path = fresh("staged")
    start = time.perf_counter()
    write_staged(staged, path)
    written = time.perf_counter() - start
    result["trainer_async"] = {"first_copy_s": copies[0], "blocking_s": copies[1], "write_s": written,
                               "pinned": device.type == "cuda"}
    print(f"[checkpoint] trainer's async: first copy {copies[0]:.1f} s, blocked {copies[1]:.1f} s, written in "
          f"{written:.1f} s", flush=True)
    del staged, buffers
    shutil.rmtree(path, ignore_errors=True)
    dist.destroy_process_group()
    return result


# ------------------------------------------------------------------------------------------------------ main


TARGETS = {
    # part: (metric, the measured figure, op, target)
    "attention": ("flex / masked SDPA seconds, forward+backward of one 8,192-token tree row", "flex_over_sdpa", "<=", 0.5),
    "ipc": ("seconds to move the model's stored bf16 tensors (4.06 GB) to another process over CUDA IPC", "ipc_s", "<=", 0.5),
    "checkpoint": ("seconds training is blocked by training.async_checkpoint's save of weights and AdamW state (the "
                   "copy into reused pinned host buffers)", "blocking_s", "<=", 5.0),
}


def medians_of(part: str, result: dict[str, Any]) -> dict[str, float]:
    if part == "attention":
        return {key: result[key] for key in ("sdpa_masked_s_median", "flex_s_median", "flex_over_sdpa")}
    if part == "ipc":
        return {f"{mode}_s_median": result[mode]["seconds_median"] for mode in ("ipc", "shm") if mode in result}
    return {"one_thread_s": result["one_thread"]["seconds"], "eight_threads_s": result["eight_threads"]["seconds"],
            "async_blocking_s": result["async_eight_threads"]["blocking_s"],
            "async_complete_s": result["async_eight_threads"]["complete_s"],
            "trainer_async_blocking_s": result["trainer_async"]["blocking_s"],
            "trainer_async_first_copy_s": result["trainer_async"]["first_copy_s"]}


def measured_of(part: str, result: dict[str, Any]) -> float:
    if part == "attention":
        return result["flex_over_sdpa"]
    if part == "ipc":
        return result.get("ipc", result["shm"])["seconds_median"]
    return result["trainer_async"]["blocking_s"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="CPU, tiny shapes: checks the script, not the figures")
    parser.add_argument("--scratch", default=None, help="where the checkpoint part writes (default: a temp folder)")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda", 0) if torch.cuda.is_available() and not args.quick else torch.device("cpu")
    if device.type != "cuda" and not args.quick:
        parser.error("no CUDA device visible: run with --quick to check the script on CPU")
    directory = out_dir(args.out_dir, args.quick)
    directory.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    failures = 0
    for part in args.parts:
        load_before = load_average()
        print(f"[{part}] start", flush=True)
        try:
            if part == "attention":
                result = probe_attention(device, args.quick, args.repeats)
            elif part == "ipc":
                result = probe_ipc(device, args.quick, args.repeats)
            else:
                scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="gpu-probe-"))
                scratch.mkdir(parents=True, exist_ok=True)
                try:
                    result = probe_checkpoint(device, args.quick, scratch)
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
        except Exception as error:  # a part that fails is recorded and the next one still runs
            import traceback

            traceback.print_exc()
            failures += 1
            (directory / f"gpu_probe_{part}.error.txt").write_text(traceback.format_exc())
            continue
        print(f"[{part}] {json.dumps(result)}", flush=True)
        metric, _, op, target = TARGETS[part]
        write_result(
            f"gpu_probe_{part}", sys.argv[1:] if argv is None else list(argv), quick=args.quick, directory=directory,
            config={"model": MODEL_ID, "gpu": gpu, "torch": torch.__version__, "repeats": args.repeats},
            samples=result, medians=medians_of(part, result), measured=measured_of(part, result), target=target, op=op, metric=metric,
            load_before=load_before, threads=torch.get_num_threads(), script="gpu_probe",
        )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
