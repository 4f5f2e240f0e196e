"""What one policy's worker group is made of: the model, its learner settings, its engine and its layout."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pettingllms.runtime.layout import WorkerLayout

if TYPE_CHECKING:
    from pettingllms.learner import LearnerConfig
    from pettingllms.learner.sharding import FSDPOptions
    from pettingllms.models import LoraSpec


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a rank of a policy's worker group needs to build itself.

    layout: ranks, GPUs, engines (``runtime/layout.py``). ``fsdp``: sharding options, used when
    ``layout.sharded``. ``adapters``: L2 has one LoRA adapter per agent (L1/L3 with LoRA: one shared adapter);
    ``frozen``: agents (and their adapters) that never train. ``seed``: the learner's seed; engine ``e`` of the
    group samples with ``engine_seed(seed, e)``. ``dtype``: the compute dtype (and the engines' weights);
    ``master_weights``: the dtype the learner keeps its weights and optimiser state in (docs/training.md).
    ``model_path``: the model as configured (alias, hub id or directory); ``model_dir``: the local directory it
    resolves to, stored once a run really starts (``resolved``), so no rank resolves (converts, downloads) again.
    """

    policy: str
    model_path: str
    learner: "LearnerConfig"
    layout: WorkerLayout
    dtype: str = "float32"
    lora: "LoraSpec | None" = None
    adapters: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()
    trainable: bool = True
    seed: int = 0
    num_threads: int = 0  # torch threads per rank; 0: leave torch's default
    requested_threads: int = 0  # base_models.<p>.num_threads as configured (0: from the CPU budget, share_cpus)
    requested_cpus: float = 0.0  # base_models.<p>.cpus_per_rank as configured (0: from the CPU budget)
    engine_options: dict[str, Any] = field(default_factory=dict)
    fsdp: "FSDPOptions | None" = None
    master_weights: str = "float32"  # the learner's weights and AdamW state; "bfloat16" only when asked for
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    model_dir: str = ""  # the resolved model directory; "" until ``resolved`` (a dry run's plan never resolves)
    # The opponent pool of a full-weight policy: the trained policy whose past versions this untrained worker plays
    # ("" for every other worker; ``runtime/snapshots.py``)
    snapshot_of: str = ""
    config_key: str = ""  # the base_models.<key> its settings come from ("" = ``policy``; an L3 copy's source entry)

    @property
    def engine(self) -> str:
        return self.layout.engine

    @property
    def base_policy(self) -> str:
        """The policy whose ``base_models.<p>`` settings and model this worker has: its own, or for an opponent-pool
        worker the policy whose past versions it plays."""
        return self.snapshot_of or self.policy

    @property
    def module_on_host(self) -> bool:
        """Its module stays in host memory: an opponent-pool worker whose engine keeps its own weights (vLLM) only
        stages past versions there on their way to the engine."""
        return bool(self.snapshot_of) and self.engine == "vllm"

    @property
    def continuous_engine(self) -> bool:
        """Its engines batch concurrent calls themselves (vLLM's engine loop, for the streaming rollout)."""
        return self.engine == "vllm" and bool(self.engine_options.get("continuous", False))

    def describe(self) -> str:
        """One line for ``--dry-run``: layout, precision and adapters."""
        adapters = f", LoRA r={self.lora.rank} adapters {list(self.adapters)}" if self.lora is not None else ""
        frozen = f", frozen {list(self.frozen)}" if self.frozen else ""
        trains = "" if self.trainable else ", not trained"
        if self.snapshot_of:
            trains = f", not trained: plays {self.snapshot_of}'s past versions (the opponent pool)"
        return f"{self.policy}: {self.layout.describe()}; {self.dtype}{adapters}{frozen}{trains}; model {self.model_path}"

    def resolved(self) -> "WorkerSpec":
        """This spec with ``model_dir`` set: ``model_path`` resolved (the packaged alias converted once, a hub id
        fetched into the HF cache); itself when already resolved. ConfigError for a model that cannot be found."""
        if self.model_dir:
            return self
        from pettingllms.models.resolve import resolve_model

        return replace(self, model_dir=str(resolve_model(self.model_path)))

    @property
    def directory(self) -> Path:
        """The resolved model directory that engines, codecs and loaders take."""
        if not self.model_dir:
            raise RuntimeError(f"policy {self.policy!r}: its model {self.model_path!r} is not resolved yet "
                               "(WorkerSpec.resolved(), RunPlan.resolved())")
        return Path(self.model_dir)

    @property
    def learner_weights_dtype(self) -> str:
        """float32 master weights, unless the policy computes in bf16 and asked for bf16 weights too."""
        return "bfloat16" if self.dtype == "bfloat16" and self.master_weights == "bfloat16" else "float32"

    @property
    def lora_names(self) -> tuple[str, ...]:
        """The adapters attached to the model (none without LoRA)."""
        return self.adapters if self.lora is not None else ()


def engine_seed(seed: int, engine_index: int) -> int:
    """Engine ``engine_index``'s sampling seed: the run's seed for engine 0, distinct seeds for the others (so
    two engines of one policy never draw the same random numbers)."""
    return seed + 1_000_003 * engine_index
