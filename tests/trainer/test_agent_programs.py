"""Agent programs (env.name=program): an unmodified program that uses only the ``openai`` client trains at L2 from
the directory that holds it; every sample is the exact call the program made and read; each adapter learns from its
own agent's calls only; failures are recorded, never silent."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from pettingllms.cli import main
from pettingllms.core import ConfigError

# A two-agent program as a user writes one: a proposer answers, a reviewer judges; only the openai client. It keeps
# what it sent and read in CALLS, so the tests can compare the run's samples with the program's own view.
PROGRAM = textwrap.dedent('''
    import itertools
    import os
    import sys
    import time
    from openai import AsyncOpenAI

    CALLS = []
    RUNS = itertools.count()

    def tasks(split, count):
        offset = 0 if split == "train" else 1000
        if os.environ.get("DUO_MODE") == "overlapping_splits":  # test ids 1000.. are among the 100,000 trained
            return [{"id": f"task-{offset + i}", "x": offset + i} for i in range(count)]
        return [{"id": f"{split}-{i}", "x": offset + i} for i in range(count)]

    async def run(task, base_url, api_key):
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        mode = os.environ.get("DUO_MODE", "both")
        if mode == "raise_half" and next(RUNS) % 2:
            raise ValueError(f"the program failed on task {task['id']}")
        run_number = next(RUNS) if mode == "exit_or_block" else 0
        if run_number % 4 == 1:
            sys.exit("could not parse the answer")  # a script's habit: a failed run, never the training's end
        if mode == "no_calls":
            return {"a": 1.0, "b": 0.0}
        if mode == "unknown_model":
            await client.chat.completions.create(model="critic", messages=[{"role": "user", "content": "hi"}])
        messages = [{"role": "user", "content": f"Say a number near {task['x']}."}]
        reply = await client.chat.completions.create(model="a", messages=messages, max_tokens=6)
        CALLS.append(("a", messages, reply.choices[0].message.content))
        rewards = {"a": float(len(reply.choices[0].message.content))}  # differs between runs: a learns
        if mode == "both":
            review = [{"role": "user", "content": "Is this a number? " + reply.choices[0].message.content}]
            verdict = await client.chat.completions.create(model="b", messages=review, max_tokens=4)
            CALLS.append(("b", review, verdict.choices[0].message.content))
            rewards["b"] = float("yes" in verdict.choices[0].message.content.lower())
        else:
            rewards["b"] = 0.0  # b made no call: it contributes nothing
        await client.close()
        if run_number % 4 == 3:
            time.sleep(1.5)  # blocks the event loop past env.options.timeout=1, then returns: wait_for cannot stop it
        return rewards
''')
TRAIN = ["train", "env.name=program", "env.options.program=duo_program", "env.agents=[a,b]", "specialization=L2",
         "rollout.mode=trajectory", "base_models.policy_0.path=tiny-random-smollm2", "training.total_training_steps=2",
         "training.train_batch_size=2", "rollout.branching=2", "training.max_response_length=8",
         "training.val_freq=0", "training.val_before_train=false", "training.export_hf=false", "training.plot=false",
         "resources.use_ray=false", "optim.lr=1e-2"]


@pytest.fixture
def program_dir(tmp_path, monkeypatch):
    (tmp_path / "duo_program.py").write_text(PROGRAM)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    sys.modules.pop("duo_program", None)


def _rows(run_root: Path) -> list[dict]:
    (summary,) = run_root.glob("**/summary.log")
    return [json.loads(line) for line in summary.read_text().splitlines()]


def test_a_program_trains_two_steps_at_l2_with_each_agents_reward_and_samples(program_dir):
    assert main([*TRAIN, f"training.log_dir={program_dir / 'logs'}"]) == 0
    rows = _rows(program_dir / "logs")
    assert len(rows) == 2
    for row in rows:
        for agent in ("a", "b"):
            assert row[f"policy_0/{agent}/samples"] == 4.0  # 2 tasks x K=2 runs, one call each
            assert f"policy_0/{agent}/reward_mean" in row
            assert row[f"policy_0/actor/adapter/{agent}/num_sequences"] == 4.0
            # the learner's log-probs of the served ids agree with the engine's: the ids were not re-tokenised
            assert row[f"policy_0/actor/adapter/{agent}/rollout/logprob_abs_diff"] < 1e-4
        assert row["episode/error_ratio"] == 0.0


def test_every_sample_is_the_exact_call_the_program_made_and_read(program_dir):
    from pettingllms.assembly.plan import plan
    from pettingllms.entry.train import load_config
    from pettingllms.models import HFChatCodec, load_model, resolve_model
    from pettingllms.rollout.hf_engine import HFEngine
    from pettingllms.rollout.policy_client import LocalPolicyClient
    from pettingllms.rollout.program import ProgramRollout

    run_plan = plan(load_config("train", [*TRAIN[1:], "specialization=L1"]))  # one plain model serves both
    path = resolve_model("tiny-random-smollm2")
    codec = HFChatCodec.from_pretrained(path)
    client = LocalPolicyClient(HFEngine(load_model(path), codec, seed=0), codec)
    rollout = ProgramRollout(run_plan.env, run_plan.agent_specs, {"policy_0": client}, run_plan.executor_config)
    try:
        import duo_program

        duo_program.CALLS.clear()
        problems = run_plan.env.procedural_problems("train", 3)
        result = rollout.run(problems, [0, 1, 2])
    finally:
        rollout.close()
    assert len(result.samples) == len(duo_program.CALLS) == 3 * 2 * 2
    # What the program sent (rendered by the chat template) and read, against what the samples hold: the same
    # calls, one for one.
    served = sorted((agent, tuple(codec.encode_chat(messages)), content)
                    for agent, messages, content in duo_program.CALLS)
    trained = sorted((s.agent, s.prompt_ids, s.response_text) for s in result.samples)
    assert served == trained
    for sample in result.samples:
        assert codec.decode(sample.response_ids) == sample.response_text
        assert len(sample.response_logprobs) == len(sample.response_ids)
        assert sample.group == (int(sample.episode[1:].split("e")[0]), -1, sample.agent)  # (task slot, whole, agent)
    rewards = {(s.episode, s.agent): s.reward for s in result.samples}
    for episode in result.episodes:
        assert {a: rewards[(episode.episode, a)] for a in ("a", "b")} == episode.agent_rewards


def test_each_adapter_learns_from_its_own_agents_calls_only(program_dir, monkeypatch):
    """b makes no call: its adapter gets no sample and its weights do not move, while a's do."""
    from pettingllms.entry.train import load_config
    from pettingllms.trainer.trainer import Trainer

    monkeypatch.setenv("DUO_MODE", "a_only")
    cfg = load_config("train", [*TRAIN[1:], f"training.log_dir={program_dir / 'logs'}", "algorithm.norm_adv_by_std=false"])
    with Trainer(cfg) as trainer:
        model = trainer.policies.ranks["policy_0"][0].learner.model
        before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
        metrics = trainer.step(1).metrics
        after = {n: p.detach() for n, p in model.named_parameters() if "lora_" in n}
    moved = {n for n in before if not (before[n] == after[n]).all()}
    assert metrics["policy_0/actor/adapter/a/num_sequences"] == 4.0 and "policy_0/b/samples" not in metrics
    assert moved and all(".a." in n for n in moved), sorted(moved)[:4]  # only a's adapter; b's is as it started
    assert any(".b." in n for n in before)


