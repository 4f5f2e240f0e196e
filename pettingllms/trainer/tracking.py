"""Metric sinks: summary.log (always), console, TensorBoard and Weights & Biases (optional, by config)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping, Protocol, Sequence

from pettingllms.core import ConfigError

BACKENDS = ("console", "tensorboard", "wandb")


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class SummaryFile:
    """``summary.log``: one JSON line per step, the record every plot and comparison reads."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "summary.log"

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in sorted(metrics.items())}}
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")

    def close(self) -> None:
        pass


class TensorBoardTracker:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """Set WANDB_MODE=offline to log without a network; sync later with ``wandb sync``."""

    def __init__(self, run_dir: Path, project: str, name: str, config: Mapping) -> None:
        import wandb

        self.run = wandb.init(project=project, name=name, dir=str(run_dir), config=dict(config), reinit=True)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


def make_trackers(backends: Sequence[str], run_dir: Path, project: str, name: str, config: Mapping) -> list[Tracker]:
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        raise ConfigError(f"training.logger has unknown backends {unknown}; choose from {list(BACKENDS)}")
    trackers: list[Tracker] = [SummaryFile(run_dir)]
    if "tensorboard" in backends:
        trackers.append(TensorBoardTracker(run_dir))
    if "wandb" in backends:
        trackers.append(WandbTracker(run_dir, project, name, config))
    return trackers


def _jsonable(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
