"""Trainer checkpoints as evaluation input.

A run directory (``logs/<experiment>/<date>/<time>``) holds the run's ``config.yaml`` and
``checkpoints/step_N/policies/<policy>/`` (the format is ``runtime/checkpoints.py``'s, read only through it). The
run's config gives the evaluation its defaults (``eval/run_settings.py``): every agent gets the policy and LoRA
adapter it was trained with, on the run's env and held-out set. Weights come from the learner's DCP shards, whatever
the number of ranks that wrote them (full weights, or the adapters under LoRA); no optimiser is built.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pettingllms.config.load import to_schema
from pettingllms.config.schema import Config
from pettingllms.core import ConfigError
from pettingllms.runtime import checkpoints as ckpt

log = logging.getLogger("pettingllms.eval")
RUN_CONFIG = "config.yaml"


def resolve_checkpoint(spec: str, key: str = "model.checkpoint") -> tuple[Path, Path]:
    """(checkpoint dir, run dir) for a run directory (its latest checkpoint) or a ``checkpoints/step_N`` dir, named
    by the setting ``key``."""
    path = Path(spec).expanduser()
    if (path / ckpt.STATE_FILE).is_file():
        ckpt.check_checkpoint(path)
        return path, path.parents[1]
    if (path / "checkpoints").is_dir():
        latest = ckpt.latest_checkpoint(path / "checkpoints")
        if latest is None:
            raise ConfigError(f"{key}={spec!r}: {path / 'checkpoints'} has no complete checkpoint "
                              f"(no '{ckpt.LATEST}' pointer to a step directory)")
        ckpt.check_checkpoint(latest)
        return latest, path
    raise ConfigError(f"{key}={spec!r} is neither a trainer run directory (with checkpoints/) nor a "
                      f"checkpoints/step_N directory (with {ckpt.STATE_FILE})")


def read_run_config(run_dir: Path) -> Config:
    """The training config a run was started with."""
    path = run_dir / RUN_CONFIG
    if not path.is_file():
        raise ConfigError(f"run directory {run_dir} has no {RUN_CONFIG}; cannot tell which model it trained")
    try:
        return to_schema(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path)))
    except (OmegaConfBaseException, ConfigError) as exc:
        raise ConfigError(f"{path} does not match this version's config schema: {exc}") from exc


def load_policy_weights(model: torch.nn.Module, checkpoint: Path, policy: str, adapters: tuple[str, ...]) -> str:
    """Copy a policy's trained weights from the checkpoint into ``model``; returns a one-line description.

    ``model`` must be built like the trainer built it (same base, same LoRA adapters).
    """
    folder = ckpt.policy_dir(checkpoint, policy)
    if not folder.is_dir():
        found = sorted(p.name for p in folder.parent.iterdir()) if folder.parent.is_dir() else []
        raise ConfigError(f"checkpoint {checkpoint} has no state for policy {policy!r} (expected {folder}); "
                          f"it has policies {found}")
    loaded = ckpt.load_trained_weights(model, folder, policy, adapters)
    if loaded is None:
        log.info("policy %s was not trained in this run (no learner state): evaluating its base weights", policy)
        return "base weights (the policy was not trained)"
    suffix = f", adapters {list(adapters)}" if adapters else ""
    return f"trained weights from {checkpoint} (learner step {loaded['step']}){suffix}"

