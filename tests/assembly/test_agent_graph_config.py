"""The agent graph and the env and agent options from the config, and the start-up errors about them, on a custom
three-agent env (tests/auction_env.py: bidder_a, bidder_b, auctioneer; its own graph is sequential).

Everything but the last test runs the plan (``check_run``, as ``--dry-run`` does) or the command line: no model
loads. The last test trains one step with the tiny model and reads the stage order from the prompts it recorded."""

from __future__ import annotations

import json
import logging

import pytest

from pettingllms.cli import main
from pettingllms.config.load import compose, to_schema
from pettingllms.core import ConfigError
from pettingllms.core.registry import ENVS
from pettingllms.entry.train import check_run, load_config

AUCTION = "env.name=auction_env:AuctionEnv"
BIDDERS_THEN_AUCTIONEER = "env.graph=[[bidder_a,bidder_b],auctioneer]"


def planned(*overrides: str):
    from pettingllms.assembly.plan import plan

    return plan(load_config("train", [AUCTION, *overrides]))


# ------------------------------------------------------------------------------------------------- env.graph
def test_env_graph_replaces_the_env_class_graph_with_a_parallel_stage_then_a_dependent_one():
    run_plan = planned(BIDDERS_THEN_AUCTIONEER)
    assert run_plan.env.graph.stages(0) == (("bidder_a", "bidder_b"), ("auctioneer",))
    assert list(run_plan.agent_specs) == ["bidder_a", "bidder_b", "auctioneer"]
    summary = "\n".join(check_run(load_config("train", [AUCTION, BIDDERS_THEN_AUCTIONEER])))
    assert "stages per turn: [bidder_a, bidder_b] -> [auctioneer]" in summary
    # every stage may be a list, and the order is the config's, not the env's
    reordered = planned("env.graph=[[auctioneer],[bidder_b,bidder_a]]").env.graph
    assert reordered.stages(0) == (("auctioneer",), ("bidder_b", "bidder_a"))


