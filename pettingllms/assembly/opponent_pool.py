"""The opponent pool (``self_play.*``): frozen past versions of the trained agents as opponents, beside the live
policy (fictitious self-play; UnstableBaselines keeps such a pool of LoRA adapters).

- Slots, LoRA policies (L2; L1/L3 with ``lora.rank``): each trained adapter of an agent that plays in the pool gets
  ``pool_size`` frozen twins on the same model, ``<adapter>-pool<k>``, declared with the policy's adapters
  (``slot_adapters``), so the same engine serves them beside the live ones (one more LoRA each, for vLLM's
  ``max_loras`` too) and the checkpoint holds their weights.
- Slots, full-weight policies (L1/L3 full fine-tunes): the policy gets one more worker, ``<policy>-pool``
  (``snapshot_policy``; ``runtime/snapshots.py``), untrained, with an engine of its own; it keeps every slot's full
  weights in host memory and plays one slot at a time, so all of a step's episodes against the pool meet the same
  past version (``step_slot``). Costs: one more engine (and its model) per such policy, and ``pool_size`` copies of
  the weights in host memory and in every checkpoint.
- Snapshots: every ``snapshot_every`` steps, after the step's update, every trained agent's weights (its adapter, or
  its full policy) are copied into slot ``k`` (the slots fill in order, then the oldest is replaced):
  ``OpponentPool.snapshot_due``, ``next_slot``, ``copies``, ``full_copies``, ``record``.
- Seating, per problem of a step (``OpponentPool.seatings``): with probability ``live_prob``, or while the pool is
  empty, every agent plays live (plain self-play: every seat trains); otherwise one seat trains, taking turns across
  the step's problems, and one past version drawn uniformly from the filled slots (per problem; per step when a
  full-weight policy is pooled) plays every other pooled agent. Those agents' samples are frozen (never grouped or
  trained; ``rollout/executor.py``). The draws are seeded by (run seed, step, problem slot), so a resumed run seats
  its problems as the original did.
- ``state_dict`` (which step each slot holds) goes into the trainer's checkpoint.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from pettingllms.core import ConfigError
from pettingllms.rollout.executor import AgentSpec, Opponent

POOL_SUFFIX = "-pool"


def snapshot_policy(policy: str) -> str:
    """The worker that plays a full-weight policy's past versions (``WorkerSpec.snapshot_of``)."""
    return f"{policy}{POOL_SUFFIX}"


def slot_adapter(adapter: str, k: int) -> str:
    """The adapter that holds slot ``k``'s copy of ``adapter``."""
    return f"{adapter}{POOL_SUFFIX}{k}"


def slot_adapters(adapters: Sequence[str], pool_size: int) -> tuple[str, ...]:
    """Every slot adapter of a policy whose trained adapters are ``adapters``."""
    return tuple(slot_adapter(a, k) for a in adapters for k in range(pool_size))


def pooled_agents(agent_specs: Mapping[str, AgentSpec]) -> list[str]:
    """The agents a past version can play: the trained ones (an untrained agent is the same in every version)."""
    return [name for name, spec in agent_specs.items() if spec.trainable]


def check_pool(pool_size: int, agent_specs: Mapping[str, AgentSpec], program: bool) -> None:
    """Refuse a pool the run cannot hold, naming the fix: it needs two trained acting agents and an env the executor
    runs."""
    if pool_size == 0:
        return
    if program:
        raise ConfigError("self_play.pool_size: an agent program's calls go through the gateway to the live agents; "
                          "the opponent pool is not built for programs (set self_play.pool_size=0)")
    if len(agent_specs) < 2:
        raise ConfigError(f"self_play.pool_size={pool_size} needs two acting agents or more (the env has "
                          f"{list(agent_specs)}); against a fixed player use the env's own opponent option "
                          "(e.g. env.options.opponent=random)")
    pooled = pooled_agents(agent_specs)
    if len(pooled) < 2:
        raise ConfigError(f"self_play.pool_size={pool_size} needs two trained agents or more (trained: {pooled}): in an "
                          "episode against the pool one trained seat plays live and the past version plays the other "
                          "trained agents, so with one there is no seat for it (a fixed opponent is an untrained agent, "
                          "agents.<role>.trainable=false, or the env's opponent option)")


def full_policies(agent_specs: Mapping[str, AgentSpec]) -> list[str]:
    """The trained policies whose past versions are full models (no adapter): each gets a ``snapshot_policy``."""
    return sorted({agent_specs[a].policy for a in pooled_agents(agent_specs) if agent_specs[a].adapter is None})


