"""The agent-graph executor: runs many multi-turn episodes concurrently and records GRPO samples.

Tree mode, for problem p with branching factor K (docs/architecture.md, the executor):

    state = env.reset(p, seed)
    for turn t < max_turns:
        for stage in graph.stages(t):                  # agents acting from the same state
            for agent a in stage:                      # one request each, n=K, all sent together
                K candidates ~ policy(a)(observe(state))
                s_k = env.step(state, a, action_k)      # pure: each candidate on its own new state
                r_k = alpha * team_reward(s_k) + local_reward_a(s_k)
                record K samples in group (p, t, a)
                chosen[a] = select(r)
            state = apply the stage's chosen actions in agent order
            stop if terminated

Selection happens only after every agent of the stage is scored on its own candidates, so no agent is ever
scored on copies of another's choice. Independent mode runs K separate episodes with n=1 and groups them by
(p, t, a) too. Trajectory mode (the multi-turn GRPO of verl and other peers, a baseline) runs K separate episodes
and forms one group per (p, a) over all of them: every sample of agent a in episode e is scored with the episode's
return R_a(e) = alpha * team_reward(final state) + sum of a's local rewards in e, and the group's statistics
count each episode once. Validation always uses independent mode.

Opponents from a pool (``run(..., opponents=)``, one mapping per problem): an agent named there plays that episode
with a frozen past version's weights (``Opponent``: its policy and adapter) instead of its own: one sample per
decision (never branched, never valued by playouts), recorded with ``Sample.frozen`` (never in groups or the loss),
and the same past version plays that agent in the episode's playouts. ``EpisodeRecord.opponents`` names them.

An episode keeps its scored nodes and makes its samples when it ends, each once, final: the mode decides their
group key and reward there (``_samples``), since a trajectory sample's return is known only then.

Who acts: the graph's stages, or the env itself (``Env.acting_agents(state)``, games): then a turn is one stage,
the agents the state names (``_stages``).

A game's result (``Env.outcome(final state)``, per agent) reaches every move of the agent (``docs/self_play.md``):
- tree mode: each candidate is valued by ``rollout.playouts`` playouts from its own state to the end, played by
  the current policies with their training sampling (one sample per decision; nothing of a playout is trained):
  its reward is its immediate reward plus its agent's mean outcome over them, and selection reads that value, so a
  move that sets up the opponent's win scores below one that does not;
- independent mode: a candidate's own episode is its playout: its reward gains its agent's outcome there;
- trajectory mode: the outcome joins each agent's return.
An env without ``outcome`` whose terminal state gives an agent a local reward its own last move had left at 0 (a
game wrapper returning the loser's -1 from ``local_reward`` once the winner has moved) would lose it: the run stops
there, naming the agent and the fix (``_check_final_locals``).

Every reward is read in one place, ``_rewards`` (a candidate's team and local reward, and an episode's final team
reward): a NaN or infinite value stops the run there, naming the env, agent, turn, problem and output
(``reward.non_finite=error``), or is dropped (``drop``): the candidate is never selected, and its sample is marked
``nonfinite_reward``, which keeps it out of its group's statistics and the loss like a failed generation.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pettingllms.core.env import Agent, Env, Problem, decides_who_acts, has_outcome
from pettingllms.core.choices import NonFiniteReward, RolloutMode, Selection
from pettingllms.core.errors import ConfigError, EnvError, PromptTooLongError
from pettingllms.core.part_clock import PartClock
from pettingllms.core.types import (
    FINISH_LENGTH,
    Completion,
    EpisodeRecord,
    GenerationRequest,
    Sample,
    SamplingParams,
    Transition,
)
from pettingllms.rollout.batcher import GENERATE, RequestBatcher
from pettingllms.rollout.policy_client import PolicyClient

MODES = RolloutMode.values()
WHOLE_EPISODE = -1  # the turn of a trajectory-mode group key: (problem slot, WHOLE_EPISODE, agent)
SELECTIONS = Selection.values()
NON_FINITE = NonFiniteReward.values()
ENV = "env"  # the clock's part for env calls: reset, step, rewards, success
OUTPUT_EXCERPT = 200  # characters of a model output quoted in a non-finite reward's message
MAX_ABS_REWARD = 1e15  # a larger finite reward is refused like a non-finite one (reward.non_finite)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentSpec:
    """One agent as the executor sees it: its behaviour, its policy and its sampling settings."""

    agent: Agent
    policy: str
    train_sampling: SamplingParams
    val_sampling: SamplingParams
    adapter: str | None = None  # L2: the agent's LoRA adapter on its policy
    trainable: bool = True

    @property
    def name(self) -> str:
        return self.agent.name


@dataclass(frozen=True)
class Opponent:
    """A frozen past version that plays one agent in one episode, in place of the agent's live weights (the
    opponent pool, ``assembly/opponent_pool.py``)."""

    name: str  # in records and metrics, e.g. "pool1@step20"
    policy: str
    adapter: str | None


@dataclass(frozen=True, kw_only=True)
class ExecutorConfig:
    """The rollout's settings, each a config key's value (no defaults here: the schema holds them, and the plan,
    ``assembly/plan.py::executor_config``, fills every field from the run's config)."""

    mode: str  # rollout.mode
    branching: int  # K, rollout.branching
    select: str  # rollout.select
    alpha: float  # reward.alpha: weight of the team reward in every agent's reward
    max_prompt_length: int  # training.max_prompt_length
    max_response_length: int  # training.max_response_length
    non_finite: str  # reward.non_finite: error (stop the run) | drop (out of groups and selection)
    playouts: int  # rollout.playouts: playouts valuing each tree candidate, for envs with an outcome
    streaming: bool  # rollout.streaming: feed each engine without waiting for every episode (batcher.py)
    streaming_wait_s: float  # rollout.streaming_wait_s: how long a free engine waits for more requests

    @property
    def advantage_unit(self) -> str:
        """What counts once in a group's mean and std (algo's ``AdvantageConfig.unit``): a sample, or in trajectory
        mode an episode, whose samples of one agent all carry the same return."""
        return "episode" if self.mode == "trajectory" else "sample"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"rollout.mode must be one of {MODES}, got {self.mode!r}")
        if self.select not in SELECTIONS:
            raise ConfigError(f"rollout.select must be one of {SELECTIONS}, got {self.select!r}")
        if self.branching < 1:
            raise ConfigError(f"rollout.branching (K) must be >= 1, got {self.branching}")
        if self.playouts < 0:
            raise ConfigError(f"rollout.playouts must be >= 0, got {self.playouts}")
        if self.streaming_wait_s < 0:
            raise ConfigError(f"rollout.streaming_wait_s must be >= 0, got {self.streaming_wait_s}")
        if self.non_finite not in NON_FINITE:
            raise ConfigError(f"reward.non_finite must be one of {NON_FINITE}, got {self.non_finite!r}")


