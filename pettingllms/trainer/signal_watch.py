"""A warning when GRPO has had almost nothing to learn from for several steps in a row.

A group whose candidates all scored the same has zero advantages: it costs its generations and teaches nothing.
``<policy>/grpo/groups_zero_std`` counts them every step; this watch turns a run of such steps into one warning,
naming the usual causes, instead of a curve somebody has to notice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

SHARE = 0.8  # a step "has no signal" for a policy when at least this share of its groups has zero variance
STEPS = 3  # consecutive such steps before the warning


@dataclass
class SignalWatch:
    env_has_outcome: bool = False
    playouts: int = 1
    mode: str = "tree"
    _streak: dict[str, int] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set)

    def check(self, step: int, metrics: Mapping[str, float], policies: list[str]) -> list[str]:
        """The warnings this step earns (each policy warns once per run)."""
        out = []
        for policy in policies:
            groups = metrics.get(f"{policy}/grpo/groups", 0.0)
            flat = metrics.get(f"{policy}/grpo/groups_zero_std", 0.0)
            self._streak[policy] = self._streak.get(policy, 0) + 1 if groups and flat / groups >= SHARE else 0
            if self._streak[policy] >= STEPS and policy not in self._warned:
                self._warned.add(policy)
                out.append(f"step {step}: {policy}: {flat:.0f} of {groups:.0f} GRPO groups had equal rewards in each "
                           f"of the last {STEPS} steps, so they teach nothing. {self._cause()}")
        return out

    def _cause(self) -> str:
        if self.env_has_outcome and self.mode == "tree" and self.playouts == 0:
            return ("The env's outcome arrives only at the end of an episode and rollout.playouts=0 keeps it from "
                    "tree candidates: set rollout.playouts >= 1 (docs/self_play.md)")
        ending = ("a game the model always wins, loses or draws (more rollout.playouts per candidate, or a stronger "
                  "or weaker opponent)" if self.env_has_outcome else
                  "a reward that arrives only at the end of an episode (a game: give the env an outcome, "
                  "docs/self_play.md)")
        return (f"Usual causes: {ending}, a task the model always or never solves, too few candidates "
                "(rollout.branching), or sampling too cold to differ (agents.<role>.train_sampling.temperature)")
