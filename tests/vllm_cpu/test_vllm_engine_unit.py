"""The parts of the vLLM engine that need no vLLM: default lane (the engine itself is tested by make test-vllm)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from pettingllms.core.errors import ConfigError
from pettingllms.core.types import FINISH_ERROR, FINISH_LENGTH, FINISH_STOP
from pettingllms.rollout.vllm import engine as vllm_engine
from pettingllms.rollout.vllm import lora as vllm_lora
from pettingllms.rollout.vllm import weights as vllm_weights
from pettingllms.rollout.vllm.engine import VLLMEngine, finish_reason, request_seed, sampled_logprobs
from pettingllms.rollout.vllm.lora import write_adapter_folder
from pettingllms.rollout.vllm.weights import VLLMWorkerWeightLoader, write_shared_weights


def test_missing_vllm_is_a_config_error_that_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[gpu\]'.*install_vllm_cpu\.sh"):
        vllm_engine.import_vllm()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"tensor_parallel_size": 1.5}, "tensor_parallel_size"),
        ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization"),
        ({"max_lora_rank": 0}, "max_lora_rank"),
    ],
)
def test_bad_options_fail_before_vllm_is_needed(monkeypatch, options, message):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ConfigError, match=message):
        VLLMEngine("any-model", **options)


def test_request_seeds_are_deterministic_and_never_collide_within_n():
    seeds = [request_seed(0, call, index) for call in range(50) for index in range(50)]
    assert seeds == [request_seed(0, call, index) for call in range(50) for index in range(50)]
    assert request_seed(1, 0, 0) != request_seed(0, 0, 0)
    assert all(0 <= s < 2**62 for s in seeds)
    # vLLM seeds sample i of a request with seed + i: no two requests' ranges of 64 samples may overlap.
    ordered = sorted(seeds)
    assert min(b - a for a, b in zip(ordered, ordered[1:])) > 64


class _Logprob:
    def __init__(self, value: float) -> None:
        self.logprob = value


def test_sampled_logprobs_pick_the_sampled_token_of_each_position():
    positions = [{5: _Logprob(-0.5), 9: _Logprob(-0.1)}, {7: _Logprob(-2.0)}]
    assert sampled_logprobs((5, 7), positions) == (-0.5, -2.0)
    with pytest.raises(RuntimeError, match="2 logprob entries for 3 tokens"):
        sampled_logprobs((5, 7, 1), positions)
    with pytest.raises(RuntimeError, match="none"):
        sampled_logprobs((5,), None)


def test_finish_reasons_map_to_ours():
    assert finish_reason("stop", (1, 2)) == FINISH_STOP
    assert finish_reason("length", (1, 2)) == FINISH_LENGTH
    assert finish_reason("abort", (1,)) == FINISH_ERROR
    assert finish_reason("stop", ()) == FINISH_ERROR


@pytest.mark.parametrize(
    "name",
    [
        "base_model.model.model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_proj.base_layer.weight",
        "model.layers.0.self_attn.q_proj.lora_A.alice.weight",
        "_fsdp_wrapped_module.model.norm.weight",
    ],
)
def test_sync_refuses_wrapper_names_before_touching_vllm(name):
    with pytest.raises(ConfigError, match="plain Hugging Face checkpoint names"):
        vllm_weights.check_weight_names(["model.norm.weight", name])


def test_shared_weights_round_trip_tied_tensors_included():
    from safetensors.torch import load_file

    embed = torch.randn(10, 4)
    norm = torch.ones(4).bfloat16()
    weights = {"model.embed_tokens.weight": embed, "lm_head.weight": embed, "model.norm.weight": norm}
    path = write_shared_weights(weights)
    try:
        if vllm_weights.Path("/dev/shm").is_dir():
            assert str(path).startswith("/dev/shm/")
        loaded = load_file(str(path))
    finally:
        path.unlink()
    assert set(loaded) == set(weights)
    for name, tensor in weights.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor)
    with pytest.raises(ConfigError, match="no tensors"):
        write_shared_weights({})


class _RecordingModel:
    def __init__(self) -> None:
        self.received: dict[str, torch.Tensor] = {}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.received[name] = tensor.clone()
        return set(self.received)


class _RecordingWorker(VLLMWorkerWeightLoader):
    """Stands in for vLLM's worker (its model runner and config); records what the extension does, in order."""

    def __init__(self, events: list) -> None:
        self.events = events
        self.vllm_config = object()
        model = _RecordingModel()
        self.model = model
        self.model_runner = type("Runner", (), {
            "get_model": lambda runner: model, "model_config": object(),
            "reset_lora_state": lambda runner: events.append("reset_lora_state")})()

    def refresh_cpu_packed_weights(self) -> int:  # needs vLLM's model; the vllm_cpu lane runs the real one
        self.events.append("refresh")
        return 0


