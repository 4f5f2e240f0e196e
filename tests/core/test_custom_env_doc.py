"""docs/custom_env.md is a test: its example module, run with exactly the commands on the page from a directory
outside the repository, passes the checker, trains, and is evaluated with the run's settings; and in-process it
rolls out as the page says."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from pettingllms.cli import main
from pettingllms.core import Problem, SamplingParams
from pettingllms.core.checker import check_env
from pettingllms.core.registry import make_agents
from pettingllms.core.registry import get_env_class
from pettingllms.rollout.executor import AgentSpec, Executor
from settings_support import executor_config
from pettingllms.rollout.policy_client import LocalPolicyClient
from pettingllms.rollout.scripted import ScriptedEngine

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "custom_env.md"


def page_module() -> tuple[str, str]:
    """(the file name the page says to save the example as, the example's code)."""
    text = DOC.read_text()
    (name,) = re.findall(r"Save this as `([^`]+)`", text)
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    return name, code


def page_commands(heading: str = "Try it") -> list[str]:
    """The shell commands of one section of the page ('Try it', 'Evaluating your env'), continuation lines joined."""
    section = DOC.read_text().split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def install_example(tmp_path, monkeypatch) -> str:
    name, code = page_module()
    (tmp_path / name).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = Path(name).stem
    sys.modules.pop(module, None)
    return module


@pytest.mark.slow  # two real training runs, each starting Ray (~40-80 s); the example code itself runs below
@pytest.mark.timeout(1800)
def test_the_pages_commands_check_and_train_from_a_directory_outside_the_repository(tmp_path, run_shell):
    name, code = page_module()
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    (workdir / name).write_text(code)
    assert REPO not in workdir.parents
    commands = page_commands()
    assert [c.split()[:2] for c in commands if c.startswith("pettingllms")] == [
        ["pettingllms", "check-env"], ["pettingllms", "check-env"], ["pettingllms", "train"], ["pettingllms", "train"]]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # the user's module must be found because the command runs next to it
    for command in commands:
        code, out, err = run_shell(command, workdir, env, timeout=600)
        assert code == 0, f"{command}\n{out[-3000:]}\n{err[-3000:]}"

    (procedural,) = workdir.glob("logs/guess/*/*")
    rows = [json.loads(line) for line in (procedural / "summary.log").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and "policy_0/guesser/reward_mean" in rows[1]
    groups = [json.loads(line) for line in (procedural / "samples" / "step_000001.jsonl").read_text().splitlines()]
    assert {g["agent"] for g in groups} == {"guesser", "judge"}
    assert all(len(g["candidates"]) == 2 and g["prompt"] for g in groups)  # K=2 candidates share one prompt
    assert "step 2/2" in (procedural / "train.log").read_text()
    (from_rows,) = workdir.glob("logs/guess_rows/*/*")
    first_step = json.loads((from_rows / "summary.log").read_text().splitlines()[-1])
    assert first_step["step"] == 1 and first_step["policy_0/guesser/samples"] > 0

    evaluations = page_commands("Evaluating your env")
    assert [c.split()[:2] for c in evaluations] == [["pettingllms", "eval"]] * 2
    for command in evaluations:
        code, out, err = run_shell(command, workdir, env, timeout=600)
        assert code == 0, f"{command}\n{out[-3000:]}\n{err[-3000:]}"
        assert "settings from the run" in err and "env.name=guess_env:GuessEnv" in err
    as_trained, overridden = sorted(workdir.glob("logs/eval/*/*"))
    for run_dir, turns, tokens in ((as_trained, 2, 8), (overridden, 1, 4)):
        summary = json.loads((run_dir / "summary.json").read_text())
        (bench,) = summary["benchmarks"].values()
        assert bench["env"] == "guess_env:GuessEnv" and bench["problems"] == 4  # the run's env.max_val_problems
        samples = [s for line in (run_dir / bench["records"]).read_text().splitlines()
                   for s in json.loads(line)["samples"]]
        assert max(s["turns"] for s in samples) == turns  # the env's own default is 1 turn
        assert all(step["response_tokens"] <= tokens for s in samples for step in s["steps"])


def test_the_train_command_quoted_on_the_page_parses_as_overrides():
    for command in page_commands():
        if command.startswith("pettingllms train"):
            args = shlex.split(command)[2:]
            assert all("=" in a and not a.startswith("-") for a in args), args


def test_the_eval_commands_on_the_page_name_real_keys(tmp_path):
    from pettingllms.config.load import compose

    for command in page_commands("Evaluating your env"):
        args = shlex.split(command.replace("$(ls -d logs/guess/*/* | tail -n 1)", str(tmp_path)))
        assert args[:2] == ["pettingllms", "eval"] and args[2] == f"model.checkpoint={tmp_path}", args
        compose("eval", args[2:])  # an unknown key or a bad value raises


def test_doc_example_passes_check_env_and_rolls_out(tmp_path, monkeypatch, capsys):
    module = install_example(tmp_path, monkeypatch)
    assert main(["check-env", f"{module}:GuessEnv"]) == 0, capsys.readouterr().out

    env = get_env_class(f"{module}:GuessEnv")(max_turns=3)
    assert check_env(env).ok
    assert get_env_class("guess") is type(env)  # the module's register_env ran on import
    train, test = env.procedural_problems("train", 50), env.procedural_problems("test", 50)
    assert not {p.problem_id for p in train} & {p.problem_id for p in test}

    def script(prompt, k, request):
        if "Guess my number" in prompt:
            return str(k + 1)  # K=9 candidates cover every number: one of them is right
        guess = re.search(r"The guess is (\d+)", prompt).group(1)
        secret = re.search(r"The secret is (\d+)", prompt).group(1)
        return "yes" if guess == secret else "no"

    engine = ScriptedEngine(script)
    sampling = SamplingParams(max_tokens=50)
    specs = {n: AgentSpec(a, "p", sampling, sampling) for n, a in make_agents(env).items()}
    executor = Executor(env, specs, {"p": LocalPolicyClient(engine, engine.codec)},
                        executor_config(branching=9, max_prompt_length=10_000))
    result = executor.run([Problem("g0"), Problem("g1", {"secret": 4})], seeds=[3, 4])
    assert all(e.success and e.terminated and e.turns == 1 for e in result.episodes)
    guesser_rewards = [s.reward for s in result.samples if s.agent == "guesser" and s.group[0] == 0]
    assert sorted(guesser_rewards) == [0.0] * 8 + [1.0]


def test_the_example_takes_the_option_it_declares_and_refuses_a_misspelt_one(tmp_path, monkeypatch, capsys):
    from pettingllms.assembly.plan import build_env
    from pettingllms.entry.train import load_config

    module = install_example(tmp_path, monkeypatch)
    env = build_env(load_config("train", [f"env.name={module}:GuessEnv", "env.options.highest=20"]))
    assert env.reset(Problem("g"), seed=5).highest == 20
    assert {p.data["secret"] for p in env.procedural_problems("train", 200)} == set(range(1, 21))
    assert main(["train", "--dry-run", f"env.name={module}:GuessEnv", "env.options.hihgest=20"]) == 2
    err = capsys.readouterr().err
    assert "GuessEnv has no option 'hihgest'. Did you mean 'highest'?" in err, err  # as the page says


def test_a_dataset_row_becomes_the_problem_reset_reads(tmp_path, monkeypatch):
    from pettingllms.data.problems import training_problems

    module = install_example(tmp_path, monkeypatch)
    rows = tmp_path / "guess_rows.jsonl"
    rows.write_text('{"id": "g1", "secret": 3}\n{"secret": 8}\n')
    env = get_env_class(f"{module}:GuessEnv")()
    problems = training_problems(env, tmp_path / "data", str(rows))
    assert problems[0] == Problem("g1", {"id": "g1", "secret": 3})
    assert problems[1].problem_id == "guess_rows/1" and problems[1].data["secret"] == 8  # no id: <stem>/<row>
    assert env.reset(problems[1], seed=0).secret == 8


def test_env_imports_failures_are_clean_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_env.py").write_text("import not_installed_dependency\n")
    cases = {
        "env.imports=[no_such_module]": "no module named 'no_such_module' on the Python path",
        "env.imports=[broken_env]": "importing 'broken_env' failed: No module named 'not_installed_dependency'",
        "env.name=no_such_module:Env": "no module named 'no_such_module'",
    }
    for override, message in cases.items():
        sys.modules.pop("broken_env", None)
        assert main(["train", "--dry-run", override]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_check_env_takes_a_short_name_from_imported_modules(tmp_path, monkeypatch, capsys):
    module = install_example(tmp_path, monkeypatch)
    assert main(["check-env", "--imports", module, "guess"]) == 0, capsys.readouterr().out
    sys.modules.pop(module, None)
    assert main(["check-env", f"env.imports=[{module}]", "guess"]) == 0  # the training key, pasted
    assert main(["check-env", "--imports", "no_such_module", "guess"]) == 2
    assert "no module named 'no_such_module'" in capsys.readouterr().err


def test_the_current_directory_is_searched_only_for_a_module_the_user_names(tmp_path, monkeypatch):
    from pettingllms.core.registry import import_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    assert main(["check-env", "toy_targets"]) == 0
    assert str(tmp_path) not in sys.path, "a command that names no module of the user's must not search the cwd"
    (tmp_path / "mine_here.py").write_text("VALUE = 7\n")
    assert import_module("mine_here", "env.imports").VALUE == 7
    assert sys.path[-1] == str(tmp_path)
    import_module("mine_here", "env.imports")
    assert sys.path.count(str(tmp_path)) == 1
    sys.modules.pop("mine_here", None)


def test_the_graph_section_builds_a_mixed_graph_in_code_and_from_the_config(monkeypatch, capsys):
    from pettingllms.core import register_env
    from pettingllms.core.registry import ENVS

    section = DOC.read_text().split("## The agent graph", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    exec(compile(code, str(DOC), "exec"), {})  # its asserts are the page's claims
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    (command,) = [line for line in block.splitlines() if line.strip()]
    assert "env.graph=" in command and "--dry-run" in command
    ENVS.names()  # the page's `auction` env is tests/auction_env.py, registered for this test only
    monkeypatch.setattr(ENVS, "_entries", dict(ENVS._entries))
    from auction_env import AuctionEnv

    register_env("auction", AuctionEnv)
    assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
    (stages,) = re.findall(r"`(stages per turn: [^`]+)`", section)
    assert stages in capsys.readouterr().out
