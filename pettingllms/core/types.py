"""Plain data types shared by every layer: chat messages, generation requests and results, samples.

Standard library only. Token ids are always the engine's exact ids; nothing here re-tokenizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict


class Message(TypedDict):
    """One chat message, as chat templates expect it."""

    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class SamplingParams:
    """Explicit sampling settings. There are no hidden defaults: top_k=0 and top_p=1.0 mean "off"."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class GenerationRequest:
    """Ask a policy for ``n`` completions of one prompt (a tree node's K branches share the prefix)."""

    request_id: str
    prompt_ids: tuple[int, ...]
    n: int
    sampling: SamplingParams
    adapter: str | None = None  # LoRA adapter name (L2), or None for the base weights
    # Requests of one group (an episode's turns) share a prompt prefix: a policy with several engines keeps them on
    # one engine so its prefix cache serves the later turns (runtime/dispatch.py). None: no preference.
    prefix_group: str | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"request {self.request_id}: n must be >= 1, got {self.n}")
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")


FINISH_STOP = "stop"  # ended with an end-of-sequence token
FINISH_LENGTH = "length"  # hit max_tokens
FINISH_ERROR = "error"  # the engine failed; the sample is masked out of the loss


@dataclass(frozen=True)
class Completion:
    """One sampled response: exact token ids and the engine's log-probabilities of them.

    logprobs: one per token, raw (``log_softmax(logits)`` at temperature 1, before top-k/top-p), the quantity every
    engine here reports and the learner compares against (the rollout-learner agreement check); empty when the
    source has none (a scripted engine, a server that returns none), which leaves that sample unchecked.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: str = FINISH_STOP

    @property
    def failed(self) -> bool:
        return self.finish_reason == FINISH_ERROR or not self.token_ids


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    completions: tuple[Completion, ...]


GroupKey = tuple[int, int, str]
"""(problem slot in the batch, turn, agent). One GRPO group; slots are unique per batch, so problems never merge."""


@dataclass(frozen=True)
class Sample:
    """One trainable (prompt, response) pair with everything needed to route, group and score it.

    Frozen: the executor makes each sample once, its group key and reward final (trajectory mode's too, made when
    the episode's return is known), so nothing downstream can regroup or rescore it; a changed copy is
    ``dataclasses.replace(sample, ...)``."""

    policy: str
    agent: str
    turn: int
    group: GroupKey
    episode: str  # episode id, unique within a step
    problem_id: str
    branch: int  # candidate index within its group
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_logprobs: tuple[float, ...]
    reward: float
    temperature: float = 1.0  # the sampling temperature the engine drew the response with (0 = greedy)
    team_reward: float = 0.0
    local_reward: float = 0.0
    adapter: str | None = None
    failed: bool = False  # failed generation: never in group statistics, never in the loss
    # reward.non_finite=drop left it out: its reward (trajectory mode: its episode's return) was NaN or infinite
    nonfinite_reward: bool = False
    truncated: bool = False  # response hit max_tokens
    chosen: bool = False  # this branch was continued (tree mode)
    frozen: bool = False  # played by a frozen past version (the opponent pool): recorded, never grouped or trained
    response_text: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def has_reward(self) -> bool:
        """False for a failed generation or a dropped non-finite reward: never in group statistics or the loss."""
        return not (self.failed or self.nonfinite_reward)


@dataclass
class Transition:
    """What ``Env.step`` returns: a new state, never a mutated one."""

    state: Any
    terminated: bool = False  # the task ended (solved, failed for good, agents agreed)
    truncated: bool = False  # stopped for an external reason (step budget), not because the task ended
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EpisodeRecord:
    """Summary of one episode (one problem's chosen path in tree mode, or one independent episode)."""

    episode: str
    problem_id: str
    turns: int
    terminated: bool
    truncated: bool
    success: bool
    team_reward: float
    agent_rewards: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    transcript: list[dict[str, Any]] = field(default_factory=list)
    nonfinite_rewards: int = 0  # NaN or infinite rewards met and dropped (reward.non_finite=drop)
    outcomes: dict[str, float] = field(default_factory=dict)  # Env.outcome of the final state, per agent (games)
    opponents: dict[str, str] = field(default_factory=dict)  # agent -> the frozen past version that played it