@pytest.fixture
def fake_vllm_reload(monkeypatch):
    """The two vLLM functions the extension calls, recording into one event list (the real ones run in the
    vllm_cpu lane)."""
    import contextlib
    import types

    events: list = []
    reload = types.ModuleType("vllm.model_executor.model_loader.reload")
    reload.initialize_layerwise_reload = lambda model: events.append("initialize")
    reload.finalize_layerwise_reload = lambda model, config: events.append("finalize")
    config = types.ModuleType("vllm.config")
    config.set_current_vllm_config = lambda cfg: contextlib.nullcontext()
    for name, module in {"vllm": types.ModuleType("vllm"), "vllm.config": config,
                         "vllm.model_executor": types.ModuleType("vllm.model_executor"),
                         "vllm.model_executor.model_loader": types.ModuleType("vllm.model_executor.model_loader"),
                         "vllm.model_executor.model_loader.reload": reload}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return events


def test_worker_extension_loads_every_chunk_within_one_layerwise_reload(fake_vllm_reload):
    events = fake_vllm_reload
    worker = _RecordingWorker(events)
    chunks = [{"model.embed_tokens.weight": torch.randn(3, 4)},
              {"model.layers.0.mlp.up_proj.weight": torch.randn(2, 4), "model.norm.weight": torch.arange(4.0)}]
    worker.begin_weight_reload()
    for chunk in chunks:
        path = write_shared_weights(chunk)
        try:
            assert worker.load_weights_file(str(path)) == len(chunk)
        finally:
            path.unlink()
        events.append("chunk")
    worker.finish_weight_reload()
    assert events == ["initialize", "chunk", "chunk", "finalize", "reset_lora_state", "refresh"]
    expected = {name: tensor for chunk in chunks for name, tensor in chunk.items()}
    assert set(worker.model.received) == set(expected)
    assert all(torch.equal(worker.model.received[name], tensor) for name, tensor in expected.items())


def test_written_files_read_back_with_safetensors_own_reader():
    from safetensors.torch import load_file

    tensors = {"scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4), "ints": torch.arange(5),
               "flags": torch.tensor([True, False]), "half": torch.randn(3, 5).half(),
               "strided": torch.randn(4, 6)[:, ::2]}
    path = write_shared_weights(tensors)
    try:
        loaded = load_file(str(path))
    finally:
        path.unlink()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