@dataclass
class RolloutResult:
    samples: list[Sample]
    episodes: list[EpisodeRecord]
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class _Candidate:
    completion: Completion
    action: Any = None
    transition: Transition | None = None  # None: failed generation, never stepped
    team: float = 0.0
    local: float = 0.0
    outcome: float = 0.0  # tree mode: its agent's mean outcome over the playouts from its state (games)
    nonfinite: bool = False  # its reward was NaN or infinite and reward.non_finite=drop: never selected

    @property
    def reward(self) -> float:
        return self.team + self.local + self.outcome  # team already carries alpha

    @property
    def failed(self) -> bool:
        return self.transition is None

    @property
    def selectable(self) -> bool:
        return not (self.failed or self.nonfinite)


@dataclass
class _Node:
    """The K candidates of one agent at one (turn, stage)."""

    agent: str
    turn: int
    prompt_ids: tuple[int, ...]
    messages: list
    candidates: list[_Candidate]
    temperature: float = 1.0  # what the candidates were sampled with
    chosen: int | None = None
    next_position: tuple[int, int] = (0, 0)  # (turn, stage index) where play goes on after this node
    opponent: Opponent | None = None  # a frozen past version played this agent here: its samples are frozen


@dataclass
class _EpisodeOutput:
    samples: list[Sample]
    record: EpisodeRecord


