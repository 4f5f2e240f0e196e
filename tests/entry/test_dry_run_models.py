"""``--dry-run`` checks every policy's model as the run's start will, without loading weights, downloading or
converting: a local directory, a built-in alias, the local Hugging Face cache, or the hub; and the chat template
renders the env's first prompts. The start of a real run refuses the same things before a worker starts."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from hub_cache import cache_hub_model

from pettingllms.cli import main
from pettingllms.models import resolve_model
from pettingllms.models.replicas import recorded_config

QUICK = ["+experiment=quick_test", "resources.use_ray=false"]


def local_model(tmp_path: Path, template: str | None = None) -> Path:
    """A copy of the tiny test model's directory, optionally with another chat template."""
    directory = tmp_path / "model"
    shutil.copytree(resolve_model("tiny-random-smollm2"), directory)
    if template is not None:
        (directory / "chat_template.jinja").write_text(template)
    return directory


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_model_directory_that_does_not_exist_is_refused_naming_the_key(dry_run, tmp_path, capsys):
    missing = tmp_path / "no_such_model"
    flags = ["--dry-run"] if dry_run else []
    logs = tmp_path / "logs"
    assert main(["train", *flags, *QUICK, f"base_models.policy_0.path={missing}", f"training.log_dir={logs}"]) == 2
    err = capsys.readouterr().err
    assert f"error: base_models.policy_0.path={missing}: model directory '{missing}' does not exist" in err
    assert not logs.exists()  # refused before the run directory and the workers


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_hub_id_not_in_the_cache_is_refused_offline(dry_run, tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))
    flags = ["--dry-run"] if dry_run else []
    logs = tmp_path / "logs"
    assert main(["train", *flags, *QUICK, "base_models.policy_0.path=Qwen/Qwen3-1.7B",
                 f"training.log_dir={logs}"]) == 2
    captured = capsys.readouterr()
    assert ("error: base_models.policy_0.path=Qwen/Qwen3-1.7B: cannot get model 'Qwen/Qwen3-1.7B': it is not in the "
            "local Hugging Face cache, and HF_HUB_OFFLINE=1 forbids downloading it") in captured.err
    # the dry run still shows the plan, the placement and the data (every problem at once); a run starts nothing
    assert ("fits this machine" in captured.out) == dry_run and not logs.exists()


def test_a_hub_id_in_the_local_cache_passes_and_its_template_is_tried(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = cache_hub_model(monkeypatch, tmp_path / "hub", "Qwen/Qwen3-1.7B", dict(recorded_config("Qwen/Qwen3-1.7B")),
                               resolve_model("tiny-replica-qwen3-1.7b"))
    assert main(["train", "--dry-run", *QUICK, "base_models.policy_0.path=Qwen/Qwen3-1.7B"]) == 0
    out = capsys.readouterr().out
    assert (f"model:    policy_0: Qwen/Qwen3-1.7B: in the local Hugging Face cache ({snapshot}); chat template renders "
            "the first prompts") in out


def test_an_incomplete_cached_copy_is_refused_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache_hub_model(monkeypatch, tmp_path / "hub", "Qwen/Qwen3-1.7B", dict(recorded_config("Qwen/Qwen3-1.7B")),
                    resolve_model("tiny-replica-qwen3-1.7b"), weights=False)
    assert main(["train", "--dry-run", *QUICK, "base_models.policy_0.path=Qwen/Qwen3-1.7B"]) == 2
    err = capsys.readouterr().err
    assert "its copy in the local Hugging Face cache is incomplete" in err and "no weights" in err


def test_online_the_dry_run_says_what_would_be_downloaded(tmp_path, capsys, monkeypatch):
    import huggingface_hub
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))
    files = {"config.json": 1_000, "model-00001-of-00002.safetensors": 3_000_000_000,
             "model-00002-of-00002.safetensors": 440_000_000, "tokenizer.json": 11_000_000, "README.md": 5_000,
             "original/consolidated.pth": 9_000_000_000}
    asked = {}

    def model_info(self, repo_id, *, files_metadata=False, timeout=None, **_):  # the hub's answer, without a network
        asked.update(repo_id=repo_id, files_metadata=files_metadata, timeout=timeout)
        return SimpleNamespace(siblings=[SimpleNamespace(rfilename=n, size=s) for n, s in files.items()])

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    assert main(["train", "--dry-run", *QUICK, "base_models.policy_0.path=Qwen/Qwen3-1.7B"]) == 0
    out = capsys.readouterr().out
    assert ("model:    policy_0: Qwen/Qwen3-1.7B: would download from the Hugging Face hub at start-up (3.45 GB); chat "
            "template checked at start-up, once the model is here") in out
    assert asked == {"repo_id": "Qwen/Qwen3-1.7B", "files_metadata": True, "timeout": 10.0}

    def unreachable(self, repo_id, **_):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    assert main(["train", "--dry-run", *QUICK, "base_models.policy_0.path=Qwen/Qwen3-1.7B"]) == 2
    assert "the Hugging Face hub did not give it within 10 s (ConnectionError" in capsys.readouterr().err


