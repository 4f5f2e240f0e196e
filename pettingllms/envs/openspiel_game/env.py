"""``openspiel``: a sequential OpenSpiel game played by LLM seats (``pip install 'pettingllms[games]'``).

    env.name=openspiel env.options.game=tic_tac_toe                      # self-play: player_0 vs player_1
    env.name=openspiel env.options.game=kuhn_poker env.options.opponent=random   # one agent vs a uniform player

- **State**: the library's action history (chance outcomes included), replayed on a fresh ``new_initial_state()``
  at each step: a pure transition whose forks share nothing, exact as the library's ``clone()``. Chance outcomes
  are drawn from the library's ``chance_outcomes()`` with a generator seeded by (problem seed, episode seed,
  position), so a problem replays identically.
- **Who acts**: the library's ``current_player()`` (``Env.acting_agents``); seats are ``player_<i>``.
- **Prompt**: the library's observation string for the seat to move (its information state where the game has no
  observation string), a key to it where the library writes only digits (Kuhn Poker's ``211``: the card, then the
  chips in the pot; Liar's Dice), the legal moves as ``action_to_string`` writes them, and why the last attempt was
  refused.
- **Moves**: a response naming exactly one legal move, or ending with one (the last legal move written in it as a
  word of its own: ``Beta`` names no ``Bet``);
  anything else is invalid: the seat moves again, and its ``max_invalid``-th invalid move in a row forfeits. Every
  step reports ``invalid`` and ``forfeit`` (0 or 1) in its info: ``<policy>/<agent>/info/invalid_mean`` and
  ``forfeit_mean`` each step.
- **Outcome** (``Env.outcome``): the library's ``returns()``; a forfeit scores -1 for the seat that forfeited and
  +1/(n-1) for each other seat; a game cut by ``max_turns`` scores 0 for everyone.
- **Opponents**: ``opponent=self`` (default) seats an agent per player; ``random`` (uniform over legal moves),
  ``mcts`` (the library's ``MCTSBot`` with random rollouts, ``mcts_simulations`` each move) or ``server`` (a model
  behind any OpenAI-compatible endpoint: ``opponent_url``, ``opponent_model``, the bearer token from the environment
  variable ``opponent_key_env``; it sees the prompt the seat would see, worked example included, and answers at
  ``opponent_temperature``, 0 by default so that a position's reply is repeatable) seats one agent, ``player``,
  which holds seat ``problem seed mod players``: seats alternate across problems. A server answer that names no
  legal move, or a failed request, is replaced by a uniform legal move and counted: every step's info reports
  ``opponent_fallbacks``, the game's count so far (``<policy>/player/info/opponent_fallbacks_mean``), and the first
  failure's cause is logged once. ``success`` is then a win of ``player``; in self-play a game played to its end
  without a forfeit.
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from pettingllms.core import AgentGraph, ConfigError, Env, Problem, Transition
from pettingllms.envs.common.server_opponent import ServerOpponent
from pettingllms.envs.seats import example_problems, seeded_problems

OPPONENTS = ("self", "random", "mcts", "server")
# How to read a library state string that is only digits: per game (short name), formatted with ``players``
# (the deck of Kuhn Poker holds players + 1 cards). Other games' strings (boards, Leduc's labelled fields) read as
# they are.
LEGENDS = {
    "kuhn_poker": "The state reads: your card (0 is the lowest of the {cards} cards, {top} the highest; the highest "
                  "card in a showdown wins), then the chips each player has put in the pot, player 0 first.",
    "liars_dice": "The state reads: your dice, then the bids so far, each written quantity-face.",
}
TRAINED = "player"  # the one agent when the other seats are played by a fixed opponent


def import_pyspiel():
    try:
        import pyspiel
    except ImportError as exc:
        raise ConfigError("env 'openspiel' needs OpenSpiel: pip install 'pettingllms[games]' (open-spiel)") from exc
    return pyspiel


@dataclass(frozen=True)
class SpielState:
    game_seed: str  # seeds chance outcomes and the opponent: "<problem seed>/<episode seed>"
    history: tuple[int, ...]  # every action of the game so far, chance outcomes and the opponent's moves included
    seat: int | None  # the seat ``player`` holds against a fixed opponent; None in self-play
    to_move: int  # the library's player to move; negative once the game is over
    prompt: str  # what the seat to move sees
    legal: tuple[str, ...]  # its legal moves as the library writes them
    invalid: int = 0  # invalid moves in a row by the seat to move
    forfeit: int | None = None  # the seat whose invalid moves ended the game
    returns: tuple[float, ...] = ()  # the library's returns once the game is over
    shot: tuple[str, str] = ()  # one_shot: a worked example for the seat to move, (its prompt, a legal answer)
    opponent_fallbacks: int = 0  # opponent=server: its moves replaced by a uniform legal move so far


class OpenSpielEnv(Env):
    graph = AgentGraph.sequential(["player_0", "player_1"])
    agent_classes = {"player_0": "games.seat", "player_1": "games.seat"}
    known_options = ()

    def __init__(self, max_turns: int = 30, game: str = "tic_tac_toe", opponent: str = "self", max_invalid: int = 2,
                 mcts_simulations: int = 50, one_shot: bool = False, opponent_url: str = "", opponent_model: str = "",
                 opponent_key_env: str = "OPENAI_API_KEY", opponent_temperature: float = 0.0,
                 opponent_timeout: float = 60.0, **options: Any) -> None:
        super().__init__(max_turns=max_turns, **options)
        pyspiel = import_pyspiel()
        if opponent not in OPPONENTS:
            raise ConfigError(f"env.options.opponent={opponent!r}: one of {list(OPPONENTS)}")
        self.server = ServerOpponent(opponent_url, opponent_model, opponent_key_env, opponent_temperature,
                                     opponent_timeout, env_name="openspiel") if opponent == "server" else None
        if max_invalid < 1:
            raise ConfigError(f"env.options.max_invalid={max_invalid}: must be >= 1")
        names = pyspiel.registered_names()
        if game.split("(")[0] not in names:
            close = difflib.get_close_matches(game, names, n=3)
            raise ConfigError(f"env.options.game={game!r} is not an OpenSpiel game" +
                              (f"; did you mean {', '.join(close)}?" if close else "") +
                              " (pyspiel.registered_names() lists them)")
        try:
            self.game = pyspiel.load_game(game)
        except Exception as exc:  # pyspiel raises a bare RuntimeError for bad parameters
            raise ConfigError(f"env.options.game={game!r}: OpenSpiel cannot load it ({exc})") from exc
        kind = self.game.get_type()
        if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            raise ConfigError(f"env.options.game={game!r} is a simultaneous-move game; only sequential games are "
                              f"supported")
        if kind.chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC:
            # Its chance is drawn inside apply_action from the game object's own generator: a replay of the same
            # moves (every step and every tree branch replays the history) would play another game each time.
            raise ConfigError(f"env.options.game={game!r} draws its chance outcomes inside its moves (sampled "
                              f"stochastic), so a state cannot be replayed exactly; games with explicit chance "
                              f"nodes (kuhn_poker, leduc_poker, pig, ...) are supported")
        self.name, self.opponent, self.max_invalid = game, opponent, max_invalid
        self.mcts_simulations = mcts_simulations
        self.players = self.game.num_players()
        roles = [TRAINED] if opponent != "self" else [f"player_{i}" for i in range(self.players)]
        self.graph = AgentGraph.sequential(roles)
        self.agent_classes = {role: "games.seat" for role in roles}
        self._shots = self._worked_examples() if one_shot else {}

    # ------------------------------------------------------------------------------------------- problems
    def procedural_problems(self, split: str, count: int) -> list[Problem]:
        return seeded_problems(self.name, split, count)

    @classmethod
    def example_problems(cls, n: int = 2) -> Sequence[Problem]:
        return example_problems(n)

    # ------------------------------------------------------------------------------------------- transitions
    def reset(self, problem: Problem, seed: int) -> SpielState:
        problem_seed = int(problem.data.get("seed", 0))
        seat = problem_seed % self.players if self.opponent != "self" else None
        game_seed = f"{problem_seed}/{seed}"
        state = self.game.new_initial_state()
        fallbacks = self._settle(state, game_seed, seat)
        return replace(self._record(state, game_seed, seat), opponent_fallbacks=fallbacks)

    def acting_agents(self, state: SpielState) -> tuple[str, ...]:
        return (self._role(state.to_move),) if state.to_move >= 0 else ()

    def step(self, state: SpielState, agent: str, action: Any) -> Transition:
        if state.to_move < 0 or state.forfeit is not None:
            return Transition(state, terminated=True)
        if agent != self._role(state.to_move):
            raise ValueError(f"{agent!r} moved, but the seat to move is {self._role(state.to_move)!r}")
        game_state = self._replay(state.history)
        move = match_move(str(action or ""), state.legal)
        if move is None:
            invalid = state.invalid + 1
            if invalid >= self.max_invalid:
                return Transition(replace(state, invalid=invalid, forfeit=state.to_move, to_move=-1),
                                  terminated=True, info=self._info(state, invalid=1.0, forfeit=1.0))
            refused = (f"Your answer {str(action)[:80]!r} is not one of the legal moves. "
                       f"{self.max_invalid - invalid} more invalid move(s) forfeit the game.")
            return Transition(replace(state, invalid=invalid, prompt=self._prompt(game_state, refused)),
                              info=self._info(state, invalid=1.0, forfeit=0.0))
        player = state.to_move
        game_state.apply_action(next(a for a in game_state.legal_actions()
                                     if game_state.action_to_string(player, a) == move))
        fallbacks = state.opponent_fallbacks + self._settle(game_state, state.game_seed, state.seat)
        new = replace(self._record(game_state, state.game_seed, state.seat), opponent_fallbacks=fallbacks)
        return Transition(new, terminated=game_state.is_terminal(), info=self._info(new, invalid=0.0, forfeit=0.0))

    # ------------------------------------------------------------------------------------------- results
    def team_reward(self, state: SpielState) -> float:
        return 0.0

    def outcome(self, state: SpielState) -> Mapping[str, float]:
        if state.forfeit is not None:
            per_seat = self._forfeit_returns(state.forfeit)
        elif state.returns:
            per_seat = list(state.returns)
        else:  # cut by max_turns
            per_seat = [0.0] * self.players
        if state.seat is not None:
            return {TRAINED: per_seat[state.seat]}
        return {f"player_{i}": v for i, v in enumerate(per_seat)}

    def _forfeit_returns(self, forfeiter: int) -> list[float]:
        """A forfeit is the forfeiter's worst outcome in the game (``min_utility``: a fixed -1 let a Leduc seat
        facing -9 lose less by answering garbage twice); in a zero-sum game the others share what it loses, else
        each gets the game's best (``max_utility``)."""
        import pyspiel

        loss = min(-1.0, float(self.game.min_utility()))
        if self.players == 1:
            return [loss]
        zero_sum = self.game.get_type().utility == pyspiel.GameType.Utility.ZERO_SUM
        win = -loss / (self.players - 1) if zero_sum else max(1.0, float(self.game.max_utility()))
        return [loss if i == forfeiter else win for i in range(self.players)]

    def success(self, state: SpielState) -> bool:
        if state.seat is not None:
            return self.outcome(state)[TRAINED] > 0
        return bool(state.returns) and state.forfeit is None

    @staticmethod
    def describe(state: SpielState) -> str:
        return f"history {list(state.history)}, to move {state.to_move}, returns {list(state.returns)}"

    # ------------------------------------------------------------------------------------------- helpers
    def _info(self, state: SpielState, **values: float) -> dict[str, float]:
        """A step's info: ``values``, and against a served opponent its fallbacks so far in the game."""
        if self.opponent == "server":
            values["opponent_fallbacks"] = float(state.opponent_fallbacks)
        return values

    def _role(self, player: int) -> str:
        return TRAINED if self.opponent != "self" else f"player_{player}"

    def _replay(self, history: Sequence[int]):
        state = self.game.new_initial_state()
        for action in history:
            state.apply_action(action)
        return state

    def _settle(self, state, game_seed: str, seat: int | None) -> int:
        """Play chance nodes and the fixed opponent's moves until a trained seat is to move or the game is over;
        returns how many of the opponent's moves were fallbacks (opponent=server)."""
        fallbacks = 0
        while not state.is_terminal():
            rng = random.Random(f"{game_seed}/{len(state.history())}")
            if state.is_chance_node():
                outcomes, probabilities = zip(*state.chance_outcomes())
                state.apply_action(rng.choices(outcomes, probabilities)[0])
            elif seat is not None and state.current_player() != seat:
                move, fell_back = self._opponent_move(state, rng)
                state.apply_action(move)
                fallbacks += fell_back
            else:
                break
        return fallbacks

    def _opponent_move(self, state, rng: random.Random) -> tuple[int, bool]:
        """(the opponent's action, whether it is a fallback for a server answer that named no legal move)."""
        if self.opponent == "random":
            return rng.choice(state.legal_actions()), False
        if self.opponent == "server":
            return self._server_move(state, rng)
        import numpy as np
        from open_spiel.python.algorithms import mcts

        generator = np.random.RandomState(rng.randrange(2**31))
        bot = mcts.MCTSBot(self.game, 2.0, self.mcts_simulations, mcts.RandomRolloutEvaluator(1, generator),
                           random_state=generator)
        return bot.step(state.clone()), False

    def _server_move(self, state, rng: random.Random) -> tuple[int, bool]:
        """The served model's move from the prompt the seat would see; a uniform legal move when it names none."""
        player = state.current_player()
        actions = state.legal_actions()
        legal = [state.action_to_string(player, a) for a in actions]
        shot = self._shots.get(player)
        messages = ([{"role": "user", "content": shot[0]}, {"role": "assistant", "content": shot[1]}] if shot else [])
        messages.append({"role": "user", "content": self._prompt(state)})
        answer, cause = self.server.ask(messages)
        move = match_move(answer, legal) if answer is not None else None
        if move is not None:
            return actions[legal.index(move)], False
        self.server.fell_back(cause or f"its answer {answer[:60]!r} names no legal move",
                              "a uniform legal move is played")
        return rng.choice(actions), True

    def _record(self, state, game_seed: str, seat: int | None) -> SpielState:
        if state.is_terminal():
            return SpielState(game_seed, tuple(state.history()), seat, -1, "", (),
                              returns=tuple(float(r) for r in state.returns()))
        player = state.current_player()
        legal = tuple(state.action_to_string(player, a) for a in state.legal_actions())
        return SpielState(game_seed, tuple(state.history()), seat, player, self._prompt(state), legal,
                          shot=self._shots.get(player, ()))

    def _worked_examples(self) -> dict[int, tuple[str, str]]:
        """``one_shot``: per player, the prompt of the first position of a fixed line of play (each move the first
        legal one, chance the first outcome) where that player is to move, answered with its middle legal move."""
        shots: dict[int, tuple[str, str]] = {}
        state = self.game.new_initial_state()
        while not state.is_terminal() and len(shots) < self.players:
            if state.is_chance_node():
                state.apply_action(state.chance_outcomes()[0][0])
                continue
            player, actions = state.current_player(), state.legal_actions()
            if player not in shots:
                shots[player] = (self._prompt(state), state.action_to_string(player, actions[len(actions) // 2]))
            state.apply_action(actions[0])
        return shots

    def _prompt(self, state, refused: str = "") -> str:
        player = state.current_player()
        kind = self.game.get_type()
        if kind.provides_observation_string:
            seen = state.observation_string(player)
        elif kind.provides_information_state_string:
            seen = state.information_state_string(player)
        else:
            seen = str(state)
        moves = [state.action_to_string(player, a) for a in state.legal_actions()]
        legend = LEGENDS.get(kind.short_name, "").format(cards=self.players + 1, top=self.players)
        lines = [f"You are player {player} in the game {kind.long_name}.", "Current state:", seen, legend,
                 f"Legal moves: {', '.join(moves)}", refused,
                 f"Answer with exactly one legal move, written as listed (for example: {moves[0]})."]
        return "\n".join(line for line in lines if line)


def match_move(text: str, legal: Sequence[str]) -> str | None:
    """The legal move ``text`` names: the whole answer (surrounding spaces and quotes aside), else the legal move
    written last in it (the longest one where several end at the same place). Case counts where two legal moves
    differ only in it (chess: ``bxc5`` is a pawn's capture, ``Bxc5`` a bishop's); elsewhere it is ignored. None: no
    legal move, or an answer that names two of them."""
    answer = text.strip().strip("`'\".").strip()
    if answer in legal:
        return answer
    folded = [move for move in legal if move.lower() == answer.lower()]
    if folded:
        return folded[0] if len(folded) == 1 else None
    twins = {move.lower() for move in legal if sum(m.lower() == move.lower() for m in legal) > 1}
    best, best_end = None, -1
    for move in legal:
        exact = move.lower() in twins  # a move with a case twin is found only as written
        at = _last_standalone(text if exact else text.lower(), move if exact else move.lower())
        if at >= 0:
            end = at + len(move)
            if end > best_end or (end == best_end and best is not None and len(move) > len(best)):
                best, best_end = move, end
    return best


def _last_standalone(text: str, move: str) -> int:
    """Where ``move`` last occurs in ``text`` not inside a word (``Bet`` is not in ``Beta`` or ``Alphabet``; a move
    that begins or ends with a bracket or a parenthesis may touch anything there), or -1."""
    at = text.rfind(move)
    while at >= 0:
        before, after = text[at - 1:at], text[at + len(move):at + len(move) + 1]
        if not (before.isalnum() and move[:1].isalnum()) and not (after.isalnum() and move[-1:].isalnum()):
            return at
        at = text.rfind(move, 0, at + len(move) - 1)
    return -1