class Executor:
    """Runs episodes of one env against a set of policies. Reusable across steps; holds no episode state."""

    def __init__(
        self,
        env: Env,
        agents: Mapping[str, AgentSpec],
        clients: Mapping[str, PolicyClient],
        config: ExecutorConfig,
    ) -> None:
        missing = [a for a in env.graph.agents if a not in agents]
        if missing:
            raise ConfigError(f"env {type(env).__name__} needs agents {missing}; configured: {sorted(agents)}")
        unknown_policies = sorted({s.policy for s in agents.values()} - set(clients))
        if unknown_policies:
            raise ConfigError(f"agents refer to policies {unknown_policies}, which are not set up: {sorted(clients)}")
        self.env = env
        self.agents = dict(agents)
        self.clients = dict(clients)
        self.config = config
        self._clock = PartClock()  # this rollout's generation and env time
        self._dropped: list[str] = []  # this rollout's dropped non-finite rewards, described

    # ----------------------------------------------------------------------------------------------- API
    def run(self, problems: Sequence[Problem], seeds: Sequence[int], validation: bool = False, n: int | None = None,
            opponents: Sequence[Mapping[str, Opponent]] | None = None):
        """Synchronous wrapper around ``arun``."""
        return asyncio.run(self.arun(problems, seeds, validation=validation, n=n, opponents=opponents))

    async def arun(
        self, problems: Sequence[Problem], seeds: Sequence[int], validation: bool = False, n: int | None = None,
        opponents: Sequence[Mapping[str, Opponent]] | None = None,
    ) -> RolloutResult:
        """Roll out every problem. Training uses ``config.mode``; validation always runs independent episodes.

        ``n`` overrides the number of branches (tree) or episodes per problem (independent). ``opponents``: per
        problem, the agents a frozen past version plays (every episode of that problem).
        """
        if len(problems) != len(seeds):
            raise ValueError(f"{len(problems)} problems but {len(seeds)} seeds")
        opponents = list(opponents) if opponents is not None else [{} for _ in problems]
        if len(opponents) != len(problems):
            raise ValueError(f"{len(problems)} problems but {len(opponents)} opponent mappings")
        for seating in opponents:
            unknown = sorted(set(seating) - set(self.agents))
            if unknown or any(o.policy not in self.clients for o in seating.values()):
                raise ConfigError(f"opponents name agents {unknown} or policies that are not set up "
                                  f"({sorted({o.policy for o in seating.values()})}; set up: {sorted(self.clients)})")
        k = n or self.config.branching
        mode = "independent" if validation else self.config.mode
        self._clock = PartClock()
        batcher = RequestBatcher(self.clients, self._clock, streaming=self.config.streaming,
                                 wait_s=self.config.streaming_wait_s)
        self._dropped = []
        start = time.perf_counter()
        by_return = mode == "trajectory"
        if mode == "tree":
            coros = [self._episode(batcher, slot, p, s, f"p{slot}", k, validation, by_return, opponents[slot])
                     for slot, (p, s) in enumerate(zip(problems, seeds))]
        else:
            coros = [self._episode(batcher, slot, p, s, f"p{slot}e{e}", 1, validation, by_return, opponents[slot])
                     for slot, (p, s) in enumerate(zip(problems, seeds)) for e in range(k)]
        outputs = await batcher.run(coros)
        if self._dropped:
            log.warning("dropped %d non-finite reward(s) (reward.non_finite=drop); the first: %s", len(self._dropped),
                        self._dropped[0])
        # The barrier calls the engines only while every live episode waits for them, so no env call runs meanwhile;
        # streaming steps envs while the engines generate. env_s is the env time with no engine call in flight, so
        # generate_s + env_s never exceed the rollout's wall time (both modes) and the step's parts add up.
        rollout_s = time.perf_counter() - start
        busy = [seconds for engines in batcher.busy_seconds().values() for seconds in engines]
        timings = {
            "rollout_s": rollout_s,
            "generate_s": self._clock.seconds(GENERATE),
            "env_s": self._clock.alone_seconds(ENV),
            "generate_calls": float(batcher.stats.calls),
            "generated_sequences": float(batcher.stats.sequences),
            # the share of the rollout during which an engine had nothing to do, averaged over every policy's engines
            "engine_idle_fraction": (1.0 - sum(busy) / (len(busy) * rollout_s)) if busy and rollout_s > 0 else 0.0,
        }
        return RolloutResult(
            samples=[s for o in outputs for s in o.samples],
            episodes=[o.record for o in outputs],
            timings=timings,
        )

    # ----------------------------------------------------------------------------------------------- episode
    async def _episode(
        self, batcher: RequestBatcher, slot: int, problem: Problem, seed: int, episode: str, k: int, validation: bool,
        by_return: bool, opponents: Mapping[str, Opponent],
    ) -> _EpisodeOutput:
        """One episode from ``env.reset``; its samples are made at its end (``by_return``: trajectory mode);
        ``opponents``: the agents frozen past versions play in it."""
        state = self._reset(problem, seed)
        scored: list[_Node] = []  # every node of the episode, in order, selection done
        transcript: list[dict[str, Any]] = []
        # A game whose fixed opponent (or chance) ends it inside reset: over before anyone here acts, with its result
        over_at_reset = terminated = self._over_at_reset(state)
        truncated = False
        error = None
        turn = 0
        dropped = 0  # non-finite rewards met and dropped in this episode
        for turn in range(0 if over_at_reset else self.env.max_turns):
            stages = self._stages(state, turn, problem)
            for index, stage in enumerate(stages):
                try:
                    nodes = await self._expand(batcher, state, turn, stage, episode, problem, k, validation,
                                               next_position=_after(turn, index, len(stages)), opponents=opponents)
                except PromptTooLongError as exc:
                    if turn == 0:
                        raise  # the task itself does not fit: a data or config problem
                    error, truncated = str(exc), True  # the history grew too long: end this episode only
                    break
                for node in nodes:
                    node.chosen = self._select(node, seed, turn)
                    scored.append(node)
                    transcript.append(_transcript_entry(node))
                    dropped += sum(c.nonfinite for c in node.candidates)
                stuck = [node.agent for node in nodes if node.chosen is None]
                if stuck:
                    error = f"every candidate of agent {stuck[0]!r} failed to generate or had a non-finite reward"
                    truncated = True
                    break
                state, terminated, truncated = self._apply(state, nodes, problem, turn)
                if terminated or truncated:
                    break
            if terminated or truncated:
                break
        turns = 0 if over_at_reset else turn + 1
        if not (terminated or truncated):
            truncated = True  # ran out of turns
        team_reward, _, final_dropped = self._rewards(state, None, problem, turn, f"at the end of episode {episode}")
        if final_dropped:
            dropped += 1
            error = "; ".join(filter(None, [error, "the final team reward was non-finite (dropped, reads 0)"]))
        outcomes = self._outcome(state, problem, f"the end of episode {episode}")
        if outcomes is None and terminated:
            self._check_final_locals(state, scored, problem, episode)
        record = EpisodeRecord(
            episode=episode,
            problem_id=problem.problem_id,
            turns=turns,
            terminated=terminated,
            truncated=truncated,
            success=self._success(state),
            team_reward=team_reward,
            agent_rewards=_agent_totals(transcript, outcomes or {}),
            error=error,
            transcript=transcript,
            nonfinite_rewards=dropped,
            outcomes=dict(outcomes or {}),
            opponents={agent: o.name for agent, o in opponents.items()},
        )
        returns = (_episode_returns(scored, self.config.alpha * team_reward, final_dropped, outcomes or {})
                   if by_return else None)
        # independent episodes: each candidate's own episode is its playout (tree candidates carry theirs already)
        independent = not by_return and (validation or self.config.mode != "tree")
        bonus = outcomes if independent else None
        samples = [s for node in scored for s in self._samples(node, slot, episode, problem, returns, bonus)]
        return _EpisodeOutput(samples, record)

    # ----------------------------------------------------------------------------------------------- games
    def _over_at_reset(self, state: Any) -> bool:
        """An env that decides who acts names no one on its reset state: the game ended inside ``reset`` (a fixed or
        served opponent's moves, or chance, finished it before the trained seat's turn). On any later state an empty
        answer is an error (``_stages``): a step ends an episode with ``terminated=True``."""
        if not decides_who_acts(self.env):
            return False
        with self._clock.part(ENV):
            named = self.env.acting_agents(state)
        return named is not None and not isinstance(named, str) and len(tuple(named)) == 0

    def _stages(self, state: Any, turn: int, problem: Problem) -> list[tuple[str, ...]]:
        """The stages of ``turn`` from ``state``: the env's acting agents as one stage, or the graph's stages."""
        if not decides_who_acts(self.env):
            return [tuple(stage) for stage in self.env.graph.stages(turn)]
        with self._clock.part(ENV):
            named = self.env.acting_agents(state)
        where = f"{type(self.env).__name__}.acting_agents on problem {problem.problem_id!r}, turn {turn}"
        if named is None:
            raise EnvError(f"{where} returned None: an env that names its acting agents names them on every state "
                           f"an episode reaches (end the episode with terminated=True instead)")
        names = tuple(named) if not isinstance(named, str) else (named,)
        unknown = [a for a in names if a not in self.agents]
        if not names or unknown or len(set(names)) != len(names):
            problem_text = (f"names {unknown}, which do not act in this run (acting: {sorted(self.agents)}; "
                            f"env.agents may leave them out)" if unknown else
                            f"returned {list(names)}: name each acting agent once, at least one")
            raise EnvError(f"{where} {problem_text}")
        return [names]

    async def _value_by_playouts(self, batcher: RequestBatcher, node: _Node, episode: str, problem: Problem,
                                 opponents: Mapping[str, Opponent]) -> None:
        """Tree mode, env with an outcome: each selectable candidate's ``outcome`` is its agent's mean outcome over
        ``playouts`` episodes continued from its state to the end (``opponents`` playing their agents there too); a
        candidate that ended the episode takes that episode's outcome (with ``playouts=0`` it is the only one that
        sees any)."""
        context = f"a playout after agent {node.agent!r}'s turn {node.turn}"

        def agents_outcome(final: Any) -> float:
            return (self._outcome(final, problem, context) or {}).get(node.agent, 0.0)

        playouts, owners = [], []
        for index, c in enumerate(node.candidates):
            if not c.selectable:
                continue
            if c.transition.terminated or c.transition.truncated:
                c.outcome = agents_outcome(c.transition.state)
                continue
            for j in range(self.config.playouts):
                tag = f"{episode}/t{node.turn:03d}/{node.agent}/k{index}/playout{j}"
                playouts.append(self._playout(batcher, c.transition.state, node.next_position, tag, problem,
                                              opponents))
                owners.append(c)
        finals = await batcher.gather(playouts)  # each playout a participant: batches wait for all of them
        for c in node.candidates:
            mine = [agents_outcome(final) for owner, final in zip(owners, finals) if owner is c]
            if mine:
                c.outcome = sum(mine) / len(mine)

    async def _playout(self, batcher: RequestBatcher, state: Any, position: tuple[int, int], tag: str,
                       problem: Problem, opponents: Mapping[str, Opponent]) -> Any:
        """The final state of one episode played on from ``state`` at ``position`` (turn, stage) by the current
        policies, one sample per decision with each agent's training sampling; ends early where the real episode
        would (a prompt grown too long, every candidate failed)."""
        turn, start = position
        while turn < self.env.max_turns:
            stages = self._stages(state, turn, problem)
            for stage in stages[start:]:
                try:
                    nodes = await self._expand(batcher, state, turn, stage, tag, problem, 1, False, playout=True,
                                               opponents=opponents)
                except PromptTooLongError:
                    return state
                for node in nodes:
                    node.chosen = self._select(node, 0, turn)
                if any(node.chosen is None for node in nodes):
                    return state
                state, terminated, truncated = self._apply(state, nodes, problem, turn)
                if terminated or truncated:
                    return state
            turn, start = turn + 1, 0
        return state

    def _outcome(self, state: Any, problem: Problem, context: str) -> dict[str, float] | None:
        """``env.outcome(state)`` checked: a mapping of known agents to finite numbers (non-finite values follow
        reward.non_finite: an error, or 0 and counted), or None for envs without one."""
        if not has_outcome(self.env):
            return None
        where = f"{type(self.env).__name__}.outcome on problem {problem.problem_id!r}, {context}"
        with self._clock.part(ENV):
            raw = self.env.outcome(state)
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise EnvError(f"{where} returned {type(raw).__name__}; return {{agent: result}} or None")
        graph, named = self.env.graph, set(map(str, raw))
        unknown = sorted(named - set(graph.agents) - set(graph.left_out))
        if unknown:
            raise EnvError(f"{where} names {unknown}, not agents of the env ({list(graph.agents + graph.left_out)})")
        # Every acting agent's result, or its moves would silently be valued 0 (a seat that lost scored as a draw).
        missing = [agent for agent in graph.agents if agent not in named]
        if missing:
            raise EnvError(f"{where} leaves out {missing}: an outcome names every acting agent's result "
                           f"({list(graph.agents)}); return None where the env has no result")
        out = {}
        for agent, value in raw.items():
            if str(agent) in graph.left_out:  # env.agents left it out: it does not act here, nothing reads its result
                continue
            value = _number(value, f"outcome[{agent!r}]", where)
            if not usable_reward(value):
                if self.config.non_finite == "error":
                    raise EnvError(f"non-finite or overflowing outcome[{agent!r}]={value!r} ({where}); outcomes must "
                                   f"be finite numbers within ±{MAX_ABS_REWARD:g}")
                self._dropped.append(f"outcome[{agent!r}]={value!r} ({where})")
                value = 0.0
            out[str(agent)] = value
        return out

    def _check_final_locals(self, state: Any, scored: Sequence[_Node], problem: Problem, episode: str) -> None:
        """Refuse an env without ``outcome`` whose terminal state gives an agent a local reward where its own last
        move left it none: the run reads an agent's local reward on the states its own moves produce, so that result
        (a game's loss returned from ``local_reward`` once the winner has moved) would be lost. A local reward that
        merely changes after the agent's move (a tester's caught bug, fixed by the coder) is the env's design: the
        agent was credited on its own state."""
        last: dict[str, _Candidate] = {}
        for node in scored:
            if node.chosen is not None:
                last[node.agent] = node.candidates[node.chosen]
        final_mover = scored[-1].agent if scored else None
        for agent, chosen in last.items():
            if agent == final_mover or chosen.nonfinite or chosen.transition is None:
                continue
            with self._clock.part(ENV):
                now = self.agents[agent].agent.local_reward(state)
            try:
                changed = chosen.local == 0 and math.isfinite(float(now)) and float(now) != 0
            except (TypeError, ValueError):
                changed = False
            if changed:
                env = type(self.env).__name__
                raise EnvError(
                    f"{env}: agent {agent!r}'s local_reward is {float(now)!r} on the final state of episode "
                    f"{episode} (problem {problem.problem_id!r}) but was {chosen.local!r} on the state its own last "
                    f"move produced; agent {final_mover!r} moved last. The run reads an agent's local reward only on "
                    f"the states its own moves produce, so this change would be lost. Return every agent's final "
                    f"result from {env}.outcome(state) instead (docs/self_play.md)")

    async def _expand(
        self,
        batcher: RequestBatcher,
        state: Any,
        turn: int,
        stage: Sequence[str],
        episode: str,
        problem: Problem,
        k: int,
        validation: bool,
        next_position: tuple[int, int] = (0, 0),
        playout: bool = False,
        opponents: Mapping[str, Opponent] | None = None,
    ) -> list[_Node]:
        """Sample k candidates for every agent of the stage from ``state`` (one for an agent an opponent plays), then
        step and score each one; in tree mode (not a playout) with an env that has an outcome, value each candidate
        of a live agent by playouts from its state."""
        opponents = opponents or {}
        requests, nodes = [], []
        for name in stage:
            spec = self.agents[name]
            opponent = opponents.get(name)
            policy, adapter = (opponent.policy, opponent.adapter) if opponent else (spec.policy, spec.adapter)
            messages = spec.agent.observe(state, turn)
            prompt_ids = tuple(self.clients[policy].codec.encode_chat(messages))
            self._check_prompt(prompt_ids, name, turn, problem)
            sampling = spec.val_sampling if validation else spec.train_sampling
            sampling = _cap_tokens(sampling, self.config.max_response_length)
            request = GenerationRequest(f"{episode}/t{turn:03d}/{name}", prompt_ids, 1 if opponent else k, sampling,
                                        adapter, prefix_group=episode)
            requests.append((policy, request))
            nodes.append(_Node(name, turn, prompt_ids, messages, [], temperature=sampling.temperature,
                               next_position=next_position, opponent=opponent))
        results = await batcher.generate_many(requests)
        for node, result in zip(nodes, results):
            node.candidates = await self._score(state, node.agent, result.completions, problem, turn)
        if has_outcome(self.env) and not playout and not validation and self.config.mode == "tree":
            await batcher.gather(self._value_by_playouts(batcher, node, episode, problem, opponents)
                                 for node in nodes if node.opponent is None)
        return nodes

    async def _score(
        self, state: Any, agent_name: str, completions: Sequence[Completion], problem: Problem, turn: int
    ) -> list[_Candidate]:
        agent = self.agents[agent_name].agent
        candidates = [_Candidate(c) for c in completions]
        live = [c for c in candidates if not c.completion.failed]
        for c in live:
            c.action = agent.parse(c.completion.text)
        transitions = await asyncio.gather(
            *(asyncio.to_thread(self._step, state, agent_name, c.action, problem, turn) for c in live)
        )
        for c, transition in zip(live, transitions):
            c.transition = transition
            team, c.local, c.nonfinite = self._rewards(transition.state, agent_name, problem, turn,
                                                       f"after output {_excerpt(c.completion.text)}")
            c.team = self.config.alpha * team
        return candidates

    def _rewards(self, state: Any, agent_name: str | None, problem: Problem, turn: int,
                 context: str) -> tuple[float, float, bool]:
        """(team reward, the agent's local reward, dropped) of ``state``: the one place the env's rewards are read.

        ``agent_name`` None reads the team reward only (an episode's final state). A NaN or infinite value raises
        (reward.non_finite=error) or gives (0, 0, True) (drop); ``context`` says what produced ``state``, for the
        message."""
        where = (f"{type(self.env).__name__} on problem {problem.problem_id!r}, turn {turn}"
                 + (f", agent {agent_name!r}" if agent_name is not None else "") + f", {context}")
        with self._clock.part(ENV):
            values = {"team_reward": _number(self.env.team_reward(state), "team_reward", where)}
            if agent_name is not None:
                label = f"{agent_name}.local_reward"
                values[label] = _number(self.agents[agent_name].agent.local_reward(state), label, where)
        team, local = values["team_reward"], values.get(f"{agent_name}.local_reward", 0.0)
        # What enters a sample is alpha * team + local: 0 * inf is as unusable as inf itself, and a finite reward so
        # large that a group's variance overflows (1e308) stops the update as surely as a NaN.
        alpha = self.config.alpha
        if usable_reward(alpha * team) and usable_reward(local) and usable_reward(alpha * team + local):
            return team, local, False
        shown = ", ".join(f"{label}={v!r}" for label, v in values.items())
        if self.config.non_finite == "error":
            raise EnvError(
                f"non-finite or overflowing reward {shown} ({where}). Rewards must be finite numbers within "
                f"±{MAX_ABS_REWARD:g}: return 0 or a penalty for unparseable output, or set reward.non_finite=drop to "
                f"leave such samples out of training")
        self._dropped.append(f"{shown} ({where})")
        return 0.0, 0.0, True

    def _select(self, node: _Node, seed: int, turn: int) -> int | None:
        """Index of the branch to continue from; None when every candidate failed."""
        options = [i for i, c in enumerate(node.candidates) if c.selectable]
        if not options:
            return None
        if self.config.select == "first":
            return options[0]
        rewards = [node.candidates[i].reward for i in options]
        if self.config.select == "greedy":
            best = max(rewards)
            return options[rewards.index(best)]  # ties: lowest index, deterministic
        rng = random.Random(f"{seed}/{turn}/{node.agent}")
        top = max(rewards)
        weights = [math.exp(r - top) for r in rewards]
        return rng.choices(options, weights=weights, k=1)[0]

    def _apply(self, state: Any, nodes: Sequence[_Node], problem: Problem, turn: int) -> tuple[Any, bool, bool]:
        """The state after the stage: the first agent's chosen transition, then the others' chosen actions."""
        first = nodes[0].candidates[nodes[0].chosen].transition
        state, terminated, truncated = first.state, first.terminated, first.truncated
        for node in nodes[1:]:
            if terminated or truncated:
                break
            chosen = node.candidates[node.chosen]
            step = self._step(state, node.agent, chosen.action, problem, turn)
            state, terminated, truncated = step.state, step.terminated, step.truncated
        return state, terminated, truncated

    def _samples(self, node: _Node, slot: int, episode: str, problem: Problem,
                 returns: Mapping[str, float | None] | None, outcomes: Mapping[str, float] | None = None
                 ) -> list[Sample]:
        """The node's samples, final. ``returns`` None (tree, independent): group (slot, turn, agent), each candidate
        scored with its own reward (independent mode: plus its agent's entry of ``outcomes``, the episode's result).
        Trajectory mode (``returns``: each agent's episode return, None where undefined): group
        (slot, WHOLE_EPISODE, agent), scored with the agent's return, or dropped with it."""
        bonus = (outcomes or {}).get(node.agent, 0.0)
        spec = node.opponent or self.agents[node.agent]  # a frozen past version's policy and adapter, or the agent's
        if returns is None:
            group, episode_return = (slot, node.turn, node.agent), None
        else:
            group, episode_return = (slot, WHOLE_EPISODE, node.agent), returns.get(node.agent)
        out = []
        for k, c in enumerate(node.candidates):
            if returns is None or c.failed:
                reward, nonfinite = (c.reward + bonus if c.selectable else 0.0), c.nonfinite
            else:  # a candidate with a non-finite reward leaves its agent's return undefined (_episode_returns)
                reward, nonfinite = (0.0, True) if episode_return is None else (episode_return, False)
            out.append(
                Sample(
                    policy=spec.policy,
                    agent=node.agent,
                    turn=node.turn,
                    group=group,
                    episode=episode,
                    problem_id=problem.problem_id,
                    branch=k,
                    prompt_ids=node.prompt_ids,
                    response_ids=c.completion.token_ids,
                    response_logprobs=c.completion.logprobs,
                    reward=reward,
                    temperature=node.temperature,
                    team_reward=c.team,
                    local_reward=c.local,
                    adapter=spec.adapter,
                    failed=c.failed,
                    nonfinite_reward=nonfinite,
                    truncated=c.completion.finish_reason == FINISH_LENGTH,
                    chosen=k == node.chosen,
                    frozen=node.opponent is not None,
                    response_text=c.completion.text,
                    info=dict(c.transition.info) if c.transition is not None else {},
                )
            )
        return out

    # ----------------------------------------------------------------------------------------------- env calls
    # Every env call is timed as the ENV part (timing/env_s), the sandbox of model-written code included.
    def _reset(self, problem: Problem, seed: int) -> Any:
        try:
            with self._clock.part(ENV):
                return self.env.reset(problem, seed)
        except Exception as exc:
            raise EnvError(f"{type(self.env).__name__}.reset failed on problem {problem.problem_id!r}: {exc!r}") from exc

    def _step(self, state: Any, agent: str, action: Any, problem: Problem, turn: int) -> Transition:
        try:
            with self._clock.part(ENV):
                transition = self.env.step(state, agent, action)
        except Exception as exc:
            raise EnvError(
                f"{type(self.env).__name__}.step crashed on problem {problem.problem_id!r}, turn {turn}, "
                f"agent {agent!r}, action {action!r:.200}: {exc!r}"
            ) from exc
        if not isinstance(transition, Transition):
            raise EnvError(f"{type(self.env).__name__}.step must return a Transition, got {type(transition)}")
        return transition

    def _success(self, state: Any) -> bool:
        with self._clock.part(ENV):
            return bool(self.env.success(state))

    def _check_prompt(self, prompt_ids: Sequence[int], agent: str, turn: int, problem: Problem) -> None:
        if len(prompt_ids) > self.config.max_prompt_length:
            raise PromptTooLongError(
                f"prompt of agent {agent!r} at turn {turn} on problem {problem.problem_id!r} has "
                f"{len(prompt_ids)} tokens > training.max_prompt_length={self.config.max_prompt_length}. "
                f"Raise training.max_prompt_length or shorten the env's observation."
            )


