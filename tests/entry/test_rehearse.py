"""``--rehearse``: the plan and placement part at the GPUs a script would take on a GPU node (8 when none is
visible), through the rehearsal's own code; what its steps change; bad input.

Placement starts one Ray actor per rank (up to 8 per script): every script is rehearsed in the slow lane (``make
test-slow``), the three math scripts' whole rehearsals, placement included, run in CI's vLLM lane, and the same
placement of all 14 scripts, through the same ``PolicyGroup``, runs in the default lane on a simulated two-node
cluster (tests/runtime/test_simulated_cluster.py).
The steps themselves (tiny replicas, 2 gloo ranks, checkpoint, resume, export, reload) run in the vLLM lane
(tests/vllm_cpu/test_rehearsal.py), one script per code path.
"""

from __future__ import annotations


import pytest
from script_support import SCRIPTS_DIR, script_command

from pettingllms.core import ConfigError

SCRIPTS = sorted(str(p.relative_to(SCRIPTS_DIR)) for p in SCRIPTS_DIR.glob("*/*.sh"))


def rehearsal_config(script: str, *overrides: str):
    """The config a script hands to ``pettingllms train --rehearse`` on a machine without GPUs."""
    from pettingllms.entry.train import load_config

    name, args = script_command(script, {}, "--rehearse", *overrides)
    assert "--rehearse" in args
    return load_config(name, [a for a in args if a != "--rehearse"])


@pytest.fixture(scope="module")
def eight_gpus():
    import ray

    assert not ray.is_initialized()
    ray.init(address="local", num_gpus=8, num_cpus=16, include_dashboard=False, namespace="pettingllms-test-rehearse",
             log_to_driver=False)
    yield
    ray.shutdown()


def test_every_shipped_script_is_found():
    assert len(SCRIPTS) == 14


@pytest.mark.slow  # 27 s per script; CI's vLLM lane rehearses three scripts whole (place included)
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_is_planned_and_placed_at_its_gpus(script, eight_gpus, capsys):
    from pettingllms.entry.rehearse import Rehearsal, place

    cfg = rehearsal_config(script)
    report = Rehearsal()
    place(cfg, report)
    (line,) = [line for line in report.lines if line.startswith("placement:")]
    assert "on 8 logical GPU(s)" in line, line  # the script took the rehearsal's 8 GPUs, as on a GPU node
    assert cfg.base_models["policy_0"].dtype == "bfloat16"  # the GPU config, not the CPU fallback


@pytest.mark.parametrize("script,ranks", [("math/math_L1_prompt.sh", 2), ("math/math_L2_lora.sh", 2),
                                          ("math/math_L3_model.sh", 1)])
def test_the_steps_swap_in_tiny_replicas_and_cap_lengths(script, ranks, tmp_path):
    from pettingllms.assembly.plan import plan
    from pettingllms.assembly.rehearsal import RESPONSE_TOKENS, step_overrides
    from pettingllms.entry.train import load_config

    cfg = rehearsal_config(script)
    overrides, changes = step_overrides(cfg, "hf", tmp_path)
    name, args = script_command(script, {}, *overrides)
    small = load_config(name, args)
    specs = plan(small).worker_specs
    assert all(s.model_path == "tiny-replica-qwen3-1.7b" and s.layout.num_ranks == ranks for s in specs)
    assert all(s.layout.gpus == 0 and s.layout.sharded == (ranks > 1) for s in specs)
    assert small.training.max_response_length == RESPONSE_TOKENS and small.training.total_training_steps == 2
    assert "Qwen/Qwen3-1.7B -> tiny-replica-qwen3-1.7b" in changes[0]


def test_a_model_without_recorded_facts_is_refused_naming_the_recorded_ones():
    from pettingllms.assembly.rehearsal import replica_of

    assert replica_of("Qwen/Qwen3-8B") == "tiny-replica-qwen3-8b"
    assert replica_of("tiny-random-smollm2") == "tiny-random-smollm2"  # already a local built-in
    with pytest.raises(ConfigError, match=r"no replica of 'org/unknown-7b'.*Qwen/Qwen3-1.7B"):
        replica_of("org/unknown-7b")


def test_rehearse_cannot_be_combined_with_dry_run(capsys):
    from pettingllms.entry.train import train_command

    assert train_command(["--config-name", "math", "--rehearse", "--dry-run"]) == 2
    assert "--rehearse rehearses one run" in capsys.readouterr().err


def test_without_gpus_the_script_rehearses_at_eight(tmp_path):
    _, args = script_command("math/math_L3_model.sh", {}, "--rehearse")
    assert "resources.gpus_per_policy=4" in args  # 8 rehearsal GPUs over the script's 2 policies
    _, args = script_command("math/math_L3_model.sh", {"REHEARSE_GPUS": "2"}, "--rehearse")
    assert "resources.gpus_per_policy=1" in args
    _, args = script_command("math/math_L3_model.sh", {})
    assert "resources.gpus_per_policy=0" in args  # a plain run on this machine is unchanged


def test_missing_hub_data_is_replaced_by_the_offline_set_and_every_set_is_named(tmp_path):
    """CI's vLLM lane failed here: the run's checks list every missing set at once (polaris, AIME24, AIME25) in one
    ConfigError, which the rehearsal took for a non-data problem and raised instead of swapping in the offline set."""
    from pettingllms.assembly.rehearsal import step_overrides
    from pettingllms.entry.rehearse import Rehearsal, data_overrides
    from pettingllms.entry.train import load_config

    cfg = rehearsal_config("math/math_L1_prompt.sh", f"env.data_root={tmp_path / 'data'}")
    overrides, _ = step_overrides(cfg, "hf", tmp_path / "logs")
    name, args = script_command("math/math_L1_prompt.sh", {}, *overrides, f"env.data_root={tmp_path / 'data'}")
    small = load_config(name, args)
    report = Rehearsal()
    assert data_overrides(small, report) == ["env.dataset=gsm_symbolic", "env.benchmark=[gsm_symbolic]"]
    said = "\n".join(report.lines)
    assert all(f"dataset '{s}'" in said for s in ("polaris", "AIME24", "AIME25")), said
    assert "offline math set 'gsm_symbolic'" in said

    bad_model = load_config(name, [*args, "base_models.policy_0.path=/nowhere/model"])
    with pytest.raises(ConfigError, match=r"4 problems stop this run(.|\n)*polaris(.|\n)*/nowhere/model"):
        data_overrides(bad_model, Rehearsal())  # a problem the offline set cannot fix is raised, data beside it
