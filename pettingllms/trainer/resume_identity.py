"""What a resumed run may change, and what makes it another run. Pure functions over config dicts.

A checkpoint holds weights, adapters and optimizer state shaped by the run's models, levels and agents: a start whose
config changes those cannot load it (``STRUCTURE``: refused, whichever way the checkpoint was found). A start that
changes the task (``TASK``: the env, its options, its graph) could load it, but is another experiment: ``resume=auto``
finding such a run refuses to continue it (two programs or games under the default experiment name would otherwise
train one model); naming the checkpoint (``training.resume=<step dir>``) continues it on the new task on purpose.
Every other change is reported and applied from the next step on.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Mapping

from pettingllms.config.diff import changed_keys, describe_changes

RESUME_NEUTRAL_KEYS = ("resume", "stop_after_steps")  # training.*: may differ between a run and its resumption
STRUCTURE = ("specialization", "base_models.*.path", "base_models.*.lora.rank", "base_models.*.lora.target_modules",
             "agents.*.policy", "agents.*.trainable", "env.agents")
TASK = ("env.name", "env.options", "env.options.*", "env.graph", "env.graph.*")


def comparable(values: Mapping[str, Any]) -> dict[str, Any]:
    """A config's values without the keys a resumption may change freely (``RESUME_NEUTRAL_KEYS``)."""
    training = {k: v for k, v in values.get("training", {}).items() if k not in RESUME_NEUTRAL_KEYS}
    return {**values, "training": training}


def _matching(changes: list[tuple[str, Any, Any]], patterns: tuple[str, ...]) -> list[tuple[str, Any, Any]]:
    return [c for c in changes if any(fnmatchcase(c[0], p) for p in patterns)]


def resume_refusal(old: Mapping[str, Any], new: Mapping[str, Any], checkpoint: Path, auto: bool) -> str | None:
    """Why this start (config ``new``) must not continue ``checkpoint`` (written with config ``old``), or None.
    ``auto``: the checkpoint was found by ``training.resume=auto``, not named."""
    changes = changed_keys(comparable(old), comparable(new))
    fresh = "start afresh with training.resume=none or another training.experiment_name"
    structure = _matching(changes, STRUCTURE)
    if structure:
        return (f"cannot resume {checkpoint}: it holds weights, adapters and optimizer state for other models, levels "
                f"or agents ({describe_changes(structure)}); {fresh}, or resume with the checkpoint's values")
    task = _matching(changes, TASK)
    if task and auto:
        return (f"training.resume=auto found {checkpoint}, a run of another task ({describe_changes(task)}); {fresh}. "
                f"To continue its weights on this task on purpose, name it: training.resume={checkpoint}")
    return None


def check_resume(checkpoint: Path, config: Mapping[str, Any], auto: bool) -> dict[str, Any]:
    """Refuse (ConfigError) a start with ``config`` that must not continue ``checkpoint`` (``resume_refusal``), or
    that has nothing left to train (the checkpoint is at or past ``training.total_training_steps``); its files are
    checked first, as a resume checks them. A checkpoint that records no config is left to the resume. Returns the
    checkpoint's trainer state, which the resume then loads."""
    from pettingllms.core import ConfigError
    from pettingllms.runtime import checkpoints as ckpt

    ckpt.check_checkpoint(checkpoint)
    state = ckpt.read_trainer_state(checkpoint)
    old = state.get("config")
    refusal = resume_refusal(old, config, checkpoint, auto) if old is not None else None
    if refusal is not None:
        raise ConfigError(refusal)
    total = int(config.get("training", {}).get("total_training_steps", 0))
    if int(state["step"]) >= total:  # a rerun of a finished command would train nothing and exit 0
        raise ConfigError(f"{checkpoint} is step {int(state['step'])} of a run that has trained its "
                          f"training.total_training_steps={total}: nothing is left to train. Raise "
                          f"training.total_training_steps to continue it, or start afresh with training.resume=none or "
                          f"another training.experiment_name (its Hugging Face folders: pettingllms export {checkpoint})")
    return state
