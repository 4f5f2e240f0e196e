"""A setting another setting switches off is named, never silently dropped (a user trial set lora.alpha on a full
fine-tune and algorithm.filter_ratio without a filter that reads it, and saw nothing)."""

from __future__ import annotations

from pettingllms.assembly.describe import describe_plan
from pettingllms.assembly.plan import plan
from pettingllms.config.load import compose, to_schema

CPU = ["base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "resources.use_ray=false"]


def run_plan(*overrides):
    return plan(to_schema(compose("train", [*CPU, *overrides])))


def test_settings_with_no_effect_are_named_in_the_plan_and_a_default_config_is_quiet():
    assert run_plan().notes == ()
    notes = run_plan("base_models.policy_0.lora.alpha=64", "base_models.policy_0.lora.target_modules=[q_proj]",
                     "algorithm.filter_ratio=0.5", "algorithm.kl.kl_type=k1", "self_play.snapshot_every=3").notes
    assert notes == (
        "base_models.policy_0.lora.alpha has no effect: lora.rank is 0 (a full fine-tune)",
        "base_models.policy_0.lora.target_modules has no effect: lora.rank is 0 (a full fine-tune)",
        "algorithm.filter_ratio has no effect: only algorithm.filter=std or mean drops a fraction of groups "
        "(filter is none)",
        "algorithm.kl.kl_type has no effect: algorithm.kl.init_kl_coeff is 0 (no KL term)",
        "self_play.snapshot_every has no effect: self_play.pool_size is 0 (no opponent pool)",
    )
    assert run_plan("base_models.policy_0.lora.rank=8", "base_models.policy_0.lora.alpha=64",
                    "algorithm.filter=std", "algorithm.filter_ratio=0.5").notes == ()
    text = describe_plan(run_plan("base_models.policy_0.lora.dropout=0.1"))
    assert "warning:  base_models.policy_0.lora.dropout has no effect" in text


def test_tree_only_settings_and_lora_dropout_are_named_where_they_do_nothing():
    assert run_plan("rollout.mode=independent", "rollout.select=sample", "rollout.playouts=3").notes == (
        "rollout.select has no effect: it chooses among a tree node's branches, and rollout.mode is independent",
        "rollout.playouts has no effect: it chooses among a tree node's branches, and rollout.mode is independent",
    )
    assert run_plan("rollout.select=sample", "rollout.playouts=3").notes == ()  # tree mode reads both
    assert run_plan("base_models.policy_0.lora.rank=8", "base_models.policy_0.lora.dropout=0.1").notes == (
        "base_models.policy_0.lora.dropout has no effect: every learner pass runs with dropout off (its log-probs "
        "must be the ones the engine sampled with)",)


def test_max_turns_of_an_agent_program_is_named():
    program = ["env.name=program", "rollout.mode=trajectory", "specialization=L2"]
    assert run_plan(*program).notes == ()
    assert run_plan(*program, "env.max_turns=3").notes == (
        "env.max_turns has no effect: an agent program decides its own turns (env.options.timeout bounds one run)",)


def test_settings_of_an_agent_that_does_not_act_are_named_and_the_shipped_single_agent_scripts_are_quiet():
    """L0 (``env.agents=[one]``) planned only the acting agent: ``agents.<other>`` was dropped without a word."""
    from script_support import script_command

    single = ["base_models.policy_0.path=tiny-random-smollm2", "resources.use_ray=false", "env.dataset=null",
              "specialization=L0", "env.agents=[reasoner]"]
    assert plan(to_schema(compose("math", single)), check_memory=False).notes == ()  # tool's sampling is reasoner's
    notes = plan(to_schema(compose("math", [*single, "agents.tool.policy=policy_1",
                                            "agents.tool.train_sampling.temperature=0.3",
                                            "agents.tool.train_sampling.top_p=0.9",
                                            "agents.tool.options.one_shot=null"])), check_memory=False).notes
    acting = "tool does not act in this run (the acting agents: ['reasoner'])"
    assert notes == (f"agents.tool.policy has no effect: {acting}",
                     f"agents.tool.train_sampling.temperature has no effect: {acting}",
                     f"agents.tool.options.one_shot has no effect: {acting}")  # an option set to null, too
    for script in ("math/math_L0_single_agent.sh", "code/code_L0_single_agent.sh", "game/sudoku_single.sh"):
        name, args = script_command(script, {})
        cfg = to_schema(compose(name, [*args, "base_models.policy_0.path=tiny-random-smollm2", "env.dataset=null",
                                       "env.benchmark=[]", "resources.use_ray=false"]))
        assert plan(cfg, check_memory=False).notes == (), script
