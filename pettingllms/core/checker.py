"""Conformance checker for environments (``pettingllms check-env NAME``), in the spirit of Gymnasium's.

It checks what tree sampling relies on: the reset/step signatures, generated test tasks disjoint from the training
ones, determinism under a seed, a pure ``step`` whose branches share no mutable object (also when stepped from many
threads at once, as the executor does: a library that draws from a global random generator fails here), termination
within ``max_turns``, rewards that are finite numbers, and agent parsers and observers that survive arbitrary text.
Rewards are checked where a fresh model takes them: from the states an episode reaches, every agent's parse, step
and rewards on adversarial outputs.
For envs that name their acting agents (games), only the agents the state names act, and the names must be the
env's agents; at the end of an episode every agent's result must arrive: ``outcome`` a mapping of the env's agents
to finite numbers, or, for an env without one, no agent that had no local reward after its own last move gets one
on the terminal state another agent's move produced (the run would lose it).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import numbers
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from pettingllms.core.env import (PROCEDURAL_TEST_SIZE, PROCEDURAL_TRAIN_SIZE, Agent, Env, Problem, decides_who_acts,
                                   has_outcome)
from pettingllms.core.errors import DataError
from pettingllms.core.registry import make_agents
from pettingllms.core.types import Transition

GARBAGE_RESPONSES: tuple[str, ...] = (
    "",
    " ",
    "\n\n\n",
    "hello",
    "42",
    "\\boxed{}",
    "\\boxed{42}",
    "\\boxed{\\frac{1}{2}",
    "```python\nprint(1)\n```",
    "```python\nprint(1)\n```\n```python\nprint(2)\n```",
    "```\nunclosed fence",
    "**Code:**\n```python\nimport os\nos._exit(3)\n```",
    "[[1,2],[3,4]]",
    "[(0,0,1)]",
    "#### U D L R",
    "#### [\"U\", \"X\", 1, None]",
    "**Actions List**: ['Up', 'Left']",
    "**Test Input:**\n```\n1\n```\n**Test Output:**\n```\n2\n```",
    "null\x00byte",
    "ünïcödé ✓ 数学 🚀 \u202e reversed",
    "a" * 20000,
    "{" * 500 + "}" * 10,
    "-1e308 nan inf",
)

# What a fresh or broken model sends, tried by every agent from every state an episode reaches: nothing, noise, an
# answer cut off, a flood, bytes that were not UTF-8 (lone surrogates, as ``surrogateescape`` decodes them), and the
# built-in formats' tags around a wrong value (NaN, overflow, impossible moves and cells).
ADVERSARIAL_RESPONSES: tuple[str, ...] = (
    "",
    "hello",
    "The answer is \\boxed{\\frac{1}{2}",
    "a" * 20000,
    b"caf\xc3 \xff\xfe\x80 \\boxed{7}".decode("utf-8", "surrogateescape"),
    "\\boxed{nan}",
    "\\boxed{-1e999} #### inf",
    # one program for every tool and coder agent (programs run in the sandbox: each costs a process), and tests
    "```python\nprint(float('nan'))\n```\n**Test Input:**\n```\nnan\n```\n**Test Output:**\n```\ninf\n```",
    "#### [\"U\", \"X\", 1e999, None]",
    "#### [[0, 0, 99], [-1, 1000000000, 0]]",
    "CODE: 99999999999999999999",
)
DRIVEN_TURNS = 2  # turns of the episode whose states the adversarial outputs are tried from


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class CheckReport:
    env: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def format(self) -> str:
        lines = [f"check-env {self.env}: {'PASS' if self.ok else 'FAIL'}"]
        for r in self.results:
            lines.append(f"  [{'ok' if r.ok else 'FAIL'}] {r.name}" + (f": {r.detail}" if r.detail else ""))
        return "\n".join(lines)


def random_responses(n: int, seed: int = 0) -> list[str]:
    """Seeded random strings of printable, whitespace, markup and unicode characters."""
    rng = random.Random(seed)
    alphabet = "abcxyz0123456789 \n\t{}[]()`*#:=+-/\\\"',.;<>|~^$%&!?_ÄßΩ数🚀\u200b"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400))) for _ in range(n)]


@dataclass
class CheckContext:
    """What the checks share: the env, its agents and example problems (filled in by the first checks), the seed,
    how many random strings each parser gets, and the first problem's start state."""

    env: Env
    agents: dict[str, Agent] | None = None
    problems: Sequence[Problem] | None = None
    seed: int = 0
    n_random: int = 200
    s0: Any = None


