"""PNG curves of a run from its summary.log: reward, success rate, episode length, response length, KL, and each
step's seconds stacked by part (``timing/*``: generation, env, update, sync, checkpoint, validation, other).

Training metrics are lines per step; validation metrics (``val/<benchmark>/...``, including the step-0 validation
before training) are points on the same panels. Per-agent panels draw one line per ``<policy>/<agent>``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from pettingllms.core import DataError
from pettingllms.trainer.run_dir import read_json_lines
from pettingllms.trainer.step_timing import BREAKDOWN_KEYS

_NAME = r"[^/]+"
_NOT_AGENT = r"(?!(?:val|episode|timing|data)/)"  # top-level namespaces that are not policies


def _per_agent(metric: str) -> tuple[str, str]:
    """Train and validation patterns of a ``<policy>/<agent>/<metric>`` key."""
    return (rf"^{_NOT_AGENT}{_NAME}/{_NAME}/{metric}$", rf"^val/{_NAME}/{_NAME}/{_NAME}/{metric}$")


def _team(metric: str) -> tuple[str, str]:
    """Train and validation patterns of an ``episode/<metric>`` key."""
    return (rf"^episode/{metric}$", rf"^val/{_NAME}/{metric}$")


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    train: str  # regex over summary keys: drawn as lines
    validation: str | None = None  # regex over summary keys: drawn as points
    stacked: bool = False  # the training keys are stacked bars per step in ``STACK_ORDER``, not lines
    optional: bool = False  # drawn only when the run has its keys (games' seats)


REWARD = Panel("reward per policy/agent", "mean reward", *_per_agent("reward_mean"))
SUCCESS = Panel("success rate", "fraction of episodes", *_team("success_rate"))
EPISODE_LENGTH = Panel("episode length", "turns", *_team("turns_mean"))
RESPONSE_LENGTH = Panel("response length per policy/agent", "tokens", *_per_agent("response_length_mean"))
# kl: to the reference model (0 without one); ppo_kl: between the updated weights and those that sampled the step.
KL = Panel("KL per policy", "KL", rf"^{_NOT_AGENT}{_NAME}/actor/(?:kl|ppo_kl)$")
# The parts of a step add up to timing/step_s, so their stack is the step's height.
STACK_ORDER = BREAKDOWN_KEYS
STEP_TIME = Panel("step time by part", "seconds", "^(?:" + "|".join(re.escape(k) for k in STACK_ORDER) + ")$",
                  stacked=True)
# Games: each seat's win rate (episode/<agent>/win_rate; val/<benchmark>/<agent>/win_rate), and with an opponent
# pool the live seats' win rate against its past versions (self_play/vs_pool/win_rate).
WIN_RATE = Panel("win rate per seat (games)", "fraction of games",
                 rf"^(?:episode/{_NAME}|self_play/vs_pool)/win_rate$", rf"^val/{_NAME}/{_NAME}/win_rate$", optional=True)
PANELS = (REWARD, SUCCESS, WIN_RATE, EPISODE_LENGTH, RESPONSE_LENGTH, KL, STEP_TIME)


MARKERS = ("o", "s", "^", "D", "v", "P")


def _identity(key: str) -> str:
    """What a curve measures, without its validation or episode prefix (``val/b/policy_0/a/x`` -> ``policy_0/a/x``)."""
    parts = key.split("/")
    if parts[0] == "val":
        parts = parts[2:]
    if parts[0] == "episode":
        parts = parts[1:]
    return "/".join(parts)


@dataclass
class PlotResult:
    path: Path
    panels: dict[str, list[str]] = field(default_factory=dict)  # panel title -> the summary keys drawn on it


def read_summary(run_dir: str | Path) -> list[dict]:
    """The rows of ``<run_dir>/summary.log``. A torn last line (a stopped run) is dropped with a warning."""
    run_dir = Path(run_dir)
    path = run_dir / "summary.log"
    if not path.is_file():
        found = sorted(p.parent for p in run_dir.glob("**/summary.log")) if run_dir.is_dir() else []
        hint = f"; run directories below it: {[str(p) for p in found[:5]]}" if found else ""
        raise DataError(
            f"{run_dir} has no summary.log: pass a run directory written by `pettingllms train` "
            f"(logs/<experiment_name>/<date>/<time>/){hint}"
        )
    rows = [row for row, _, _ in read_json_lines(path)]
    if not rows:
        raise DataError(f"{path} is empty: the run has not logged a step yet")
    return rows


def collect_series(rows: Iterable[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """key -> (steps, values), leaving out missing and non-finite values."""
    series: dict[str, tuple[list[int], list[float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key == "step" or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            steps, values = series.setdefault(key, ([], []))
            steps.append(int(row["step"]))
            values.append(float(value))
    return series


def panel_keys(keys: Iterable[str]) -> dict[str, tuple[list[str], list[str]]]:
    """Panel title -> (training keys, validation keys) among ``keys``, sorted (a stacked panel's in
    ``STACK_ORDER``)."""
    keys = sorted(keys)
    chosen = {}
    for p in PANELS:
        train = [k for k in keys if re.match(p.train, k)]
        if p.stacked:
            train.sort(key=STACK_ORDER.index)
        chosen[p.title] = (train, [k for k in keys if p.validation and re.match(p.validation, k)])
    return chosen


def stack_rows(series: dict[str, tuple[list[int], list[float]]],
               keys: list[str]) -> tuple[list[int], list[list[float]]]:
    """The steps any of ``keys`` has, and each key's values on them (0 where a step lacks it; a negative value,
    ``other_s`` when two parts overlapped, drawn as 0)."""
    steps = sorted({s for k in keys for s in series[k][0]})
    values = []
    for key in keys:
        at = dict(zip(*series[key]))
        values.append([max(at.get(s, 0.0), 0.0) for s in steps])
    return steps, values


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> PlotResult:
    """Draw the run's curves into ``out`` (default ``<run_dir>/curves.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    series = collect_series(read_summary(run_dir))
    chosen = panel_keys(series)
    out = Path(out) if out else run_dir / "curves.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = PlotResult(out)
    panels = [p for p in PANELS if not p.optional or any(chosen[p.title])]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3 * len(panels)), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    try:
        for ax, panel in zip(axes, panels):
            train, validation = chosen[panel.title]
            # A policy/agent keeps one colour for its training line and its validation points; benchmarks differ
            # by marker.
            identities = sorted({_identity(k) for k in train + validation})
            color = {i: colors[n % len(colors)] for n, i in enumerate(identities)}
            benchmarks = sorted({k.split("/")[1] for k in validation})
            if panel.stacked and train:
                steps, values = stack_rows(series, train)
                bottom = [0.0] * len(steps)
                for key, heights in zip(train, values):  # one bar per step, its parts stacked
                    ax.bar(steps, heights, bottom=bottom, width=0.8, color=color[_identity(key)], label=key)
                    bottom = [b + h for b, h in zip(bottom, heights)]
            for key in [] if panel.stacked else train:
                ax.plot(*series[key], "-", color=color[_identity(key)], label=key, linewidth=1.2)
            for key in validation:
                marker = MARKERS[benchmarks.index(key.split("/")[1]) % len(MARKERS)]
                ax.plot(*series[key], marker=marker, linestyle=":", color=color[_identity(key)], label=key,
                        markersize=6, linewidth=0.8)
            result.panels[panel.title] = train + validation
            ax.set_title(panel.title)
            ax.set_ylabel(panel.ylabel)
            ax.grid(alpha=0.3)
            if ax.lines or ax.containers:
                ax.legend(fontsize=7, loc="best")
            else:
                ax.text(0.5, 0.5, "no data in summary.log", ha="center", va="center", transform=ax.transAxes)
        axes[-1].set_xlabel("step")
        fig.suptitle(str(run_dir), fontsize=8)
        fig.tight_layout()
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return result
