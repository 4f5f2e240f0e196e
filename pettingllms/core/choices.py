"""The config vocabulary: every setting that takes one of a few names, as a ``str`` enum, in one place.

The config schema types its fields with these, so Hydra/OmegaConf refuses a wrong name when the config is composed
("Invalid value 'trees', expected one of [tree, independent, trajectory]"), before anything starts. The modules that
take the same settings as plain arguments (executor, learner, layout) check against the same enums, so a name is
spelled in one place only.

A member *is* its name as a string: it compares, hashes, formats and serialises (JSON, Ray) like the plain string,
so ``cfg.rollout.mode == "tree"`` and ``f"{mode}"`` work as before. Member names equal their values, since OmegaConf
converts a string to a member by name, so every enum is built from its values (``token-mean`` is no identifier).
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A named choice that behaves as its string value."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str.__str__(self), spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)


def _choice(name: str, values: tuple[str, ...]) -> type[Choice]:
    """A Choice enum whose members are ``values``, each named by its value (OmegaConf looks members up by name)."""
    members = [(value, value) for value in values]
    return Choice(name, members, module=__name__, qualname=name)  # type: ignore[return-value]


# L0 single agent | L1 one shared policy | L2 one LoRA adapter per agent | L3 one model per agent.
Specialization = _choice("Specialization", ("L0", "L1", "L2", "L3"))
# tree: AT-GRPO (K candidates per (turn, agent) node) | independent: K episodes, groups per turn |
# trajectory: K episodes, one group per (problem, agent) scored with the episode's return.
RolloutMode = _choice("RolloutMode", ("tree", "independent", "trajectory"))
# Which of a node's K candidates the episode continues with.
Selection = _choice("Selection", ("greedy", "sample", "first"))
# What a NaN or infinite reward does: error stops the run naming the env, agent, turn, problem and output |
# drop takes that sample out of its group, the loss and branch selection, and counts it in the step's metrics.
NonFiniteReward = _choice("NonFiniteReward", ("error", "drop"))
GroupFilter = _choice("GroupFilter", ("none", "dapo", "std", "mean"))
DType = _choice("DType", ("float32", "bfloat16"))
# Bytes per element, by our dtype names and by safetensors' (a header's "dtype"): the one table of them.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "F32": 4, "BF16": 2, "F16": 2}
# auto: vLLM when the policy has GPUs, the transformers engine on CPU.
EngineKind = _choice("EngineKind", ("auto", "hf", "vllm"))
Tracker = _choice("Tracker", ("console", "tensorboard", "wandb"))
# What ``pettingllms eval`` sends an OpenAI-compatible server: exact prompt token ids, or the decoded text.
PromptFormat = _choice("PromptFormat", ("ids", "text"))
# Aggregation modes whose micro-batch losses add up exactly to the mini-batch loss. verl's
# ``seq-mean-token-sum-norm`` divides by the padded response width, which differs between token-budget micro-batches,
# so gradient accumulation would not equal one big batch; it is refused rather than silently wrong.
# The learner's attention kernel over packed rows (learner/masks.py, models/attention.py): "auto" = flex on CUDA
# (FlexAttention skips the blocks the mask hides), sdpa elsewhere (FlexAttention has no backward on CPU).
AttentionKernel = _choice("AttentionKernel", ("auto", "sdpa", "flex"))
LossAggMode = _choice("LossAggMode", ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum"))
# verl's KL penalty estimators (``kl_penalty``); a trailing ``+`` is verl's straight-through variant.
KLType = _choice("KLType", ("k1", "k2", "k3", "low_var_kl", "abs", "mse", "kl", "k1+", "k3+", "low_var_kl+"))

# The one default for ``base_models.<p>.lora.target_modules`` and ``LoraSpec``: the attention projections, as the
# reference's LoRA presets use. Models whose layers are named otherwise set the key explicitly.
DEFAULT_LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
