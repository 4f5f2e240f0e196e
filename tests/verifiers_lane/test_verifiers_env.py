"""``env.name=verifiers``: an environment written for verifiers (v1) trains as an agent program, each role on its
own adapter with its own reward (make test-verifiers: the verifiers package in its own venv). The env is the one a
verifiers user writes (``pettingllms/envs/verifiers_env/example.py``), run by verifiers itself: its taskset, its
roles' ``null`` harnesses in local subprocesses, its interception server, its rubric and ``finalize``."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.verifiers
verifiers = pytest.importorskip("verifiers")

from pettingllms.cli import main  # noqa: E402
from pettingllms.core import EnvError  # noqa: E402
from pettingllms.envs.verifiers_env import VerifiersEnv, role_rewards  # noqa: E402

DOC = Path(__file__).parents[2] / "docs/verifiers.md"


def doc_commands() -> list[list[str]]:
    """The commands of the page's "Select an env" block, as argument lists."""
    section = DOC.read_text().split("## Select an env", 1)[1]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [shlex.split(line)[1:] for line in block.splitlines() if line.strip()]


def test_the_example_passes_check_env_with_its_roles_and_disjoint_splits():
    from pettingllms.entry.check_env import conformance_report

    env = VerifiersEnv()
    try:
        assert env.roles == ["solver", "checker"] and len(env.tasks) == 2000
        test = env.procedural_problems("test", 100)
        assert len(test) == 50 and test[0].problem_id == "sum-1950"  # the last test_size tasks
        report = conformance_report(env, name="verifiers")
        assert report.ok, report.format()
    finally:
        env.close()


