"""Metrics from a step's samples and episodes. Pure functions.

Key scheme (the trainer adds the policy-level and validation prefixes around these):
- ``<policy>/<agent>/<metric>``: everything measured per agent (rewards, lengths, returns, per-turn rewards, and
  ``info/<name>_mean`` for each numeric value the env put in ``Transition.info``);
- ``episode/<metric>``: team-level outcomes of the step's episodes (success, turns), which belong to no agent;
- ``episode/<agent>/{win,draw,loss}_rate`` and ``outcome_mean``: per-seat results of envs with an outcome (games):
  a positive outcome is a win, zero a draw, negative a loss;
- ``<policy>/actor/...`` and ``<policy>/grpo/...``: one policy's update and grouping (added by the trainer);
- ``val/<benchmark>/`` + any of the above: the same metrics on a validation benchmark.
"""

from __future__ import annotations

import math
from collections import defaultdict
from statistics import fmean
from typing import Iterable, Mapping, Sequence

from pettingllms.core import EpisodeRecord, Sample
from pettingllms.rollout.executor import WHOLE_EPISODE


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return fmean(values) if values else 0.0


def sample_metrics(samples: Sequence[Sample],
                   outcomes: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, float]:
    """Reward, length and failure statistics per policy/agent and per policy/agent/turn.

    ``episode_return_mean`` is the agent's return in each episode, averaged over the episodes of ``samples``; an
    episode where the agent never acted counts 0 (the same quantity as ``EpisodeRecord.agent_rewards``, but
    namespaced by the agent's policy): its immediate rewards (team + local) along the continued path (the chosen
    branch of every node), plus its entry of the episode's outcome (``outcomes``: episode id -> the game's result
    per agent, ``EpisodeRecord.outcomes``) once. A tree or independent sample's ``reward`` carries an outcome on
    every move (its playouts' mean, or its episode's result), so summing rewards would count a game's result once a
    move. In trajectory mode every sample of an agent carries the episode's whole return, which is counted once.
    """
    outcomes = outcomes or {}
    by_agent: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    by_turn: dict[tuple[str, str, int], list[Sample]] = defaultdict(list)
    episodes = {s.episode for s in samples}
    for s in samples:
        by_agent[(s.policy, s.agent)].append(s)
        by_turn[(s.policy, s.agent, s.turn)].append(s)
    out: dict[str, float] = {}
    for (policy, agent), rows in sorted(by_agent.items()):
        key = f"{policy}/{agent}"
        ok = [s for s in rows if s.has_reward]
        if ok:  # an agent whose every reward was dropped (failed, non-finite) has no mean: never a measured 0
            out[f"{key}/reward_mean"] = _mean(s.reward for s in ok)
            out[f"{key}/team_reward_mean"] = _mean(s.team_reward for s in ok)
            out[f"{key}/local_reward_mean"] = _mean(s.local_reward for s in ok)
        out[f"{key}/response_length_mean"] = _mean(len(s.response_ids) for s in rows)
        out[f"{key}/prompt_length_mean"] = _mean(len(s.prompt_ids) for s in rows)
        out[f"{key}/response_clip_ratio"] = _mean(float(s.truncated) for s in rows)
        out[f"{key}/failed_ratio"] = _mean(float(s.failed) for s in rows)
        out[f"{key}/nonfinite_rewards"] = float(sum(s.nonfinite_reward for s in rows))
        out[f"{key}/samples"] = float(len(rows))
        returns: dict[str, float] = {}
        for s in ok:
            if s.group[1] == WHOLE_EPISODE:  # trajectory mode: every sample carries the whole return; count it once
                returns[s.episode] = s.reward
            elif s.chosen:
                if s.episode not in returns:  # the game's result, once per episode the agent acted in
                    returns[s.episode] = outcomes.get(s.episode, {}).get(agent, 0.0)
                returns[s.episode] += s.team_reward + s.local_reward
        out[f"{key}/episode_return_mean"] = _mean(returns.get(e, 0.0) for e in episodes)
        out.update(info_metrics(ok, f"{key}/info"))
    for (policy, agent, turn), rows in sorted(by_turn.items()):
        if any(s.has_reward for s in rows):
            out[f"{policy}/{agent}/turn_{turn}/reward_mean"] = _mean(s.reward for s in rows if s.has_reward)
    return out


