"""Per-problem evaluation records and the benchmark summary computed from them. Pure functions over plain data.

A problem record (one JSONL line) holds its n samples; a sample is one independent episode with its steps
(prompt messages, response, rewards, and success after the step). The summary is computed from the records
alone, so anyone can recompute it from the JSONL files.

Definitions (docs/evaluation.md):
- pass@k: the unbiased estimator over each problem's n samples (``passk.pass_at_k``), averaged over problems;
- success_by_turn[t]: the fraction of samples whose state is solved at the end of turn t (an episode that
  stopped earlier keeps its final state), so the last value is the success rate;
- per agent: ``success_after_action`` is the fraction of the agent's applied actions after which the state was
  solved; rewards are those of its chosen responses, per step; ``return_mean`` is its return per episode (its
  steps' rewards plus, in a game, its result); token counts are of its responses.
"""

from __future__ import annotations

import math

from collections import defaultdict
from statistics import fmean
from typing import Any, Iterable, Mapping, Sequence

from pettingllms.core import EpisodeRecord, Sample
from pettingllms.eval.passk import mean_pass_at_k, pass_at_k
from pettingllms.eval.trace import success_by_turn


def sample_record(
    episode: EpisodeRecord, samples: Sequence[Sample], trace: Sequence[bool] | None, max_turns: int
) -> dict[str, Any]:
    """One sample (independent episode): outcome, and every step with its prompt, response and rewards.

    samples: the executor's samples of this episode (one per step), for token counts and failure flags.
    trace: success after each applied step (``trace.success_trace``), or None if it could not be replayed.
    """
    by_node: dict[tuple[int, str], list[Sample]] = defaultdict(list)
    for s in samples:
        by_node[(s.turn, s.agent)].append(s)
    steps = []
    for i, entry in enumerate(episode.transcript):
        node = by_node.get((int(entry["turn"]), entry["agent"]))
        sample = node.pop(0) if node else None
        steps.append({
            "turn": int(entry["turn"]),
            "agent": entry["agent"],
            "prompt": entry["prompt"],
            "response": entry["response"],
            "reward": entry["reward"],
            "team_reward": entry["team_reward"],
            "local_reward": entry["local_reward"],
            "response_tokens": len(sample.response_ids) if sample else 0,
            "truncated": bool(sample.truncated) if sample else False,
            "failed": bool(sample.failed) if sample else entry["response"] is None,
            "applied": trace is not None and i < len(trace),
            "success_after": trace[i] if trace is not None and i < len(trace) else None,
        })
    return {
        "episode": episode.episode,
        "success": bool(episode.success),
        "team_reward": float(episode.team_reward),
        "agent_rewards": dict(episode.agent_rewards),
        "turns": int(episode.turns),
        "terminated": bool(episode.terminated),
        "truncated": bool(episode.truncated),
        "error": episode.error,
        "success_by_turn": None if trace is None else success_by_turn(episode.transcript, trace, max_turns),
        "outcomes": dict(episode.outcomes),  # games: each seat's result (Env.outcome of the final state)
        "steps": steps,
    }


def problem_record(benchmark: str, problem_id: str, samples: Sequence[Mapping[str, Any]],
                   ks: Sequence[int]) -> dict[str, Any]:
    """One JSONL line: a problem's samples and its own pass@k values."""
    n, c = len(samples), sum(bool(s["success"]) for s in samples)
    return {
        "benchmark": benchmark,
        "problem_id": problem_id,
        "n": n,
        "num_success": c,
        "pass_at_k": {str(k): pass_at_k(n, c, k) for k in ks},
        "samples": list(samples),
    }


def benchmark_summary(records: Sequence[Mapping[str, Any]], ks: Sequence[int], max_turns: int) -> dict[str, Any]:
    """The benchmark's headline numbers, per-turn and per-agent success, from its problem records."""
    samples = [s for r in records for s in r["samples"]]
    steps = [step for s in samples for step in s["steps"]]
    traced = [s["success_by_turn"] for s in samples if s["success_by_turn"] is not None]
    summary: dict[str, Any] = {
        "problems": len(records),
        "samples": len(samples),
        **{f"pass@{k}": mean_pass_at_k(((r["n"], r["num_success"]) for r in records), k) for k in ks},
        "success_rate": _mean(float(s["success"]) for s in samples),
        "team_reward_mean": _mean(s["team_reward"] for s in samples),
        "turns_mean": _mean(s["turns"] for s in samples),
        "error_ratio": _mean(float(s["error"] is not None) for s in samples),
        "failed_generation_ratio": _mean(float(step["failed"]) for step in steps),
        "response_clip_ratio": _mean(float(step["truncated"]) for step in steps),
        "replayed_samples": len(traced),
        "success_by_turn": {str(t): _mean(float(row[t]) for row in traced) for t in range(max_turns)} if traced else {},
        "agents": agent_summary(steps, samples),
    }
    seats = seat_summary(s.get("outcomes") or {} for s in samples)
    if seats:
        summary["seats"] = seats
    return summary


def seat_summary(outcomes: Iterable[Mapping[str, float]]) -> dict[str, dict[str, Any]]:
    """Games: per seat, the games it has a result in, its win (> 0), draw (= 0) and loss (< 0) rates, each with a
    95% Wilson interval ``[low, high]``, and its mean outcome."""
    by_seat: dict[str, list[float]] = defaultdict(list)
    for row in outcomes:
        for seat, value in row.items():
            by_seat[seat].append(float(value))
    out: dict[str, dict[str, Any]] = {}
    for seat, values in sorted(by_seat.items()):
        n = len(values)
        entry: dict[str, Any] = {"games": n}
        for name, count in (("win", sum(v > 0 for v in values)), ("draw", sum(v == 0 for v in values)),
                            ("loss", sum(v < 0 for v in values))):
            entry[f"{name}_rate"] = count / n
            entry[f"{name}_ci95"] = list(wilson_interval(count, n))
        entry["outcome_mean"] = fmean(values)
        out[seat] = entry
    return out


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% for the default ``z``); (0, 1) when ``n`` is 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def agent_summary(steps: Iterable[Mapping[str, Any]],
                  samples: Iterable[Mapping[str, Any]] = ()) -> dict[str, dict[str, float | None]]:
    """Per agent: its actions, success after them, its steps' mean rewards and tokens, and ``return_mean``: its
    return per episode it acted in (``agent_rewards``: its steps' rewards plus a game's result), from ``samples``."""
    by_agent: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for step in steps:
        by_agent[step["agent"]].append(step)
    returns: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        for agent, value in (sample.get("agent_rewards") or {}).items():
            returns[agent].append(value)
    out = {}
    for agent, rows in sorted(by_agent.items()):
        ok = [r for r in rows if not r["failed"]]
        applied = [r for r in rows if r["applied"]]
        out[agent] = {
            "actions": float(len(rows)),
            "success_after_action": _mean(float(r["success_after"]) for r in applied),
            "reward_mean": _mean(r["reward"] for r in ok),
            "local_reward_mean": _mean(r["local_reward"] for r in ok),
            "return_mean": _mean(returns.get(agent, ())),
            "response_tokens_mean": _mean(r["response_tokens"] for r in rows),
            "failed_ratio": _mean(float(r["failed"]) for r in rows),
        }
    return out


def _mean(values: Iterable[float]) -> float | None:
    """Mean of the values; None (not 0) when there are none, so an empty set never reads as a measured 0."""
    values = [float(v) for v in values if v is not None]
    return fmean(values) if values else None
