"""Metric sinks, chosen by ``training.logger``.

- ``summary.log`` in the run directory: always written, one JSON line per step; plots and comparisons read it.
- ``console``: always on. The trainer's progress bar prints one line per step (``trainer/progress.py``); the name
  is accepted in ``training.logger`` so that configs written for the reference (``[console,wandb]``) keep working.
- ``tensorboard``: event files under ``<run_dir>/tensorboard`` (``tensorboard --logdir logs``).
- ``wandb``: Weights & Biases. With ``WANDB_MODE=offline`` the run is written under ``<run_dir>/wandb`` and
  nothing touches the network; upload it later with ``wandb sync <run_dir>/wandb/offline-run-*``. A resumed
  training run continues its W&B run (the id is kept in ``<run_dir>/wandb_run_id``).

TensorBoard and W&B come with the ``trackers`` extra: ``pip install -e '.[trackers]'``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import uuid
from pathlib import Path
from typing import Mapping, Protocol, Sequence

from pettingllms.core.atomic import append_whole
from pettingllms.core.choices import Tracker
from pettingllms.core import ConfigError

BACKENDS = Tracker.values()
BACKEND_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # backend -> the package it imports


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class SummaryFile:
    """``summary.log``: one JSON line per step, the record every plot and comparison reads."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "summary.log"

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in sorted(metrics.items())}}
        append_whole(self.path, json.dumps(row) + "\n")  # a full disk: a DiskFullError, and no torn line

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """Scalars under their metric keys (TensorBoard groups the charts by the first path component: the policy)."""

    def __init__(self, run_dir: Path, config: Mapping | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(run_dir) / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        if config:
            # The resolved config, readable in TensorBoard's TEXT tab (markdown: indent by four spaces = code).
            text = json.dumps(config, indent=2, sort_keys=True, default=str)
            self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, float(value), step)
        self.writer.flush()  # a crashed run still leaves every logged step on disk

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """One W&B run per training run, with the resolved config. ``WANDB_MODE=offline`` works without a network.

    The run id is kept in ``<run_dir>/wandb_run_id``: a resumed training run (same run directory) continues the
    same W&B run (``resume="allow"``) instead of starting a new one."""

    def __init__(self, run_dir: Path, project: str, name: str, config: Mapping) -> None:
        import wandb

        self.run_id = wandb_run_id(run_dir)
        try:
            # finish_previous: a sweep runs several trainings in one process, each with its own W&B run.
            self.run = wandb.init(project=project, name=name, dir=str(run_dir), config=dict(config),
                                  id=self.run_id, resume="allow", reinit="finish_previous")
        except Exception as exc:  # wandb raises its own error types (UsageError, CommError, ...)
            raise ConfigError(
                f"could not start Weights & Biases for training.logger=wandb: {exc}. Without a network or an "
                "account, set WANDB_MODE=offline (the run is kept under <run_dir>/wandb; `wandb sync` uploads it "
                "later); otherwise run `wandb login`, or drop wandb from training.logger"
            ) from exc

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


WANDB_ID_FILE = "wandb_run_id"


def wandb_run_id(run_dir: Path) -> str:
    """The W&B run id of this run directory: the stored one, else a new one, stored before the run starts."""
    path = Path(run_dir) / WANDB_ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:16]  # W&B ids: letters and digits
    path.write_text(run_id + "\n")
    return run_id


def check_backends(backends: Sequence[str]) -> None:
    """Raise ConfigError for an unknown backend name or a backend whose package is not installed."""
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ConfigError(f"training.logger has unknown backend(s) {unknown}; choose from {list(BACKENDS)}")
    for backend in backends:
        package = BACKEND_PACKAGES.get(backend)
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"training.logger includes {backend!r} but the {package} package is not installed: "
                "pip install -e '.[trackers]' (or drop it from training.logger)"
            )


def make_trackers(backends: Sequence[str], run_dir: Path, project: str, name: str, config: Mapping) -> list[Tracker]:
    """summary.log first (always), then the optional backends in a fixed order."""
    check_backends(backends)
    trackers: list[Tracker] = [SummaryFile(run_dir)]
    try:
        if "tensorboard" in backends:
            trackers.append(TensorBoardTracker(run_dir, config))
        if "wandb" in backends:
            trackers.append(WandbTracker(run_dir, project, name, config))
    except BaseException:
        for tracker in trackers:  # a backend failed to start: close the ones already open
            tracker.close()
        raise
    return trackers


def _jsonable(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
