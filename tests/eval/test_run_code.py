"""A run directory's files are data: what its config.yaml names is not imported or built by eval, export, resume or
a dry run unless the user names it or vouches for the run (``pettingllms/eval/run_code.py``). Each payload would
write a marker file if it ran; the marker must not appear."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from pettingllms.cli import main

TRAIN = [
    "base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
    "training.total_training_steps=1", "training.train_batch_size=2", "training.max_response_length=6",
    "training.val_freq=0", "training.export_hf=false", "training.plot=false",
    "rollout.branching=2", "resources.use_ray=false",
    "agents.alice.train_sampling.max_tokens=6", "agents.bob.train_sampling.max_tokens=6",
]
EVAL = ["env.benchmark=[procedural]", "env.max_val_problems=2", "eval.max_tokens=4"]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> Path:
    from pettingllms.entry.train import run_training

    trainer, _ = run_training("train", TRAIN + ["training.resume=none",
                                                f"training.log_dir={tmp_path_factory.mktemp('logs')}"])
    return trainer.run_dir


def poisoned(clean_run: Path, tmp_path: Path, payload: str) -> tuple[Path, Path]:
    """A copy of the run whose config.yaml carries ``payload``, and the marker file the payload would write."""
    run = tmp_path / "shared_run"
    shutil.copytree(clean_run, run)
    marker = tmp_path / "MARKER"
    config = yaml.safe_load((run / "config.yaml").read_text())
    if payload == "popen":  # an "agent class" that is a process launcher, with a shell command as its option
        config["agents"]["alice"]["cls"] = "subprocess:Popen"
        config["agents"]["alice"]["options"] = {"args": f"touch {marker}", "shell": True}
    elif payload == "program":  # an "agent program" beside the config, named as the env's program
        (run / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
        config["env"]["name"] = "program"
        config["env"]["options"] = {"program": "evil"}
    else:  # a module beside the config, named in env.imports
        (run / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
        config["env"]["imports"] = ["evil"]
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run, marker


@pytest.fixture()
def no_evil_module():
    yield
    sys.modules.pop("evil", None)


@pytest.mark.parametrize("payload", ["popen", "imports", "program"])
def test_eval_and_export_refuse_code_named_by_a_run_and_run_none_of_it(clean_run, tmp_path, monkeypatch, capsys,
                                                                       payload, no_evil_module):
    run, marker = poisoned(clean_run, tmp_path, payload)
    monkeypatch.chdir(run)  # started from inside the run directory, where evil.py lies
    key = {"popen": "agents.alice.cls=subprocess:Popen", "imports": "env.imports=[evil]",
           "program": "env.options.program=evil"}[payload]
    assert main(["eval", f"model.checkpoint={run}", f"eval.log_dir={tmp_path / 'eval'}", *EVAL]) == 2
    err = capsys.readouterr().err
    assert key in err and "model.trust_run_code=true" in err and "Traceback" not in err, err
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert key in err and "--trust-run-code" in err, err
    assert not marker.exists()
    assert not (tmp_path / "hf").exists()


def test_resume_and_dry_run_read_no_code_from_the_run_directory(clean_run, tmp_path, monkeypatch, capsys,
                                                                no_evil_module):
    from pettingllms.entry.train import run_training

    for payload in ("popen", "imports"):
        run, marker = poisoned(clean_run, tmp_path / payload, payload)
        monkeypatch.chdir(run)
        step = run / "checkpoints" / "step_000001"
        resume = [*TRAIN, f"training.resume={step}", "training.total_training_steps=2", f"training.log_dir={run}"]
        assert main(["train", "--dry-run", *resume]) == 0, capsys.readouterr().err
        trainer, _ = run_training("train", resume)
        assert trainer.step_done == 2 and trainer.run_dir == run
        assert not marker.exists(), payload


def test_a_name_that_reaches_no_agent_or_env_class_is_refused_even_when_trusted(clean_run, tmp_path, monkeypatch,
                                                                                capsys):
    run, marker = poisoned(clean_run, tmp_path, "popen")
    assert main(["eval", f"model.checkpoint={run}", "model.trust_run_code=true",
                 f"eval.log_dir={tmp_path / 'eval'}", *EVAL]) == 2
    err = capsys.readouterr().err
    assert "'subprocess:Popen' is subprocess:Popen, not a subclass of pettingllms.Agent" in err, err
    assert main(["export", str(run), "--trust-run-code", "--out", str(tmp_path / "hf")]) == 2
    assert "not a subclass of pettingllms.Agent" in capsys.readouterr().err
    assert main(["train", "--dry-run", "env.name=subprocess:Popen"]) == 2
    assert "not a subclass of pettingllms.Env" in capsys.readouterr().err
    assert not marker.exists()


def test_a_trusted_run_and_a_user_named_module_are_imported(clean_run, tmp_path, monkeypatch, no_evil_module):
    """The opt-ins do what they say: the same module runs once the user names it or vouches for the run."""
    run, marker = poisoned(clean_run, tmp_path, "imports")
    monkeypatch.chdir(run)
    assert main(["export", str(run), "--trust-run-code", "--out", str(tmp_path / "hf")]) == 0
    assert marker.exists() and (tmp_path / "hf" / "policy_0").is_dir()
    marker.unlink()
    sys.modules.pop("evil", None)
    assert main(["eval", f"model.checkpoint={run}", "env.imports=[evil]", f"eval.log_dir={tmp_path / 'eval'}",
                 *EVAL]) == 0
    assert marker.exists()


def test_a_symlinked_shard_or_a_latest_pointer_leaving_the_run_is_refused(clean_run, tmp_path, capsys):
    import os

    from pettingllms.entry.train import run_training
    from pettingllms.core import UnsafeCheckpointError

    run = tmp_path / "run"
    shutil.copytree(clean_run, run)
    step = run / "checkpoints" / "step_000001"
    shard = next(p for p in sorted(step.rglob("*")) if p.is_file() and p.suffix in (".distcp", ".pt"))
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(shard.read_bytes())
    shard.unlink()
    os.symlink(outside, shard)
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 2
    assert "is a symlink to" in capsys.readouterr().err
    with pytest.raises(UnsafeCheckpointError, match="is a symlink to"):
        run_training("train", [*TRAIN, f"training.resume={step}", "training.total_training_steps=2",
                               f"training.log_dir={run}"])
    shard.unlink()
    shard.write_bytes(outside.read_bytes())
    (run / "checkpoints" / "latest").write_text("../../elsewhere")
    assert main(["eval", f"model.checkpoint={run}", f"eval.log_dir={tmp_path / 'eval'}", *EVAL]) == 2
    assert "not a step directory inside" in capsys.readouterr().err


def test_the_settings_taken_from_a_run_print_option_values():
    from pettingllms.eval.run_settings import _describe

    assert _describe({"settle": True, "game": "kuhn_poker"}) == "{settle=True, game=kuhn_poker}"


@pytest.mark.parametrize("damage", ["truncated shard", "garbage rank file", "pickled object in rank file"])
def test_a_damaged_checkpoint_is_refused_in_one_line_by_eval_export_resume_and_dry_run(clean_run, tmp_path, capsys,
                                                                                     damage):
    """A full disk or an interrupted copy truncates a shard; an edit breaks a rank file. Each command names the file
    in one line (exit 2, no traceback), and --dry-run of a resume checks the files too."""
    import torch

    run = tmp_path / "run"
    shutil.copytree(clean_run, run)
    step = run / "checkpoints" / "step_000001"
    if damage == "truncated shard":
        shard = max((p for p in step.rglob("*.distcp")), key=lambda p: p.stat().st_size)
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
        expected = "is truncated or incomplete"
    else:
        (rank,) = step.rglob("rank_0.pt")
        if damage == "garbage rank file":
            rank.write_bytes(b"not a torch file")
        else:  # a torch file whose pickle builds an object: weights_only refuses it
            torch.save({"torch_rng": ValueError("x"), "engine_rng": None}, rank)
        expected = "cannot be read" if damage == "garbage rank file" else "refers to exceptions.ValueError, which a checkpoint never needs"
    assert main(["eval", f"model.checkpoint={run}", f"eval.log_dir={tmp_path / 'eval'}", *EVAL]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 2
    assert expected in capsys.readouterr().err
    resume = [*TRAIN, f"training.resume={step}", "training.total_training_steps=2", f"training.log_dir={run}"]
    assert main(["train", *resume, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
    assert main(["train", *resume]) == 2
    assert expected in capsys.readouterr().err
