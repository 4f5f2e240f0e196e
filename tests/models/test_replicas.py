"""Replicas of the real hub checkpoints: recorded facts that agree with the published file sizes and with
transformers, and tiny random copies that keep the real names, shard files, tying, token ids and chat template.
Nothing here writes a full-size replica: full shapes are checked on the ``meta`` device and from the facts."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from pettingllms.core.errors import ConfigError
from pettingllms.models import replicas, resolve_model
from pettingllms.models.resolve import ALIASES

MODELS = ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct"]
QWEN = [m for m in MODELS if m.startswith("Qwen/")]
VLLM_CPU_HEAD_SIZES = {32, 64, 80, 96, 112, 128}
TWO_MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Add 2 and 3."}]


@pytest.fixture(scope="module")
def tiny_dirs(smollm2_dir):
    """The cached ``tiny-replica-*`` aliases (built on first use, about a second each)."""
    return {model: resolve_model(replicas.tiny_alias(model)) for model in MODELS}


def _stored(directory) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (file, shape) for every tensor stored in a model directory's safetensors files."""
    found = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                assert name not in found, f"{name} stored twice"
                found[name] = (path.name, tuple(handle.get_slice(name).get_shape()))
    return found


def _digest(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


# ---- the recorded facts ----


def test_the_named_models_are_recorded_and_looked_up_by_hub_id_in_any_case():
    assert replicas.known_models() == sorted(MODELS)
    config = replicas.recorded_config("qwen/QWEN3-1.7b")
    assert config == replicas.recorded_config("Qwen/Qwen3-1.7B")
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (2048, 6144, 28)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (16, 8, 128)
    assert (config["vocab_size"], config["tie_word_embeddings"], config["rope_theta"]) == (151936, True, 1000000)
    assert (config["max_position_embeddings"], config["rms_norm_eps"]) == (40960, 1e-6)
    assert config["torch_dtype"] == "bfloat16" and config["hidden_act"] == "silu"
    assert (config["use_sliding_window"], config["sliding_window"], config["max_window_layers"]) == (False, None, 28)
    assert (config["bos_token_id"], config["eos_token_id"], config["attention_bias"]) == (151643, 151645, False)
    assert replicas.recorded_config("Qwen/Qwen3-8B")["tie_word_embeddings"] is False  # 8B is untied
    assert replicas.recorded_facts("meta-llama/Meta-Llama-3.1-8B-Instruct")["hub_id"] == MODELS[3]  # renamed repo
    assert replicas.recorded_facts("nobody/nothing") is None and replicas.recorded_config("nobody/nothing") is None
    config["hidden_size"] = 1  # a copy: the recorded facts do not change
    assert replicas.recorded_config("Qwen/Qwen3-1.7B")["hidden_size"] == 2048


@pytest.mark.parametrize("model", MODELS)
def test_recorded_facts_reproduce_the_published_file_sizes(model):
    """config, generation config, tokenizer config, index and every weight file, to the byte."""
    facts = replicas.recorded_facts(model)
    for filename, style in facts["files"].items():
        assert len(replicas.hub_json_text(model, filename).encode()) == style["bytes"], filename
    plan = replicas.replica_plan(model, "full")
    weights = facts["weights"]
    assert sum(s.nbytes for s in plan) == weights["total_size"]
    for recorded in weights["files"]:
        group = [s for s in plan if s.file == recorded["name"]]
        assert len(group) == recorded["tensor_count"]
        assert replicas.safetensors_file_bytes(group) == recorded["bytes"], recorded["name"]
    if weights["index_file"]:
        assert len(replicas.index_json_text(plan).encode()) == weights["index_json_bytes"]
    assert {s.file for s in plan} == {f["name"] for f in weights["files"]}


@pytest.mark.parametrize("model", MODELS)
def test_the_full_config_on_the_meta_device_has_exactly_the_recorded_tensors(model):
    facts = replicas.recorded_facts(model)
    config = replicas.replica_config(model, "full")
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(replicas.hf_config(config))
    assert type(built).__name__ == config["architectures"][0]
    stored = [(name, tuple(t.shape)) for name, t in built.state_dict().items()]
    assert stored == [(s.name, s.shape) for s in replicas.replica_plan(model, "full")]
    assert sum(p.numel() for p in built.parameters()) == facts["weights"]["parameters_unique"]  # tied: once
    assert sum(t.numel() for t in built.state_dict().values()) == facts["weights"]["parameters_stored"]


def test_qwen3_quirks_are_recorded():
    q17 = {s.name: s for s in replicas.replica_plan("Qwen/Qwen3-1.7B", "full")}
    assert replicas.recorded_facts("Qwen/Qwen3-1.7B")["weights"]["parameters_unique"] == 1_720_574_976
    assert sum(s.numel for s in q17.values()) == 2_031_739_904  # the tied head counted separately
    head = q17["lm_head.weight"]
    assert (head.shape, head.dtype, head.file) == ((151936, 2048), "BF16", "model-00002-of-00002.safetensors")
    assert [s.name for s in q17.values() if s.file == head.file] == ["lm_head.weight"]
    assert q17["model.layers.27.self_attn.q_norm.weight"].shape == (128,)
    q06 = {s.name: s for s in replicas.replica_plan("Qwen/Qwen3-0.6B", "full")}
    assert {s.file for s in q06.values()} == {"model.safetensors"} and "lm_head.weight" in q06
    assert q06["model.layers.0.self_attn.q_proj.weight"].shape == (2048, 1024)  # attention wider than hidden
    q8 = [s for s in replicas.replica_plan("Qwen/Qwen3-8B", "full") if s.file == "model-00005-of-00005.safetensors"]
    assert [s.name for s in q8] == ["lm_head.weight"]
    tokenizer = replicas.recorded_facts("Qwen/Qwen3-1.7B")["tokenizer"]
    assert tokenizer["size"] == 151669 and tokenizer["regular_tokens"] == 151643
    assert tokenizer["notable_ids"]["<think>"] == 151667 and tokenizer["eos_token_id"] == 151645
    assert "enable_thinking is defined and enable_thinking is false" in tokenizer["tokenizer_config"]["chat_template"]


# ---- the tiny replicas ----


def test_every_recorded_model_has_a_tiny_alias():
    assert {replicas.tiny_alias(m) for m in MODELS} == {
        "tiny-replica-qwen3-0.6b", "tiny-replica-qwen3-1.7b", "tiny-replica-qwen3-8b",
        "tiny-replica-llama-3.1-8b-instruct",
    }
    assert all(replicas.tiny_alias(m) in ALIASES for m in MODELS)


@pytest.mark.parametrize("model", MODELS)
def test_tiny_replica_loads_with_the_real_class_tying_and_a_vllm_cpu_head_size(tiny_dirs, model):
    directory = tiny_dirs[model]
    config = json.loads((directory / "config.json").read_text())
    real = replicas.recorded_config(model)
    assert config == replicas.replica_config(model, "tiny")
    for key in ("architectures", "model_type", "tie_word_embeddings", "rope_theta", "rope_scaling", "vocab_size",
                "rms_norm_eps", "attention_bias", "torch_dtype", "bos_token_id", "eos_token_id"):
        assert config[key] == real[key], key
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    assert head_dim in VLLM_CPU_HEAD_SIZES
    group = real["num_attention_heads"] // real["num_key_value_heads"]
    assert config["num_attention_heads"] // config["num_key_value_heads"] == group
    model_ = AutoModelForCausalLM.from_pretrained(directory)
    assert type(model_).__name__ == real["architectures"][0]
    tied = model_.lm_head.weight is model_.model.embed_tokens.weight
    assert tied == real["tie_word_embeddings"]
    with torch.no_grad():
        logits = model_(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, real["vocab_size"])


@pytest.mark.parametrize("model", MODELS)
def test_tiny_replica_stores_the_real_names_in_the_real_files(tiny_dirs, model):
    directory = tiny_dirs[model]
    plan = replicas.replica_plan(model, "tiny")
    stored = _stored(directory)
    assert stored == {s.name: (s.file, s.shape) for s in plan}
    real = {s.name: s.file for s in replicas.replica_plan(model, "full")}
    assert {f for f, _ in stored.values()} == set(real.values())  # every real file, no other
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        assert stored[name][0] == real[name], name  # same relative shard position
    for filename in {s.file for s in plan}:
        group = [s for s in plan if s.file == filename]
        assert (directory / filename).stat().st_size == replicas.safetensors_file_bytes(group)
    if replicas.recorded_facts(model)["weights"]["index_file"]:
        index = json.loads((directory / "model.safetensors.index.json").read_text())
        assert index["weight_map"] == {name: file for name, (file, _) in stored.items()}
        assert all((directory / file).is_file() for file in index["weight_map"].values())
        assert index["metadata"]["total_size"] == sum(s.nbytes for s in plan)
    else:
        assert not (directory / "model.safetensors.index.json").exists()
    if replicas.recorded_config(model)["tie_word_embeddings"]:
        with safe_open(str(directory / stored["lm_head.weight"][0]), framework="pt") as handle:
            head = handle.get_tensor("lm_head.weight")
        with safe_open(str(directory / stored["model.embed_tokens.weight"][0]), framework="pt") as handle:
            assert torch.equal(head, handle.get_tensor("model.embed_tokens.weight"))


@pytest.mark.parametrize("model", QWEN)
def test_qwen3_tiny_chat_template_switches_thinking_off_like_qwen3(tiny_dirs, model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs[model])
    facts = replicas.recorded_facts(model)["tokenizer"]
    assert len(tokenizer) == facts["size"]
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in facts["notable_ids"]} == facts["notable_ids"]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token) == (151645, 151643, None)
    off = tokenizer.apply_chat_template(TWO_MESSAGES, tokenize=False, add_generation_prompt=True,
                                        enable_thinking=False)
    assert off == ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
                   "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    on = tokenizer.apply_chat_template(TWO_MESSAGES, tokenize=False, add_generation_prompt=True)
    assert on.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer(off, add_special_tokens=False)["input_ids"]
    assert (ids[-4], ids[-2], ids[-3]) == (151667, 151668, ids[-1])  # <think> "\n\n" </think> "\n\n"
    assert tokenizer.decode(ids) == off


