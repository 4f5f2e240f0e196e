"""A two-agent game env: a tool agent writes a solver program, a plan agent decides the real moves.

Per turn, two sequential stages: ``tool_agent`` then ``plan_agent``.
- Tool step: the program (last fenced code block) runs in the sandbox with the board text on stdin; the
  actions it prints after ``**Actions List**:`` are simulated on the current board. The real board does not
  change: the state only records the code, output, parsed actions and the simulated outcome, for the planner.
- Plan step: the action list after ``####`` is applied to the real board.
Rewards (each game adds its own shaping, see its module):
- tool agent local reward: the simulated return of its actions; ``no_action_penalty`` (default -2, as the
  reference) when there is no code, no output marker or no action;
- plan agent local reward: the return of its real step; ``no_action_penalty`` when nothing parses;
- team reward: the real board's cumulative return so far (constant across tool branches of a node, since the
  tool never moves the real board; the tool's signal is its local reward).
- ``rewards="success"`` replaces every game's shaping with the bare outcome: a step (real or simulated) returns 1
  when it solves the board and 0 otherwise; ``no_action_penalty`` still applies. With shaping, a small model can
  learn to dodge: Sudoku charges -0.5 for a wrong digit in a hole but -0.1 for a fill that tries to change a clue
  (and is refused), so when no sampled guess of a GRPO group is right, the refused fills score best.
Termination: ``terminated`` when the real board is solved; ``truncated`` when its move budget is spent.
Success: the real board is solved.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from pettingllms.core import AgentGraph, DataError, Env, Problem, Transition

from .parsing import MAX_ACTIONS, text_after_actions_marker
from .runner import ProgramRunner, tool_runner

TOOL = "tool_agent"
PLAN = "plan_agent"
TEST_SEED_OFFSET = 10**9  # train seeds are [0, 1e9), test seeds [1e9, ...): disjoint by construction
EXAMPLE_SEED = -1  # the example's first candidate: in neither split, so no prompt shows a training or test answer
EXAMPLE_CANDIDATES = 64  # seeds -1, -2, ..., -64 are tried in turn for an example whose answer shows enough (below)
EXAMPLE_SEARCH_STATES = 20_000  # a seed whose solver search passes this is skipped (none solved: no example)
SHOWN_CODE_CHARS = 3000
SHOWN_OUTPUT_CHARS = 1500


@dataclass(frozen=True)
class Outcome:
    """The result of applying a list of actions to a board (pure; the input board is unchanged)."""

    board: Any
    reward: float
    solved: bool
    out_of_moves: bool = False
    valid: int = 0
    invalid: int = 0


@dataclass(frozen=True)
class ToolRecord:
    code: str
    stdout: str
    verdict: str  # sandbox verdict, or "no-code"
    actions: tuple = ()
    sim_reward: float = 0.0
    sim_solved: bool = False


@dataclass(frozen=True)
class WorkedExample:
    """A solved puzzle of the episode's kind, shown before the real one by the plan agent's compact prompt."""

    board_text: str
    positions: str
    answer: str  # an action list that solves it, in the game's answer format
    seed: int = EXAMPLE_SEED  # the puzzle's seed (negative: in neither split)


@dataclass(frozen=True)
class GameState:
    game: str
    instructions: str  # rules and answer format of this game (static per episode)
    board: Any  # the game's frozen board
    board_text: str
    positions: str = ""  # where things are on the board, in words (the compact prompt's help for small models)
    example: WorkedExample | None = None  # a solved puzzle of the same kind (None when the solver gave up)
    tool: ToolRecord | None = None  # the latest tool run (this turn's, once the tool has acted)
    plan_actions: tuple = ()
    plan_reward: float = 0.0
    real_return: float = 0.0
    plan_steps: int = 0
    solved: bool = False
    history: tuple[str, ...] = ()  # one line per finished turn, shown in later prompts


class Game(ABC):
    """Pure rules of one puzzle. Boards are frozen values; nothing here keeps state."""

    name: str
    action_format: str  # how to write an action list, shown in prompts

    @abstractmethod
    def generate(self, seed: int) -> dict[str, Any]:
        """The plain (parquet-friendly) data of the puzzle made from ``seed``."""

    @abstractmethod
    def board_from_data(self, data: Mapping[str, Any]) -> Any:
        """A board from problem data; raises DataError naming what is wrong."""

    @abstractmethod
    def has_content(self, data: Mapping[str, Any]) -> bool:
        """Whether ``data`` holds the puzzle itself (a dataset row) rather than only a seed."""

    @abstractmethod
    def content_key(self, data: Mapping[str, Any]) -> str:
        """A string equal for equal puzzles (to keep the test split out of the training split)."""

    @abstractmethod
    def render(self, board: Any) -> str: ...

    @abstractmethod
    def positions(self, board: Any) -> str:
        """Where the pieces are, in words with 0-based rows and columns (the same board as ``render``)."""

    @abstractmethod
    def solution(self, board: Any, max_states: int) -> str | None:
        """An answer that solves ``board``, in the answer format; None when a search of ``max_states`` finds none."""

    @abstractmethod
    def rules(self, board: Any) -> str: ...

    @abstractmethod
    def parse_actions(self, text: str | None, board: Any) -> tuple | None:
        """Actions in an answer segment for ``board``; None when none parse. Never raises."""

    @abstractmethod
    def apply(self, board: Any, actions: Sequence, first_step: bool) -> Outcome: ...

    @abstractmethod
    def is_solved(self, board: Any) -> bool: ...

    def describe_actions(self, actions: Sequence) -> str:
        return "[" + ", ".join(str(a) for a in actions[:60]) + (", ..." if len(actions) > 60 else "") + "]"

    def example_shows_enough(self, answer: str) -> bool:
        """Whether a solved puzzle with this answer is a good worked example. A small model copies the example's
        answer onto every board, so a game whose short answers look alike (Plan-Path's single move ``L``) asks for
        one that does not; the default takes the first puzzle that has a solution."""
        del answer
        return True


class GameEnv(Env):
    """Base of the Sokoban, Sudoku and Plan-Path envs. Subclasses set ``game`` in ``__init__``."""

    REWARDS = ("shaped", "success")

    graph = AgentGraph.sequential([TOOL, PLAN])
    agent_classes = {TOOL: "pettingllms.envs.games_common.agents:ToolAgent", PLAN: "pettingllms.envs.games_common.agents:PlanAgent"}
    known_options = ()
    game: Game

    def __init__(
        self,
        max_turns: int = 4,
        no_action_penalty: float = -2.0,
        tool_timeout_s: float = 5.0,
        sandbox_workers: int = 4,
        runner: ProgramRunner | None = None,
        rewards: str = "shaped",
        **options: Any,
    ) -> None:
        super().__init__(max_turns=max_turns, **options)
        if rewards not in self.REWARDS:
            raise ValueError(f"rewards must be one of {', '.join(self.REWARDS)}, got {rewards!r}")
        self.rewards = rewards
        self.no_action_penalty = float(no_action_penalty)
        self.runner: ProgramRunner = runner or tool_runner(timeout_s=tool_timeout_s, workers=sandbox_workers)

    # ------------------------------------------------------------------ problems
    def puzzle_data(self, problem: Problem) -> Mapping[str, Any]:
        """The problem's puzzle: its own content (dataset rows), else generated from its seed."""
        data = problem.data
        if self.game.has_content(data):
            return data
        if "seed" not in data:
            raise DataError(
                f"{self.game.name} problem {problem.problem_id!r} has neither a puzzle nor a seed: {data!r:.200}"
            )
        return _generate_cached(self.game, int(data["seed"]))

    def procedural_problems(self, split: str, count: int) -> list[Problem]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        offset = 0 if split == "train" else TEST_SEED_OFFSET
        # Seed-only data: cheap to list 100k of them; reset generates (and caches) the puzzle on first use.
        return [Problem(f"{self.game.name}-{offset + i}", {"seed": offset + i}) for i in range(count)]

    def materialize(self, problem: Problem) -> Problem:
        """The same problem with the full puzzle in its data (what the loaders write)."""
        return Problem(problem.problem_id, {**dict(problem.data), **dict(self.puzzle_data(problem))})

    # ------------------------------------------------------------------ episode
    def reset(self, problem: Problem, seed: int) -> GameState:
        del seed  # the problem fixes the puzzle
        board = self.game.board_from_data(self.puzzle_data(problem))
        return GameState(
            game=self.game.name,
            instructions=self.game.rules(board),
            board=board,
            board_text=self.game.render(board),
            positions=self.game.positions(board),
            example=worked_example(self.game),
            solved=self.game.is_solved(board),
        )

    def step(self, state: GameState, agent: str, action: Any) -> Transition:
        if agent == TOOL:
            return Transition(self._tool_step(state, action if isinstance(action, str) else None))
        if agent == PLAN:
            return self._plan_step(state, action if isinstance(action, str) else None)
        raise KeyError(f"unknown agent {agent!r}; {type(self).__name__} has {list(self.graph.agents)}")

    def _tool_step(self, state: GameState, code: str | None) -> GameState:
        if not code or not code.strip():
            return replace(state, tool=ToolRecord("", "", "no-code", (), self.no_action_penalty, False))
        output = self.runner(code, state.board_text + "\n")
        actions = self.game.parse_actions(text_after_actions_marker(output.stdout), state.board)
        record = ToolRecord(code[:SHOWN_CODE_CHARS], output.stdout[:SHOWN_OUTPUT_CHARS], output.verdict)
        if not actions:
            return replace(state, tool=replace(record, sim_reward=self.no_action_penalty))
        outcome = self.game.apply(state.board, actions[:MAX_ACTIONS], first_step=state.plan_steps == 0)
        return replace(state, tool=replace(record, actions=tuple(actions), sim_reward=self._reward(outcome),
                                           sim_solved=outcome.solved))

    def _reward(self, outcome: Outcome) -> float:
        """The step's reward: the game's shaped return, or under ``rewards="success"`` 1 if it solved the board."""
        if self.rewards == "success":
            return 1.0 if outcome.solved else 0.0  # a solved board ends the episode, so this counts once
        return outcome.reward

    def _plan_step(self, state: GameState, answer: str | None) -> Transition:
        actions = self.game.parse_actions(answer, state.board)
        turn = state.plan_steps + 1
        if not actions:
            line = f"turn {turn}: the plan agent gave no parsable action list; the board did not change"
            new = replace(state, plan_actions=(), plan_reward=self.no_action_penalty, plan_steps=turn,
                          history=state.history + (line,))
            return Transition(new)
        outcome = self.game.apply(state.board, actions[:MAX_ACTIONS], first_step=state.plan_steps == 0)
        reward = self._reward(outcome)
        line = (f"turn {turn}: applied {self.game.describe_actions(actions)} "
                f"({outcome.valid} valid, {outcome.invalid} invalid), reward {reward:+.2f}"
                + (", solved" if outcome.solved else ""))
        new = replace(
            state,
            board=outcome.board,
            board_text=self.game.render(outcome.board),
            positions=self.game.positions(outcome.board),
            plan_actions=tuple(actions),
            plan_reward=reward,
            real_return=state.real_return + reward,
            plan_steps=turn,
            solved=outcome.solved,
            history=state.history + (line,),
        )
        return Transition(new, terminated=outcome.solved, truncated=outcome.out_of_moves and not outcome.solved)

    def team_reward(self, state: GameState) -> float:
        return float(state.real_return)

    def success(self, state: GameState) -> bool:
        return bool(state.solved)

    @classmethod
    def example_problems(cls, n: int = 2) -> Sequence[Problem]:
        env = cls()
        return [env.materialize(p) for p in env.procedural_problems("train", n)]

    @staticmethod
    def describe(state: Any) -> str:
        if isinstance(state, GameState):
            return f"{state.game} step {state.plan_steps} return {state.real_return:+.2f}\n{state.board_text}"
        return repr(state)[:500]


@functools.lru_cache(maxsize=64)
def worked_example(game: Game) -> WorkedExample | None:
    """The first puzzle of seeds ``EXAMPLE_SEED``, ``EXAMPLE_SEED - 1``, ... whose solution the game calls a good
    example (``Game.example_shows_enough``), else the first with a solution (once per game setting and process)."""
    first: WorkedExample | None = None
    for seed in range(EXAMPLE_SEED, EXAMPLE_SEED - EXAMPLE_CANDIDATES, -1):
        try:
            board = game.board_from_data(game.generate(seed))
        except RuntimeError:  # a setting the generator cannot build (it raises for every seed): stop looking
            break
        answer = game.solution(board, EXAMPLE_SEARCH_STATES)
        if answer is None:  # too hard a search: the next seed
            continue
        example = WorkedExample(game.render(board), game.positions(board), answer, seed)
        if game.example_shows_enough(answer):
            return example
        first = first or example
    return first


@functools.lru_cache(maxsize=4096)
def _generate_cached(game: Game, seed: int) -> Mapping[str, Any]:
    return game.generate(seed)
