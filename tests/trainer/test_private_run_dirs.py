"""Run directories (training and eval) are owner-only and checkpoint files are not readable by others, unless
``training.share_run_dir=true``; even under a permissive umask (022, the usual one)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from pettingllms.entry.eval import run_eval
from pettingllms.entry.train import run_training

TRAIN = [
    "base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
    "training.total_training_steps=1", "training.train_batch_size=2", "training.max_response_length=6",
    "training.val_freq=0", "training.export_hf=false", "training.plot=false", "training.resume=none",
    "resources.use_ray=false", "rollout.branching=2", "agents.alice.train_sampling.max_tokens=6",
    "agents.bob.train_sampling.max_tokens=6",
]
EVAL = ["env.name=toy_targets", "env.benchmark=[procedural]", "env.max_val_problems=2", "env.max_turns=1",
        "eval.max_tokens=4"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask():
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    previous = os.umask(0o022)
    yield
    os.umask(previous)
    torch.set_num_threads(previous_threads)


@pytest.mark.parametrize("share", [False, True], ids=["private", "shared"])
def test_run_dirs_and_checkpoints_are_owner_only_unless_shared(tmp_path, share):
    setting = f"training.share_run_dir={str(share).lower()}"
    trainer, _ = run_training("train", TRAIN + [setting, f"training.log_dir={tmp_path / 'logs'}"])
    run = trainer.run_dir
    checkpoint_files = [p for p in (run / "checkpoints").rglob("*") if p.is_file()]
    assert {p.name for p in checkpoint_files} >= {"latest", "trainer_state.json", ".metadata", "rank_0.pt"}
    evaluated = run_eval("eval", [*EVAL, setting, f"model.checkpoint={run}", f"eval.log_dir={tmp_path / 'eval'}"],
                         print_table=False)
    if share:
        assert mode(run) == mode(evaluated.run_dir) == 0o755
        assert all(mode(p) & 0o044 == 0o044 for p in checkpoint_files)  # group and others may read them
    else:
        assert mode(run) == mode(evaluated.run_dir) == 0o700
        assert all(mode(p) & 0o077 == 0 for p in checkpoint_files), {p.name: oct(mode(p)) for p in checkpoint_files}
        assert all(mode(p) == 0o700 for p in (run / "checkpoints").rglob("*") if p.is_dir())
