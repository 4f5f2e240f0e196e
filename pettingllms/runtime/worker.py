"""A policy worker: one rollout engine and one learner, in one process (colocated on the same GPU, if any).

With the transformers engine the engine and the learner hold the *same* module object, so a weight sync after
an update costs nothing. The vLLM engine keeps its own copy: it sleeps while the learner trains and receives
the trained tensors from memory afterwards (runtime/engine_sync.py). Each worker owns an explicit torch thread budget: on a small CPU machine two workers with
the default thread count slow each other down several-fold (DESIGN.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from pettingllms.core import ConfigError, GenerationRequest, GenerationResult, Sample
from pettingllms.learner import LearnerConfig, PolicyLearner
from pettingllms.learner.fsdp import FSDPOptions, full_weights, trained_parameter_names
from pettingllms.models import HFChatCodec, LoraSpec, load_model, resolve_model, use_adapter
from pettingllms.runtime.engine_sync import EngineSync, peft_adapter_configs

STATE_FILE = "worker_state.pt"


@dataclass(frozen=True)
class WorkerSpec:
    policy: str
    model_path: str
    learner: LearnerConfig
    dtype: str = "float32"
    lora: LoraSpec | None = None
    adapters: tuple[str, ...] = ()  # L2: one per agent
    frozen: tuple[str, ...] = ()  # agents whose samples never train this policy
    trainable: bool = True
    seed: int = 0
    num_threads: int = 0  # 0: leave torch's default
    engine: str = "hf"
    engine_options: dict[str, Any] = field(default_factory=dict)
    # Worker group layout (see runtime/placement.py). fsdp None: one PolicyWorker process (num_ranks must be 1);
    # set: num_ranks FSDPRankWorker processes training one FSDP2-sharded learner.
    num_ranks: int = 1
    gpus_per_rank: float = 0.0
    cpus_per_rank: float = 0.0  # Ray CPUs per rank; 0: max(1, num_threads)
    tensor_parallel: int = 1
    fsdp: FSDPOptions | None = None

    def __post_init__(self) -> None:
        if self.fsdp is None and self.num_ranks != 1:
            raise ConfigError(f"policy {self.policy!r}: num_ranks={self.num_ranks} needs FSDP options (fsdp)")

    @property
    def ray_cpus_per_rank(self) -> float:
        return self.cpus_per_rank if self.cpus_per_rank > 0 else float(max(1, self.num_threads))


class PolicyWorker:
    def __init__(self, spec: WorkerSpec) -> None:
        if spec.num_threads > 0:
            torch.set_num_threads(spec.num_threads)
        torch.manual_seed(spec.seed)
        self.spec = spec
        path = resolve_model(spec.model_path)
        lora_names = spec.adapters if spec.lora is not None else ()
        # Ray sets CUDA_VISIBLE_DEVICES to this worker's GPUs: the learner takes the first one.
        device = torch.device("cuda", 0) if spec.gpus_per_rank > 0 else torch.device("cpu")
        self.model = load_model(path, spec.dtype, spec.lora, lora_names).to(device)
        self.codec = HFChatCodec.from_pretrained(path)
        self.engine = make_engine(spec, self.model, self.codec)
        self.sync = EngineSync(self.engine, peft_adapter_configs(self.model, lora_names))
        self.learner = None
        if spec.trainable:
            self.learner = PolicyLearner(
                self.model,
                spec.learner,
                adapter_names=lora_names,
                adapter_context=use_adapter,
                frozen=spec.frozen,
                policy=spec.policy,
                pad_token_id=self.codec.pad_token_id,
            )
        if lora_names:
            self.sync.push(full_weights(self.model, self._trained_names(trained_only=False)))  # fresh adapters

    def ready(self) -> str:
        return self.spec.policy

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return self.engine.generate(list(requests))

    def update(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict[str, float]:
        if self.learner is None:
            return {}
        self.sync.release_for_update()
        start = time.perf_counter()
        metrics = dict(self.learner.update(samples, advantages))
        metrics["timing/update_s"] = time.perf_counter() - start
        # The transformers engine generates with the module just updated (0 s); vLLM gets the tensors.
        metrics["timing/sync_s"] = self.sync.push(full_weights(self.model, self._trained_names(trained_only=True)))
        return metrics

    def _trained_names(self, trained_only: bool) -> list[str]:
        """Parameters the engine must receive: all of a full model; under LoRA, the (trained) adapters'."""
        adapters = self.spec.adapters if self.spec.lora is not None else ()
        frozen = self.spec.frozen if trained_only else ()
        return trained_parameter_names(self.model, adapters, frozen)

    def save(self, directory: str) -> None:
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        state = {
            "learner": self.learner.state_dict() if self.learner else None,
            "engine_rng": self.engine.get_rng_state(),
            "torch_rng": torch.get_rng_state(),
        }
        torch.save(state, folder / STATE_FILE)

    def load(self, directory: str) -> None:
        path = Path(directory) / STATE_FILE
        if not path.is_file():
            raise ConfigError(f"checkpoint for policy {self.spec.policy!r} not found at {path}")
        state = torch.load(path, weights_only=False)
        if self.learner is not None and state["learner"] is not None:
            self.learner.load_state_dict(state["learner"])
            # An engine with its own copy (vLLM) still holds the initial weights: give it the restored ones.
            self.sync.push(full_weights(self.model, self._trained_names(trained_only=False)))
        self.engine.set_rng_state(state["engine_rng"])
        torch.set_rng_state(state["torch_rng"])

    def close(self) -> None:
        """Stop the engine's own processes (vLLM); the transformers engine has none."""
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()

    def export_hf(self, directory: str) -> list[str]:
        if self.learner is None:
            return []
        return save_tokenizer_beside(self.learner.export_hf(directory), self.codec)


def save_tokenizer_beside(paths: Sequence[Path | str], codec: HFChatCodec) -> list[str]:
    """Write the tokenizer (chat template included) into every exported full-model folder, so it loads and
    serves on its own (vLLM, transformers); adapter folders load on top of the base model and need none."""
    for path in paths:
        if (Path(path) / "config.json").is_file():
            codec.tokenizer.save_pretrained(path)
    return [str(p) for p in paths]


def make_engine(spec: WorkerSpec, model: torch.nn.Module, codec: HFChatCodec):
    """The policy's rollout engine: transformers on ``model`` itself, or vLLM with its own copy of the weights."""
    if spec.engine == "hf":
        from pettingllms.rollout.hf_engine import HFEngine

        return HFEngine(model, codec, seed=spec.seed, **spec.engine_options)
    if spec.engine == "vllm":
        from pettingllms.rollout.vllm_engine import VLLMEngine

        # Colocated with the learner: sleep on GPU. The learner's dtype unless engine_options say otherwise.
        options = {"enable_sleep_mode": True, "dtype": spec.dtype, **spec.engine_options}
        if spec.lora is not None:
            options.setdefault("enable_lora", True)
            options.setdefault("max_loras", max(1, len(spec.adapters)))
            options.setdefault("max_lora_rank", spec.lora.rank)
        return VLLMEngine(resolve_model(spec.model_path), tensor_parallel_size=spec.tensor_parallel,
                          seed=spec.seed, codec=codec, **options)
    raise ConfigError(f"unknown engine {spec.engine!r} for policy {spec.policy!r}: use 'hf' or 'vllm'")
