"""EngineSync: which tensors reach an engine that owns its weights, under which names, in which order.

The real vLLM path is checked end to end in the opt-in lane (tests/vllm_cpu/test_vllm_worker.py: vLLM's
logprobs after an update equal the learner's). Here a recording engine pins the contract every engine with
``sync_weights`` relies on, with a real peft model for the names.
"""

from __future__ import annotations

import pytest
import torch

from pettingllms.core.errors import ConfigError
from pettingllms.learner.weights import full_weights, trained_parameter_names, weight_shapes
from pettingllms.models import LoraSpec, load_model
from pettingllms.models.lora import adapter_tensors
from pettingllms.runtime import serving
from pettingllms.runtime.serving import EngineSync, peft_adapter_configs


class RecordingEngine:
    """Has the methods of VLLMEngine that EngineSync calls; records each call in order."""

    def __init__(self, sleep_enabled: bool, calls: list | None = None) -> None:
        self.sleep_enabled = sleep_enabled
        self.calls: list[tuple] = [] if calls is None else calls

    def sync_weights(self, named_tensors):
        names = [name for name, _ in named_tensors]
        self.calls.append(("sync_weights", tuple(names)))
        return 0.0

    def check_weights(self, shapes):
        self.calls.append(("check_weights", tuple(shapes)))

    def add_adapter(self, name, tensors, *, config=None):
        self.calls.append(("add_adapter", name, tuple(sorted(tensors)), config))

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))


@pytest.fixture(scope="module")
def peft_model():
    return load_model("tiny-random-smollm2", "float32", LoraSpec(rank=4, alpha=8.0), ("alice", "bob"))


def test_adapter_tensors_get_peft_saved_names_and_host_copies(peft_model):
    adapters = adapter_tensors(full_weights(peft_model), ["alice", "bob"])

    assert set(adapters) == {"alice", "bob"}
    params = dict(peft_model.named_parameters())
    for adapter in ("alice", "bob"):
        own = [n for n in params if f".lora_A.{adapter}." in n or f".lora_B.{adapter}." in n]
        assert len(adapters[adapter]) == len(own) > 0  # every LoRA tensor of the adapter, nothing else
        for saved_name, tensor in adapters[adapter].items():
            assert ".lora_A.weight" in saved_name or ".lora_B.weight" in saved_name
            live = params[saved_name.replace(".lora_A.weight", f".lora_A.{adapter}.weight").replace(
                ".lora_B.weight", f".lora_B.{adapter}.weight")]
            assert torch.equal(tensor, live) and tensor.data_ptr() != live.data_ptr()


def test_lora_push_sends_each_trained_adapter_to_its_own_name(peft_model):
    engine = RecordingEngine(sleep_enabled=False)
    sync = EngineSync(engine, peft_adapter_configs(peft_model, ("alice", "bob")))
    names = trained_parameter_names(peft_model, ("alice", "bob"), frozen=("bob",))

    seconds = sync.push(full_weights(peft_model, names))

    assert seconds >= 0.0
    assert [(c[0], c[1]) for c in engine.calls] == [("add_adapter", "alice")]  # bob is frozen: not re-sent
    assert engine.calls[0][3] is peft_model.peft_config["alice"]


@pytest.fixture
def calls(monkeypatch):
    """One record of engine calls and allocator-cache releases, in order."""
    record: list[tuple] = []
    monkeypatch.setattr(serving, "release_accelerator_cache", lambda: record.append(("release_cache",)) or 0)
    return record


def test_full_model_sleeps_deep_releases_the_cache_then_syncs_then_wakes_the_cache(calls):
    """The sync wakes the weights itself, right before its first chunk loads (VLLMEngine.sync_weights); the
    allocator's cache is released before anything wakes."""
    model = load_model("tiny-random-smollm2", "float32")
    engine = RecordingEngine(sleep_enabled=True, calls=calls)
    sync = EngineSync(engine)

    sync.release_for_update()
    sync.release_for_update()  # idempotent: one sleep per update
    sync.push(full_weights(model), weight_shapes(model))

    expected_names = tuple(name for name, _ in model.named_parameters())
    assert calls == [
        ("sleep", 2),  # the weights are resent anyway: discard them
        ("release_cache",),  # before any wake: vLLM's process cannot take what PyTorch's cache holds
        ("check_weights", expected_names),  # names and shapes, before anything is gathered
        ("sync_weights", expected_names),
        ("release_cache",),  # the stream's gathered tensors, before the KV cache takes its memory
        ("wake_up", ("kv_cache",)),
    ]


