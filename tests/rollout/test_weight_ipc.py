"""The CUDA IPC weight transport's plain-data parts, on CPU: packing a chunk into one buffer and reading it back, the
layout's bounds, and the choice of transport (shared memory wherever IPC cannot be proven by a round trip). The IPC
round trip itself needs a CUDA GPU (benchmarks/gpu_probe.py measures it; gpu_smoke.py trains through it)."""

from __future__ import annotations

import pytest
import torch

from pettingllms.rollout.vllm.ipc import (
    ALIGN,
    IPC,
    SHARED_MEMORY,
    choose_transport,
    ipc_bytes,
    pack_bucket,
    probe_pattern,
    probe_sum,
    unpack_bucket,
    unpack_one,
)
from pettingllms.rollout.vllm.weights import weight_chunks


def chunk():
    generator = torch.Generator().manual_seed(0)
    return {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 6, generator=generator),
        "model.layers.0.input_layernorm.weight": torch.randn(6, generator=generator),
        "model.rotary.inv_freq_count": torch.arange(5, dtype=torch.int64),
        "model.empty": torch.empty(0, 3),
        "model.norm.weight": torch.randn(3, generator=generator).to(torch.bfloat16),
    }


def test_a_packed_chunk_reads_back_cast_to_the_engines_dtype_and_integers_untouched():
    tensors = chunk()
    bucket, layout = pack_bucket(tensors, torch.bfloat16)
    assert bucket.dtype == torch.uint8 and [row[0] for row in layout] == list(tensors)
    back = dict(unpack_bucket(bucket, layout))
    for name, original in tensors.items():
        expected = original.to(torch.bfloat16) if original.is_floating_point() else original
        assert back[name].dtype == expected.dtype and torch.equal(back[name], expected), name
    # each tensor at an aligned offset, none overlapping the next
    spans = [(offset, offset + ipc_bytes(dtype, shape)) for _, dtype, shape, offset in layout]
    assert all(start % ALIGN == 0 for start, _ in spans)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
    assert bucket.numel() >= spans[-1][1]


def test_the_layout_is_plain_data_and_views_share_the_buffer():
    bucket, layout = pack_bucket(chunk())
    assert all(isinstance(name, str) and isinstance(dtype, str) and isinstance(offset, int) and
               all(isinstance(d, int) for d in shape) for name, dtype, shape, offset in layout)
    name, dtype, shape, offset = layout[0]
    view = unpack_one(bucket, dtype, list(shape), offset)  # msgpack hands the shape back as a list
    view.zero_()
    assert torch.count_nonzero(dict(unpack_bucket(bucket, layout))[name]) == 0


def test_a_layout_pointing_outside_the_buffer_or_naming_no_dtype_is_refused():
    bucket, layout = pack_bucket(chunk())
    name, dtype, shape, _ = layout[0]
    with pytest.raises(ValueError, match="outside"):
        unpack_one(bucket, dtype, shape, bucket.numel() - 4)
    with pytest.raises(ValueError, match="unknown tensor dtype"):
        unpack_one(bucket, "Tensor", shape, 0)


@pytest.mark.parametrize("platform, tp, probe, expected, why", [
    ("cpu", 1, lambda: True, SHARED_MEMORY, "not CUDA"),
    ("cuda", 2, lambda: True, SHARED_MEMORY, "2 engine workers"),
    ("cuda", 1, None, SHARED_MEMORY, "no round trip"),
    ("cuda", 1, lambda: False, SHARED_MEMORY, "another checksum"),
    ("cuda", 1, lambda: 1 / 0, SHARED_MEMORY, "ZeroDivisionError"),
    ("cuda", 1, lambda: True, IPC, "returned the pattern"),
])
def test_the_transport_is_ipc_only_when_a_round_trip_proves_it(platform, tp, probe, expected, why):
    transport, reason = choose_transport(platform, tp, probe)
    assert transport == expected and why in reason


def test_the_engine_counts_its_workers_from_vllms_parallel_config():
    """Pipeline parallel set through llm_options also puts workers on other GPUs: tensor parallel 1 is not enough."""
    from types import SimpleNamespace

    from pettingllms.rollout.vllm.engine import VLLMEngine

    engine = object.__new__(VLLMEngine)
    engine.tensor_parallel_size = 1
    engine.llm = SimpleNamespace(llm_engine=SimpleNamespace(
        vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(world_size=2))))
    assert engine._worker_count() == 2
    engine.llm = SimpleNamespace()  # a vLLM without it: the engine's own count
    assert engine._worker_count() == 1


def test_the_probe_pattern_sums_to_what_the_worker_must_return():
    assert int(probe_pattern("cpu").sum(dtype=torch.int64)) == probe_sum()


def test_chunks_for_ipc_stay_on_their_device_cast_and_never_split_a_layer():
    tensors = [(f"model.layers.{i}.mlp.w", torch.ones(4, 4)) for i in range(3)] + [("lm_head.weight", torch.ones(2))]
    chunks = list(weight_chunks(iter(tensors), chunk_bytes=40, dtype=torch.bfloat16, to_host=False))
    names = [name for name, _ in tensors]
    assert [list(c) for c in chunks] == [names[:1], names[1:2], names[2:]]  # 32-byte layers in 40-byte chunks
    assert all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for c in chunks for t in c.values())


def test_a_reload_gives_the_memory_it_freed_back_to_the_driver_on_a_gpu(monkeypatch):
    """vLLM 0.26's wake-up maps the KV cache without emptying PyTorch's cache first, so the reload empties it."""
    from pettingllms.rollout.vllm import weights

    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    weights.return_cached_memory()
    assert emptied == [True]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    weights.return_cached_memory()  # on CPU there is no device cache to empty
    assert emptied == [True]
