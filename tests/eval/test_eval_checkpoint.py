"""Evaluating what the trainer wrote: a checkpoint (run dir or step dir), its HF export (full model without a
tokenizer), and its per-agent LoRA adapters. Each source must give the same weights, hence the same greedy
responses, as the checkpoint it came from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eval_support import read_jsonl
from pettingllms.entry.eval import run_eval
from pettingllms.entry.train import run_training

TRAIN = [
    "base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
    "training.total_training_steps=1", "training.train_batch_size=2", "training.max_response_length=6",
    "training.val_freq=0", "training.export_hf=true", "training.plot=false", "training.resume=none",
    "rollout.branching=2", "optim.lr=0.05", "resources.use_ray=false",
    "agents.alice.train_sampling.max_tokens=6", "agents.bob.train_sampling.max_tokens=6",
]
EVAL = ["env.name=toy_targets", "env.benchmark=[procedural]", "env.max_val_problems=3", "env.max_turns=1",
        "eval.max_tokens=6"]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    trainer, _ = run_training("train", TRAIN + [f"training.log_dir={tmp_path_factory.mktemp('full')}"])
    return trainer.run_dir


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    trainer, _ = run_training("train", TRAIN + ["specialization=L2", "base_models.policy_0.lora.rank=4",
                                                f"training.log_dir={tmp_path_factory.mktemp('lora')}"])
    return trainer.run_dir


def responses(result) -> list[str]:
    bench = result.summary["benchmarks"]["toy_targets/procedural"]
    return [step["response"] for record in read_jsonl(result.run_dir / bench["records"])
            for sample in record["samples"] for step in sample["steps"]]


def evaluate(tmp_path: Path, name: str, *overrides: str):
    return run_eval("eval", [*EVAL, f"eval.log_dir={tmp_path / name}", *overrides], print_table=False)


def test_checkpoint_weights_are_the_trained_ones(full_run):
    from pettingllms.eval.checkpoints import load_policy_weights, resolve_checkpoint
    from pettingllms.models import load_model

    checkpoint, run = resolve_checkpoint(str(full_run))
    assert run == full_run and checkpoint.name == "step_000001"
    assert resolve_checkpoint(str(checkpoint)) == (checkpoint, full_run)
    model = load_model("tiny-random-smollm2")
    base = {k: v.clone() for k, v in model.state_dict().items()}
    assert "trained weights" in load_policy_weights(model, checkpoint, "policy_0", ())
    exported = load_model(full_run / "hf" / "policy_0").state_dict()
    trained = model.state_dict()
    assert all(torch.equal(trained[k], exported[k]) for k in trained)
    assert any(not torch.equal(trained[k], base[k]) for k in trained)  # the update changed something


def test_checkpoint_and_hf_export_give_the_same_responses(full_run, tmp_path):
    from_checkpoint = evaluate(tmp_path, "ckpt", f"model.checkpoint={full_run}")
    from_export = evaluate(tmp_path, "hf", f"base_models.policy_0.path={full_run / 'hf' / 'policy_0'}")
    policy = from_checkpoint.summary["model"]["policies"]["policy_0"]
    assert "trained weights" in policy["weights"] and from_checkpoint.summary["model"]["checkpoint"]
    assert responses(from_checkpoint) == responses(from_export)
    assert len(responses(from_checkpoint)) == 3 * 2  # 3 problems x 2 agents x 1 turn


def test_full_model_export_carries_its_tokenizer_and_chat_template(full_run):
    from transformers import AutoTokenizer

    from pettingllms.models import resolve_model

    exported = AutoTokenizer.from_pretrained(full_run / "hf" / "policy_0")  # served on its own, e.g. by vLLM
    original = AutoTokenizer.from_pretrained(resolve_model("tiny-random-smollm2"))
    chat = [{"role": "user", "content": "2 + 2?"}]
    assert exported.apply_chat_template(chat, tokenize=False) == original.apply_chat_template(chat, tokenize=False)
    assert exported("hello 123").input_ids == original("hello 123").input_ids


def test_lora_checkpoint_and_exported_adapters_give_the_same_responses(lora_run, tmp_path):
    from_checkpoint = evaluate(tmp_path, "ckpt", f"model.checkpoint={lora_run}")
    from_adapters = evaluate(tmp_path, "adapters", "base_models.policy_0.path=tiny-random-smollm2",
                             f"model.adapters={lora_run / 'hf' / 'policy_0'}")
    for result in (from_checkpoint, from_adapters):
        assert result.summary["model"]["agents"] == {"alice": {"policy": "policy_0", "adapter": "alice"},
                                                      "bob": {"policy": "policy_0", "adapter": "bob"}}
        assert result.summary["model"]["specialization"] == "L2"  # one adapter per agent, however they came
    assert responses(from_checkpoint) == responses(from_adapters)


def test_checkpoint_of_another_env_is_refused(lora_run, tmp_path, data_root):
    from pettingllms.core import ConfigError

    with pytest.raises(ConfigError, match=r"adapters \['reasoner', 'tool'\].*trained \['alice', 'bob'\]"):
        run_eval("eval", [f"model.checkpoint={lora_run}", f"env.data_root={data_root}",
                          "env.benchmark=[math/basic_arithmetic]", f"eval.log_dir={tmp_path}"], print_table=False)


def test_adapter_export_given_as_a_model_gets_a_hint(lora_run, tmp_path):
    from pettingllms.core import ConfigError

    with pytest.raises(ConfigError, match="holds LoRA adapters.*model.adapters="):
        evaluate(tmp_path, "wrong", f"base_models.policy_0.path={lora_run / 'hf' / 'policy_0'}")