@dataclass
class OpponentPool:
    """The pool's slots and what each holds; the seating of a step's problems. Pure: the trainer copies the weights
    (``PolicyGroup.snapshot``) and checkpoints ``state_dict``."""

    size: int
    snapshot_every: int
    live_prob: float
    agent_specs: Mapping[str, AgentSpec]
    seed: int
    slots: list[int | None] = field(default_factory=list)  # the step each slot's copy was taken at (None: empty)

    def __post_init__(self) -> None:
        if not self.slots:
            self.slots = [None] * self.size

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def snapshot_due(self, step: int) -> bool:
        return self.enabled and step % self.snapshot_every == 0

    def next_slot(self) -> int:
        """The slot the next snapshot goes into: the first empty one, else the one holding the oldest step."""
        for k, taken_at in enumerate(self.slots):
            if taken_at is None:
                return k
        return min(range(self.size), key=lambda k: self.slots[k])

    def copies(self, k: int) -> dict[str, list[tuple[str, str]]]:
        """policy -> (live adapter, slot adapter) pairs of slot ``k``: every pooled agent's adapter, once."""
        out: dict[str, list[tuple[str, str]]] = {}
        for name in pooled_agents(self.agent_specs):
            spec = self.agent_specs[name]
            if spec.adapter is None:  # a full model: full_copies
                continue
            pair = (spec.adapter, slot_adapter(spec.adapter, k))
            if pair not in out.setdefault(spec.policy, []):
                out[spec.policy].append(pair)
        return out

    def full_copies(self) -> dict[str, str]:
        """Full-weight policy -> the worker that keeps its past versions (every snapshot copies the whole policy)."""
        return {policy: snapshot_policy(policy) for policy in full_policies(self.agent_specs)}

    def record(self, k: int, step: int) -> None:
        self.slots[k] = step

    def filled(self) -> list[int]:
        return [k for k, taken_at in enumerate(self.slots) if taken_at is not None]

    def opponent(self, k: int, agent: str) -> Opponent:
        spec = self.agent_specs[agent]
        name = f"pool{k}@step{self.slots[k]}"
        if spec.adapter is None:  # a full model: its pool worker plays the slot the step serves (step_slot)
            return Opponent(name, snapshot_policy(spec.policy), None)
        return Opponent(name, spec.policy, slot_adapter(spec.adapter, k))

    def step_slot(self, step: int) -> int | None:
        """The slot every problem of ``step`` drawn against the pool meets when a full-weight policy is pooled (its
        pool worker holds one past version at a time); None when no slot is filled or every policy has adapters
        (their slots are drawn per problem)."""
        filled = self.filled()
        if not filled or not full_policies(self.agent_specs):
            return None
        return random.Random(f"{self.seed}/{step}/opponent-pool-slot").choice(filled)

    def seatings(self, step: int, problems: int) -> list[dict[str, Opponent]]:
        """Per problem of ``step``: the agents a past version plays (empty: every agent live)."""
        filled = self.filled()
        pooled = pooled_agents(self.agent_specs)
        per_step = self.step_slot(step)
        out: list[dict[str, Opponent]] = []
        for slot in range(problems):
            rng = random.Random(f"{self.seed}/{step}/{slot}/opponent-pool")
            if not filled or rng.random() < self.live_prob:
                out.append({})
                continue
            k = per_step if per_step is not None else rng.choice(filled)
            learner = pooled[(step + slot) % len(pooled)]  # seats take turns across problems (and steps)
            out.append({agent: self.opponent(k, agent) for agent in pooled if agent != learner})
        return out

    def describe(self) -> str:
        """One line for the run plan: who plays whom, with which weights."""
        if not self.enabled:
            return "self-play: every agent live (self_play.pool_size=0)"
        pooled = pooled_agents(self.agent_specs)
        full = full_policies(self.agent_specs)
        # The adapters, each once (L1 with one shared adapter: one), as the slots copy them (slot_adapters).
        adapters = sorted({self.agent_specs[a].adapter for a in pooled if self.agent_specs[a].adapter is not None})
        parts = [f"the adapter(s) {', '.join(adapters)}"] if adapters else []
        if full:
            parts.append(f"{', '.join(full)}'s full weights, kept in host memory and played by "
                         f"{', '.join(snapshot_policy(p) for p in full)}")
        what = " and ".join(parts)
        drawn = "per step (a pool worker plays one past version at a time)" if full else "per problem"
        return (f"self-play with an opponent pool of {self.size} past versions (a snapshot of {what} every "
                f"{self.snapshot_every} steps): each problem is plain self-play with probability {self.live_prob:g}, "
                f"otherwise one seat trains (taking turns) against one past version drawn uniformly from the pool "
                f"{drawn}, which plays every other agent and is never trained")

    def state_dict(self) -> dict:
        return {"slots": list(self.slots)}

    def load_state_dict(self, state: Mapping) -> None:
        slots = list(state["slots"])
        if len(slots) != self.size:
            raise ConfigError(f"the checkpoint's opponent pool has {len(slots)} slots but self_play.pool_size="
                              f"{self.size}: resume with self_play.pool_size={len(slots)}")
        self.slots = slots