def test_lora_releases_the_cache_before_waking(peft_model, calls):
    engine = RecordingEngine(sleep_enabled=True, calls=calls)
    sync = EngineSync(engine, peft_adapter_configs(peft_model, ("alice",)))
    sync.release_for_update()
    sync.push(full_weights(peft_model, trained_parameter_names(peft_model, ("alice",))))
    assert [c[0] for c in calls] == ["sleep", "release_cache", "wake_up", "add_adapter", "release_cache", "wake_up"]
    assert calls[2] == ("wake_up", ("weights",)) and calls[5] == ("wake_up", ("kv_cache",))


def test_a_rank_without_an_engine_releases_its_cache_and_joins_the_stream(calls):
    consumed = []
    sync = EngineSync(None)
    sync.push((name, consumed.append(name) or torch.ones(1)) for name in ("a", "b"))
    assert consumed == ["a", "b"] and calls == [("release_cache",)]


def test_a_refused_check_still_finishes_the_collective_stream(calls):
    class Refusing(RecordingEngine):
        def check_weights(self, shapes):
            raise ConfigError("sync_weights does not match the served checkpoint")

    consumed = []
    sync = EngineSync(Refusing(sleep_enabled=False, calls=calls))
    with pytest.raises(ConfigError, match="served checkpoint"):
        sync.push(((n, consumed.append(n) or torch.ones(1)) for n in ("a", "b")), {"a": (1,), "b": (1,)})
    assert consumed == ["a", "b"]  # the other FSDP ranks are gathering it: never leave them waiting
    assert not any(c[0] == "sync_weights" for c in calls)


def test_release_accelerator_cache_empties_the_cuda_cache_when_cuda_is_in_use(monkeypatch):
    reserved = iter([5 * 2**30, 2**30])
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: next(reserved))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    assert serving.release_accelerator_cache() == 4 * 2**30 and emptied == [True]


def test_lora_sleeps_at_level_one(peft_model):
    engine = RecordingEngine(sleep_enabled=True)
    sync = EngineSync(engine, peft_adapter_configs(peft_model, ("alice",)))
    sync.release_for_update()
    assert engine.calls == [("sleep", 1)]  # base weights kept in host memory: they never change


def test_an_engine_sharing_the_module_gets_nothing_but_the_stream_is_consumed():
    from pettingllms.models import HFChatCodec, resolve_model
    from pettingllms.rollout.hf_engine import HFEngine

    model = load_model("tiny-random-smollm2", "float32")
    engine = HFEngine(model, HFChatCodec.from_pretrained(resolve_model("tiny-random-smollm2")))
    sync = EngineSync(engine)
    consumed = []

    def stream():
        for item in full_weights(model):
            consumed.append(item[0])
            yield item

    sync.release_for_update()
    assert sync.push(stream()) == 0.0
    assert len(consumed) == len(list(model.parameters()))  # under FSDP the stream is a collective
    assert EngineSync(None).push(iter(())) == 0.0  # ranks without an engine


def test_a_push_on_a_gpu_reports_memory_after_each_phase(monkeypatch):
    """What gpu_smoke prints per step: device memory after the cache release, the weights' sync and the wake, in GB
    (1e9 bytes) like the memory plan it is compared with."""
    used = iter(range(10, 100, 10))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80e9 - next(used) * 1e9, 80e9))
    sync = EngineSync(RecordingEngine(sleep_enabled=True))
    sync.release_for_update()
    sync.push(iter([("model.norm.weight", torch.ones(2))]))
    assert [sync.memory[f"memory/{phase}_device_used_gb"] for phase in ("after_release", "after_weights",
                                                                          "after_wake")] == [10, 20, 30]
    assert sync.memory["memory/cache_released_gb"] == 0


