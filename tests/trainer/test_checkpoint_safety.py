"""A checkpoint cannot run code: a tampered ``.metadata`` in a checkpoint the trainer wrote is refused by
``pettingllms eval model.checkpoint=...`` (the command line) and by ``training.resume=<it>`` (a real Trainer), with
one line naming the file and the function it refers to, and its payload never runs. The same file read with
plain pickle (what torch's DCP does) runs the payload, so these tests fail where the refusal is missing."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from pettingllms.cli import main
from pettingllms.core import UnsafeCheckpointError
from pettingllms.entry.train import run_training
from pettingllms.learner.safe_dcp import read_metadata
from pettingllms.runtime import checkpoints as ckpt

TRAIN = [
    "base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
    "training.total_training_steps=1", "training.train_batch_size=2", "training.max_response_length=6",
    "training.val_freq=0", "training.export_hf=false", "training.plot=false", "resources.use_ray=false",
    "rollout.branching=2", "agents.alice.train_sampling.max_tokens=6", "agents.bob.train_sampling.max_tokens=6",
]
EVAL = ["env.name=toy_targets", "env.benchmark=[procedural]", "env.max_val_problems=2", "env.max_turns=1",
        "eval.max_tokens=4"]


class TouchFile:
    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    trainer, _ = run_training("train", TRAIN + ["training.resume=none",
                                                f"training.log_dir={tmp_path_factory.mktemp('logs')}"])
    return trainer.run_dir


@pytest.fixture
def tampered(trained_run, tmp_path):
    """A copy of the run whose checkpoint index would ``touch`` a marker file when unpickled:
    (step dir, index file, marker)."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    step_dir = ckpt.latest_checkpoint(run / "checkpoints")
    index = ckpt.policy_dir(step_dir, "policy_0") / ckpt.SHARDS_DIR / ".metadata"
    marker = tmp_path / "payload_ran"
    metadata = read_metadata(index)
    metadata.planner_data["payload"] = TouchFile(marker)
    index.write_bytes(pickle.dumps(metadata))
    return step_dir, index, marker


def test_the_tampered_index_runs_its_payload_under_plain_pickle(tampered):
    _, index, marker = tampered
    with open(index, "rb") as stream:
        pickle.load(stream)
    assert marker.exists()


def test_eval_command_refuses_the_tampered_checkpoint(tampered, tmp_path, capsys):
    step_dir, index, marker = tampered
    code = main(["eval", *EVAL, f"model.checkpoint={step_dir.parents[1]}", f"eval.log_dir={tmp_path / 'eval'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert (f"error: checkpoint {index} refers to posix.system, which a checkpoint never needs: refusing to load it"
            in err.splitlines())
    assert "Traceback" not in err
    assert not marker.exists()


def test_resume_refuses_the_tampered_checkpoint(tampered, tmp_path):
    step_dir, index, marker = tampered
    with pytest.raises(UnsafeCheckpointError) as refused:
        run_training("train", TRAIN + ["training.total_training_steps=2", f"training.resume={step_dir}",
                                       f"training.log_dir={tmp_path / 'logs'}"])
    assert str(refused.value) == (f"checkpoint {index} refers to posix.system, which a checkpoint never needs: "
                                  "refusing to load it")
    assert not marker.exists()


def test_an_untampered_checkpoint_still_evaluates(trained_run, tmp_path, capsys):
    assert main(["eval", *EVAL, f"model.checkpoint={trained_run}", f"eval.log_dir={tmp_path / 'eval'}"]) == 0