def test_checkpoint_shapes_read_headers_and_make_a_tied_head_optional(tmp_path):
    from safetensors.torch import save_file

    weights = {"model.embed_tokens.weight": torch.zeros(10, 4), "model.norm.weight": torch.zeros(4)}
    save_file(weights, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    shapes, optional = vllm_weights.checkpoint_shapes(tmp_path)
    assert shapes == {"model.embed_tokens.weight": (10, 4), "model.norm.weight": (4,), "lm_head.weight": (10, 4)}
    assert optional == {"lm_head.weight"}
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    untied = {"model.embed_tokens.weight": (10, 4), "model.norm.weight": (4,)}
    assert vllm_weights.checkpoint_shapes(tmp_path) == (untied, set())
    assert vllm_weights.checkpoint_shapes(tmp_path / "nothing-here") is None


def test_a_tied_head_stored_in_the_checkpoint_is_optional_too(tmp_path):
    """Qwen3-0.6B/1.7B/8B tie the head yet store ``lm_head.weight`` (Qwen3-1.7B's second shard is that tensor);
    the learner's named_parameters() yields the tied tensor once, as the embedding. Step 1's sync must pass."""
    from safetensors.torch import save_file

    embed = torch.zeros(10, 4)
    save_file({"model.embed_tokens.weight": embed, "model.norm.weight": torch.zeros(4)},
              tmp_path / "model-00001-of-00002.safetensors")
    save_file({"lm_head.weight": embed.clone()}, tmp_path / "model-00002-of-00002.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    shapes, optional = vllm_weights.checkpoint_shapes(tmp_path)
    assert shapes["lm_head.weight"] == (10, 4) and optional == {"lm_head.weight"}
    learner_stream = {"model.embed_tokens.weight": (10, 4), "model.norm.weight": (4,)}
    vllm_weights.check_against_checkpoint(learner_stream, shapes, optional)  # raised "1 of its weights missing"
    vllm_weights.check_against_checkpoint({**learner_stream, "lm_head.weight": (10, 4)}, shapes, optional)
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))  # untied: the head is needed
    shapes, optional = vllm_weights.checkpoint_shapes(tmp_path)
    with pytest.raises(ConfigError, match=r"missing, e\.g\. \['lm_head.weight'\]"):
        vllm_weights.check_against_checkpoint(learner_stream, shapes, optional)


def test_synced_weights_must_match_the_checkpoint():
    expected = {"a": (2, 3), "b": (3,), "lm_head.weight": (2, 3)}
    check = vllm_weights.check_against_checkpoint
    check({"a": (2, 3), "b": (3,)}, expected, frozenset({"lm_head.weight"}))  # the tied head may be left out
    check({"a": (2, 3), "b": (3,), "lm_head.weight": (2, 3)}, expected, frozenset({"lm_head.weight"}))
    with pytest.raises(ConfigError, match=r"missing, e\.g\. \['lm_head.weight'\]"):
        check({"a": (2, 3), "b": (3,)}, expected)
    with pytest.raises(ConfigError, match=r"names the checkpoint does not have, e\.g\. \['c'\]"):
        check({"a": (2, 3), "b": (3,), "c": (1,)}, expected, frozenset({"lm_head.weight"}))
    with pytest.raises(ConfigError, match=r"b: \(4,\) vs \(3,\)"):
        check({"a": (2, 3), "b": (4,)}, expected, frozenset({"lm_head.weight"}))


def test_adapter_tensors_become_a_peft_folder():
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    tensors = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 8)}
    folder = write_adapter_folder(tensors, config)
    try:
        written = json.loads((folder / "adapter_config.json").read_text())
        assert written["r"] == 4 and sorted(written["target_modules"]) == ["q_proj", "v_proj"]
        assert (folder / "adapter_model.safetensors").is_file()
    finally:
        vllm_lora.shutil.rmtree(folder)
    with pytest.raises(ConfigError, match="empty"):
        write_adapter_folder({}, config)


def test_adapter_folder_without_peft_files_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="adapter_config.json"):
        vllm_lora.checked_adapter_folder(tmp_path, "alice")
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ConfigError, match="adapter_model.safetensors"):
        vllm_lora.checked_adapter_folder(tmp_path, "alice")


class _StubLLM:
    """Records the calls ``VLLMEngine.sync_weights`` makes on vLLM's ``LLM``; loads files like the worker would."""

    def __init__(self, fail_on_chunk: int | None = None) -> None:
        self.calls: list = []
        self.fail_on_chunk = fail_on_chunk
        self.loaded: dict[str, tuple] = {}

    def collective_rpc(self, method, args=()):
        from safetensors import safe_open

        if method == "load_weights_file":
            chunk = sum(c[0] == "load_weights_file" for c in self.calls)
            with safe_open(args[0], framework="pt", device="cpu") as handle:
                names = list(handle.keys())
                self.loaded.update({n: tuple(handle.get_slice(n).get_shape()) for n in names})
            self.calls.append((method, tuple(names)))
            if chunk == self.fail_on_chunk:
                raise RuntimeError("worker died")
            return [len(names)]
        self.calls.append((method,))
        return [0]

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def _stub_engine(llm, checkpoint, chunk_mb=0.0005, asleep=False):
    engine = object.__new__(VLLMEngine)
    engine.llm = llm
    engine._lock = __import__("threading").Lock()
    engine._checkpoint = checkpoint
    engine.sync_chunk_bytes = int(chunk_mb * 2**20)
    engine.weight_dtype = torch.bfloat16
    engine._weights_asleep = asleep
    engine._asleep_level = 2 if asleep else 0
    engine._weights_stale = asleep
    engine.last_sync_seconds = None
    return engine