# ---------------------------------------------------------------------------------------------------- the checks
# Each takes the context and returns None when the env passes it, else what is wrong; they run in CHECKS' order, and
# a check may rely on the ones before it (the context's agents, problems and start state).


def check_signatures(ctx: CheckContext) -> str | None:
    for method, params in (("reset", ("problem", "seed")), ("step", ("state", "agent", "action"))):
        try:
            inspect.signature(getattr(ctx.env, method)).bind(*params)
        except TypeError as exc:
            return f"{method}{params} cannot be called positionally: {exc}"
    if not isinstance(ctx.env.max_turns, int) or ctx.env.max_turns < 1:
        return f"max_turns must be a positive int, got {ctx.env.max_turns!r}"
    return None


def check_agents(ctx: CheckContext) -> str | None:
    if ctx.agents is None:
        ctx.agents = make_agents(ctx.env)
    missing = [a for a in ctx.env.graph.agents if a not in ctx.agents]
    return f"no agent for roles {missing}" if missing else None


def check_problems(ctx: CheckContext) -> str | None:
    if ctx.problems is None:
        ctx.problems = list(ctx.env.example_problems(2))
    return None if ctx.problems else "example_problems() returned nothing to check with"


def check_splits_are_disjoint(ctx: CheckContext) -> str | None:
    """An env that generates its tasks: the test split shares no task id with the training tasks a run reads (the
    run refuses that at its start; this says it before). Envs that read data files pass."""
    try:
        test = list(ctx.env.procedural_problems("test", PROCEDURAL_TEST_SIZE))
    except DataError:
        return None  # no generated tasks: its data files are checked when a run starts
    trained = {p.problem_id for p in ctx.env.procedural_problems("train", PROCEDURAL_TRAIN_SIZE)}
    shared = [p.problem_id for p in test if p.problem_id in trained]
    if shared:
        return (f"procedural_problems: {len(shared)} of the first {len(test)} 'test' task ids are among the first "
                f"{PROCEDURAL_TRAIN_SIZE:,} 'train' ones ({', '.join(map(str, shared[:3]))}): validation would score "
                f"tasks the run trains on; make the splits disjoint (e.g. the test split's seeds past the train's)")
    return None


def check_reset_determinism(ctx: CheckContext) -> str | None:
    env, seed = ctx.env, ctx.seed
    for p in ctx.problems:
        a, b = env.reset(p, seed), env.reset(p, seed)
        if not _same(a, b):
            return f"reset({p.problem_id!r}, seed={seed}) gave different states: {_short(a)} vs {_short(b)}"
    ctx.s0 = env.reset(ctx.problems[0], seed)
    return None


def check_parsers_survive_garbage(ctx: CheckContext) -> str | None:
    for role, agent in ctx.agents.items():
        for text in GARBAGE_RESPONSES + tuple(random_responses(ctx.n_random, ctx.seed)):
            try:
                agent.parse(text)
            except Exception as exc:  # the whole point: nothing may escape
                return f"agent {role!r}.parse raised {exc!r} on {text[:60]!r}"
    return None


def check_observe_returns_chat_messages(ctx: CheckContext) -> str | None:
    for role, agent in ctx.agents.items():
        messages = agent.observe(ctx.s0, 0)
        if not isinstance(messages, list) or not messages:
            return f"agent {role!r}.observe returned {type(messages).__name__}, expected a non-empty list"
        for m in messages:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                return f"agent {role!r}.observe returned a malformed message {m!r:.200}"
    return None