@pytest.mark.parametrize("overrides, needle", [
    ([BIDDERS_THEN_AUCTIONEER.replace("bidder_b", "bidder_c")],
     "env.graph stage 0 names 'bidder_c', which is not an agent of env 'auction_env:AuctionEnv'. Did you mean "
     "'bidder_b' or 'bidder_a'?"),
    (["env.graph=[[bidder_a,bidder_b],bidder_a,auctioneer]"], "env.graph names 'bidder_a' twice"),
    (["env.graph=[[bidder_a,bidder_b]]"],
     "env.graph leaves out ['auctioneer'], agent(s) of env 'auction_env:AuctionEnv' (agents: ['bidder_a', "
     "'bidder_b', 'auctioneer']); add them to a stage, or, to run without them, also set env.agents=[bidder_a,bidder_b]"),
    (["env.graph=[[bidder_a,bidder_b]]", "env.agents=[bidder_a,bidder_b,auctioneer]"],
     "env.graph leaves out ['auctioneer'], which env.agents="),
    (["env.graph=[[bidder_a,bidder_b],auctioneer]", "env.agents=[bidder_a,auctioneer]"],
     "env.graph has ['bidder_b'], which env.agents="),
    (["env.graph=[[bidder_a,bidder_b],[]]"], "env.graph stage 1 ([]) must be an agent's name or a non-empty list"),
])
def test_a_wrong_env_graph_is_refused_naming_the_stage_the_agent_and_the_fix(overrides, needle, capsys):
    assert main(["train", "--dry-run", AUCTION, *overrides]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err


def test_env_graph_may_leave_agents_out_that_env_agents_also_leaves_out():
    run_plan = planned("env.graph=[auctioneer,bidder_a]", "env.agents=[bidder_a,auctioneer]")
    assert run_plan.env.graph.stages(0) == (("auctioneer",), ("bidder_a",))
    assert set(run_plan.agent_specs) == {"bidder_a", "auctioneer"}


# ------------------------------------------------------------------------------------------------- env.agents
def test_env_agents_in_another_order_than_the_graph_is_refused_pointing_at_env_graph(capsys):
    assert main(["train", "--dry-run", AUCTION, "env.agents=[auctioneer,bidder_a]"]) == 2
    err = capsys.readouterr().err
    assert ("env.agents=['auctioneer', 'bidder_a'] lists the agents in another order than the graph of env "
            "'auction_env:AuctionEnv', [bidder_a] -> [bidder_b] -> [auctioneer]") in err
    assert "write env.agents=[bidder_a,auctioneer], or set the order with env.graph" in err


@pytest.mark.parametrize("level, policies", [
    ("L1", {"policy_0": ("bidder_a", "auctioneer")}),
    ("L2", {"policy_0": ("bidder_a", "auctioneer")}),
    ("L3", {"policy_bidder_a": ("bidder_a",), "policy_auctioneer": ("auctioneer",)}),
])
def test_env_agents_selects_the_acting_agents_at_every_level(level, policies, caplog):
    with caplog.at_level(logging.INFO, logger="pettingllms.assembly"):
        run_plan = planned(f"specialization={level}", "env.agents=[bidder_a,auctioneer]")
    assert run_plan.env.graph.stages(0) == (("bidder_a",), ("auctioneer",))  # bidder_b does not act
    assert list(run_plan.agent_specs) == ["bidder_a", "auctioneer"]
    assert {name: p.agents for name, p in run_plan.policies.items()} == policies
    assert "['bidder_b'] of env 'auction_env:AuctionEnv' do not" in caplog.text  # said, not silent


@pytest.mark.parametrize("overrides, needle", [
    (["specialization=L0", "env.agents=[bidder_a,auctioneer]"], "L0 is a single agent"),
    (["env.agents=[bidder_a,bidder_c]"], "env.agents names 'bidder_c', which is not an agent of env "
                                         "'auction_env:AuctionEnv'. Did you mean 'bidder_b' or 'bidder_a'?"),
    (["env.agents=[]"], "env.agents=[] selects no agent"),
])
def test_env_agents_that_cannot_work_are_refused(overrides, needle, capsys):
    assert main(["train", "--dry-run", AUCTION, *overrides]) == 2
    assert needle in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize("override, needle", [
    ("+env.options.lyout=sealed",
     "error: env.options.lyout: AuctionEnv has no option 'lyout'. Did you mean 'layout'? Options: layout, reserve"),
    ("env.options.lyout=sealed", "error: env.options.lyout: AuctionEnv has no option 'lyout'"),
    ("+env.options.max_turns=3", "error: env.options.max_turns: set env.max_turns=3 instead"),
    ("agents.bidder_a.options.stlye=bold",
     "error: agents.bidder_a.options.stlye: Bidder has no option 'stlye'. Did you mean 'style'? Options: style"),
])
def test_an_option_the_class_does_not_take_is_refused_with_close_matches(override, needle, capsys):
    assert main(["train", "--dry-run", AUCTION, override]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err


def test_an_agent_class_is_checked_whatever_it_calls_the_name_the_run_passes(capsys):
    appraiser = "agents.auctioneer.cls=auction_env:Appraiser"  # __init__(self, role, currency): currency required
    assert main(["train", "--dry-run", AUCTION, appraiser]) == 2
    assert ("error: agents.auctioneer.options: Appraiser needs the option 'currency': set "
            "agents.auctioneer.options.currency=<value>") in capsys.readouterr().err
    assert main(["train", "--dry-run", AUCTION, appraiser, "agents.auctioneer.options.role=x"]) == 2
    assert "agents.auctioneer.options.role: Appraiser takes 'role' from the run itself" in capsys.readouterr().err
    agent = planned(appraiser, "agents.auctioneer.options.currency=eur").agent_specs["auctioneer"].agent
    assert agent.name == "auctioneer" and agent.options == {"currency": "eur"}


def test_options_are_set_without_plus():
    env = planned("env.options.layout=sealed", "agents.bidder_a.options.style=bold").env
    assert env.layout == "sealed"
    toy = to_schema(compose("train", ["env.name=toy_targets", "env.options.threshold=2.0"]))
    assert toy.env.options == {"threshold": 2.0}
    check_run(toy)


# ------------------------------------------------------------------------------------------------- known_options
OPEN_AUCTION = "env.name=auction_env:OpenAuctionEnv"  # no __init__: Env's takes **options; known_options = (layout,)


def test_an_env_without_init_refuses_an_option_it_does_not_declare_in_known_options(capsys):
    from pettingllms.assembly.plan import plan

    assert plan(load_config("train", [OPEN_AUCTION, "env.options.layout=sealed"])).env.layout == "sealed"
    assert main(["train", "--dry-run", OPEN_AUCTION, "env.options.lyout=sealed"]) == 2
    err = capsys.readouterr().err
    assert ("error: env.options.lyout: OpenAuctionEnv has no option 'lyout'. Did you mean 'layout'? Options: layout "
            "(those read from self.options are declared in OpenAuctionEnv.known_options)") in err, err


def test_an_env_taking_any_option_that_declares_none_warns_once_naming_the_options(monkeypatch, caplog):
    from pettingllms.assembly import construct
    from pettingllms.assembly.plan import plan

    monkeypatch.setattr(construct, "_warned", set())  # what earlier tests of this process warned about
    undeclared = "env.name=auction_env:UndeclaredAuctionEnv"
    with caplog.at_level(logging.WARNING, logger="pettingllms.assembly"):
        plan(load_config("train", [undeclared]))  # no options: nothing to warn about
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        env = plan(load_config("train", [undeclared, "env.options.lyout=sealed"])).env
        plan(load_config("train", [undeclared, "env.options.lyout=sealed"]))  # an evaluation builds its env twice
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith("env.options: UndeclaredAuctionEnv takes **options and does not declare which it reads"
                              ", so lyout cannot be checked"), warning
    assert "known_options = ('lyout',)" in warning
    assert env.options == {"lyout": "sealed"}  # passed on, unchecked


@pytest.mark.parametrize("overrides, needle", [
    (["env.name=math", "+env.options.one_shoot=false"],
     "error: env.options.one_shoot: MathEnv has no option 'one_shoot'. Did you mean agents.reasoner.options.one_shot "
     "or agents.tool.options.one_shot? Options: code_timeout_s, sandbox_workers, verify_timeout_s"),
    (["env.name=math", "agents.reasoner.options.one_shoot=false"],
     "error: agents.reasoner.options.one_shoot: ReasonerAgent has no option 'one_shoot'. Did you mean 'one_shot'? "
     "Options: one_shot, strict_boxed"),
    (["env.name=code", "agents.tester.options.max_test=2"],
     "error: agents.tester.options.max_test: TesterAgent has no option 'max_test'. Did you mean 'max_tests'?"),
    (["env.name=toy_targets", "env.options.anything=1"], "error: env.options.anything: TargetsEnv has no option"),
    (["env.name=sokoban", "env.options.no_action_penalti=-1"],  # a GameEnv option, reached through **options
     "error: env.options.no_action_penalti: SokobanEnv has no option 'no_action_penalti'. Did you mean "
     "'no_action_penalty'?"),
])
def test_a_misspelt_option_of_a_built_in_env_or_agent_is_refused(overrides, needle, capsys):
    assert main(["train", "--dry-run", *overrides]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err


def test_the_options_of_built_ins_that_configs_set_still_pass():
    from pettingllms.assembly.plan import build_env

    sokoban = build_env(load_config("train", ["env.name=sokoban", "env.options.no_action_penalty=-1",
                                              "env.options.size=5"]))
    assert (sokoban.no_action_penalty, sokoban.options) == (-1.0, {})
    vault = build_env(load_config("train", ["env.name=vault", "+env.options.players=1"]))
    assert vault.graph.agents == ("solo",)


def test_an_agent_role_without_a_class_is_named_with_the_fix(capsys):
    unstaffed = "env.name=auction_env:UnstaffedAuctionEnv"
    assert main(["train", "--dry-run", unstaffed]) == 2
    err = capsys.readouterr().err
    assert ("error: UnstaffedAuctionEnv has no agent class for role 'auctioneer' (classes are set for ['bidder_a', "
            "'bidder_b']): add 'auctioneer' to UnstaffedAuctionEnv.agent_classes, or set "
            "agents.auctioneer.cls=<module:Class>") in err and "Traceback" not in err, err
    assert main(["train", "--dry-run", unstaffed, "agents.auctioneer.cls=auction_env:Auctioneer"]) == 0


@pytest.mark.parametrize("override, needle", [
    ("+env.options.reserve=-1", "error: env 'auction_env:AuctionEnv' could not be built with env.max_turns=0 (the "
                                "env's own default), env.options={'reserve': -1}: ValueError: reserve must be >= 0, "
                                "got -1"),
    ("agents.bidder_b.options.style=loud", "error: agent 'bidder_b' (Bidder) could not be built with "
                                           "agents.bidder_b.options={'style': 'loud'}: ValueError: style must be"),
])
def test_a_constructor_error_is_one_line_and_its_traceback_goes_to_the_debug_log(override, needle, capsys, caplog):
    with caplog.at_level(logging.DEBUG, logger="pettingllms.assembly"):
        assert main(["train", "--dry-run", AUCTION, override]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    (record,) = [r for r in caplog.records if r.levelno == logging.DEBUG and "could not be built" in r.getMessage()]
    assert record.exc_info and record.exc_info[0] is ValueError


# ------------------------------------------------------------------------------------------------- env.imports
def test_a_short_name_without_its_import_says_env_imports_may_be_missing(tmp_path, monkeypatch, capsys):
    ENVS.names()  # the built-in envs registered, then a copy: this test's registration is undone afterwards
    monkeypatch.setattr(ENVS, "_entries", dict(ENVS._entries))
    (tmp_path / "bazaar_plugin.py").write_text("from auction_env import AuctionEnv\n"
                                               "from pettingllms.core import register_env\n"
                                               "register_env('bazaar', AuctionEnv)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["train", "--dry-run", "env.name=bazaar"]) == 2
    err = capsys.readouterr().err
    assert ("env.name='bazaar' is not registered; if it is defined in your package, add env.imports=[your.module]"
            in err), err
    # a single module, not written as a list, is the one-element list it obviously means
    assert main(["train", "--dry-run", "env.imports=bazaar_plugin", "env.name=bazaar"]) == 0, capsys.readouterr().err
    assert load_config("train", ["env.imports=bazaar_plugin"]).env.imports == ["bazaar_plugin"]
    (tmp_path / "mine.yaml").write_text("defaults: [train, _self_]\nenv:\n  imports: bazaar_plugin\n")
    with pytest.raises(ConfigError, match=r"env.imports is a list: write the value in brackets, e.g. imports: \[x\]"):
        compose("mine", [], tmp_path)  # in a file, the schema's list type stands: the message says how to write it


# ------------------------------------------------------------------------------------------------- evaluation
def test_evaluating_a_run_keeps_its_graph_and_other_envs_drop_it():
    from pettingllms.eval.run_settings import with_settings_of_run
    from pettingllms.eval.tasks import config_for_env

    run = load_config("train", [AUCTION, BIDDERS_THEN_AUCTIONEER])
    evaluated = with_settings_of_run(load_config("eval", [AUCTION]), run, {"env.name", "env.imports"}).config
    assert evaluated.env.graph == [["bidder_a", "bidder_b"], "auctioneer"]
    other, roles = config_for_env(evaluated, "toy_targets")
    assert other.env.graph is None and roles == ("alice", "bob")
    # the acting agents are one setting: a command line that names env.agents takes neither key from the run
    narrowed = with_settings_of_run(load_config("eval", [AUCTION, "env.agents=[auctioneer]"]), run,
                                    {"env.name", "env.imports", "env.agents"}).config
    assert narrowed.env.agents == ["auctioneer"] and narrowed.env.graph is None


# ------------------------------------------------------------------------------------------------- a real run
@pytest.mark.timeout(300)
def test_one_training_step_runs_the_parallel_stage_before_the_dependent_one(tmp_path):
    from pettingllms.entry.train import run_training

    trainer, _ = run_training("train", [
        AUCTION, BIDDERS_THEN_AUCTIONEER, "base_models.policy_0.path=tiny-random-smollm2", "env.max_turns=1",
        "training.total_training_steps=1", "training.train_batch_size=1", "training.max_response_length=4",
        "training.val_freq=0", "training.val_before_train=false", "training.export_hf=false", "training.plot=false",
        "training.save_samples_freq=1", "rollout.branching=2", "resources.use_ray=false",
        f"training.log_dir={tmp_path}"])
    groups = [json.loads(line) for line in (trainer.run_dir / "samples" / "step_000001.jsonl").read_text().splitlines()]
    prompts = {g["agent"]: g["prompt"] for g in groups if g["turn"] == 0}
    assert set(prompts) == {"bidder_a", "bidder_b", "auctioneer"}
    assert "Acted so far: nobody." in prompts["bidder_a"] and "Acted so far: nobody." in prompts["bidder_b"]
    assert "Acted so far: bidder_a, bidder_b." in prompts["auctioneer"]  # after both bidders, in agent order


def test_the_plan_of_an_env_that_names_its_acting_agents_says_so_instead_of_graph_stages():
    summary = "\n".join(check_run(load_config("train", ["env.name=lenient_nim:LenientNim"])))
    assert "who acts: the env's acting_agents(state), one stage a turn (of player_0, player_1)" in summary
    assert "stages per turn" not in summary
