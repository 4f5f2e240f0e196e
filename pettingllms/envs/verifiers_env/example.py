"""A two-agent verifiers (v1) environment, the default of ``env.name=verifiers``: a solver answers a sum, a checker
says whether the solver's answer is right. Written as a verifiers user writes one (a ``Taskset`` of ``Task``s with
a ``@vf.reward``, an ``Env`` whose roles are ``AgentConfig`` fields and whose ``run`` plays them, ``finalize``
crediting the checker), and loaded by its id: ``taskset.id=pettingllms-sums``.
Both roles use the tool-less ``null`` harness, so an episode needs no sandbox and no network."""

from __future__ import annotations

import re

import verifiers.v1 as vf

TASKS = 2_000  # sums a + b with a, b in [0, 100), in a fixed order


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply or "")
        return float(bool(numbers) and numbers[-1] == self.data.answer)


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for i in range(TASKS):
            a, b = (i * 37) % 100, (i * 61 + 13) % 100
            yield SumTask(SumData(id=f"sum-{i}", prompt=f"What is {a} + {b}? Answer with the number only.",
                                  answer=str(a + b)), self.config.task)


class SolverCheckerConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    checker: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})


class SolverCheckerEnv(vf.Env[SolverCheckerConfig]):
    async def run(self, task, agents):
        answer = await agents.solver.run(task)  # scored by SumTask.correct
        question = f"{task.data.prompt_text}\nA student answered: {answer.last_reply!r}. Is that right? yes or no."
        await agents.checker.run(vf.Task(vf.TaskData(id=f"{task.data.id}-check", prompt=question)))

    async def finalize(self, task, episode):
        solver = next(t for t in episode.traces if t.agent.name == "solver")
        checker = next(t for t in episode.traces if t.agent.name == "checker")
        says_right = (checker.last_reply or "").strip().lower().startswith("yes")
        checker.record_reward("agrees", float(says_right == (solver.reward >= 1.0)), 1.0)


__all__ = ["SumTaskset", "SolverCheckerEnv"]
