"""Success after every action of an episode, by replaying its transcript through the env.

The executor records, per (turn, agent), the chosen response and its rewards, but only the *final* success of
an episode. Per-turn and per-agent success need ``env.success`` of the state after each applied action. The
env API makes a replay exact: ``reset`` is the only source of randomness and ``step`` is a pure function of
(state, agent, action), and the agents' ``parse`` never fails. The replay applies the chosen actions in
transcript order, which is the order the executor applied them (a stage's first agent, then the others),
and stops where the executor stopped (a terminated or truncated state, or a failed generation).

Built-in envs cache sandbox runs by program, so a replay re-runs no program. A replay whose final success
disagrees with the recorded one (an env that breaks the purity contract) is reported as None, never guessed.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from pettingllms.core import Agent, Env, EpisodeRecord, Problem

log = logging.getLogger("pettingllms.eval")


def success_trace(
    env: Env, agents: Mapping[str, Agent], problem: Problem, seed: int, episode: EpisodeRecord
) -> list[bool] | None:
    """``env.success`` after each transcript entry, in order (entries without a response end the replay).

    Returns None when the replay cannot reproduce the recorded final success.
    """
    try:
        state = env.reset(problem, seed)
        after: list[bool] = []
        for entry in episode.transcript:
            if entry.get("response") is None:
                break
            agent = entry["agent"]
            transition = env.step(state, agent, agents[agent].parse(entry["response"]))
            state = transition.state
            after.append(bool(env.success(state)))
            if transition.terminated or transition.truncated:
                break
        final = bool(env.success(state))
    except Exception as exc:  # an env that fails on its own recorded actions: report, never guess
        log.warning("replay of episode %s (problem %s) failed: %r", episode.episode, problem.problem_id, exc)
        return None
    if final != episode.success:
        log.warning("replay of episode %s (problem %s) ends with success=%s but the rollout recorded %s; "
                    "the env's step is not a pure function of (state, action)", episode.episode,
                    problem.problem_id, final, episode.success)
        return None
    return after


def success_by_turn(transcript: Sequence[Mapping[str, Any]], trace: Sequence[bool], max_turns: int) -> list[bool]:
    """Success at the end of each turn 0..max_turns-1; an episode that stopped early keeps its last state.

    transcript[i] is the entry whose action produced trace[i]; entries beyond the trace were never applied.
    """
    last_of_turn: dict[int, bool] = {}
    for entry, success in zip(transcript, trace):
        last_of_turn[int(entry["turn"])] = success
    out, current = [], False
    for turn in range(max_turns):
        current = last_of_turn.get(turn, current)
        out.append(current)
    return out