def check_acting_agents(ctx: CheckContext) -> str | None:
    """On the initial state, then on every state of episodes played with garbage and random answers (as the run
    asks it, once per turn until the episode ends)."""
    env = ctx.env
    failure = _check_acting(env, ctx.s0, "the initial state")
    if failure or not decides_who_acts(env):
        return failure
    for i, text in enumerate(GARBAGE_RESPONSES[:6] + tuple(random_responses(4, ctx.seed))):
        problem = ctx.problems[i % len(ctx.problems)]
        where = f"problem {problem.problem_id!r}, every agent answering {_short(text)}"
        failure = _play(env, ctx.agents, problem, ctx.seed + i, text,
                        look=lambda state, turn: _check_acting(env, state, f"turn {turn}'s state ({where})")).failure
        if failure:
            return failure
    return None


def check_step_is_pure_and_deterministic(ctx: CheckContext) -> str | None:
    env, s0 = ctx.env, ctx.s0
    for role, agent in ctx.agents.items():
        if role not in _first_stage(env, s0):
            continue  # a game's seats that are not to move are never stepped
        for text in GARBAGE_RESPONSES[:8]:
            action = agent.parse(text)
            before = copy.deepcopy(s0)
            first = env.step(s0, role, action)
            if not isinstance(first, Transition):
                return f"step returned {type(first).__name__}, expected Transition"
            if not _same(s0, before):
                return f"step({role!r}, {text!r}) mutated its input state"
            second = env.step(s0, role, action)
            if not _same(first.state, second.state) or (first.terminated, first.truncated) != (
                second.terminated,
                second.truncated,
            ):
                return f"step({role!r}, {text!r}) is not deterministic"
            if not isinstance(first.terminated, bool) or not isinstance(first.truncated, bool):
                return "terminated and truncated must be bools"
    return None


def check_no_aliasing_between_branches(ctx: CheckContext) -> str | None:
    env, s0 = ctx.env, ctx.s0
    role = _first_stage(env, s0)[0]
    agent = ctx.agents[role]
    a = env.step(s0, role, agent.parse(GARBAGE_RESPONSES[3])).state
    b = env.step(s0, role, agent.parse(GARBAGE_RESPONSES[4])).state
    for label, x, y in (("two branches", a, b), ("a branch and its parent", a, s0)):
        shared = _mutable_ids(x) & _mutable_ids(y)
        if shared:
            return f"{label} share {len(shared)} mutable object(s); return new immutable states from step"
    return None


def check_forks_are_independent_across_threads(ctx: CheckContext) -> str | None:
    env, s0, agents = ctx.env, ctx.s0, ctx.agents
    role = _first_stage(env, s0)[0]
    texts = [GARBAGE_RESPONSES[i % 8] for i in range(16)]
    alone = [env.step(s0, role, agents[role].parse(t)).state for t in texts]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show in a few calls
    try:
        with ThreadPoolExecutor(8) as pool:  # the executor steps branches in threads, concurrently
            together = list(pool.map(lambda t: env.step(s0, role, agents[role].parse(t)).state, texts))
            resets = list(pool.map(lambda _: env.reset(ctx.problems[0], ctx.seed), range(8)))
    finally:
        sys.setswitchinterval(interval)
    for text, a, b in zip(texts, alone, together):
        if not _same(a, b):
            return (f"step({role!r}, {text!r}) from one state gave {_short(b)} in a thread beside others but "
                    f"{_short(a)} alone: steps must not share state (a library's global random generator, a "
                    f"cached game object)")
    if not all(_same(r, s0) for r in resets):
        return "reset gave different states when called from several threads at once"
    return None


def check_rewards_are_finite(ctx: CheckContext) -> str | None:
    env, s0 = ctx.env, ctx.s0
    values = {"team_reward": env.team_reward(s0)}
    values.update({f"{r}.local_reward": ag.local_reward(s0) for r, ag in ctx.agents.items()})
    for label, v in values.items():
        if not _finite_number(v):
            return f"{label} returned {v!r}; rewards must be finite numbers"
    if not isinstance(env.success(s0), bool):
        return f"success() must return a bool, got {type(env.success(s0)).__name__}"
    return None


def check_adversarial_outputs_from_reached_states(ctx: CheckContext) -> str | None:
    return _drive_adversarially(ctx.env, ctx.agents, ctx.problems[0], ctx.seed)


