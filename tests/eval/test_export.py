"""``pettingllms export``: a checkpoint becomes Hugging Face folders that transformers loads with the same logits
as the trained policy (full model; LoRA adapters; adapters merged with --merge-lora)."""

from __future__ import annotations

from pathlib import Path

import torch

from pettingllms.cli import main
from pettingllms.entry.train import run_training

TRAIN = [
    "base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
    "training.total_training_steps=1", "training.train_batch_size=2", "training.max_response_length=6",
    "training.val_freq=0", "training.export_hf=false", "training.plot=false", "training.resume=none",
    "rollout.branching=2", "optim.lr=0.05", "resources.use_ray=false",
    "agents.alice.train_sampling.max_tokens=6", "agents.bob.train_sampling.max_tokens=6",
]
INPUT = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11, 3365, 3437]])


def trained(tmp_path: Path, *level: str) -> Path:
    trainer, _ = run_training("train", TRAIN + [f"training.log_dir={tmp_path / 'run'}", *level])
    return trainer.run_dir


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT).logits


def trained_model(run: Path, adapters: tuple[str, ...] = ()):
    """The policy as the checkpoint holds it, built the way the trainer built it."""
    from pettingllms.models import LoraSpec, load_model
    from pettingllms.runtime.checkpoints import load_trained_weights

    lora = LoraSpec(rank=4, alpha=32.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj")) if adapters else None
    model = load_model("tiny-random-smollm2", "float32", lora, adapters)
    folder = run / "checkpoints" / "step_000001" / "policies" / "policy_0"
    assert load_trained_weights(model, folder, "policy_0", adapters) is not None
    return model.eval()


def test_a_full_model_checkpoint_exports_to_a_loadable_folder_with_its_tokenizer(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = trained(tmp_path)
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert f"policy_0: {tmp_path / 'hf' / 'policy_0'} (trained)" in capsys.readouterr().out
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "policy_0").eval()
    assert torch.allclose(logits(exported), logits(trained_model(run)), atol=1e-6)
    base = AutoModelForCausalLM.from_pretrained(
        __import__("pettingllms.models", fromlist=["resolve_model"]).resolve_model("tiny-random-smollm2")).eval()
    assert not torch.allclose(logits(exported), logits(base), atol=1e-4), "the export must hold the trained weights"
    assert AutoTokenizer.from_pretrained(tmp_path / "hf" / "policy_0").chat_template


def test_lora_adapters_export_as_peft_folders_and_merge_into_full_models(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from pettingllms.models import load_model, use_adapter

    run = trained(tmp_path, "specialization=L2", "base_models.policy_0.lora.rank=4")
    model = trained_model(run, ("alice", "bob"))
    assert main(["export", str(run / "checkpoints" / "step_000001"), "--out", str(tmp_path / "peft")]) == 0
    assert main(["export", str(run), "--out", str(tmp_path / "merged"), "--merge-lora"]) == 0
    for agent in ("alice", "bob"):
        with use_adapter(model, agent):
            expected = logits(model)
        peft = PeftModel.from_pretrained(load_model("tiny-random-smollm2"), tmp_path / "peft" / "policy_0" / agent)
        assert torch.allclose(logits(peft.eval()), expected, atol=1e-5)
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / "policy_0" / agent).eval()
        assert torch.allclose(logits(merged), expected, atol=1e-4), agent


def test_export_names_what_is_wrong(tmp_path, capsys):
    assert main(["export", str(tmp_path)]) == 2
    assert "neither a trainer run directory" in capsys.readouterr().err
