"""The valid range of every numeric config key, in one table, checked as the config is composed (``to_schema``).

A value out of range fails at start-up (and in ``--dry-run``) naming the key, the value and the reason, e.g.
``training.train_batch_size=0: must be >= 1 (problems per step)``, instead of running as a silent no-op or failing
deep inside a worker. Keys are the dotted schema keys; entries of ``base_models`` and ``agents`` are written
``base_models.<name>.lora.rank``. ``tests/config/test_ranges.py`` checks that every numeric schema field has a row,
so a new numeric key cannot be added without its range. The learner, executor and layout keep their own checks as
internal asserts; this table is where a user's value is judged.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, Iterator

from pettingllms.config.keys import config_keys
from pettingllms.core.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """``low <= value <= high`` (``<`` where open); ``off`` allows exactly 0 outside the range (0 = off)."""

    low: float | None = None
    high: float | None = None
    why: str = ""
    low_open: bool = False
    high_open: bool = False
    off: bool = False

    def allows(self, value: float) -> bool:
        if self.off and value == 0:
            return True
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return False
        return True

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            bound = f"in {left}{self.low:g}, {self.high:g}{right}"
        elif self.low is not None:
            bound = f"{'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            bound = f"{'<' if self.high_open else '<='} {self.high:g}"
        else:
            bound = "a finite number"
        return f"must be {'0 (off) or ' if self.off else ''}{bound}" + (f" ({self.why})" if self.why else "")


def at_least(low: float, why: str = "", **kw: Any) -> Range:
    return Range(low=low, why=why, **kw)


def above(low: float, why: str = "", **kw: Any) -> Range:
    return Range(low=low, low_open=True, why=why, **kw)


def within(low: float, high: float, why: str = "", **kw: Any) -> Range:
    return Range(low=low, high=high, why=why, **kw)


_SAMPLING = {
    "temperature": at_least(0, "0 = greedy"),
    "top_p": Range(0, 1, "nucleus mass; 1 = off", low_open=True),
    "top_k": at_least(0, "0 = off"),
    "max_tokens": at_least(1, "tokens per response"),
}

RANGES: dict[str, Range] = {
    # base_models.<name>
    "base_models.<name>.lora.rank": at_least(0, "0 = full fine-tuning"),
    "base_models.<name>.lora.alpha": above(0, "LoRA scaling is alpha / rank"),
    "base_models.<name>.lora.dropout": Range(0, 1, "a probability", high_open=True),
    "base_models.<name>.num_gpus": at_least(0, "0 = CPU, below 1 = a share of one GPU"),
    "base_models.<name>.tensor_parallel": at_least(1, "GPUs per vLLM engine"),
    "base_models.<name>.num_ranks": at_least(0, "0 = one per GPU, or 1 on CPU"),
    "base_models.<name>.num_threads": at_least(0, "0 = share the CPU budget"),
    "base_models.<name>.cpus_per_rank": at_least(0, "0 = automatic"),
    # agents.<name>
    **{f"agents.<name>.{which}.{key}": r for which in ("train_sampling", "val_sampling") for key, r in _SAMPLING.items()},
    "agents.<name>.server.timeout_s": above(0, "seconds per request, in total"),
    "agents.<name>.server.max_retries": within(0, 100, "retries per request"),
    # env, rollout, reward
    "env.max_val_problems": at_least(0, "0 = every problem"),
    "env.max_turns": at_least(0, "0 = the env's own default"),
    "rollout.branching": within(2, 1024, "K candidates form one GRPO group; K=1 makes every group a singleton and "
                                     "nothing is learned"),
    "rollout.val_samples": within(1, 1024, "episodes per validation problem"),
    "rollout.playouts": within(0, 64, "0 = only a move that ends the game sees its outcome; each costs a whole game"),
    "rollout.streaming_wait_s": within(0, 10, "seconds a free engine waits for more requests; 0 = send at once"),
    "self_play.pool_size": within(0, 64, "past versions kept; each is one more LoRA adapter on the model, or one "
                                         "more copy of a full model in host memory"),
    "self_play.snapshot_every": at_least(1, "steps between snapshots"),
    "self_play.live_prob": within(0, 1, "a probability"),
    "reward.alpha": at_least(0, "weight of the team reward"),
    # algorithm
    "algorithm.filter_ratio": Range(0, 1, "the fraction of groups dropped", high_open=True),
    "algorithm.clip_ratio_low": Range(0, 1, "PPO clips the ratio at 1 - clip_ratio_low", low_open=True,
                                      high_open=True),
    "algorithm.clip_ratio_high": above(0, "PPO clips the ratio at 1 + clip_ratio_high"),
    "algorithm.clip_ratio_c": above(1, "the dual-clip bound"),
    "algorithm.entropy_coeff": at_least(0, "entropy bonus"),
    "algorithm.kl.init_kl_coeff": at_least(0, "0 = no KL term"),
    "algorithm.kl.kl_target": above(0, "the adaptive controller's target"),
    "algorithm.kl.kl_horizon": at_least(1, "the adaptive controller's horizon in steps"),
    "algorithm.rollout_check.max_kl": at_least(0, "0 = off"),
    "algorithm.tis_cap": at_least(1, "the largest importance weight", off=True),
    # optim
    "optim.lr": above(0, "peak learning rate"),
    "optim.weight_decay": at_least(0),
    "optim.warmup_steps": at_least(0, "steps"),
    "optim.min_lr_ratio": within(0, 1, "the final learning rate as a fraction of lr"),
    "optim.grad_clip": at_least(0, "0 = off"),
    "optim.ppo_epochs": at_least(1, "passes over a step's samples"),
    "optim.ppo_mini_batch_size": at_least(0, "0 = the whole batch"),
    "optim.micro_batch_max_tokens": at_least(1, "tokens per forward pass"),
    "optim.logprob_chunk_tokens": at_least(0, "response tokens per chunk of the LM head (0 = dense)"),
    "optim.max_nonfinite_grad_steps": at_least(0, "0 = never stop"),
    # training
    "training.total_training_steps": at_least(1, "training steps; also the learning-rate schedule's length"),
    "training.epoch_size": at_least(0, "problems per epoch; 0 or null = the whole dataset"),
    "training.train_batch_size": at_least(1, "problems per step"),
    "training.max_prompt_length": at_least(1, "tokens"),
    "training.max_response_length": at_least(1, "tokens; caps every agent's max_tokens"),
    "training.val_freq": at_least(0, "0 = never validate"),
    "training.save_freq": at_least(0, "0 = only at the end"),
    "training.max_ckpt_to_keep": at_least(0, "0 = keep all"),
    "training.stop_after_steps": at_least(0, "0 = no limit"),
    "training.seed": at_least(0),
    "training.save_samples_freq": at_least(0, "0 = never"),
    # resources
    "resources.num_cpus": at_least(0, "0 = this machine's"),
    "resources.gpus_per_policy": at_least(0, "0 = CPU"),
    "resources.gpu_memory_gb": at_least(0, "0 = the visible device's"),
    # evaluation (pettingllms eval)
    "model.request_timeout_s": above(0, "seconds"),
    "model.max_concurrency": at_least(1, "requests in flight"),
    "model.max_retries": at_least(0),
    "model.max_failed_share": within(0, 1, "share of failed requests above which an evaluation fails"),
    "eval.n": at_least(1, "samples per problem"),
    "eval.k": at_least(1, "pass@k; every k must also be <= eval.n"),
    **{f"eval.{key}": r for key, r in _SAMPLING.items()},
    "eval.seed": at_least(0),
    "eval.batch_problems": at_least(1, "problems rolled out together"),
}


# ``pettingllms eval`` reads some training keys differently.
EVAL_RANGES: dict[str, Range] = {
    "env.max_turns": at_least(0, "0 = each env's own default"),
    "rollout.branching": at_least(1, "not read by evaluation, which samples eval.n episodes per problem"),
}


def check_ranges(config: Any, training: bool = True) -> None:
    """Raise ConfigError for the first numeric value outside its range (``training=False``: an evaluation
    config, with ``EVAL_RANGES``), or an ``eval.k`` above ``eval.n``."""
    table = RANGES if training else {**RANGES, **EVAL_RANGES}
    for key, pattern, value in numeric_values(config):
        rule = table.get(pattern)
        if rule is None:
            continue
        if not rule.allows(float(value)):
            raise ConfigError(f"{key}={value!r}: {rule.describe()}")
    section = getattr(config, "eval", None)
    if section is not None:
        above_n = [k for k in section.k if k > section.n]
        if above_n:
            raise ConfigError(f"eval.k={list(section.k)}: pass@k needs 1 <= k <= eval.n={section.n}; {above_n} are out "
                              f"of range. Raise eval.n or drop those k.")


def numeric_values(node: Any, prefix: str = "", pattern: str = "") -> Iterator[tuple[str, str, float]]:
    """(dotted key, table key, value) of every number in a config object; list items share their list's key."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        key, row = f"{prefix}{f.name}", f"{pattern}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from numeric_values(value, key + ".", row + ".")
        elif isinstance(value, dict) and value and all(dataclasses.is_dataclass(v) for v in value.values()):
            for name, entry in value.items():  # base_models / agents: user-named entries of one dataclass
                yield from numeric_values(entry, f"{key}.{name}.", f"{row}.<name>.")
        elif isinstance(value, (list, tuple)):
            yield from ((key, row, item) for item in value if _is_number(item))
        elif _is_number(value):
            yield key, row, value


def numeric_schema_keys(root: type) -> list[str]:
    """Every table key of ``root`` whose field is a number (int, float, optional or a list of them)."""
    return [key.name for key in config_keys(root) if _numeric_type(key.hint)]


def _numeric_type(hint: Any) -> bool:
    if hint in (int, float):
        return True
    return any(_numeric_type(arg) for arg in typing.get_args(hint) if arg is not type(None))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