def check_every_agent_answering_garbage_at_once(ctx: CheckContext) -> str | None:
    for i, text in enumerate(ADVERSARIAL_RESPONSES + tuple(random_responses(4, ctx.seed))):
        failure = _garbage_together(ctx.env, ctx.agents, ctx.problems[i % len(ctx.problems)], ctx.seed + i, text)
        if failure:
            return failure
    return None


def check_episode_ends_within_max_turns(ctx: CheckContext) -> str | None:
    env = ctx.env
    for i, text in enumerate(GARBAGE_RESPONSES[:6]):
        steps = _play(env, ctx.agents, ctx.problems[0], ctx.seed + i, text).steps
        budget = env.max_turns * len(env.graph.agents)
        if steps > budget:
            return f"took {steps} steps, more than max_turns x agents = {budget}"
    return None


def check_every_agents_result_arrives(ctx: CheckContext) -> str | None:
    for i, text in enumerate(GARBAGE_RESPONSES[:6] + tuple(random_responses(4, ctx.seed))):
        problem = ctx.problems[i % len(ctx.problems)]
        failure = _check_results(ctx.env, ctx.agents, problem, ctx.seed + i, text)
        if failure:
            return failure
    return None


Check = Callable[[CheckContext], "str | None"]

CHECKS: tuple[tuple[str, Check], ...] = (
    ("signatures", check_signatures),
    ("agents", check_agents),
    ("problems", check_problems),
    ("splits are disjoint", check_splits_are_disjoint),
    ("reset determinism", check_reset_determinism),
    ("parser survives garbage", check_parsers_survive_garbage),
    ("observe returns chat messages", check_observe_returns_chat_messages),
    ("acting agents are the env's", check_acting_agents),
    ("step is pure and deterministic", check_step_is_pure_and_deterministic),
    ("no aliasing between branches", check_no_aliasing_between_branches),
    ("forks are independent across threads", check_forks_are_independent_across_threads),
    ("rewards are finite", check_rewards_are_finite),
    ("adversarial outputs from reached states", check_adversarial_outputs_from_reached_states),
    ("every agent answering garbage at once", check_every_agent_answering_garbage_at_once),
    ("episode ends within max_turns", check_episode_ends_within_max_turns),
    ("every agent's result arrives", check_every_agents_result_arrives),
)
"""Every check, by the name the report prints, in the order they run."""


def check_env(
    env: Env,
    agents: dict[str, Agent] | None = None,
    problems: Sequence[Problem] | None = None,
    seed: int = 0,
    n_random: int = 200,
    name: str | None = None,
) -> CheckReport:
    """Run every check of ``CHECKS`` on ``env`` and return a report; never raises for a failing env. After the
    first failure the rest are reported as skipped (they rely on what the earlier ones established)."""
    report = CheckReport(name or type(env).__name__)
    ctx = CheckContext(env, agents, problems, seed, n_random)
    for check_name, check in CHECKS:
        if not report.ok:
            report.results.append(CheckResult(check_name, False, "skipped: an earlier check failed"))
            continue
        try:
            detail = check(ctx)
        except Exception as exc:
            detail = f"raised {exc!r}"
        report.results.append(CheckResult(check_name, detail is None, detail or ""))
    return report


def _drive_adversarially(env: Env, agents: dict[str, Agent], problem: Problem, seed: int) -> str | None:
    """Play one episode (reset, then up to DRIVEN_TURNS turns): at each (turn, stage) every acting agent's parse,
    step, rewards and success must hold on every adversarial output from the state reached; the episode goes on
    with each agent's best-rewarded output, as greedy tree sampling would. Returns the first failure, or None."""
    state = env.reset(problem, seed)
    for turn in range(min(env.max_turns, DRIVEN_TURNS)):
        for stage in _stages(env, state, turn):
            best: dict[str, tuple[float, Any, Transition]] = {}
            for role in stage:
                agent = agents[role]
                for text in ADVERSARIAL_RESPONSES:
                    where = f"agent {role!r} at turn {turn} of problem {problem.problem_id!r}, output {_short(text)}"
                    try:
                        action = agent.parse(text)
                    except Exception as exc:
                        return f"{role}.parse raised {exc!r} ({where})"
                    try:
                        step = env.step(state, role, action)
                    except Exception as exc:
                        return f"step raised {exc!r} ({where})"
                    if not isinstance(step, Transition):
                        return f"step returned {type(step).__name__}, expected Transition ({where})"
                    team, local = env.team_reward(step.state), agent.local_reward(step.state)
                    for label, value in (("team_reward", team), (f"{role}.local_reward", local)):
                        if not _finite_number(value):
                            return (f"{label} returned {value!r} ({where}); rewards must be finite numbers: return 0 "
                                    f"or a penalty for unparseable output")
                    if not isinstance(env.success(step.state), bool):
                        return f"success() returned {type(env.success(step.state)).__name__}, not a bool ({where})"
                    if role not in best or team + local > best[role][0]:
                        best[role] = (float(team + local), action, step)
            state, done = _apply_stage(env, stage, best)
            if done:
                return None
    return None