def _layered(layers=3):
    yield "model.embed_tokens.weight", torch.randn(16, 8)
    for i in range(layers):
        yield f"model.layers.{i}.self_attn.q_proj.weight", torch.randn(8, 8)
        yield f"model.layers.{i}.mlp.up_proj.weight", torch.randn(16, 8)
    yield "model.norm.weight", torch.ones(8)


def test_sync_streams_chunks_in_one_reload_waking_sleeping_weights_only_at_the_first_chunk():
    expected = ({name: tuple(t.shape) for name, t in _layered()} | {"lm_head.weight": (16, 8)},
                frozenset({"lm_head.weight"}))  # tied, stored: optional
    pulled = []

    def stream():
        for name, tensor in _layered():
            pulled.append((name, len(llm.calls)))
            yield name, tensor

    llm = _StubLLM()
    engine = _stub_engine(llm, expected, asleep=True)
    engine.sync_weights(stream())
    methods = [c[0] for c in llm.calls]
    assert methods[:2] == ["wake_up", "begin_weight_reload"] and llm.calls[0] == ("wake_up", ("weights",))
    assert pulled[0][1] == 0  # the first tensor was gathered before anything woke
    assert methods.count("load_weights_file") == engine.last_sync_report.chunks >= 3
    assert methods[-2:] == ["finish_weight_reload", "reset_prefix_cache"]
    assert llm.loaded == {name: tuple(t.shape) for name, t in _layered()}
    for _, names in (c for c in llm.calls if c[0] == "load_weights_file"):
        layers = [n.split(".")[2] for n in names if n.startswith("model.layers.")]
        assert all(layers.count(x) == 2 for x in set(layers))  # q and up of a layer always travel together
    assert not engine._weights_stale and not engine._weights_asleep


@pytest.mark.parametrize("tags, woken", [(None, ("kv_cache",)), (["weights", "kv_cache"], ("kv_cache",)),
                                          (["weights"], None)])
def test_wake_up_wakes_only_what_is_still_asleep(tags, woken):
    """vLLM 0.26 maps a tag again even when it is awake: a wake_up() after a sync woke the weights held them twice."""
    llm = _StubLLM()
    engine = _stub_engine(llm, None, asleep=True)
    engine.sleep_available = engine.sleep_enabled = True
    engine.sync_weights(_layered())  # wakes the weights at its first chunk; the KV cache stays asleep
    llm.calls.clear()
    engine.wake_up(tags)
    wakes = [c[1] for c in llm.calls if c[0] == "wake_up"]
    assert wakes == ([woken] if woken else [])
    assert not engine._weights_asleep and engine.asleep == (tags == ["weights"])


def test_a_sync_that_fails_midway_finishes_the_stream_and_the_reload_and_refuses_to_generate():
    llm = _StubLLM(fail_on_chunk=1)
    engine = _stub_engine(llm, None)
    consumed = []
    stream = ((name, consumed.append(name) or tensor) for name, tensor in _layered())
    with pytest.raises(ConfigError, match="could not load the synced weights"):
        engine.sync_weights(stream)
    assert consumed == [name for name, _ in _layered()]  # under FSDP the other ranks are still gathering
    assert [c[0] for c in llm.calls][-2:] == ["finish_weight_reload", "reset_prefix_cache"]
    assert engine._weights_stale
    with pytest.raises(ConfigError, match="incomplete"):
        engine._check_ready()


def test_a_stream_missing_a_weight_is_refused_at_its_end():
    names = {name: tuple(t.shape) for name, t in _layered()}
    engine = _stub_engine(_StubLLM(), (names, frozenset()))
    with pytest.raises(ConfigError, match=r"missing, e\.g\. \['model.norm.weight'\]"):
        engine.sync_weights((n, t) for n, t in _layered() if n != "model.norm.weight")
    assert engine._weights_stale
    engine.sync_weights(_layered())  # a complete sync makes it usable again
    assert not engine._weights_stale


