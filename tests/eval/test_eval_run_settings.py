"""``pettingllms eval model.checkpoint=<run>`` evaluates the run the way it was trained and validated: a custom
three-agent env with its own held-out file, max_turns 2 (the env's own default is 1), the run's response length,
per-agent sampling and reward weight; a key given on the command line still wins, and the run's env is dropped when
the command line names another env."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from eval_support import check_records_against_summary, only_run_dir, read_jsonl
from pettingllms.core import Agent, AgentGraph, Env, Problem, Transition, register_env
from pettingllms.entry.eval import eval_command
from pettingllms.entry.train import run_training

ENV = "relay3_eval_test"


@dataclass(frozen=True)
class RelayState:
    target: int
    said: tuple[str, ...] = ()


class Speaker(Agent):
    def observe(self, state, turn):
        return [{"role": "user", "content": f"Say {state.target}. Heard so far: {list(state.said)}"}]

    def parse(self, response):
        return response.strip()[:20]

    def local_reward(self, state):
        return 0.0


class RelayEnv(Env):
    """Three agents in a row; never terminates (a random model never says the number), so every episode runs
    exactly max_turns turns. No ``__init__``: the env's own max_turns default is Env's, 1."""

    graph = AgentGraph.sequential(["planner", "solver", "checker"])
    agent_classes = {role: f"{__name__}:Speaker" for role in ("planner", "solver", "checker")}

    def reset(self, problem, seed):
        return RelayState(int(problem.data.get("target", seed % 9)))

    def step(self, state, agent, action):
        new = replace(state, said=(*state.said, action))
        return Transition(new, terminated=self.success(new))

    def team_reward(self, state):
        return 1.0 if state.said and state.said[-1] == str(state.target) else 0.0

    def success(self, state):
        return self.team_reward(state) == 1.0

    def procedural_problems(self, split, count):
        offset = 0 if split == "train" else 1000
        return [Problem(f"relay-{split}-{i}", {"target": (offset + i) % 9}) for i in range(count)]


register_env(ENV, RelayEnv)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("relay")
    held_out = root / "relay_held_out.jsonl"
    held_out.write_text("".join(json.dumps({"id": f"h{i}", "target": i}) + "\n" for i in range(4)))
    trainer, _ = run_training("train", [
        "base_models.policy_0.path=tiny-random-smollm2", f"env.name={ENV}", "env.max_turns=2",
        f"env.benchmark=[{held_out}]", "env.max_val_problems=2", "training.max_response_length=5",
        "agents.checker.val_sampling.max_tokens=3", "reward.alpha=0.5",
        "base_models.policy_0.chat_template_kwargs={enable_thinking: false}",
        "training.total_training_steps=1", "training.train_batch_size=2", "training.val_freq=0",
        "training.export_hf=false", "training.plot=false", "training.resume=none", "rollout.branching=2",
        "resources.use_ray=false", f"training.log_dir={root / 'logs'}",
    ])
    return trainer.run_dir


def evaluate(tmp_path: Path, *overrides: str) -> tuple[Path, dict]:
    assert eval_command([*overrides, f"eval.log_dir={tmp_path}"]) == 0
    run_dir = only_run_dir(tmp_path)
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def steps_of(run_dir: Path, summary: dict) -> list[tuple[dict, list[dict]]]:
    """(sample, its steps) for every sample of every benchmark."""
    return [(sample, sample["steps"]) for bench in summary["benchmarks"].values()
            for record in read_jsonl(run_dir / bench["records"]) for sample in record["samples"]]


def test_a_checkpoint_is_evaluated_on_its_runs_env_turns_lengths_and_sampling(run, tmp_path):
    run_dir, summary = evaluate(tmp_path, f"model.checkpoint={run}")
    assert list(summary["benchmarks"]) == [f"{ENV}/relay_held_out"]  # the run's env and held-out file, not math
    bench = summary["benchmarks"][f"{ENV}/relay_held_out"]
    assert bench["problems"] == 2  # the run's max_val_problems
    assert bench["records"] == f"records/{ENV}/relay_held_out.jsonl"  # in the run directory, named by the stem
    check_records_against_summary(run_dir, summary)
    samples = steps_of(run_dir, summary)
    assert samples and all(sample["turns"] == 2 for sample, _ in samples)  # the run's max_turns, not the env's 1
    for _, steps in samples:
        assert [s["agent"] for s in steps] == ["planner", "solver", "checker"] * 2
        limit = {"planner": 5, "solver": 5, "checker": 3}  # max_response_length 5; the checker's val_sampling 3
        assert all(0 < s["response_tokens"] <= limit[s["agent"]] for s in steps)
        assert all(s["reward"] == pytest.approx(0.5 * s["team_reward"] + s["local_reward"]) for s in steps)
    settings = summary["settings"]
    assert {role: s["max_tokens"] for role, s in settings["agents"].items()} == {
        "planner": 5, "solver": 5, "checker": 3}
    assert settings["max_tokens"] is None and settings["temperature"] == 0.0  # per agent; all greedy
    taken = summary["from_run"]
    assert taken["env.name"] == ENV and taken["env.max_turns"] == "2" and taken["reward.alpha"] == "0.5"
    assert taken["training.max_response_length"] == "5"
    assert taken["eval.temperature/top_p/top_k/max_tokens"] == "each agent's val_sampling"
    assert "env.max_turns=2" in (run_dir / "eval.log").read_text()  # said in the run directory, not only the console
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert written["env"]["max_turns"] == 2 and written["eval"]["max_tokens"] is None
    assert written["base_models"]["policy_0"]["chat_template_kwargs"] == {"enable_thinking": False}


def test_command_line_keys_win_over_the_run(run, tmp_path):
    run_dir, summary = evaluate(tmp_path, f"model.checkpoint={run}", "env.max_turns=1", "eval.max_tokens=2",
                                "agents.solver.val_sampling.top_k=7")
    samples = steps_of(run_dir, summary)
    assert samples and all(sample["turns"] == 1 for sample, _ in samples)
    assert all(0 < s["response_tokens"] <= 2 for _, steps in samples for s in steps)
    agents = summary["settings"]["agents"]
    assert {role: s["max_tokens"] for role, s in agents.items()} == {"planner": 2, "solver": 2, "checker": 2}
    assert agents["solver"]["top_k"] == 7 and agents["planner"]["top_k"] == 0  # one key of the run's entry changed
    assert summary["model"]["agents"]["solver"]["policy"] == "policy_0"
    taken = summary["from_run"]
    assert "env.max_turns" not in taken and taken["env.name"] == ENV
    assert taken["eval.temperature/top_p/top_k"] == "each agent's val_sampling"  # not max_tokens: it was given


def test_naming_another_env_drops_the_runs_env_settings(run):
    from pettingllms.config.load import compose, to_schema
    from pettingllms.eval.run_settings import override_keys
    from pettingllms.eval.runner import prepare

    overrides = [f"model.checkpoint={run}", "env.name=toy_targets", "env.benchmark=[procedural]"]
    cfg, _, tasks, taken = prepare(to_schema(compose("eval", overrides)), override_keys(overrides))
    assert [t.env_name for t in tasks] == ["toy_targets"]
    assert (cfg.env.max_turns, cfg.env.max_val_problems) == (0, 0)  # eval.yaml's (the env's default), not 2
    assert not any(key.startswith("env.") for key in taken) and taken["reward.alpha"] == "0.5"

