"""A model folder is data: one whose config maps the model to code shipped in the folder (``auto_map``) is refused
without running that code or prompting, and a weights file with a crafted safetensors header is refused, each in one
line naming the folder, by loading and by ``--dry-run`` (which reads the config and the headers only)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from pettingllms.core.errors import DamagedCheckpointError, UnsafeCheckpointError
from pettingllms.models import resolve_model
from pettingllms.models.load import check_model_folder, load_model, load_tokenizer


@pytest.fixture
def folder(tmp_path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(resolve_model("tiny-random-smollm2"), copy)
    return copy


def _with_own_code(folder: Path, marker: Path) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="evilnet", architectures=["EvilModel"],
                  auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return folder


def test_a_folder_asking_to_run_its_own_code_is_refused_and_its_code_never_runs(folder, tmp_path):
    marker = tmp_path / "marker"
    evil = _with_own_code(folder, marker)
    for load in (load_model, check_model_folder):
        with pytest.raises(UnsafeCheckpointError, match=r"auto_map.*never runs"):
            load(evil)
    assert not marker.exists()


def test_a_crafted_safetensors_header_is_refused_in_one_line(folder):
    (weights,) = folder.glob("*.safetensors")
    weights.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    for load in (load_model, check_model_folder):
        with pytest.raises(DamagedCheckpointError, match="not valid safetensors.*header too large"):
            load(folder)
    assert load_tokenizer(folder).chat_template  # the tokenizer is not the weights: it still loads


def test_a_good_folder_passes(folder):
    check_model_folder(folder)


def test_the_dry_run_lists_both_refusals(folder, tmp_path):
    from pettingllms.entry.train import load_config, run_checks

    marker = tmp_path / "marker"
    crafted = tmp_path / "crafted"
    shutil.copytree(folder, crafted)
    (weights,) = crafted.glob("*.safetensors")
    weights.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    for path, kind in ((_with_own_code(folder, marker), UnsafeCheckpointError), (crafted, DamagedCheckpointError)):
        _, problems = run_checks(load_config("train", [f"base_models.policy_0.path={path}"]))
        assert any(isinstance(p, kind) and "base_models.policy_0.path=" in str(p) for p in problems), problems
    assert not marker.exists()
