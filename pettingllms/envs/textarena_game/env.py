"""``textarena``: a two-player TextArena game played by LLM seats (``pip install 'pettingllms[games]'``).

    env.name=textarena env.options.game=TicTacToe-v0        # self-play: player_0 vs player_1
    env.name=textarena env.options.game=KuhnPoker-v0
    env.name=textarena env.options.opponent=server env.options.opponent_url=http://host:8000/v1 \
        env.options.opponent_model=<name>                    # one agent, ``player``, vs a served model

- **State**: (game id, seed, the moves sent so far) plus what the library said after them (who moves, what that seat
  sees, the rewards once over). Each step replays the game from ``reset(seed)`` through every move: a pure
  transition whose forks share nothing. TextArena seeds the *module-level* ``random`` in ``reset`` and its games
  draw from it as they go, so a deep copy of a game object would not copy its randomness, and our env steps run in
  threads. Its LLM observation wrapper keeps every observation across ``reset``, so each replay makes the game
  afresh (``ta.make``, microseconds). A replay holds one lock, seeds as the library does, and restores the interpreter's ``random`` and
  ``numpy.random`` states afterwards, so concurrent forks never see each other's draws.
- **Who acts**: the library's ``get_observation()`` player, so its own rules decide (a resubmit after an invalid
  move, Kuhn Poker's alternating starter). Seats are ``player_0`` and ``player_1``.
- **Moves**: the response as it is (at most 2,000 characters); the library's own action wrapper and rules judge it
  (by default a second invalid move in a row loses the game).
- **Outcome** (``Env.outcome``): the rewards of ``close()`` per seat; a game cut by ``max_turns`` scores 0 for both.
  ``success``: the game reached its end without a forfeit (against an opponent: ``player`` won), as in
  ``openspiel``: a game a seat lost by invalid moves ended by no one's play.
- **Opponents**: ``opponent=self`` (default) seats an agent per player; ``opponent=random`` seats one agent,
  ``player``, against a uniform random choice among the moves the library's observation lists (its ``Available
  Moves: '[0]', '[4]'`` or ``available actions are: '[check]', '[bet]'`` line), drawn with a generator seeded by the
  game's seed and the number of moves so far, so a replay draws the same move; a game whose observation lists no
  moves is refused at the opponent's first turn, naming the game. ``opponent=server`` seats one agent,
  ``player``, in seat (problem seed mod 2), so seats alternate across problems, and a model behind any
  OpenAI-compatible endpoint plays the other seat (``envs/common/server_opponent.py``: ``opponent_url``,
  ``opponent_model``, the bearer token from the environment variable ``opponent_key_env``, ``opponent_temperature``
  0 by default, ``opponent_timeout``, ``opponent_max_tokens``). It sees that seat's observation and its answer is
  the move, judged by the library like any; a failed request sends an empty move (invalid, as the library's rules
  judge it) and is counted in ``info/opponent_fallbacks``. Its moves are in the state, so a replay never asks again.
"""

from __future__ import annotations

import random
import re
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pettingllms.core import AgentGraph, ConfigError, Env, EnvError, Problem, Transition
from pettingllms.envs.common.server_opponent import ServerOpponent
from pettingllms.envs.seats import example_problems, seeded_problems

PLAYERS = 2
SEATS = tuple(f"player_{i}" for i in range(PLAYERS))
TRAINED = "player"  # the one agent when a served model plays the other seat
OPPONENTS = ("self", "random", "server")
# A listed move: a bracketed token in quotes on the observation's last line that names the available moves or actions
_LISTED = re.compile(r"'(\[[^\]']*\])'")
_REPLAY = threading.Lock()  # TextArena draws from the module-level ``random``: one replay at a time


def import_textarena():
    try:
        import textarena
    except ImportError as exc:
        raise ConfigError("env 'textarena' needs TextArena: pip install 'pettingllms[games]' (textarena)") from exc
    return textarena