def info_metrics(samples: Sequence[Sample], prefix: str) -> dict[str, float]:
    """The mean of every numeric ``Transition.info`` value the env reported (e.g. code's ``pass_rate``) over the
    samples that have it, as ``<prefix>/<name>_mean``. Non-numeric values (labels, answers) stay in the records."""
    values: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        for name, value in s.info.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                values[name].append(float(value))
    return {f"{prefix}/{name}_mean": _mean(v) for name, v in sorted(values.items())}


def episode_metrics(episodes: Sequence[EpisodeRecord], prefix: str = "episode") -> dict[str, float]:
    """Team-level outcomes. Per-agent returns are in ``sample_metrics`` (``<policy>/<agent>/episode_return_mean``),
    which knows each agent's policy."""
    if not episodes:
        return {}
    return {
        f"{prefix}/success_rate": _mean(float(e.success) for e in episodes),
        f"{prefix}/turns_mean": _mean(e.turns for e in episodes),
        f"{prefix}/team_reward_mean": _mean(e.team_reward for e in episodes),
        f"{prefix}/terminated_ratio": _mean(float(e.terminated) for e in episodes),
        f"{prefix}/error_ratio": _mean(float(e.error is not None) for e in episodes),
        f"{prefix}/nonfinite_rewards": float(sum(e.nonfinite_rewards for e in episodes)),
        **seat_results(episodes, prefix),
    }


def seat_results(episodes: Sequence[EpisodeRecord], prefix: str = "episode") -> dict[str, float]:
    """Per seat, over the episodes whose env reported an outcome: ``<prefix>/<agent>/win_rate`` (outcome > 0),
    ``draw_rate`` (= 0), ``loss_rate`` (< 0) and ``outcome_mean``. Empty for envs without outcomes."""
    by_agent: dict[str, list[float]] = defaultdict(list)
    for e in episodes:
        for agent, value in e.outcomes.items():
            by_agent[agent].append(value)
    out: dict[str, float] = {}
    for agent, values in sorted(by_agent.items()):
        out[f"{prefix}/{agent}/win_rate"] = _mean(float(v > 0) for v in values)
        out[f"{prefix}/{agent}/draw_rate"] = _mean(float(v == 0) for v in values)
        out[f"{prefix}/{agent}/loss_rate"] = _mean(float(v < 0) for v in values)
        out[f"{prefix}/{agent}/outcome_mean"] = _mean(values)
    return out


def pool_metrics(episodes: Sequence[EpisodeRecord], filled: int) -> dict[str, float]:
    """The opponent pool's step (``self_play.*``): ``self_play/pool_filled`` (slots holding a past version),
    ``self_play/vs_pool_share`` (episodes played against one), and the live seats' results in those episodes
    (``self_play/vs_pool/win_rate``, ``draw_rate``, ``loss_rate``: the current policy against its past versions)."""
    against = [e for e in episodes if e.opponents]
    out = {"self_play/pool_filled": float(filled),
           "self_play/vs_pool_share": _mean(float(bool(e.opponents)) for e in episodes) if episodes else 0.0}
    live = [value for e in against for agent, value in e.outcomes.items() if agent not in e.opponents]
    if live:
        out["self_play/vs_pool/win_rate"] = _mean(float(v > 0) for v in live)
        out["self_play/vs_pool/draw_rate"] = _mean(float(v == 0) for v in live)
        out["self_play/vs_pool/loss_rate"] = _mean(float(v < 0) for v in live)
    return out


def episode_errors(episodes: Sequence[EpisodeRecord]) -> str | None:
    """One line on the episodes an error ended early, or None. Such an episode is kept (its turns before the error
    train), so without this line a config that cuts episodes short, such as a ``training.max_prompt_length`` the
    second turn's history outgrows, would show only as ``error_ratio`` in the summary (0.84 in such a run)."""
    failed = [e for e in episodes if e.error is not None]
    if not failed:
        return None
    return f"{len(failed)} of {len(episodes)} episodes ended early on an error; the first: {failed[0].error}"


def prefixed(prefix: str, metrics: Mapping[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": float(v) for k, v in metrics.items()}
