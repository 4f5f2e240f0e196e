"""engine_options.gpu_memory_utilization=auto: vLLM's budget is the largest with which the GPU memory plan fits (less a
margin, at most 0.9), written into the engine's spec; the plan printout says so; without the GPU's size it is
refused with the fix; an evaluation of such a run keeps vLLM's default budget."""

from __future__ import annotations

import dataclasses

import pytest

from pettingllms.assembly.memory_fixes import AUTO_MARGIN, AUTO_MAX_UTILIZATION
from pettingllms.assembly.plan import plan
from pettingllms.core import ConfigError
from pettingllms.entry.train import load_config
from pettingllms.runtime.serving import vllm_options

SCRIPT = ["training.experiment_name=math_L1_prompt", "specialization=L1", "resources.gpus_per_policy=8"]
AUTO = "++base_models.policy_0.engine_options.gpu_memory_utilization=auto"


def test_auto_gives_vllm_the_largest_budget_that_fits_and_the_engine_gets_it(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # the layout is the cluster's: no GPU needed here
    fixed = plan(load_config("math", [*SCRIPT, "resources.gpu_memory_gb=80"]))
    auto = plan(load_config("math", [*SCRIPT, "resources.gpu_memory_gb=80", AUTO]))
    (spec,) = auto.worker_specs
    value = spec.engine_options["gpu_memory_utilization"]
    (planned,) = auto.memory.policies
    assert isinstance(value, float) and value == planned.utilization
    assert fixed.memory.policies[0].utilization == 0.5 < value <= AUTO_MAX_UTILIZATION - AUTO_MARGIN
    assert auto.memory.fits
    # a budget AUTO_MARGIN larger than the chosen one is the largest that fits (or the ceiling): nothing is left over
    bigger = dataclasses.replace(planned, utilization=round(value + AUTO_MARGIN + 0.01, 2))
    from pettingllms.assembly.memory_phases import gpu_plans

    assert value + AUTO_MARGIN >= AUTO_MAX_UTILIZATION - 1e-9 or not all(
        p.fits for p in gpu_plans([bigger], auto.memory.gpu_bytes))
    assert vllm_options(spec)["gpu_memory_utilization"] == value  # what the engine is started with
    assert "(auto: the largest that fits" in auto.memory.describe()


def test_auto_needs_the_gpus_size_and_an_evaluation_keeps_the_default(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    with pytest.raises(ConfigError, match="gpu_memory_utilization=auto .* needs the GPU's size: set "
                                          "resources.gpu_memory_gb"):
        plan(load_config("math", [*SCRIPT, AUTO]))
    spec = plan(load_config("math", [*SCRIPT, "resources.gpu_memory_gb=80", AUTO]), check_memory=False).worker_specs[0]
    assert spec.engine_options["gpu_memory_utilization"] == "auto"  # not planned: left to the engine's default
    assert vllm_options(spec, colocated=False).get("gpu_memory_utilization") != "auto"  # vLLM's own default