def test_the_tied_head_warning_of_a_reload_is_dropped_and_nothing_else(fake_vllm_reload):
    import logging
    import types

    worker = _RecordingWorker(fake_vllm_reload)
    worker.model_runner.model_config = types.SimpleNamespace(hf_config=types.SimpleNamespace(tie_word_embeddings=True))
    worker.begin_weight_reload()
    layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    kept = [r for r in (logging.makeLogRecord({"msg": m, "levelno": logging.WARNING}) for m in (
        "ParallelLMHead: Failed to load weights", "Qwen3DecoderLayer: Failed to load weights"))
        if all(f.filter(r) for f in layerwise.filters)]
    assert [r.getMessage() for r in kept] == ["Qwen3DecoderLayer: Failed to load weights"]


class _PrefixCachingLLM:
    """vLLM's ``LLM`` as far as adapters and the prefix cache go: like vLLM, cached blocks are keyed by the
    adapter's *name*, and remember which adapter id (which weights) computed them."""

    def __init__(self) -> None:
        self.loaded: dict[int, str] = {}  # lora_int_id -> lora_name
        self.cached: dict[str, int] = {}  # lora_name -> the id whose weights computed the cached prefix
        self.llm_engine = self

    def add_lora(self, request) -> None:
        self.loaded[request.lora_int_id] = request.lora_name

    def remove_lora(self, lora_int_id: int) -> None:
        del self.loaded[lora_int_id]

    def reset_prefix_cache(self) -> bool:
        self.cached.clear()
        return True

    def serve(self, request) -> int:
        """The id whose weights the prefix KV of ``request`` comes from: a cache hit by name, else its own."""
        return self.cached.setdefault(request.lora_name, request.lora_int_id)


def test_a_replaced_adapter_never_serves_prefix_kv_computed_with_its_old_weights(monkeypatch, tmp_path):
    import threading
    import types
    from dataclasses import dataclass

    @dataclass
    class LoRARequest:
        lora_name: str
        lora_int_id: int
        lora_path: str

    for name in ("vllm", "vllm.lora"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", types.SimpleNamespace(LoRARequest=LoRARequest))
    folders = []
    for version in ("v1", "v2"):
        folder = tmp_path / version
        folder.mkdir()
        (folder / "adapter_config.json").write_text("{}")
        (folder / "adapter_model.safetensors").write_bytes(b"")
        folders.append(folder)
    llm = _PrefixCachingLLM()
    engine = object.__new__(VLLMEngine)
    engine.llm, engine._lock, engine.enable_lora = llm, threading.Lock(), True
    engine.adapters = vllm_lora.AdapterRegistry(llm, engine._lock)

    engine.add_adapter("alice", folders[0])
    old = engine._lora_request("alice")
    assert llm.serve(old) == old.lora_int_id  # the shared prefix is now cached under "alice"
    engine.add_adapter("alice", folders[1])  # the learner's update
    new = engine._lora_request("alice")
    assert new.lora_int_id != old.lora_int_id and list(llm.loaded) == [new.lora_int_id]
    assert llm.serve(new) == new.lora_int_id  # not the KV the old weights computed
    engine.remove_adapter("alice")
    engine.add_adapter("alice", folders[0])  # removed, then registered again under the name
    again = engine._lora_request("alice")
    assert llm.serve(again) == again.lora_int_id


def test_an_ipc_sync_hands_the_workers_buffers_they_can_read_back_exactly(monkeypatch):
    """The engine's side of the CUDA IPC transport, with the handle replaced by a key into this process's buffers
    (``_share_cuda_`` needs a GPU): what the worker receives is plain data that unpacks to the sent tensors, in bf16,
    every chunk inside one reload. On a GPU the same sync runs through benchmarks/gpu_smoke.py."""
    from pettingllms.rollout.vllm import ipc

    buffers = {}
    monkeypatch.setattr(vllm_engine, "share_handle", lambda bucket: buffers.setdefault(len(buffers), bucket) is not None
                        and (len(buffers) - 1,))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)

    class IpcStubLLM(_StubLLM):
        received: dict[str, torch.Tensor] = {}

        def collective_rpc(self, method, args=()):
            if method == "load_weights_ipc":
                (key,), size, layout = args
                assert isinstance(size, int) and all(isinstance(row, list) for row in layout)
                bucket = buffers[key]
                assert bucket.numel() == size
                self.received.update({n: t.clone() for n, t in ipc.unpack_bucket(bucket, [tuple(r) for r in layout])})
                self.calls.append((method, tuple(row[0] for row in layout)))
                return [len(layout)]
            return super().collective_rpc(method, args)

    llm = IpcStubLLM()
    engine = _stub_engine(llm, None)
    engine.sync_transport = ipc.IPC
    monkeypatch.setattr(VLLMEngine, "_transport_for", lambda self, tensor: self.sync_transport)
    sent = dict(_layered())
    engine.sync_weights(iter(sent.items()))
    methods = [c[0] for c in llm.calls]
    assert methods[0] == "begin_weight_reload" and methods[-2:] == ["finish_weight_reload", "reset_prefix_cache"]
    assert methods.count("load_weights_ipc") == engine.last_sync_report.chunks >= 3
    assert "load_weights_file" not in methods and engine.last_sync_report.transport == ipc.IPC
    assert llm.received.keys() == sent.keys()
    for name, tensor in sent.items():
        assert torch.equal(llm.received[name], tensor.to(torch.bfloat16)), name


