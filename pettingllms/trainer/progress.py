"""A progress bar over training steps that also prints one line per step (readable in CI logs). The same line
goes to train.log (``assembly/run_log.py``'s ``STEP_LOGGER``)."""

from __future__ import annotations

import logging
from typing import Mapping

from tqdm import tqdm

from pettingllms.assembly.run_log import STEP_LOGGER
from pettingllms.trainer.step_timing import step_line

HEADLINE = ("episode/success_rate", "episode/team_reward_mean")
NONFINITE = "nonfinite_rewards"  # dropped NaN/inf rewards (reward.non_finite=drop): shown whenever there are any
ERRORS = "error_ratio"  # episodes an error ended early (e.g. a history past max_prompt_length): shown when any
SHOWN_WHEN_ANY = {NONFINITE: ".0f", ERRORS: ".3f"}  # episode metrics on the line only when non-zero, and their format


class StepProgress:
    def __init__(self, total: int, done: int) -> None:
        self.bar = tqdm(total=total, initial=done, desc="train", unit="step", dynamic_ncols=True)

    def __enter__(self) -> "StepProgress":
        return self

    def advance(self, step: int, metrics: Mapping[str, float]) -> None:
        rewards = [v for k, v in metrics.items() if k.endswith("/reward_mean") and "/turn_" not in k
                   and not k.startswith("val/")]
        reward = sum(rewards) / len(rewards) if rewards else float("nan")
        parts = [f"step {step}/{self.bar.total}", f"reward {reward:.3f}"]
        parts += [f"{k.split('/')[-1]} {metrics[k]:.3f}" for k in HEADLINE if k in metrics]
        parts += [_seat_results(metrics, seat) for seat in _seats(metrics)]  # games: each seat's W/D/L
        if "self_play/vs_pool/win_rate" in metrics:  # the live seats against the pool's past versions
            rates = "/".join(f"{metrics[f'self_play/vs_pool/{name}_rate']:.2f}" for name in ("win", "draw", "loss"))
            parts.append(f"vs pool W/D/L {rates} ({metrics['self_play/vs_pool_share']:.0%} of games)")
        timing = step_line(metrics)  # the step's seconds and where they went
        if timing is not None:
            parts.append(timing)
        parts += [f"{name} {metrics[f'episode/{name}']:{fmt}}" for name, fmt in SHOWN_WHEN_ANY.items()
                  if metrics.get(f"episode/{name}")]
        val = [f"{k} {v:.3f}" for k, v in metrics.items() if k.startswith("val/") and k.endswith("success_rate")]
        val += [f"{k} {v:{fmt}}" for name, fmt in SHOWN_WHEN_ANY.items() for k, v in metrics.items()
                if k.startswith("val/") and k.count("/") == 2 and k.endswith(f"/{name}") and v]
        line = " | ".join(parts + val)
        tqdm.write(line)
        logging.getLogger(STEP_LOGGER).info(line)
        self.bar.set_postfix(reward=f"{reward:.3f}")
        self.bar.update(1)

    def __exit__(self, *exc) -> None:
        self.bar.close()


def _seats(metrics: Mapping[str, float]) -> list[str]:
    """The seats with results this step (``episode/<seat>/win_rate``, written for envs with an outcome)."""
    return [k.split("/")[1] for k in metrics if k.startswith("episode/") and k.endswith("/win_rate")]


def _seat_results(metrics: Mapping[str, float], seat: str) -> str:
    rates = "/".join(f"{metrics[f'episode/{seat}/{name}_rate']:.2f}" for name in ("win", "draw", "loss"))
    return f"{seat} W/D/L {rates}"