def test_the_pages_commands_check_the_env_and_train_two_steps_at_l2_each_role_on_its_adapter(tmp_path, capsys):
    check, train, custom = doc_commands()
    assert main(check) == 0 and "check-env verifiers: PASS" in capsys.readouterr().out
    assert main([*train, f"training.log_dir={tmp_path}"]) == 0
    (summary,) = tmp_path.glob("**/summary.log")
    rows = [json.loads(line) for line in summary.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["episode/error_ratio"] == 0.0  # every verifiers episode finished
        for role in ("solver", "checker"):
            assert row[f"policy_0/actor/adapter/{role}/num_sequences"] == 4  # 2 tasks x 2 runs, one call each
            assert 0.0 <= row[f"policy_0/{role}/reward_mean"] <= 1.0
    # the checker is credited by the env's finalize ("agrees"): right about a wrong sum is reward 1
    assert rows[0]["policy_0/checker/reward_mean"] > 0.0


def test_bad_options_are_refused_in_one_line():
    with pytest.raises(EnvError, match=r"env.agents names \['critic'\], which are not roles .*\['solver', 'checker'\]"):
        VerifiersEnv(agents=["critic"])
    with pytest.raises(EnvError, match=r"test_size=2000: the taskset holds 2000 tasks"):
        VerifiersEnv(test_size=2000)
    with pytest.raises(EnvError, match=r"env.options.config: verifiers refused it: .*no_such_taskset"):
        VerifiersEnv(config={"taskset": {"id": "no_such_taskset"}})


def test_a_role_that_ran_several_times_gets_the_mean_of_its_traces():
    class Trace:
        def __init__(self, name, reward):
            self.agent, self.reward = type("Agent", (), {"name": name})(), reward

    assert role_rewards([Trace("agent", 1.0), Trace("agent", 0.0), Trace("judge", 0.5)]) == {"agent": 0.5,
                                                                                           "judge": 0.5}


def test_the_example_module_is_what_a_verifiers_user_writes():
    source = (Path(__file__).parents[2] / "pettingllms/envs/verifiers_env/example.py").read_text()
    assert "import verifiers.v1 as vf" in source and "pettingllms" not in source.split('"""', 2)[2]


MY_TASKSET = """
import verifiers.v1 as vf


class EchoData(vf.TaskData):
    word: str


class EchoTask(vf.Task[EchoData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def echoed(self, trace) -> float:
        return float(self.data.word in (trace.last_reply or ""))


class EchoTaskset(vf.Taskset[EchoTask, vf.TasksetConfig]):
    def load(self):
        for i in range(60):
            yield EchoTask(EchoData(id=f"echo-{i}", prompt=f"Say the word w{i}.", word=f"w{i}"), self.config.task)


__all__ = ["EchoTaskset"]
"""


def test_the_pages_own_taskset_line_trains_a_users_single_agent_taskset(tmp_path, monkeypatch):
    (tmp_path / "my_taskset.py").write_text(MY_TASKSET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    *_, custom = doc_commands()
    tiny = ["base_models.policy_0.path=tiny-random-smollm2", "training.total_training_steps=1",
            "training.train_batch_size=2", "rollout.branching=2", "training.max_response_length=8",
            "training.val_freq=0", "training.val_before_train=false", "training.export_hf=false", "training.plot=false",
            "resources.use_ray=false", f"training.log_dir={tmp_path / 'logs'}"]
    assert main([*custom, *tiny]) == 0
    (summary,) = (tmp_path / "logs").glob("**/summary.log")
    (row,) = [json.loads(line) for line in summary.read_text().splitlines()]
    assert row["episode/error_ratio"] == 0.0 and row["policy_0/actor/num_sequences"] == 4


FROZEN_AND_DOCKER = """
import verifiers.v1 as vf
from pettingllms.envs.verifiers_env.example import SumTaskset


class FrozenConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    judge: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, runtime={"type": "docker"})


class FrozenJudgeEnv(vf.Env[FrozenConfig]):
    async def setup(self, agents):
        agents.judge.trainable = False

    async def run(self, task, agents):
        await agents.solver.run(task)
        await agents.judge.run(task)


__all__ = ["SumTaskset", "FrozenJudgeEnv"]
"""
ENDLESS = """
import verifiers.v1 as vf
from pettingllms.envs.verifiers_env.example import SumTask, SumData


class Endless(vf.Taskset[SumTask, vf.TasksetConfig]):
    INFINITE = True

    def load(self):
        i = 0
        while True:
            yield SumTask(SumData(id=f"e-{i}", prompt="1 + 1?", answer="2"), self.config.task)
            i += 1


__all__ = ["Endless"]
"""


def test_a_runtime_the_env_declares_is_kept_a_frozen_role_is_refused_and_an_endless_taskset_too(tmp_path,
                                                                                                 monkeypatch):
    from pettingllms.envs.verifiers_env import _with_local_roles

    (tmp_path / "frozen_judge.py").write_text(FROZEN_AND_DOCKER)
    (tmp_path / "endless_sums.py").write_text(ENDLESS)
    monkeypatch.syspath_prepend(str(tmp_path))
    config, roles = _with_local_roles({"taskset": {"id": "frozen_judge"}})
    assert roles == ["solver", "judge"]
    assert config["solver"]["runtime"] == {"type": "subprocess"}  # verifiers' default (a Prime sandbox) replaced
    assert "runtime" not in config["judge"]  # the env's docker runtime is kept, never run unsandboxed
    with pytest.raises(EnvError, match=r"endless \(INFINITE\): bound it"):
        VerifiersEnv(config={"taskset": {"id": "endless_sums"}})

    env = VerifiersEnv(config={"taskset": {"id": "frozen_judge"}, "judge": {"runtime": {"type": "subprocess"}}})
    try:
        from pettingllms.entry.check_env import conformance_report

        report = conformance_report(env, name="frozen")  # its runs through the gateway, against a scripted model
        assert not report.ok and "marks ['judge'] untrainable (trainable=False)" in report.format(), report.format()
    finally:
        env.close()


HOOKED = """
import os

from pettingllms.envs.verifiers_env.example import SolverCheckerEnv, SumTaskset


def note(event):
    with open(os.environ["HOOKED_SUMS_LOG"], "a") as f:
        f.write(event + "\\n")


class HookedEnv(SolverCheckerEnv):
    async def start(self):
        note("start")

    async def stop(self):
        note("stop")

    async def run(self, task, agents):
        note("episode")
        await super().run(task, agents)


__all__ = ["SumTaskset", "HookedEnv"]
"""


def test_an_env_with_its_own_start_and_stop_runs_every_episode_inside_one_serving_held_until_close(tmp_path,
                                                                                                   monkeypatch):
    """verifiers runs ``start()`` inside ``serving()`` before any rollout and ``stop()`` when it exits: a rollout of an
    env that brings up its own resources there holds one serving() for all its episodes, entered before the first and
    left when the rollout closes the env; the next rollout enters it afresh."""
    from pettingllms.entry.check_env import conformance_report

    (tmp_path / "hooked_sums.py").write_text(HOOKED)
    log = tmp_path / "events"
    monkeypatch.setenv("HOOKED_SUMS_LOG", str(log))
    monkeypatch.syspath_prepend(str(tmp_path))
    env = VerifiersEnv(config={"taskset": {"id": "hooked_sums"}})
    try:
        assert env._needs_serving
        report = conformance_report(env, name="hooked")  # rollouts through the gateway, each closing the env
        assert report.ok, report.format()
    finally:
        env.close()
    events = log.read_text().split()
    blocks = " ".join(events).split(" stop")[:-1]  # one per serving(): "start episode episode ..."
    assert " ".join(events).endswith("stop") and len(blocks) >= 2, events
    for block in blocks:
        words = block.split()
        assert words[0] == "start" and words.count("start") == 1 and words.count("episode") >= 2, events
