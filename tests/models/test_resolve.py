"""resolve_model: aliases convert once and are reused; bad local paths and offline hub ids fail clearly."""

import json
import sys
import time
from pathlib import Path

import pytest
import torch

from pettingllms.core.errors import ConfigError
from pettingllms.models import aliases
from pettingllms.models.aliases import MANIFEST
from pettingllms.models.resolve import resolve_model


def test_packaged_alias_is_converted_once_and_reused(smollm2_dir):
    start = time.perf_counter()
    again = resolve_model("smollm2-135m-instruct")
    assert time.perf_counter() - start < 1.0, "the second resolve must reuse the converted cache"
    assert again == smollm2_dir
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json", MANIFEST):
        assert (smollm2_dir / name).is_file(), name
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert not list(smollm2_dir.parent.glob(".smollm2-135m-instruct.tmp-*")), "no half-written leftovers"


def test_converted_tokenizer_has_chat_template_and_right_special_tokens(smollm2_dir):
    from pettingllms.models import load_tokenizer

    tokenizer = load_tokenizer(smollm2_dir)
    assert "<|im_start|>" in tokenizer.chat_template
    # GGUF metadata: eos = <|im_end|> (2); we pad with <|endoftext|> (0) so that pad != eos.
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 0)
    assert tokenizer.bos_token == "<|im_start|>"
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2 and generation["pad_token_id"] == 0


@pytest.mark.slow
def test_converted_weights_equal_the_dequantized_gguf(smollm2_dir):
    from transformers import AutoModelForCausalLM

    gguf = aliases.packaged_smollm2_gguf()
    original = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    expected, found = original.state_dict(), converted.state_dict()
    assert expected.keys() == found.keys()
    for name in expected:
        assert torch.equal(expected[name], found[name]), name


def _fake_builds(monkeypatch, calls):
    def fake_convert(gguf_path, dest, *, pad_token=None):
        calls.append(dest)
        (dest / "config.json").write_text("{}")

    monkeypatch.setattr(aliases, "convert_gguf_model", fake_convert)


def test_alias_cache_is_built_once_per_cache_dir(tmp_path, monkeypatch):
    calls = []
    _fake_builds(monkeypatch, calls)
    first = resolve_model("smollm2-135m-instruct", cache_dir=tmp_path)
    second = resolve_model("smollm2-135m-instruct", cache_dir=tmp_path)
    assert first == second == tmp_path / "models" / "smollm2-135m-instruct"
    assert len(calls) == 1
    manifest = json.loads((first / MANIFEST).read_text())
    assert manifest["alias"] == "smollm2-135m-instruct"
    assert manifest["source"]["gguf"] == aliases.SMOLLM2_GGUF


def test_environment_variable_moves_the_cache(tmp_path, monkeypatch):
    calls = []
    _fake_builds(monkeypatch, calls)
    monkeypatch.setenv("PETTINGLLMS_CACHE", str(tmp_path / "elsewhere"))
    assert resolve_model("smollm2-135m-instruct") == tmp_path / "elsewhere" / "models" / "smollm2-135m-instruct"


def test_a_crash_while_converting_leaves_no_model_directory(tmp_path, monkeypatch):
    def crashing_convert(gguf_path, dest, *, pad_token=None):
        (dest / "model.safetensors").write_bytes(b"half a model")
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(aliases, "convert_gguf_model", crashing_convert)
    with pytest.raises(RuntimeError, match="killed mid-write"):
        resolve_model("smollm2-135m-instruct", cache_dir=tmp_path)
    models = tmp_path / "models"
    assert not (models / "smollm2-135m-instruct").exists()
    assert list(models.iterdir()) == [], "the temporary directory is cleaned up too"


def test_converting_without_the_gguf_package_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # what a missing package looks like to import
    with pytest.raises(ConfigError, match="needs the 'gguf' package.*pip install gguf"):
        aliases.convert_gguf_model(aliases.packaged_smollm2_gguf(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_stale_cache_is_rebuilt(tmp_path, monkeypatch):
    calls = []
    _fake_builds(monkeypatch, calls)
    stale = tmp_path / "models" / "smollm2-135m-instruct"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    (stale / MANIFEST).write_text(json.dumps({"format": 0}))
    assert resolve_model("smollm2-135m-instruct", cache_dir=tmp_path) == stale
    assert len(calls) == 1
    assert json.loads((stale / MANIFEST).read_text())["format"] == aliases.MANIFEST_FORMAT


def test_local_directory_is_returned_as_is(tiny_dir):
    assert resolve_model(str(tiny_dir)) == tiny_dir.resolve()


def test_local_directory_without_config_is_a_clear_error(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model(tmp_path)


def test_missing_local_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "no" / "such" / "model"
    with pytest.raises(ConfigError, match="does not exist") as info:
        resolve_model(missing)
    assert str(missing) in str(info.value)


def test_offline_hub_id_names_the_id_and_the_fixes(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError) as info:
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    message = str(info.value)
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in message
    assert "HF_HUB_OFFLINE" in message
    assert "local directory" in message and "smollm2-135m-instruct" in message


def test_hub_id_already_in_the_hf_cache_resolves_offline(tmp_path, monkeypatch, tiny_dir):
    """The real snapshot_download path, fed from a local HF cache laid out as the hub client writes it."""
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tiny-chat"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in Path(tiny_dir).iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_model("acme/tiny-chat") == snapshot.resolve()


@pytest.mark.parametrize("spec", ["", "   ", "not a model id!"])
def test_malformed_specs_are_rejected(spec):
    with pytest.raises(ConfigError):
        resolve_model(spec)
