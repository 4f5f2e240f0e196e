"""Experiment presets (pettingllms/configs/experiment/*.yaml) compose onto train.yaml with ``+experiment=<name>``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pettingllms.config.load import CONFIG_DIR
from pettingllms.entry.train import load_config

PAPER = {  # preset -> (env, agents, K, max_turns): the public reference's launch-script values
    "paper_math": ("math", {"reasoner", "tool"}, 8, 4),
    "paper_code": ("code", {"coder", "tester"}, 8, 5),
    "paper_sokoban": ("sokoban", {"tool_agent", "plan_agent"}, 4, 4),
    "paper_sudoku": ("sudoku", {"tool_agent", "plan_agent"}, 8, 4),
    "paper_plan_path": ("plan_path", {"tool_agent", "plan_agent"}, 8, 4),
}
CPU = {  # preset -> (env, env options): the packaged SmolLM2-135M on boards it can learn on a CPU
    "cpu_plan_path": ("plan_path", {"size": 4, "wall_prob": 0.0, "max_moves": 6}),
    "cpu_sudoku": ("sudoku", {"size": 4, "holes": 1, "rewards": "success"}),
    "cpu_sokoban": ("sokoban", {"size": 6, "boxes": 1, "max_moves": 2}),
}
GAME_PRESETS = ("cpu_tictactoe",)  # a library game against a fixed opponent (docs/self_play.md)
PROGRAM_PRESETS = ("cpu_vault_program",)  # an agent program written with an agent framework (docs/agent_programs.md)
TINY_STEP = ["base_models.policy_0.path=tiny-random-smollm2", "training.total_training_steps=1",
             "training.train_batch_size=1", "rollout.branching=2", "env.max_val_problems=2", "training.val_freq=1",
             "resources.use_ray=false", "training.export_hf=false", "training.plot=false"]


def env_roles(name: str) -> set[str]:
    from pettingllms.core.registry import get_env_class

    return set(get_env_class(name).graph.agents)


def test_every_preset_file_is_global_and_tested():
    presets = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
    assert presets == sorted([*PAPER, *CPU, *GAME_PRESETS, *PROGRAM_PRESETS, "quick_test"])
    for name in presets:
        first = (CONFIG_DIR / "experiment" / f"{name}.yaml").read_text().splitlines()[0]
        assert first == "# @package _global_", f"{name}.yaml must start with '# @package _global_'"


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_presets_carry_the_papers_settings(name):
    env, agents, branching, turns = PAPER[name]
    cfg = load_config("train", [f"+experiment={name}"])
    assert cfg.base_models["policy_0"].path == "Qwen/Qwen3-1.7B"
    assert (cfg.env.name, set(cfg.agents), cfg.rollout.branching, cfg.env.max_turns) == (env, agents, branching, turns)
    assert env_roles(env) == agents  # the preset configures the env's real roles
    t = cfg.training
    assert (t.total_training_steps, t.train_batch_size, t.val_freq) == (200, 32, 10)
    assert (t.max_prompt_length, t.max_response_length) == (4096, 2048)
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.ppo_mini_batch_size) == (5e-6, 10, 16)
    assert cfg.algorithm.kl.init_kl_coeff == 0.0 and cfg.rollout.mode == "tree"
    assert t.experiment_name == name


def test_presets_take_further_overrides():
    cfg = load_config("train", ["+experiment=paper_math", "specialization=L3", "training.total_training_steps=5"])
    assert cfg.specialization == "L3" and cfg.training.total_training_steps == 5


def test_quick_test_is_a_tiny_cpu_run():
    cfg = load_config("train", ["+experiment=quick_test"])
    assert cfg.base_models["policy_0"].path == "tiny-random-smollm2"
    assert cfg.training.total_training_steps == 2 and cfg.training.resume == "none"
    assert set(cfg.agents) == env_roles(cfg.env.name) == {"solver", "checker"}


@pytest.mark.slow
def test_quick_test_runs_end_to_end(tmp_path):
    from pettingllms.cli import main

    assert main(["train", "+experiment=quick_test", f"training.log_dir={tmp_path}"]) == 0
    (run,) = tmp_path.glob("quick_test/*/*")
    rows = [json.loads(line) for line in (run / "summary.log").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and "val/procedural/success_rate" in rows[-1]
    assert (run / "curves.png").is_file() and Path(run / "hf" / "policy_0").is_dir()


@pytest.mark.parametrize("name", sorted(CPU))
def test_cpu_presets_train_the_packaged_model_and_validate_64_held_out_problems(name):
    env, options = CPU[name]
    cfg = load_config("train", [f"+experiment={name}"])
    policy = cfg.base_models["policy_0"]
    assert (policy.path, policy.dtype, policy.lora.rank) == ("smollm2-135m-instruct", "float32", 32)
    assert (cfg.env.name, dict(cfg.env.options), cfg.specialization, list(cfg.env.agents)) == (env, options, "L0",
                                                                                             ["plan_agent"])
    assert dict(cfg.agents["plan_agent"].options) == {"prompt": "compact"}
    # fresh generated problems to train on, the env's test seeds (disjoint) to validate on, before and after
    assert cfg.env.dataset is None and list(cfg.env.benchmark) == [] and cfg.env.max_val_problems >= 64
    t = cfg.training
    assert t.val_before_train and t.val_freq == t.total_training_steps and t.experiment_name == name


@pytest.mark.parametrize("name", sorted(CPU))
def test_cpu_presets_take_another_level_from_the_command_line(name):
    # a `specialization: L0` key in the preset silently beat `specialization=L2` (a group override): now the preset
    # sets the group in its defaults list, which the command line overrides
    for level in ("L0", "L1", "L2", "L3"):
        extra = [] if level == "L0" else [f"specialization={level}"]
        assert load_config("train", [f"+experiment={name}", *extra]).specialization == level


@pytest.mark.parametrize("name", sorted(CPU))
def test_cpu_presets_run_one_tiny_step(name, tmp_path, capsys):
    from pettingllms.cli import main

    assert main(["train", f"+experiment={name}", f"training.log_dir={tmp_path}", *TINY_STEP]) == 0
    (run,) = tmp_path.glob(f"{name}/*/*")
    rows = [json.loads(line) for line in (run / "summary.log").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/procedural/success_rate" in r] == [0, 1]
    assert "held-out procedural (2 problems, validation sampling): success" in capsys.readouterr().out


# a wrong first answer as long as one that leaves a second turn can be: the history line grows with it.
# Plan-Path: 5 moves (a sixth would spend the 6-move budget and end the episode); Sokoban: 1 move; Sudoku: 4 fills
# (16 tokens hold 2)
SECOND_TURN_ANSWERS = {
    "cpu_plan_path": lambda board: "D D R R L",
    "cpu_sokoban": lambda board: "U",  # a second move would spend the 2-move budget
    "cpu_sudoku": lambda board: "[[{0}, {1}, {2}], [0, 0, 1], [1, 1, 2], [2, 2, 3]]".format(
        *next((r, c, v % 4 + 1) for r in range(4) for c in range(4) for v in [board.solution[r][c]]
              if not board.clues[r][c])),
}


@pytest.mark.parametrize("name", sorted(CPU))
def test_cpu_presets_second_turn_prompts_fit_their_max_prompt_length(name):
    # cpu_sudoku's 512 let the first prompt through (504 tokens) but not the second (580): every episode not solved
    # in turn 1 ended there, in the runs of 2026-11-26, with only an error_ratio in the summary to show it
    from pettingllms.core.registry import get_env_class
    from pettingllms.envs.games_common.agents import PlanAgent
    from pettingllms.envs.games_common.runner import EchoRunner
    from pettingllms.models.codec import HFChatCodec

    cfg = load_config("train", [f"+experiment={name}"])
    env = get_env_class(cfg.env.name)(max_turns=cfg.env.max_turns, runner=EchoRunner(), **dict(cfg.env.options))
    agent = PlanAgent("plan_agent", **dict(cfg.agents["plan_agent"].options))
    codec = HFChatCodec.from_pretrained(cfg.base_models["policy_0"].path)  # the real tokenizer and chat template
    second_turns = []
    for problem in env.procedural_problems("test", cfg.env.max_val_problems):
        state = env.reset(problem, 0)
        step = env.step(state, "plan_agent", SECOND_TURN_ANSWERS[name](state.board))
        if not (step.terminated or step.truncated):  # (the answer solves a few boards by chance)
            second_turns.append(len(codec.encode_chat(agent.observe(step.state, 1))))
    assert len(second_turns) >= 32 and max(second_turns) <= cfg.training.max_prompt_length


def test_the_tictactoe_preset_plays_one_agent_against_the_random_opponent_and_its_prompts_fit(tmp_path, capsys):
    """cpu_tictactoe: one agent vs OpenSpiel's board with a random opponent; its longest prompt (the worked example,
    a full board and the refusal of an invalid answer) fits training.max_prompt_length with the real tokenizer; and
    one tiny step runs with validation before and after."""
    pytest.importorskip("pyspiel", reason="the games extra")
    from pettingllms.cli import main
    from pettingllms.core.registry import get_env_class
    from pettingllms.envs.seats import SeatAgent
    from pettingllms.models.codec import HFChatCodec

    cfg = load_config("train", ["+experiment=cpu_tictactoe"])
    assert (cfg.env.name, cfg.specialization, cfg.rollout.mode, cfg.rollout.playouts) == ("openspiel", "L0", "tree", 1)
    assert dict(cfg.env.options) == {"game": "tic_tac_toe", "opponent": "random", "one_shot": True, "max_invalid": 2}
    env = get_env_class("openspiel")(max_turns=cfg.env.max_turns, **dict(cfg.env.options))
    agent, codec = SeatAgent("player"), HFChatCodec.from_pretrained(cfg.base_models["policy_0"].path)
    longest = 0
    for problem in env.procedural_problems("test", 8):
        state = env.reset(problem, 0)
        while state.to_move >= 0:
            refused = env.step(state, "player", "no idea").state  # the prompt with a refusal in it
            longest = max(longest, len(codec.encode_chat(agent.observe(refused, 0))))
            state = env.step(state, "player", state.legal[0]).state
    assert 0 < longest <= cfg.training.max_prompt_length
    assert main(["train", "+experiment=cpu_tictactoe", f"training.log_dir={tmp_path}", *TINY_STEP]) == 0
    assert "held-out procedural (2 problems, validation sampling): success" in capsys.readouterr().out


def test_the_vault_program_preset_runs_the_sdk_program_through_the_gateway_with_the_vault_envs_prompts(tmp_path):
    """cpu_vault_program: the vault task's two agents as OpenAI Agents SDK agents; the prompts the gateway records
    are the vault env's own (worked example included), and one tiny step runs with validation before and after."""
    pytest.importorskip("agents", reason="the programs extra")
    from pettingllms.core.registry import make_agents
    from pettingllms.entry.train import run_training
    from pettingllms.envs.vault.env import VaultEnv

    cfg = load_config("train", ["+experiment=cpu_vault_program"])
    assert (cfg.env.name, cfg.specialization, cfg.rollout.mode, list(cfg.env.agents)) == (
        "program", "L1", "trajectory", ["reader", "opener"])
    trainer, results = run_training("train", ["+experiment=cpu_vault_program", *TINY_STEP,
                                              "training.save_samples_freq=1", f"training.log_dir={tmp_path}"])
    assert len(results) == 1 and "val/procedural/success_rate" in results[0].metrics
    rows = [json.loads(line) for line in (trainer.run_dir / "samples" / "step_000001.jsonl").open()]
    vault = VaultEnv()
    agents = make_agents(vault)
    problem = vault.procedural_problems("train", 1)[0]
    reader_prompt = agents["reader"].observe(vault.reset(problem, 0), 0)
    from pettingllms.models.codec import HFChatCodec

    codec = HFChatCodec.from_pretrained("tiny-random-smollm2")
    expected = codec.decode(codec.encode_chat(reader_prompt))
    prompts = [row["prompt"] or c["prompt"] for row in rows if row["agent"] == "reader" for c in row["candidates"]]
    assert prompts and all(p.split("Your card says:")[0] == expected.split("Your card says:")[0] for p in prompts)
