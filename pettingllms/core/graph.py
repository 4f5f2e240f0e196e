"""Agent graph: which agents act in each turn, and which of them act from the same state.

A *stage* is a tuple of agents that observe the same state. Stages run in order; after a stage, the chosen
actions of its agents are applied in agent order. ``[("coder", "tester")]`` is one parallel stage;
``[("tool",), ("planner",)]`` is two sequential stages, so the planner sees the tool's result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class AgentGraph:
    stage_list: tuple[tuple[str, ...], ...]
    # Agents of the env that do not act in this run (``restricted_to``: ``env.agents`` left them out). The env may
    # still name them (an ``outcome`` of every seat); the run reads nothing of theirs.
    left_out: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.stage_list or any(not stage for stage in self.stage_list):
            raise ValueError("an agent graph needs at least one stage, and no stage may be empty")
        names = [a for stage in self.stage_list for a in stage]
        dupes = sorted({a for a in names if names.count(a) > 1})
        if dupes:
            raise ValueError(f"agent(s) {dupes} appear in more than one stage of a turn")

    @classmethod
    def parallel(cls, agents: Sequence[str]) -> "AgentGraph":
        """All agents act from the turn-start state."""
        return cls((tuple(agents),))

    @classmethod
    def sequential(cls, agents: Sequence[str]) -> "AgentGraph":
        """Each agent sees the state left by the previous one."""
        return cls(tuple((a,) for a in agents))

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(a for stage in self.stage_list for a in stage)

    def stages(self, turn: int) -> tuple[tuple[str, ...], ...]:
        """The stages of ``turn``. The same every turn; subclass to vary it by turn."""
        del turn
        return self.stage_list

    def restricted_to(self, agents: Sequence[str]) -> "AgentGraph":
        """The same graph with only ``agents`` (e.g. the L0 single-agent variant)."""
        keep = set(agents)
        unknown = keep - set(self.agents)
        if unknown:
            raise ValueError(f"agents {sorted(unknown)} are not in this graph {list(self.agents)}")
        stages = tuple(tuple(a for a in stage if a in keep) for stage in self.stage_list)
        dropped = tuple(a for a in self.agents if a not in keep)
        return AgentGraph(tuple(s for s in stages if s), left_out=self.left_out + dropped)