def _apply_stage(env: Env, stage: Sequence[str], chosen: dict[str, tuple[float, Any, Transition]]) -> tuple[Any, bool]:
    """The stage's outcome as the executor applies it: the first agent's transition, then the others' actions."""
    step = chosen[stage[0]][2]
    for role in stage[1:]:
        if step.terminated or step.truncated:
            break
        step = env.step(step.state, role, chosen[role][1])
    return step.state, step.terminated or step.truncated


def _stages(env: Env, state: Any, turn: int) -> list[tuple[str, ...]]:
    """The stages of ``turn`` as the executor runs them: the env's acting agents, or the graph's stages."""
    if not decides_who_acts(env):
        return [tuple(stage) for stage in env.graph.stages(turn)]
    named = env.acting_agents(state)
    return [tuple(named)] if named else []


def _first_stage(env: Env, state: Any) -> tuple[str, ...]:
    stages = _stages(env, state, 0)
    return stages[0] if stages else tuple(env.graph.agents[:1])


def _check_acting(env: Env, state: Any, where: str) -> str | None:
    """``acting_agents`` on a state of an episode that goes on: a tuple of the graph's agents, each once, the same
    on a second call (an episode whose game is over ends with terminated=True, never with no one to act)."""
    if not decides_who_acts(env):
        return None
    named = env.acting_agents(state)
    if named is None or isinstance(named, str) or not named:
        return (f"acting_agents({where}) returned {named!r}: name the agents to act as a tuple, e.g. "
                f"({env.graph.agents[0]!r},); end a finished game with terminated=True")
    unknown = [a for a in named if a not in env.graph.agents]
    if unknown:
        return f"acting_agents({where}) names {unknown}, which are not in graph.agents {list(env.graph.agents)}"
    if len(set(named)) != len(tuple(named)):
        return f"acting_agents({where}) returned {list(named)}: name each acting agent once"
    if tuple(env.acting_agents(state)) != tuple(named):
        return f"acting_agents gave different agents for the same state ({where})"
    return None


@dataclass
class _Played:
    """One episode played by ``_play``: its final state, steps, whether it terminated, who moved last, and each
    agent's local reward on the state its own last move produced."""

    state: Any
    steps: int = 0
    terminated: bool = False
    last_mover: str | None = None
    last_local: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None  # what ``look`` found wrong, where it ended the episode


def _play(env: Env, agents: dict[str, Agent], problem: Problem, seed: int, text: str,
          look: Callable[[Any, int], "str | None"] | None = None) -> _Played:
    """One episode as the executor runs its stages, every agent answering ``text``, each move applied at once.
    ``look(state, turn)``, where given, sees each turn's state before its stages: the first failure it returns ends
    the episode there (``_Played.failure``)."""
    played = _Played(env.reset(problem, seed))
    for turn in range(env.max_turns):
        if look is not None:
            played.failure = look(played.state, turn)
            if played.failure:
                return played
        for stage in _stages(env, played.state, turn):
            for role in stage:
                step = env.step(played.state, role, agents[role].parse(text))
                played.state, played.steps, played.last_mover = step.state, played.steps + 1, role
                played.last_local[role] = agents[role].local_reward(step.state)
                if step.terminated or step.truncated:
                    played.terminated = step.terminated
                    return played
    return played