def _cap_tokens(sampling: SamplingParams, max_response_length: int) -> SamplingParams:
    if sampling.max_tokens <= max_response_length:
        return sampling
    return SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, max_response_length)


def usable_reward(value: float) -> bool:
    """Finite, and small enough that a group's mean and variance cannot overflow (float64 squares pass 1e308 from
    1.3e154 on); ``MAX_ABS_REWARD`` leaves every reward an env means far inside."""
    return math.isfinite(value) and abs(value) <= MAX_ABS_REWARD


def _number(value: Any, label: str, where: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise EnvError(f"{label} returned {value!r:.80} ({where}); rewards must be numbers") from None


def _excerpt(text: str) -> str:
    """A model output as a message quotes it: its start, repr-escaped, and its length when cut."""
    if len(text) <= OUTPUT_EXCERPT:
        return repr(text)
    return f"{text[:OUTPUT_EXCERPT]!r}... ({len(text)} chars)"


def _after(turn: int, index: int, stage_count: int) -> tuple[int, int]:
    """(turn, stage index) where play goes on after stage ``index`` of ``turn``'s ``stage_count``: the next stage, or
    the next turn's first (always, for an env that names its acting agents: each of its turns is one stage)."""
    if index + 1 >= stage_count:
        return turn + 1, 0
    return turn, index + 1


def _episode_returns(nodes: Sequence[_Node], team: float, team_dropped: bool,
                     outcomes: Mapping[str, float]) -> dict[str, float | None]:
    """Each agent's return over an episode's nodes: ``team`` (alpha * the final state's team reward) + the sum of its
    local rewards + its ``outcomes`` entry (a game's result). None (undefined) for an agent one of whose rewards, or
    for everyone when the final team reward, was non-finite and dropped: all its samples of the episode are dropped
    with it. Failed generations add nothing."""
    local: dict[str, float] = {}
    undefined: set[str] = set()
    for node in nodes:
        for c in node.candidates:
            if c.nonfinite or team_dropped:
                undefined.add(node.agent)
            if not c.failed:
                local[node.agent] = local.get(node.agent, 0.0) + c.local
    return {agent: None if agent in undefined else team + total + outcomes.get(agent, 0.0)
            for agent, total in local.items()}


def _transcript_entry(node: _Node) -> dict[str, Any]:
    chosen = node.candidates[node.chosen] if node.chosen is not None else None
    return {
        "turn": node.turn,
        "agent": node.agent,
        "prompt": node.messages,
        "response": chosen.completion.text if chosen else None,
        "reward": chosen.reward if chosen else None,
        "team_reward": chosen.team if chosen else None,
        "local_reward": chosen.local if chosen else None,
        "branch_rewards": [c.reward if c.selectable else None for c in node.candidates],
        "info": dict(chosen.transition.info) if chosen and chosen.transition is not None else {},
    }


def _agent_totals(transcript: Sequence[dict[str, Any]], outcomes: Mapping[str, float]) -> dict[str, float]:
    """Each acting agent's return along the episode: its chosen responses' immediate rewards (team + local), plus its
    ``outcomes`` entry once. Not the transcript's ``reward``: in tree mode that also carries the playouts' outcome
    estimate, which would count a game's result once a move."""
    totals: dict[str, float] = {}
    for entry in transcript:
        if entry["reward"] is not None:
            agent = entry["agent"]
            if agent not in totals:
                totals[agent] = outcomes.get(agent, 0.0)
            totals[agent] += entry["team_reward"] + entry["local_reward"]
    return totals