def test_a_failing_program_is_recorded_and_a_step_where_all_fail_stops_the_run(program_dir, monkeypatch, capsys):
    monkeypatch.setenv("DUO_MODE", "raise_half")
    assert main([*TRAIN, f"training.log_dir={program_dir / 'one'}", "training.total_training_steps=1"]) == 0
    row = _rows(program_dir / "one")[0]
    assert row["episode/error_ratio"] == 0.5  # every other run raised: two of four
    assert row["policy_0/a/samples"] == 2.0  # the failed runs' calls are not trained on
    (log,) = (program_dir / "one").glob("**/train.log")
    text = log.read_text()
    assert "ValueError: the program failed on task" in text and "Traceback" in text
    assert "error_ratio 0.500" in capsys.readouterr().out

    monkeypatch.setenv("DUO_MODE", "unknown_model")
    assert main([*TRAIN, f"training.log_dir={program_dir / 'all'}", "training.total_training_steps=1"]) != 0
    (log,) = (program_dir / "all").glob("**/train.log")
    text = log.read_text()
    assert "every one of the 4 program runs failed" in text
    assert "NotFoundError" in text and "'critic' is not an agent of this run" in text and "['a', 'b']" in text


def test_a_program_that_exits_or_blocks_fails_its_run_and_one_that_never_calls_is_refused(program_dir, monkeypatch):
    monkeypatch.setenv("DUO_MODE", "exit_or_block")  # of every 4 runs, one exits and one blocks past the timeout
    out = program_dir / "exit_or_block"
    assert main([*TRAIN, f"training.log_dir={out}", "training.total_training_steps=1", "env.options.timeout=1"]) == 0
    # both failed their runs (a run that blocked used to count as done: 0.25; sys.exit ended the training)
    assert _rows(out)[0]["episode/error_ratio"] == 0.5
    (log,) = out.glob("**/train.log")
    text = log.read_text()
    assert "2 of 4 program runs failed" in text
    assert ("the program raised SystemExit: could not parse the answer" in text  # the first failure is logged
            or "a blocking call inside async def run holds its event loop" in text)
    monkeypatch.setenv("DUO_MODE", "no_calls")  # rewards returned, but no call: nothing to train
    assert main([*TRAIN, f"training.log_dir={program_dir / 'none'}", "training.total_training_steps=1"]) != 0
    (log,) = (program_dir / "none").glob("**/train.log")
    assert "the program made no model call in any of the 4 runs that finished" in log.read_text()
    monkeypatch.setenv("DUO_MODE", "a_only")  # b never calls: it trains on nothing, and the log says so once
    assert main([*TRAIN, f"training.log_dir={program_dir / 'a_only'}"]) == 0
    (log,) = (program_dir / "a_only").glob("**/train.log")
    assert log.read_text().count("agent(s) ['b'] made no call in any of this step's 4 finished program runs") == 1