def test_a_cpu_sync_goes_through_shared_memory_and_a_bad_transport_is_refused(monkeypatch):
    llm = _StubLLM()
    engine = _stub_engine(llm, None)
    engine.sync_weights(_layered())
    assert engine.last_sync_report.transport == "shared_memory"
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ConfigError, match="sync_transport"):
        VLLMEngine("any-model", sync_transport="nccl")


def test_the_ipc_handle_asks_the_receiver_for_no_event():
    """torch's receiver opens the handle's event and never destroys it; every sender synchronizes first instead."""
    from pettingllms.rollout.vllm import ipc

    class Storage:
        def _share_cuda_(self):
            return (0, b"mem", 4096, 0, b"/torch_1", 3, b"event", True)

    class Bucket:
        def untyped_storage(self):
            return Storage()

    assert ipc.share_handle(Bucket()) == (0, b"mem", 4096, 0, b"/torch_1", 3, b"event", False)


def test_the_worker_copies_each_ipc_tensor_out_as_the_model_takes_it(monkeypatch):
    """``load_weights_ipc`` on a CPU buffer standing in for the mapped one: the model gets copies, never views of the
    sender's buffer, made one at a time as it consumes them, and the buffer is let go only after the last copy."""
    import types

    from pettingllms.rollout.vllm import ipc

    sent = dict(_layered(2))
    bucket, layout = ipc.pack_bucket(sent, torch.bfloat16)
    monkeypatch.setattr(ipc, "open_handle", lambda handle, size: bucket if size == bucket.numel() else None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: types.SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    config = types.ModuleType("vllm.config")
    config.set_current_vllm_config = lambda cfg: __import__("contextlib").nullcontext()
    monkeypatch.setitem(sys.modules, "vllm.config", config)
    received, pending = {}, []

    class Model:
        def load_weights(self, weights):
            for name, tensor in weights:
                pending.append(name)
                assert tensor.untyped_storage().data_ptr() != bucket.untyped_storage().data_ptr()
                received[name] = tensor

    clones = []
    real_clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda self, *a, **k: clones.append(len(pending)) or real_clone(self))
    worker = types.SimpleNamespace(vllm_config=None, model_runner=types.SimpleNamespace(get_model=Model))
    rows = [[name, dtype, list(shape), offset] for name, dtype, shape, offset in layout]
    assert VLLMWorkerWeightLoader.load_weights_ipc(worker, [0], bucket.numel(), rows) == len(sent)
    assert clones == list(range(len(sent)))  # each copy made when the model asked for that tensor, not before
    assert received.keys() == sent.keys()
    for name, tensor in sent.items():
        assert torch.equal(received[name], tensor.to(torch.bfloat16)), name
