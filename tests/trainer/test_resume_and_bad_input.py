"""Resume reproduces an uninterrupted run exactly; bad input fails before any compute, with a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pettingllms.core import ConfigError, DataError, PromptTooLongError
from pettingllms.entry.train import run_training

BASE = [
    "base_models.policy_0.path=tiny-random-smollm2",
    "env.name=toy_targets",
    "env.max_turns=2",
    "training.total_training_steps=4",
    "training.train_batch_size=2",
    "training.max_response_length=5",
    "training.val_freq=2",
    "training.export_hf=false",
    "training.plot=false",
    "rollout.branching=3",
    "rollout.select=sample",
    "optim.lr=1e-3",
    "optim.warmup_steps=1",
    "resources.use_ray=false",
    "+agents.alice.train_sampling.max_tokens=5",
    "+agents.bob.train_sampling.max_tokens=5",
    "+agents.alice.val_sampling.temperature=1.0",  # sampled validation: exercises the engine RNG too
]
VOLATILE = ("timing/", "/timing/", "update_s")


def comparable(run_dir: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "summary.log").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not any(t in k for t in VOLATILE)} for r in rows}


# Slow lane: the kill -9 resume test of the default lane holds the same, interrupted harder.
@pytest.mark.slow
def test_resumed_run_reproduces_the_uninterrupted_one(tmp_path):
    straight, _ = run_training("train", BASE + [f"training.log_dir={tmp_path}/a", "training.resume=none"])
    first, _ = run_training("train", BASE + [f"training.log_dir={tmp_path}/b", "training.resume=auto",
                                             "training.stop_after_steps=2"])
    assert first.step_done == 2 and (first.run_dir / "checkpoints" / "latest").is_file()
    resumed, _ = run_training("train", BASE + [f"training.log_dir={tmp_path}/b", "training.resume=auto"])
    assert resumed.run_dir == first.run_dir  # continues the same run directory
    expected, got = comparable(straight.run_dir), comparable(resumed.run_dir)
    assert sorted(got) == [0, 1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        assert got[step] == expected[step], f"step {step} differs after resume"


def test_wrong_config_key(tmp_path):
    with pytest.raises(ConfigError, match="total_trainin_steps"):
        run_training("train", BASE + ["training.total_trainin_steps=3"])


def test_unknown_model_path(tmp_path):
    with pytest.raises(ConfigError, match="no/such-model|does not exist|not found"):
        run_training("train", BASE + [f"training.log_dir={tmp_path}", "base_models.policy_0.path=/no/such-model"])
    assert not list(tmp_path.iterdir())  # nothing started: not even a run directory


def test_unknown_engine_is_named_before_anything_loads(tmp_path):
    expected = r"base_models.policy_0: Invalid value 'vlm', expected one of \[auto, hf, vllm\] \(key engine\)"
    with pytest.raises(ConfigError, match=expected):
        run_training("train", BASE + [f"training.log_dir={tmp_path}", "base_models.policy_0.engine=vlm"])
    assert not list(tmp_path.iterdir())


def test_vllm_engine_without_vllm_says_how_to_install_it(tmp_path):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here; this test covers the default (CPU) environment")
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[gpu\]'"):
        run_training("train", BASE + [f"training.log_dir={tmp_path}", "base_models.policy_0.engine=vllm"])


def test_empty_dataset(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "data" / "misc" / "train"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), folder / "empty.parquet")
    with pytest.raises(DataError, match="empty"):
        run_training("train", BASE + [f"env.data_root={tmp_path}/data", "env.dataset=empty",
                                      f"training.log_dir={tmp_path}/logs"])


def test_missing_dataset_of_an_env_without_a_loader_names_no_command_that_does_not_exist(tmp_path):
    with pytest.raises(DataError, match="nothing_here.parquet does not exist. No loader writes 'misc' data") as info:
        run_training("train", BASE + [f"env.data_root={tmp_path}", "env.dataset=nothing_here"])
    assert "scripts/dataprocess" not in str(info.value)  # no load_misc.py: it does not exist


def test_prompt_longer_than_max_prompt_length(tmp_path):
    with pytest.raises(PromptTooLongError, match="max_prompt_length=8"):
        run_training("train", BASE + [f"training.log_dir={tmp_path}", "training.max_prompt_length=8"])