def test_tree_mode_and_a_program_without_agents_are_refused_with_the_fix(program_dir):
    from pettingllms.assembly.plan import plan
    from pettingllms.core import EnvError
    from pettingllms.entry.train import load_config

    with pytest.raises(ConfigError, match="cannot be forked.*rollout.mode=trajectory"):
        plan(load_config("train", [*TRAIN[1:], "rollout.mode=tree"]))
    with pytest.raises((ConfigError, EnvError), match="env.agents=\\[a,b\\]"):
        plan(load_config("train", [t for t in TRAIN[1:] if not t.startswith("env.agents")]))


def test_check_env_passes_the_program_and_names_what_a_broken_one_does_wrong(program_dir, monkeypatch, capsys):
    assert main(["check-env", "program", "--option", "program=duo_program", "--option", "agents=[a,b]"]) == 0
    assert "check-env program: PASS" in capsys.readouterr().out
    monkeypatch.setenv("DUO_MODE", "a_only")  # b is declared but never called
    assert main(["check-env", "program", "--option", "program=duo_program", "--option", "agents=[a,b]"]) == 1
    assert "['b'] made no call in any run" in capsys.readouterr().out
    monkeypatch.setenv("DUO_MODE", "raise_half")
    assert main(["check-env", "program", "--option", "program=duo_program", "--option", "agents=[a,b]"]) == 1
    out = capsys.readouterr().out
    assert "runs failed; the first: the program raised ValueError" in out
    assert "['a', 'b'] made no call" not in out  # a called, in the runs that failed too
    monkeypatch.setenv("DUO_MODE", "unknown_model")  # every run fails: whether each agent calls is not known
    assert main(["check-env", "program", "--option", "program=duo_program", "--option", "agents=[a,b]"]) == 1
    out = capsys.readouterr().out
    assert "every agent calls: not checked: every run failed (above)" in out and "made no call" not in out
    monkeypatch.setenv("DUO_MODE", "overlapping_splits")  # disjoint over the first few, not over what a run reads
    assert main(["check-env", "program", "--option", "program=duo_program", "--option", "agents=[a,b]"]) == 1
    assert "[FAIL] tasks: procedural_problems: 50 of the first 50 'test' task ids" in capsys.readouterr().out


# The same shape written with an agent framework (the OpenAI Agents SDK): two agents, each its own `Agent` with
# instructions, run one after the other by the SDK's `Runner` over chat completions.
SDK_PROGRAM = textwrap.dedent('''
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no trace export: the run is offline


    def tasks(split, count):
        start = 0 if split == "train" else 500
        return [{"id": f"{split}-{i}", "topic": f"item {start + i}"} for i in range(count)]


    async def run(task, base_url, api_key):
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        writer = Agent(name="writer", instructions="Write one short sentence.",
                       model=OpenAIChatCompletionsModel(model="writer", openai_client=client))
        judge = Agent(name="judge", instructions="Answer yes if the sentence is short, else no.",
                      model=OpenAIChatCompletionsModel(model="judge", openai_client=client))
        offline = RunConfig(tracing_disabled=True)
        draft = await Runner.run(writer, f"Describe {task['topic']}.", run_config=offline)
        verdict = await Runner.run(judge, str(draft.final_output), run_config=offline)
        await client.close()
        short = len(str(draft.final_output).split()) <= 6
        return {"writer": float(short),
                "judge": float(str(verdict.final_output).strip().lower().startswith("yes") == short)}
''')


def test_a_program_written_with_the_openai_agents_sdk_trains_each_agent_on_its_own_adapter(tmp_path, monkeypatch):
    from pettingllms.entry.train import load_config
    from pettingllms.trainer.trainer import Trainer

    (tmp_path / "sdk_program.py").write_text(SDK_PROGRAM)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    overrides = [t for t in TRAIN[1:] if not t.startswith(("env.options.program", "env.agents"))]
    cfg = load_config("train", [*overrides, "env.options.program=sdk_program", "env.agents=[writer,judge]",
                                "training.save_samples_freq=1", f"training.log_dir={tmp_path / 'logs'}"])
    try:
        with Trainer(cfg) as trainer:
            metrics = trainer.step(1).metrics
            rows = [json.loads(line) for line in (trainer.run_dir / "samples" / "step_000001.jsonl").open()]
    finally:
        sys.modules.pop("sdk_program", None)
    for agent in ("writer", "judge"):
        assert metrics[f"policy_0/{agent}/samples"] == 4.0
        assert metrics[f"policy_0/actor/adapter/{agent}/num_sequences"] == 4.0
    assert metrics["episode/error_ratio"] == 0.0
    # the framework's messages are what was trained on: each agent's instructions lead its prompts
    prompts = {row["agent"]: [row["prompt"] or c["prompt"] for c in row["candidates"]] for row in rows}
    assert all("Write one short sentence." in p for p in prompts["writer"])
    assert all("Answer yes if the sentence is short" in p for p in prompts["judge"])
