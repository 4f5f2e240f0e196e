"""A weight sync moves a model in bounded chunks: never a whole extra copy of it, never half a decoder layer.

Before this, ``VLLMEngine.sync_weights`` built a dict of every gathered tensor (on a GPU: the whole fp32 model on the
device, after vLLM's own weights woke) and wrote all of it as one host copy plus one /dev/shm file per engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from pettingllms.core.errors import ConfigError
from pettingllms.rollout.vllm import weights as vllm_weights
from pettingllms.rollout.vllm.weights import CheckpointCheck, layer_of, weight_chunks

MB = 2**20


def _layer_stream(layers: int, per_layer_mb: float):
    side = int((per_layer_mb * MB / 4 / 2) ** 0.5)  # two fp32 tensors per layer
    yield "model.embed_tokens.weight", torch.ones(side, side)
    for index in range(layers):
        for part in ("self_attn.q_proj", "mlp.up_proj"):
            yield f"model.layers.{index}.{part}.weight", torch.full((side, side), float(index))
    yield "model.norm.weight", torch.ones(side)


def test_layer_of_keeps_a_decoder_layer_together():
    assert layer_of("model.layers.7.self_attn.q_proj.weight") == "model.layers.7"
    assert layer_of("model.layers.7.mlp.gate_proj.weight") == "model.layers.7"
    assert layer_of("model.layers.17.input_layernorm.weight") == "model.layers.17"
    assert layer_of("model.embed_tokens.weight") == "model.embed_tokens"
    assert layer_of("lm_head.weight") == "lm_head"


def test_chunks_respect_the_size_close_at_layer_boundaries_and_cast():
    chunks = list(weight_chunks(_layer_stream(6, per_layer_mb=2.0), chunk_bytes=3 * MB, dtype=torch.bfloat16))
    names = [name for chunk in chunks for name in chunk]
    assert names == [name for name, _ in _layer_stream(6, 2.0)]  # everything, in order, once
    for chunk in chunks:
        assert all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in chunk.values())
        layers = {layer_of(n) for n in chunk}
        for layer in layers:  # a layer is whole in the one chunk that has it
            assert sum(layer_of(n) == layer for n in chunk) == sum(layer_of(n) == layer for n in names)
        size = sum(t.numel() * t.element_size() for t in chunk.values())
        assert size <= 3 * MB or len(layers) == 1
    assert len(chunks) >= 3


def test_a_layer_larger_than_the_chunk_is_a_chunk_of_its_own():
    chunks = list(weight_chunks(_layer_stream(2, per_layer_mb=8.0), chunk_bytes=1 * MB))
    assert [sorted({layer_of(n) for n in c}) for c in chunks] == [
        ["model.embed_tokens"], ["model.layers.0"], ["model.layers.1"], ["model.norm"]]


def test_checkpoint_check_refuses_a_wrong_tensor_as_it_arrives_and_a_missing_one_at_the_end():
    expected = ({"a.weight": (2,), "b.weight": (3,), "lm_head.weight": (2,)}, frozenset({"lm_head.weight"}))
    check = CheckpointCheck(expected)
    check("a.weight", (2,))
    with pytest.raises(ConfigError, match=r"b.weight: \(4,\) vs \(3,\)"):
        check("b.weight", (4,))
    with pytest.raises(ConfigError, match="does not have"):
        CheckpointCheck(expected)("c.weight", (1,))
    with pytest.raises(ConfigError, match="twice"):
        check("a.weight", (2,))
    with pytest.raises(ConfigError, match=r"missing, e\.g\. \['b.weight'\]"):
        check.finish()
    complete = CheckpointCheck(expected)
    complete("a.weight", (2,))
    complete("b.weight", (3,))
    complete.finish()  # the tied head may be left out


def _sync_peak_bytes(mode: str, chunk_mb: float) -> tuple[int, int]:
    """(peak extra bytes, tensors moved) of one sync in a child process: its resident memory plus the sync's
    shared-memory files, above the level before the sync, sampled from this process every millisecond.

    A child, because the sampling must not wait for the sync to release the GIL, and because glibc keeps freed
    heap pages resident: ``MALLOC_MMAP_THRESHOLD_`` makes large blocks come from mmap, returned when freed, so
    resident memory tracks what is live.
    """
    script = Path(__file__).with_name("sync_memory_child.py")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, str(script), mode, str(chunk_mb)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        statm = Path(f"/proc/{child.pid}/statm")
        page = os.sysconf("SC_PAGE_SIZE")
        shm = vllm_weights.shared_memory_dir()

        def level() -> int:
            files = 0
            for path in shm.glob("pettingllms-weights-*"):
                try:
                    files += path.stat().st_size
                except FileNotFoundError:
                    pass
            return int(statm.read_text().split()[1]) * page + files

        base = level()
        done: list[str] = []
        reader = threading.Thread(target=lambda: done.append(child.stdout.readline()), daemon=True)
        child.stdin.write("go\n")
        child.stdin.flush()
        reader.start()
        peak = 0
        while not done:
            peak = max(peak, level() - base)
            time.sleep(0.001)
        child.stdin.write("exit\n")
        child.stdin.flush()
        child.wait(timeout=60)
    finally:
        child.kill()
    assert done[0].startswith("done"), done
    return peak, int(done[0].split()[1])


@pytest.mark.slow  # 13.5 s of peak-memory measurement; the chunking and its round trip stay in the default lane
def test_sync_memory_is_bounded_by_the_chunk_not_the_model():
    """SmolLM2-135M (135M parameters, 257 MB in bf16): the extra memory on the sending side during a chunked sync
    stays under the documented bound 2 * max(chunk, L) + L, L the largest layer (here its 49152 x 576 embedding,
    54 MB in bf16): a chunk and its file while it is written, then the file and the next layer being assembled.
    A whole-model sync, as before, needs more than the model."""
    from pettingllms.models import load_model

    chunk_mb = 16
    model = load_model("smollm2-135m-instruct", "float32")
    params = sum(p.numel() for p in model.parameters())
    assert params >= 100_000_000
    model_bf16 = params * 2
    largest_layer = max(sum(p.numel() * 2 for n, p in model.named_parameters() if layer_of(n) == layer)
                        for layer in {layer_of(n) for n, _ in model.named_parameters()})
    count = len(list(model.parameters()))
    del model
    bound = 2 * max(chunk_mb * MB, largest_layer) + largest_layer

    chunked, moved = _sync_peak_bytes("chunked", chunk_mb)
    whole, _ = _sync_peak_bytes("whole", chunk_mb)

    print(f"\nsync of {params / 1e6:.0f}M parameters ({model_bf16 / MB:.0f} MB bf16): chunked ({chunk_mb} MB) peak "
          f"+{chunked / MB:.0f} MB (bound {bound / MB:.0f} MB); whole-model peak +{whole / MB:.0f} MB")
    assert moved == count
    assert chunked <= bound < model_bf16
    assert whole >= model_bf16  # what the old sync held: the measurement tells them apart
