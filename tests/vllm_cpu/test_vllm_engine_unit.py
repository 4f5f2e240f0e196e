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


class _RecordingWorker(VLLMWorkerWeightLoader):
    """Stands in for vLLM's worker (which supplies reload_weights); records what the extension hands it."""

    refreshed = False

    def reload_weights(self, weights_iterator, is_checkpoint_format):
        self.received = {name: tensor.clone() for name, tensor in weights_iterator}
        self.checkpoint_format = is_checkpoint_format

    def refresh_cpu_packed_weights(self) -> int:  # needs vLLM's model; the vllm_cpu lane runs the real one
        self.refreshed = True
        return 0


def test_worker_extension_reloads_every_shared_tensor():
    weights = {"model.norm.weight": torch.arange(4.0), "model.embed_tokens.weight": torch.randn(3, 4)}
    path = write_shared_weights(weights)
    worker = _RecordingWorker()
    try:
        assert worker.load_weights_file(str(path)) == 2
    finally:
        path.unlink()
    assert worker.checkpoint_format is True and worker.refreshed
    assert set(worker.received) == set(weights)
    assert all(torch.equal(worker.received[name], tensor) for name, tensor in weights.items())


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