def test_an_engine_spanning_its_peers_gpus_waits_for_them_to_sleep_and_to_release(calls):
    """TP > 1: the engine's shards and KV cache live on the peers' GPUs too. Every rank passes the group barrier once
    the engine is asleep (before any learner trains) and once every rank has released its cache after the stream
    (before the KV cache wakes); host and peer call it the same number of times, or the group would hang."""
    model = load_model("tiny-random-smollm2", "float32")
    host = EngineSync(RecordingEngine(sleep_enabled=True, calls=calls),
                      group_barrier=lambda: calls.append(("barrier",)))
    host.release_for_update()
    host.push(full_weights(model))
    assert [c[0] for c in calls] == ["sleep", "barrier", "release_cache", "sync_weights", "release_cache", "barrier",
                                     "wake_up"]
    calls.clear()
    peer = EngineSync(None, group_barrier=lambda: calls.append(("barrier",)))
    peer.release_for_update()
    peer.push(full_weights(model))
    assert [c[0] for c in calls] == ["barrier", "release_cache", "release_cache", "barrier"]


def test_only_a_tensor_parallel_group_waits_at_the_barrier_on_a_gloo_group(tmp_path):
    """The barrier is a real gloo barrier (on the CPU: it holds no GPU memory, and NCCL's watchdog does not time it
    out while the host starts vLLM), here in a one-rank group."""
    import torch.distributed as dist

    from pettingllms.runtime.layout import resolve_layout
    from pettingllms.runtime.worker import ENGINE_BARRIER_TIMEOUT, engine_group_barrier

    assert engine_group_barrier(resolve_layout("p", num_gpus=4, engine="vllm")) is None  # an engine per GPU
    assert engine_group_barrier(resolve_layout("p", num_gpus=1, engine="vllm")) is None
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        barrier = engine_group_barrier(resolve_layout("p", num_gpus=4, tensor_parallel=2, engine="vllm"))
        assert barrier.func is dist.barrier and dist.get_backend(barrier.keywords["group"]) == "gloo"
        barrier()
    finally:
        dist.destroy_process_group()
    assert ENGINE_BARRIER_TIMEOUT.total_seconds() >= 3600


def test_a_push_reports_the_seconds_of_each_of_its_parts(calls):
    """timing/sync_s says that a sync was slow; its parts say which part: the cache release, the weights' wake, their
    transfer, the KV cache's wake. Each is measured where it happens (a slow wake shows in its own part)."""
    import time

    class SlowWake(RecordingEngine):
        def wake_up(self, tags=None):
            time.sleep(0.05)
            super().wake_up(tags)

    model = load_model("tiny-random-smollm2", "float32")
    sync = EngineSync(SlowWake(sleep_enabled=True, calls=calls))
    sync.release_for_update()
    total = sync.push(full_weights(model), weight_shapes(model))
    parts = sync.timings
    assert set(parts) == {"timing/sync_release_s", "timing/sync_wake_weights_s", "timing/sync_weights_s",
                          "timing/sync_wake_s"}
    assert parts["timing/sync_wake_s"] >= 0.05 > parts["timing/sync_weights_s"]
    assert parts["timing/sync_wake_weights_s"] == 0.0  # this engine wakes nothing inside its sync
    assert parts["timing/sync_weights_s"] + parts["timing/sync_wake_s"] <= total + 1e-6


def test_the_weights_wake_is_a_part_of_its_own(calls):
    """Under LoRA the weights are woken before the adapters go in; with a full model vLLM wakes them inside its sync and
    says how long it took (``last_wake_seconds``): either way the wake leaves the transfer's part."""
    import time

    class SlowWeightsWake(RecordingEngine):
        def wake_up(self, tags=None):
            if tags == ["weights"]:
                time.sleep(0.05)
            super().wake_up(tags)

        def sync_weights(self, named_tensors):
            started = time.perf_counter()
            self.wake_up(["weights"])
            self.last_wake_seconds = time.perf_counter() - started
            return super().sync_weights(named_tensors)

    model = load_model("tiny-random-smollm2", "float32")
    sync = EngineSync(SlowWeightsWake(sleep_enabled=True, calls=calls))
    sync.release_for_update()
    sync.push(full_weights(model), weight_shapes(model))
    assert sync.timings["timing/sync_wake_weights_s"] >= 0.05 > sync.timings["timing/sync_weights_s"]