def test_the_packaged_alias_is_not_converted_by_the_dry_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PETTINGLLMS_CACHE", str(tmp_path / "cache"))
    assert main(["train", "--dry-run", "--config-name", "quickstart"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct: built-in alias, not built yet: converted once from the packaged GGUF at start-up" in out
    assert not (tmp_path / "cache").exists()  # checked that it can be converted, converted nothing


def test_a_missing_gguf_package_fails_the_dry_run_of_the_alias(tmp_path, capsys, monkeypatch):
    from pettingllms.models import aliases

    monkeypatch.setenv("PETTINGLLMS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(aliases, "SMOLLM2_PACKAGE", "no_such_package_here")
    assert main(["train", "--dry-run", "--config-name", "quickstart"]) == 2
    assert "error: base_models.policy_0.path=smollm2-135m-instruct: the built-in model" in capsys.readouterr().err


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_chat_template_that_cannot_render_the_first_prompt_is_refused(dry_run, tmp_path, capsys):
    model = local_model(tmp_path, "{{ raise_exception('this template takes no system message') }}")
    flags = ["--dry-run"] if dry_run else []
    logs = tmp_path / "logs"
    assert main(["train", *flags, *QUICK, f"base_models.policy_0.path={model}", f"training.log_dir={logs}"]) == 2
    err = capsys.readouterr().err
    assert "agent 'solver''s first prompt does not render with policy_0's chat template" in err
    assert "this template takes no system message" in err and not logs.exists()


def test_a_model_directory_without_a_tokenizer_is_refused(tmp_path, capsys):
    model = local_model(tmp_path)
    (model / "tokenizer.json").unlink()
    assert main(["train", "--dry-run", *QUICK, f"base_models.policy_0.path={model}"]) == 2
    assert f"base_models.policy_0.path={model}: model directory '{model}' has no tokenizer" in capsys.readouterr().err


def test_the_dry_run_finds_a_first_prompt_over_the_limit(capsys):
    assert main(["train", "--dry-run", *QUICK, "training.max_prompt_length=8"]) == 2
    err = capsys.readouterr().err
    assert "agent 'solver''s first prompt has" in err and "> training.max_prompt_length=8" in err


def test_a_valid_local_model_passes(tmp_path, capsys):
    model = local_model(tmp_path)
    assert main(["train", "--dry-run", *QUICK, f"base_models.policy_0.path={model}"]) == 0
    out = capsys.readouterr().out
    assert f"model:    policy_0: {model}: local directory {model}; chat template renders the first prompts" in out


def test_the_dry_run_shows_the_plan_and_every_problem_at_once(tmp_path, capsys, monkeypatch):
    """A login node without the model and with a damaged resume point: the plan (the GPU memory plan needs only the
    recorded config) is printed, and each problem is listed; none hides the next."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # the layout is the cluster's: no GPU needed here
    not_a_checkpoint = tmp_path / "nowhere"
    code = main(["train", "--dry-run", "--config-name", "math", "training.experiment_name=math_L1_prompt",
                 "resources.gpus_per_policy=8", "resources.gpu_memory_gb=80", "base_models.policy_0.path=Qwen/Qwen3-1.7B",
                 f"training.resume={not_a_checkpoint}", f"env.data_root={tmp_path / 'data'}"])
    captured = capsys.readouterr()
    assert code == 2
    assert "each of its 8 GPUs holds" in captured.out and "peak" in captured.out  # the memory plan, printed
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert "5 problem(s) stop this run" in captured.err and len(errors) == 5, captured.err
    assert any("Qwen/Qwen3-1.7B" in e and "HF_HUB_OFFLINE" in e for e in errors)  # the model
    assert any(f"training.resume={str(not_a_checkpoint)!r}" in e for e in errors)  # the resume point
    # the data files: the training set and each of the two benchmarks, none hidden behind the first
    assert [next(name for name in ("polaris", "AIME24", "AIME25") if f"dataset '{name}'" in e)
            for e in errors if e.startswith("error: dataset ")] == ["polaris", "AIME24", "AIME25"]
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # said, not refused: the cluster's nodes run the workers
        assert "engines:  policy_0 generate with vLLM, which is not installed here; RAY_ADDRESS is set" in captured.out


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_config_that_cannot_be_planned_still_names_a_missing_model(dry_run, tmp_path, capsys):
    """An unknown agent stops the plan, but the model path is checked without it: both are named at once."""
    missing = tmp_path / "no_such_model"
    flags = ["--dry-run"] if dry_run else []
    assert main(["train", *flags, *QUICK, "env.agents=[nobody]", f"base_models.policy_0.path={missing}",
                 f"training.log_dir={tmp_path / 'logs'}"]) == 2
    err = capsys.readouterr().err
    if dry_run:
        assert "2 problems stop this run" in err and "env.agents names 'nobody'" in err
        assert f"base_models.policy_0.path={missing}: model directory" in err
    else:  # the run itself stops at the plan, as before; the dry run is where every problem is listed
        assert "env.agents names 'nobody'" in err
