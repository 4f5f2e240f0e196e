"""The GPU memory plan of a run: every GPU policy's worker spec as the plan's input, the GPU's size, the
per-GPU phases, and the refusal of a plan that cannot fit, with the arithmetic and the fixes, most effective
first (docs/distributed.md, "GPU memory plan"). ``--dry-run`` prints it, every GPU run logs it before anything
loads.

Everything here is arithmetic over the model's config.json and the run's settings; nothing loads a model,
touches a GPU or reaches the network. The parts: the phases and what each term counts
(``assembly/memory_phases.py``), the fixes and the ``auto`` vLLM budget (``assembly/memory_fixes.py``), the
printout (``assembly/memory_report.py``); each footprint lives beside what it estimates
(``learner/footprint.py``, ``rollout/vllm/footprint.py``, ``models/shape.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pettingllms.assembly.memory_fixes import fixes, size_auto_engines
from pettingllms.assembly.memory_phases import GB, GpuPlan, PolicyInput, gb, gpu_plans
from pettingllms.assembly.memory_report import format_plan
from pettingllms.core.choices import DTYPE_BYTES
from pettingllms.core.errors import ConfigError
from pettingllms.learner.footprint import LearnerSetup
from pettingllms.models.shape import KNOWN_MODEL_TYPES, ModelShape, model_config
from pettingllms.rollout.vllm.footprint import ipc_sync_bytes
from pettingllms.rollout.vllm.weights import DEFAULT_SYNC_CHUNK_MB

@dataclass(frozen=True)
class MemoryPlan:
    """A run's GPU memory plan: the per-GPU plans, the policies without one (and why), where the GPU size came
    from, and the printout."""

    plans: tuple[GpuPlan, ...]
    policies: tuple[PolicyInput, ...]
    gpu_bytes: float | None
    gpu_source: str
    unplanned: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return all(plan.fits for plan in self.plans)

    def describe(self) -> str:
        return format_plan(self.plans, self.gpu_source, self.unplanned)

    def refusal(self) -> str:
        """The ConfigError text: what does not fit, the arithmetic, and the fixes, most effective first."""
        problems = [text for plan in self.plans for text in plan.problems()]
        lines = [f"GPU memory: this run cannot fit its GPUs: {'; '.join(problems)}.", self.describe()]
        found = fixes(self.policies, self.gpu_bytes or 0.0)
        if found:
            lines.append("fixes, most effective first (each alone, unless said; the peak each leaves):")
            for fix in found:
                lines.append(f"  {fix.overrides}: peak {gb(fix.peak)}{'' if fix.fits else ', not enough'}")
        return "\n".join(lines)


def planned_utilizations(memory: "MemoryPlan | None") -> dict[str, float]:
    """Policy -> the budget the plan gave an ``auto`` engine, for its worker spec."""
    if memory is None:
        return {}
    return {p.name: p.utilization for p in memory.policies if p.auto_utilization}


def check_gpu_memory(cfg: Any, worker_specs: Sequence[Any]) -> MemoryPlan | None:
    """Plan every GPU policy's memory; None when no policy uses GPUs. Raises ConfigError (with the arithmetic and the
    fixes) when the GPU's size is known and the plan cannot fit it. The dry run prints the plan (``describe_plan``);
    a training run logs it into its train.log."""
    gpu_specs = [spec for spec in worker_specs if spec.layout.uses_gpus]
    if not gpu_specs:
        return None
    gpu_bytes, gpu_source = gpu_size(getattr(cfg.resources, "gpu_memory_gb", 0.0) or 0.0)
    longest = int(cfg.training.max_prompt_length) + int(cfg.training.max_response_length)
    inputs, unplanned = [], []
    for spec in gpu_specs:
        config, source = model_config(spec.model_path)
        if config is None:
            unplanned.append(f"{spec.policy}: no memory plan for {spec.model_path}: {source}")
            continue
        try:
            shape = ModelShape.from_config(config)
        except ConfigError as exc:
            unplanned.append(f"{spec.policy}: no memory plan for {spec.model_path}: {exc}")
            continue
        if shape.model_type not in KNOWN_MODEL_TYPES:
            source += f"; model_type {shape.model_type!r} counted as a Llama-like decoder (approximate)"
        inputs.append(policy_input(spec, shape, source, longest))
    inputs = size_auto_engines(inputs, gpu_bytes)
    memory = MemoryPlan(tuple(gpu_plans(inputs, gpu_bytes)), tuple(inputs), gpu_bytes, gpu_source,
                        tuple(unplanned))
    if not memory.fits:
        raise ConfigError(memory.refusal())
    return memory


def policy_input(spec: Any, shape: ModelShape, source: str, longest_sample: int) -> PolicyInput:
    """A worker spec (``runtime/spec.py``) as the plan's input."""
    from pettingllms.runtime.serving import vllm_options

    layout, learner = spec.layout, spec.learner
    lora = spec.lora
    names = tuple(spec.lora_names)
    trained_adapters = len([name for name in names if name not in set(spec.frozen)])
    compute = DTYPE_BYTES[str(spec.dtype)]
    weights = DTYPE_BYTES[str(spec.learner_weights_dtype)] if spec.trainable else compute
    fsdp = spec.fsdp
    setup = LearnerSetup(
        world_size=layout.num_ranks if layout.sharded else 1,
        sharded=bool(layout.sharded),
        compute_bytes=compute,
        weight_bytes=weights,
        trainable=bool(spec.trainable),
        lora_rank=lora.rank if lora is not None else 0,
        lora_targets=tuple(lora.target_modules) if lora is not None else (),
        adapters=len(names),
        trained_adapters=trained_adapters,
        gradient_checkpointing=bool(learner.gradient_checkpointing),
        cpu_offload=bool(fsdp.cpu_offload) if fsdp is not None else False,
        reshard_after_forward=bool(fsdp.reshard_after_forward) if fsdp is not None else True,
        reference_copy=bool(spec.trainable and learner.kl.enabled and lora is None),
        entropy_grad=learner.entropy_coeff > 0,
        foreach_optimizer=not (fsdp is not None and fsdp.cpu_offload),
        logprob_chunk_tokens=int(learner.logprob_chunk_tokens),
        # The plan is a GPU's: "auto" runs FlexAttention there. Its K/V stay grouped.
        flex_attention=str(learner.attention) != "sdpa",
        expand_kv=str(learner.attention) == "sdpa",
    ).with_tokens(max(int(learner.micro_batch_max_tokens), longest_sample))
    from pettingllms.runtime.serving import AUTO_UTILIZATION

    options = vllm_options(spec)  # "auto" left out: the default budget, until the plan sizes it
    max_model_len = int(options.get("max_model_len") or shape.max_positions or longest_sample)
    llm_options = options.get("llm_options") or {}
    return PolicyInput(
        name=spec.policy, model=str(spec.model_path), source=source, shape=shape, learner=setup,
        gpus=float(layout.gpus), tensor_parallel=int(layout.tensor_parallel),
        utilization=float(options["gpu_memory_utilization"]),
        auto_utilization=spec.engine_options.get("gpu_memory_utilization") == AUTO_UTILIZATION,
        engine_bytes=compute, max_model_len=max_model_len,
        longest_sample=longest_sample, micro_batch_max_tokens=int(learner.micro_batch_max_tokens),
        batched_tokens=int(llm_options.get("max_num_batched_tokens") or 0),
        max_seqs=int(llm_options.get("max_num_seqs") or 0),
        snapshot_of=spec.snapshot_of,
        config_key=spec.config_key,
        module_on_host=spec.module_on_host,
        sync_device_bytes=ipc_sync_bytes(float(options.get("sync_chunk_mb", DEFAULT_SYNC_CHUNK_MB)),
                                         str(options.get("sync_transport", "auto")), int(layout.tensor_parallel),
                                         full_model=lora is None),
    )


def gpu_size(gpu_memory_gb: float) -> tuple[float | None, str]:
    """(bytes, where that came from): ``resources.gpu_memory_gb`` when set, else the first visible CUDA device's
    total memory, else unknown (None)."""
    if gpu_memory_gb > 0:
        return gpu_memory_gb * GB, f"resources.gpu_memory_gb={gpu_memory_gb:g}"
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return float(props.total_memory), f"{props.name}, detected"
    except Exception as exc:  # noqa: BLE001 - a broken CUDA setup: the size is unknown, say why
        return None, f"no GPU size: {type(exc).__name__}: {exc}; set resources.gpu_memory_gb"
    return None, "no GPU visible here and resources.gpu_memory_gb=0"
