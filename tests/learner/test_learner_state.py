"""state_dict / load_state_dict resume bit-identically; export_hf writes loadable Hugging Face folders."""

import io
import json

import pytest
import torch

from pettingllms.learner import PolicyLearner
from settings_support import learner_config, kl_penalty


def _config():
    # Several epochs and mini-batches (old log-probs pass), warmup + cosine, adaptive KL: every piece of state.
    return learner_config(
        total_steps=6,
        warmup_steps=1,
        lr=1e-3,
        ppo_epochs=2,
        ppo_mini_batch_size=3,
        micro_batch_max_tokens=24,
        kl=kl_penalty(coef=0.05, adaptive=True, target=0.001, horizon=20),
    )


def _batches(make_samples, lora):
    batches = []
    for step in range(4):
        if lora:
            samples = make_samples(3, seed=10 + step, agent="alice", adapter="alice") + make_samples(
                3, seed=20 + step, agent="bob", adapter="bob", start=3
            )
        else:
            samples = make_samples(6, seed=10 + step)
        advantages = [((step + i) % 3 - 1) * 0.7 for i in range(6)]
        batches.append((samples, advantages))
    return batches


def _roundtrip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_resume_is_bit_identical(make_model, make_lora_model, make_samples, lora):
    build = (lambda: make_lora_model(0)) if lora else (lambda: make_model(0))
    names = ["alice", "bob"] if lora else []
    batches = _batches(make_samples, lora)

    straight = PolicyLearner(build(), _config(), adapter_names=names)
    for samples, advantages in batches:
        straight.update(samples, advantages)

    first = PolicyLearner(build(), _config(), adapter_names=names)
    for samples, advantages in batches[:2]:
        first.update(samples, advantages)
    state = _roundtrip(first.state_dict())
    for samples, advantages in batches[2:]:
        first.update(samples, advantages)  # a snapshot must not change when training goes on

    resumed = PolicyLearner(build(), _config(), adapter_names=names)  # fresh model, initial weights
    resumed.load_state_dict(state)
    assert resumed.step == 2
    for samples, advantages in batches[2:]:
        resumed.update(samples, advantages)

    assert resumed.step == straight.step == 4
    assert resumed.lr == straight.lr and resumed.kl_coefs == straight.kl_coefs
    assert straight.kl_coefs != {s: 0.05 for s in straight.kl_coefs}  # the adaptive coefficient did move
    for (name, a), (_, b) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name


def test_load_state_dict_rejects_a_different_layout(make_model, make_lora_model):
    lora_state = PolicyLearner(make_lora_model(0), _config(), adapter_names=["alice", "bob"]).state_dict()
    with pytest.raises(ValueError, match="adapters"):
        PolicyLearner(make_lora_model(0), _config(), adapter_names=["alice"]).load_state_dict(lora_state)
    with pytest.raises(ValueError, match="KL"):
        PolicyLearner(make_model(0), learner_config(total_steps=6)).load_state_dict(
            PolicyLearner(make_model(0), _config()).state_dict()
        )


def test_lora_state_holds_only_adapter_weights(make_lora_model):
    state = PolicyLearner(make_lora_model(0), _config(), adapter_names=["alice", "bob"]).state_dict()
    assert state["model"] and all("lora_" in name for name in state["model"])
    assert any(".alice." in n for n in state["model"]) and any(".bob." in n for n in state["model"])


def test_export_full_model(tmp_path, make_model, make_samples):
    from transformers import LlamaForCausalLM

    learner = PolicyLearner(make_model(0), learner_config(total_steps=2, lr=1e-3))
    learner.update(make_samples(3, seed=1), [1.0, -1.0, 0.5])
    learner.export_hf(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").exists()
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    for (name, a), (_, b) in zip(learner.model.named_parameters(), reloaded.named_parameters()):
        assert torch.equal(a, b), name


def test_export_lora_writes_one_folder_per_agent(tmp_path, make_model, make_lora_model, make_samples):
    from peft import PeftModel

    learner = PolicyLearner(make_lora_model(0), learner_config(total_steps=2, lr=1e-3), adapter_names=["alice", "bob"])
    samples = make_samples(2, seed=1, agent="alice", adapter="alice") + make_samples(
        2, seed=2, agent="bob", adapter="bob", start=2
    )
    learner.update(samples, [1.0, -1.0, -1.0, 1.0])
    folders = learner.export_hf(tmp_path / "out")
    assert folders == [tmp_path / "out" / "alice", tmp_path / "out" / "bob"]
    for folder in folders:
        assert (folder / "adapter_model.safetensors").exists()
        assert json.loads((folder / "adapter_config.json").read_text())["pettingllms_agent"] == folder.name

    # peft ignores (with a warning) the extra "pettingllms_agent" key when it reads the config back.
    with pytest.warns(UserWarning, match="pettingllms_agent"):
        reloaded = PeftModel.from_pretrained(make_model(0), folders[0], adapter_name="alice")
        reloaded.load_adapter(folders[1], adapter_name="bob")
    check = PolicyLearner(reloaded, learner_config(total_steps=1), adapter_names=["alice", "bob"])
    assert check.compute_logprobs(samples) == learner.compute_logprobs(samples)
