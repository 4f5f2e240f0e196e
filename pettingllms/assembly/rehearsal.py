"""The rehearsal's run: a config's models swapped for tiny replicas of them, on CPU, lengths and budget capped.

``pettingllms train --rehearse`` (``entry/rehearse.py``) trains this after placing the config as it is.
"""

from __future__ import annotations

from pathlib import Path

from pettingllms.core import ConfigError

RESPONSE_TOKENS = 8  # every agent's max_tokens in the rehearsal's steps


def replica_of(path: str) -> str:
    """The tiny replica alias of the model a config names, or a ConfigError naming the models that have one."""
    from pettingllms.models.replicas import known_models, recorded_facts, tiny_alias
    from pettingllms.models.resolve import ALIASES

    if path in ALIASES:  # already a built-in (the packaged SmolLM2, a tiny model or a replica)
        return path
    if recorded_facts(path) is None:
        raise ConfigError(f"no replica of {path!r} to rehearse with: recorded models are {known_models()} "
                          "(pettingllms/models/facts/); add its facts there, or rehearse with one of them")
    return tiny_alias(path)


def step_overrides(cfg, engine: str, run_dir: Path) -> tuple[list[str], list[str]]:
    """(overrides for the rehearsal's steps, what they change, in words)."""
    from pettingllms.config.schema import Specialization

    overrides, changes = [], []
    level = cfg.specialization
    ranks = 1 if level == Specialization.L3 else 2
    context = cfg.training.max_prompt_length + RESPONSE_TOKENS + 8
    for name, model in cfg.base_models.items():
        replica = replica_of(model.path)
        key = f"base_models.{name}"
        overrides += [f"{key}.path={replica}", f"{key}.num_gpus=0", f"{key}.num_ranks={ranks}",
                      f"{key}.fsdp.enabled={'true' if ranks > 1 else 'false'}", f"{key}.dtype=float32",
                      f"{key}.engine={engine}", f"{key}.num_threads=1", f"{key}.cpus_per_rank=0.5"]
        if engine == "vllm":
            overrides.append(f"+{key}.engine_options={{max_model_len:{context},"
                             "llm_options:{enforce_eager:true,block_size:32}}")
        changes.append(f"{name}: {model.path} -> {replica} (tiny replica), {ranks} gloo rank(s), {engine} engine, "
                       "float32 on CPU")
    overrides += [
        "resources.gpus_per_policy=0", f"training.max_response_length={RESPONSE_TOKENS}",
        "training.train_batch_size=2", "rollout.branching=2", f"env.max_turns={min(cfg.env.max_turns or 2, 2)}",
        "training.total_training_steps=2", "training.save_freq=1", "training.val_before_train=false",
        "training.val_freq=0", "training.export_hf=false", "training.plot=false", "training.logger=[console]",
        f"training.log_dir={run_dir}", "training.resume=none", "training.stop_after_steps=1",
    ]
    changes.append(f"lengths and budget capped: {RESPONSE_TOKENS} response tokens, 2 problems x 2 branches, "
                   f"{min(cfg.env.max_turns or 2, 2)} turn(s), 2 steps (1, checkpoint, resume, 2)")
    return overrides, changes