def _garbage_together(env: Env, agents: dict[str, Agent], problem: Problem, seed: int, text: str) -> str | None:
    """One episode with every agent answering ``text`` (a fresh model's usual state): after every move the rewards
    must be finite and success a bool. The adversarial check drives one agent's garbage at a time; a reward that
    breaks only when two agents of a stage both send garbage shows here."""
    state = env.reset(problem, seed)
    where = f"problem {problem.problem_id!r}, every agent answering {_short(text)}"
    for turn in range(env.max_turns):
        for stage in _stages(env, state, turn):
            for role in stage:
                step = env.step(state, role, agents[role].parse(text))
                state = step.state
                values = {"team_reward": env.team_reward(state),
                          **{f"{r}.local_reward": a.local_reward(state) for r, a in agents.items()}}
                bad = {label: v for label, v in values.items() if not _finite_number(v)}
                if bad:
                    return (f"{bad} after agent {role!r}'s move at turn {turn} ({where}); rewards must be finite "
                            "numbers whatever the agents send together: return 0 or a penalty")
                if not isinstance(env.success(state), bool):
                    return f"success() returned {type(env.success(state)).__name__}, not a bool ({where})"
                if step.terminated or step.truncated:
                    return None
    return None


def _check_results(env: Env, agents: dict[str, Agent], problem: Problem, seed: int, text: str) -> str | None:
    """Play one episode with every agent answering ``text``; at its end, every agent's result must reach it."""
    played = _play(env, agents, problem, seed, text)
    state, last_mover = played.state, played.last_mover
    where = f"problem {problem.problem_id!r}, every agent answering {_short(text)}"
    if has_outcome(env):
        outcome = env.outcome(state)
        if outcome is None:
            return None
        if not isinstance(outcome, dict) and not hasattr(outcome, "items"):
            return f"outcome returned {type(outcome).__name__}, expected {{agent: result}} ({where})"
        unknown = [a for a in outcome if a not in env.graph.agents]
        if unknown:
            return f"outcome names {unknown}, not agents of the env {list(env.graph.agents)} ({where})"
        missing = [a for a in env.graph.agents if a not in outcome]
        if missing:
            return (f"outcome leaves out {missing}: it names every agent's result (a seat left out would be trained "
                    f"as if it drew); return None where the env has no result ({where})")
        bad = {a: v for a, v in outcome.items() if not _finite_number(v)}
        return f"outcome values must be finite numbers, got {bad} ({where})" if bad else None
    if not played.terminated:  # as the run: a result is looked for only where the game ended
        return None
    for role, before in played.last_local.items():
        if role == last_mover:
            continue
        now = agents[role].local_reward(state)
        if _finite_number(now) and _finite_number(before) and before == 0 and now != 0:
            return (f"agent {role!r}'s local_reward went from {before!r} to {now!r} through agent {last_mover!r}'s "
                    f"last move ({where}): the run reads an agent's local reward only on the states its own moves "
                    f"produce, so that result would be lost; return every agent's final result from "
                    f"{type(env).__name__}.outcome(state) (docs/self_play.md)")
    return None


def _finite_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _same(a: Any, b: Any) -> bool:
    try:
        if a == b:
            return True
    except Exception:  # e.g. arrays with ambiguous truth values
        pass
    return repr(a) == repr(b)


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 120 else text[:117] + "..."


def _is_mutable(obj: Any) -> bool:
    if isinstance(obj, (list, dict, set, bytearray)):
        return True
    flags = getattr(obj, "flags", None)  # numpy-like arrays
    if flags is not None and getattr(flags, "writeable", False):
        return True
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return not obj.__dataclass_params__.frozen
    return hasattr(obj, "__dict__") and not isinstance(obj, type) and not callable(obj)


def _children(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        yield from obj.keys()
        yield from obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield getattr(obj, f.name)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        yield from vars(obj).values()


def _mutable_ids(root: Any, limit: int = 200_000) -> set[int]:
    """Ids of the mutable objects reachable from ``root`` (containers, arrays, plain objects)."""
    seen: set[int] = set()
    mutable: set[int] = set()
    stack = [root]
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(obj))
        if _is_mutable(obj):
            mutable.add(id(obj))
        stack.extend(_children(obj))
    return mutable
