"""``env.name=program``: a user's agent program as an env (``core/program.py``).

The program is a module (``env.options.program=<module>``, importable from the current directory or installed) with

    async def run(task: dict, base_url: str, api_key: str) -> dict[str, float]
        # one episode against the OpenAI-compatible endpoint at base_url; each agent names itself in `model`
    def tasks(split: str, count: int) -> list[dict]
        # `count` tasks of "train" or "test" (disjoint)

and optionally ``AGENTS = [...]``, the model names it uses (``env.agents`` overrides it). Example:
``pettingllms.envs.program.example`` (two agents, a solver and a checker, on sums; only the ``openai`` client).
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping, Sequence

from pettingllms.core.env import Agent, Problem
from pettingllms.core.errors import EnvError
from pettingllms.core.program import AgentProgram
from pettingllms.core.registry import import_module
from pettingllms.core.types import Message

EXAMPLE = "pettingllms.envs.program.example"


class ProgramModule(AgentProgram):
    """The program of ``env.options.program``. ``agents``: ``env.agents`` (the run passes it), else the module's
    ``AGENTS``. ``timeout``: seconds per run."""

    known_options = ()
    takes_config_agents = True  # assembly passes env.agents as ``agents``

    def __init__(self, program: str = EXAMPLE, agents: Sequence[str] = (), timeout: float = 600.0,
                 max_turns: int = 1) -> None:
        module = import_module(program, f"env.options.program={program!r}")
        self.program = program
        self._run = getattr(module, "run", None)
        self._tasks = getattr(module, "tasks", None)
        if not inspect.iscoroutinefunction(self._run) or len(inspect.signature(self._run).parameters) != 3:
            raise EnvError(f"program {program!r} must define `async def run(task, base_url, api_key)` returning "
                           "each agent's reward")
        if not callable(self._tasks):
            raise EnvError(f"program {program!r} must define `def tasks(split, count)` returning a list of task dicts")
        agents = list(agents) or list(getattr(module, "AGENTS", []))
        if not agents:
            raise EnvError(f"program {program!r}: name its agents, the model names it uses: env.agents=[a,b] (or "
                           "AGENTS = [...] in the module)")
        if not timeout > 0:
            raise EnvError(f"env.options.timeout must be > 0 seconds, got {timeout}")
        super().__init__(agents, max_turns=max_turns)
        self.timeout_s = float(timeout)

    async def play(self, task: Mapping[str, Any], base_url: str, api_key: str) -> Mapping[str, float]:
        return await self._run(dict(task), base_url, api_key)

    def procedural_problems(self, split: str, count: int) -> Sequence[Problem]:
        tasks = self._tasks(split, count)
        if not isinstance(tasks, (list, tuple)) or any(not isinstance(t, dict) for t in tasks):
            raise EnvError(f"program {self.program!r}: tasks({split!r}, {count}) must return a list of dicts")
        return [Problem(str(t.get("id", f"{split}-{i}")), dict(t)) for i, t in enumerate(tasks)]

    @classmethod
    def example_problems(cls, n: int = 2) -> Sequence[Problem]:
        return ProgramModule().procedural_problems("test", n)


class ProgramAgent(Agent):
    """An agent of a program: its prompts are the program's own requests, so it is never asked to observe."""

    def observe(self, state: Any, turn: int) -> list[Message]:
        raise EnvError(f"agent {self.name!r} of an agent program writes its own prompts; it is not observed")

    def parse(self, response: str) -> Any:
        return response