def test_llama_tiny_chat_template_and_bos(tiny_dirs):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs["meta-llama/Llama-3.1-8B-Instruct"])
    assert len(tokenizer) == 128256
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (128000, 128009, None)
    text = tokenizer.apply_chat_template(TWO_MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are terse.<|eot_id|>" in text
    assert text.endswith("Add 2 and 3.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert tokenizer("hi")["input_ids"][0] == 128000  # the tokenizer adds <|begin_of_text|> itself


def test_building_is_deterministic_for_a_seed(tmp_path, smollm2_dir):
    model = "Qwen/Qwen3-0.6B"
    first = replicas.build_replica(model, tmp_path / "a", seed=0, tokenizer_dir=smollm2_dir)
    second = replicas.build_replica(model, tmp_path / "b", seed=0, tokenizer_dir=smollm2_dir)
    third = replicas.build_replica(model, tmp_path / "c", seed=1, tokenizer_dir=smollm2_dir)
    assert _digest(first) == _digest(second)
    differs = {name for name, digest in _digest(third).items() if _digest(first)[name] != digest}
    assert differs == {"model.safetensors"}


def test_unknown_models_and_sizes_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="Qwen/Qwen3-1.7B"):
        replicas.build_replica("nobody/nothing", tmp_path / "x")
    with pytest.raises(ConfigError, match="tiny"):
        replicas.replica_plan("Qwen/Qwen3-1.7B", size="huge")
    assert not (tmp_path / "x").exists()


def test_command_line_builds_a_replica(tmp_path, smollm2_dir, capsys):
    dest = tmp_path / "cli"
    code = replicas.main(["qwen/qwen3-8b", str(dest), "--size", "tiny", "--tokenizer-dir", str(smollm2_dir)])
    assert code == 0 and str(dest) in capsys.readouterr().out
    assert len(list(dest.glob("model-0000?-of-00005.safetensors"))) == 5
    assert replicas.main(["nobody/nothing", str(tmp_path / "y")]) == 2