@dataclass(frozen=True)
class ArenaState:
    seed: int
    moves: tuple[str, ...]  # every move sent, invalid ones included, in order
    to_move: int  # the seat the library asks next; -1 once the game is over
    prompt: str  # the library's observation for that seat
    rewards: tuple[float, ...] = ()  # close()'s rewards per seat once the game is over
    reason: str = ""  # the library's reason for the result
    seat: int | None = None  # the seat ``player`` holds against an opponent (random, served); None in self-play
    opponent_fallbacks: int = 0  # opponent=server: failed requests answered with an empty move so far
    forfeit: int | None = None  # the seat whose invalid moves ended the game (the library's ``invalid_move``)


class TextArenaEnv(Env):
    graph = AgentGraph.sequential(list(SEATS))
    agent_classes = {seat: "games.seat" for seat in SEATS}
    known_options = ()

    def __init__(self, max_turns: int = 30, game: str = "TicTacToe-v0", opponent: str = "self",
                 opponent_url: str = "", opponent_model: str = "", opponent_key_env: str = "OPENAI_API_KEY",
                 opponent_temperature: float = 0.0, opponent_timeout: float = 60.0, opponent_max_tokens: int = 64,
                 **options: Any) -> None:
        super().__init__(max_turns=max_turns, **options)
        if opponent not in OPPONENTS:
            raise ConfigError(f"env.options.opponent={opponent!r}: one of {list(OPPONENTS)}")
        if opponent_max_tokens < 1:
            raise ConfigError(f"env.options.opponent_max_tokens={opponent_max_tokens}: must be >= 1")
        self._make = import_textarena().make
        try:
            self._make(game)
        except Exception as exc:
            raise ConfigError(f"env.options.game={game!r}: TextArena cannot make it ({exc})") from exc
        self.game = game
        try:  # the library checks the player count in reset: a one- or three-player game fails there, not in make
            self._play(0, ())
        except Exception as exc:
            raise ConfigError(f"env.options.game={game!r}: env 'textarena' plays two-player games, and TextArena's "
                              f"{game} does not start with {PLAYERS} players ({type(exc).__name__}: {exc})") from exc
        self.server = ServerOpponent(opponent_url, opponent_model, opponent_key_env, opponent_temperature,
                                     opponent_timeout, env_name="textarena") if opponent == "server" else None
        self.opponent_max_tokens = opponent_max_tokens
        self.random_opponent = opponent == "random"
        if self.server is not None or self.random_opponent:
            self.graph = AgentGraph.sequential([TRAINED])
            self.agent_classes = {TRAINED: "games.seat"}

    def procedural_problems(self, split: str, count: int) -> list[Problem]:
        return seeded_problems(self.game, split, count)

    @classmethod
    def example_problems(cls, n: int = 2) -> Sequence[Problem]:
        return example_problems(n)

    def reset(self, problem: Problem, seed: int) -> ArenaState:
        problem_seed = int(problem.data.get("seed", 0))
        seat = problem_seed % PLAYERS if self._has_opponent else None
        return self._settle(self._play(problem_seed * 1_000_003 + seed, (), seat))

    def acting_agents(self, state: ArenaState) -> tuple[str, ...]:
        return (self._role(state.to_move),) if state.to_move >= 0 else ()

    def step(self, state: ArenaState, agent: str, action: Any) -> Transition:
        if state.to_move < 0:
            return Transition(state, terminated=True)
        if agent != self._role(state.to_move):
            raise ValueError(f"{agent!r} moved, but the seat to move is {self._role(state.to_move)!r}")
        new = self._settle(self._play(state.seed, state.moves + (str(action or ""),), state.seat,
                                      state.opponent_fallbacks))
        info = {"opponent_fallbacks": float(new.opponent_fallbacks)} if self.server is not None else {}
        return Transition(new, terminated=new.to_move < 0, info=info)

    def team_reward(self, state: ArenaState) -> float:
        return 0.0

    def outcome(self, state: ArenaState) -> Mapping[str, float]:
        values = state.rewards or (0.0,) * PLAYERS
        if state.seat is not None:
            return {TRAINED: float(values[state.seat])}
        return {seat: float(v) for seat, v in zip(SEATS, values)}

    def success(self, state: ArenaState) -> bool:
        if state.seat is not None:
            return self.outcome(state)[TRAINED] > 0
        return bool(state.rewards) and state.forfeit is None

    @property
    def _has_opponent(self) -> bool:
        return self.server is not None or self.random_opponent

    def _role(self, player: int) -> str:
        return TRAINED if self._has_opponent else SEATS[player]

    def _settle(self, state: ArenaState) -> ArenaState:
        """Against an opponent: play its moves until ``player``'s seat is to move or the game is over."""
        while self.random_opponent and state.to_move >= 0 and state.to_move != state.seat:
            listed = listed_moves(state.prompt)
            if not listed:
                raise EnvError(f"env.options.opponent=random: {self.game}'s observation lists no moves to draw from "
                               f"(its last lines: {state.prompt[-300:]!r}); use opponent=self or opponent=server")
            move = random.Random(f"{state.seed}/{len(state.moves)}").choice(listed)
            state = self._play(state.seed, state.moves + (move,), state.seat)
        while self.server is not None and state.to_move >= 0 and state.to_move != state.seat:
            answer, cause = self.server.ask([{"role": "user", "content": state.prompt}], self.opponent_max_tokens)
            fallbacks = state.opponent_fallbacks
            if answer is None:
                self.server.fell_back(cause, "an empty move (invalid by the game's rules) is sent")
                answer, fallbacks = "", fallbacks + 1
            state = self._play(state.seed, state.moves + (answer,), state.seat, fallbacks)
        return state

    @staticmethod
    def describe(state: ArenaState) -> str:
        return (f"seed {state.seed}, moves {list(state.moves)}, to move {state.to_move}, rewards {list(state.rewards)}"
                + (f", player holds seat {state.seat}" if state.seat is not None else ""))

    def _play(self, seed: int, moves: tuple[str, ...], seat: int | None = None, fallbacks: int = 0) -> ArenaState:
        """Replay the game from ``reset(seed)`` through ``moves`` and record what the library says next."""
        import numpy as np

        with _REPLAY:
            saved, saved_np = random.getstate(), np.random.get_state()
            try:
                arena = self._make(self.game)  # fresh: the LLM observation wrapper keeps its text across resets
                arena.reset(num_players=PLAYERS, seed=seed)
                done = False
                for move in moves:
                    if done:
                        raise ValueError(f"a move after the end of the game: {moves}")
                    done, _ = arena.step(move)
                if done:
                    rewards, info = arena.close()
                    seats = {i: v for i, v in (info or {}).items() if isinstance(v, dict)}  # close()'s game_info
                    reason = next((str(v.get("reason", "")) for v in seats.values()), "")
                    forfeit = next((int(i) for i, v in seats.items() if v.get("invalid_move")), None)
                    return ArenaState(seed, moves, -1, "", tuple(float(rewards.get(i, 0.0)) for i in range(PLAYERS)),
                                      reason, seat, fallbacks, forfeit)
                player, observation = arena.get_observation()
                return ArenaState(seed, moves, int(player), _text(observation), seat=seat, opponent_fallbacks=fallbacks)
            finally:
                random.setstate(saved)
                np.random.set_state(saved_np)


def listed_moves(observation: str) -> list[str]:
    """The moves the library lists for the seat to move: the bracketed, quoted tokens of the last line that names the
    available moves or actions (TicTacToe's ``Available Moves: '[0]', ...``, Kuhn Poker's ``Your available actions
    are: '[check]', '[bet]'``); [] when no line does."""
    for line in reversed(observation.splitlines()):
        if "available" in line.lower():
            found = _LISTED.findall(line)
            if found:
                return list(dict.fromkeys(found))
    return []


def _text(observation: Any) -> str:
    """The library's observation as one string (its LLM wrapper gives one; a raw env gives (sender, text) pairs)."""
    if isinstance(observation, str):
        return observation
    return "\n".join(str(part[-1]) if isinstance(part, (tuple, list)) else str(part) for part in observation)
