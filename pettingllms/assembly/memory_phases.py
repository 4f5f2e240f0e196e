"""The GPU memory plan's phases: what one GPU holds for each policy during the update, the weight sync
and the rollout, and whether that fits the GPU. ``assembly/memory.py`` composes a run's plan from these,
``assembly/memory_fixes.py`` searches the changes that make a plan fit, ``assembly/memory_report.py``
prints it.

Everything here is arithmetic over the model's config.json and the run's settings; nothing loads a model, touches a
GPU or reaches the network. Sizes are bytes unless a name says otherwise; the printout is in GB (1e9 bytes).
The terms follow what the code does:

- learner (``learner/learner.py``, ``learner/forward.py``, ``learner/sharding.py``, ``runtime/worker.py``): the
  weights are loaded in the master dtype (float32 unless ``master_weights=bfloat16``), the LoRA base included; FSDP2
  shards them, their gradients and the AdamW state (two tensors per trained parameter, same dtype) over the
  policy's ranks; with ``dtype=bfloat16`` FSDP's MixedPrecisionPolicy all-gathers bf16 copies layer by layer, and a
  one-rank group without FSDP autocasts instead, which keeps a bf16 cast of every linear weight for the backward;
- activations: the tensors autograd saves for the backward at ``optim.micro_batch_max_tokens`` tokens, counted
  op by op for a Llama/Qwen decoder layer (``layer_activation_bytes``), plus the learner's 4-D attention mask,
  which the SDPA kernel converts to an additive mask in the compute dtype and saves once per layer;
- logits: fp32 logits of up to that many tokens; the backward of ``logsumexp`` (``learner/batching.py``) holds the
  logits, the gradient from the picked tokens and three logits-sized temporaries at once: 5 copies;
- vLLM (``runtime/serving.py::vllm_options``): a fixed budget of ``gpu_memory_utilization`` x the GPU for its
  weights (``params x dtype / tensor_parallel``), its start-up profile's activations and KV cache; it starts only
  when what is left after the weights and that profile holds one ``max_model_len`` sequence of KV cache
  (``engine_profile_bytes``); asleep during the update
  (``runtime/serving.py``: level 2 for a full model, level 1 under LoRA: both leave neither on the GPU);
- between the update and the engine's wake-up every rank gives its caching allocator's free blocks back
  (``runtime/serving.py::release_accelerator_cache``, its order tested in tests/runtime/test_engine_sync.py):
  the rollout phase holds the
  learner's resident state (weights, AdamW state; gradients are freed) next to the whole vLLM budget;
- the weight sync gathers one full tensor at a time on the GPU (in the compute dtype for a full model); over host
  shared memory its chunks (engine option ``sync_chunk_mb``) live in host memory, over CUDA IPC (a full model on one
  GPU, the default there) a chunk's cast tensors and the bucket they are packed into are on the GPU
  (``rollout/vllm/footprint.ipc_sync_bytes``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from pettingllms.learner.footprint import LearnerMemory, LearnerSetup, learner_memory
from pettingllms.models.shape import ModelShape, layer_parameters, parameter_count
from pettingllms.rollout.vllm.footprint import (DEFAULT_GPU_MEMORY_UTILIZATION, kv_bytes_per_token, vllm_kv_room,
                                                vllm_profile_bytes)

GB = 1e9  # the printout's unit
GIB = 2**30

# Memory a process holds outside PyTorch's allocator and outside vLLM's budget: the CUDA context and loaded
# kernels, cuBLAS workspaces, NCCL buffers (learner); the engine process's CUDA context and what vLLM allocates
# outside its sleep-mode pool (vLLM). Both measured on an H200 (torch 2.11, CUDA 13). The learner's
# (benchmarks/gpu_learner.py): device memory in use minus PyTorch's reserved, 0.73-0.83 GiB for one process,
# 1.38 GiB with an NCCL process group. vLLM's (benchmarks/gpu_smoke.py, math_L1_prompt.sh with vLLM 0.26 on a
# Qwen3-1.7B replica): device memory in use minus the learner's, 1.80 GiB asleep and 2.08 GiB above its
# gpu_memory_utilization budget awake (vLLM counts its CUDA graphs inside the budget).
LEARNER_PROCESS_BYTES = 1.5 * GIB
ENGINE_PROCESS_BYTES = 2.1 * GIB
# PyTorch's caching allocator reserves more than is allocated at the update's peak (blocks rounded up, freed blocks
# too small to reuse): measured on the same H200 at 0.7-6.4% of the allocated peak (full, FSDP, LoRA, gradient
# checkpointing). The update phase counts this share on top of the learner's peak.
ALLOCATOR_RESERVE = 0.07


def gb(value: float) -> str:
    """A byte count as the printout writes it."""
    return f"{value / GB:.2f} GB"


@dataclass(frozen=True)
class PolicyInput:
    """One policy as the plan sees it: its model, its learner on one of its GPUs, and its vLLM engine."""

    name: str
    model: str
    source: str  # where the model's config came from
    shape: ModelShape
    learner: LearnerSetup
    gpus: float  # the policy's GPUs (a share below 1)
    tensor_parallel: int = 1
    utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION  # vLLM gpu_memory_utilization
    auto_utilization: bool = False  # engine_options.gpu_memory_utilization=auto: the plan sizes it
    engine_bytes: int = 2
    max_model_len: int = 0
    longest_sample: int = 0  # max_prompt_length + max_response_length: a micro-batch never has fewer tokens
    micro_batch_max_tokens: int = 8192
    lora_note: str = ""
    batched_tokens: int = 0  # vLLM's max_num_batched_tokens when llm_options sets it (0: vLLM's default)
    max_seqs: int = 0  # vLLM's max_num_seqs when llm_options sets it (0: vLLM's default)
    snapshot_of: str = ""  # an opponent-pool worker: the trained policy whose config (base_models.<p>) it shares
    module_on_host: bool = False  # its module stays in host memory (a vLLM pool worker stages past versions there)
    config_key: str = ""  # the base_models.<key> its settings come from ("": its name, or its pool's policy's)
    sync_device_bytes: float = 0.0  # a sync's chunk on the GPU (CUDA IPC: rollout/vllm/footprint.ipc_sync_bytes)

    @property
    def config_name(self) -> str:
        """The ``base_models.<name>`` its settings come from: an L3 copy's source entry, a pool worker's policy's."""
        return self.config_key or self.snapshot_of or self.name


def with_twins(policies: Sequence[PolicyInput], target: PolicyInput, pools: bool = True,
               **changes: Any) -> list[PolicyInput]:
    """``policies`` with ``changes`` made to ``target`` and to every input configured by the same
    ``base_models.<p>`` (L3's copies of it, and with ``pools`` their opponent-pool workers), as a change of that
    config key would."""
    return [dataclasses.replace(q, **changes) if q.config_name == target.config_name and (pools or not q.snapshot_of)
            else q for q in policies]


def without_pools_of(policies: Sequence[PolicyInput], names: set[str]) -> list[PolicyInput]:
    """``policies`` less the opponent-pool workers of ``names``: a policy given LoRA keeps its past versions as
    adapters instead (assembly/opponent_pool.py)."""
    return [p for p in policies if p.snapshot_of not in names]


@dataclass(frozen=True)
class PolicyMemory:
    """One policy's share of one GPU, phase by phase (bytes)."""

    policy: PolicyInput
    learner: LearnerMemory
    budget: float  # vLLM's gpu_memory_utilization x the GPU
    engine_weights: float
    kv_per_token: int
    engine_profile: float  # the least vLLM's start-up profile holds beside its weights (engine_profile_bytes)
    sync_transient: float
    update: float
    sync: float
    rollout: float

    @property
    def kv_room(self) -> float:
        """What vLLM's budget leaves for its KV cache after its weights and its start-up profile (``engine_room``)."""
        return self.budget - self.engine_weights - self.engine_profile


def policy_memory(policy: PolicyInput, gpu_bytes: float | None) -> PolicyMemory:
    """The three phases of one policy on one of its GPUs.

    update: the learner's peak; the engine sleeps (level 2 or 1: no weights, no KV cache on the GPU). sync: the
    learner's resident state (and the cache it keeps), vLLM's weights awake again, the tensor being gathered (on
    every rank: one full tensor and its shard's cast) and the decoder layer vLLM is reloading. rollout: what the
    learner keeps and the whole vLLM budget. Both processes add their overheads in every phase. A policy that does
    not train never updates, and its engine never sleeps.
    """
    learner = learner_memory(policy.shape, policy.learner)
    budget = policy.utilization * (gpu_bytes or 0.0)
    weights = parameter_count(policy.shape) * policy.engine_bytes / policy.tensor_parallel
    kv = kv_bytes_per_token(policy.shape, policy.engine_bytes, policy.tensor_parallel)
    profile = policy_engine_profile(policy, gpu_bytes)
    process = LEARNER_PROCESS_BYTES + ENGINE_PROCESS_BYTES
    engine = max(budget, weights)  # with the GPU size unknown, at least the weights
    if not policy.learner.trainable:
        rollout = (0.0 if policy.module_on_host else learner.resident) + engine + process
        return PolicyMemory(policy, learner, budget, weights, kv, profile, 0.0, rollout, rollout, rollout)
    kept = learner.kept  # the update's peak went back with the cache release, before the engine woke
    world = policy.learner.world_size
    transient = learner.largest_tensor * (1 + 1 / world) + \
        layer_parameters(policy.shape) * policy.engine_bytes / policy.tensor_parallel + policy.sync_device_bytes
    update = learner.peak * (1 + ALLOCATOR_RESERVE) + process
    sync = kept + transient + weights + process
    rollout = kept + engine + process
    return PolicyMemory(policy, learner, budget, weights, kv, profile, transient, update, sync, rollout)


def policy_engine_profile(policy: PolicyInput, gpu_bytes: float | None) -> float:
    """``vllm_profile_bytes`` of a policy's engine."""
    return vllm_profile_bytes(policy.shape, policy.engine_bytes, policy.tensor_parallel, gpu_bytes,
                              policy.batched_tokens, policy.max_seqs)


def engine_room(policy: PolicyInput, gpu_bytes: float) -> float:
    """``vllm_kv_room`` of a policy's engine."""
    return vllm_kv_room(policy.shape, policy.engine_bytes, policy.tensor_parallel, policy.utilization, gpu_bytes,
                        policy.batched_tokens, policy.max_seqs)


def engine_short(policy: PolicyInput, gpu_bytes: float) -> bool:
    """vLLM refuses to start: what its budget leaves for the KV cache cannot hold one max_model_len sequence."""
    kv = kv_bytes_per_token(policy.shape, policy.engine_bytes, policy.tensor_parallel) * policy.max_model_len
    return engine_room(policy, gpu_bytes) < kv


@dataclass(frozen=True)
class GpuPlan:
    """What one GPU holds: the policies on it (one, or several sharing it) and the phases' totals."""

    policies: tuple[PolicyMemory, ...]
    gpu_bytes: float | None

    @property
    def update(self) -> float:
        return sum(p.update for p in self.policies)

    @property
    def sync(self) -> float:
        return sum(p.sync for p in self.policies)

    @property
    def rollout(self) -> float:
        return sum(p.rollout for p in self.policies)

    @property
    def out_of_step(self) -> float:
        """Policies sharing a GPU update in parallel, each waking its engine as soon as its own update and sync end
        (and one with no samples in a step never sleeps): one can hold its awake engine while another is at its
        update's peak. The worst such mix, each policy at its own highest phase; for identical policies it equals
        the worst phase of them all."""
        return sum(max(p.update, p.sync, p.rollout) for p in self.policies)

    @property
    def peak(self) -> float:
        return max(self.update, self.sync, self.rollout, self.out_of_step)

    @property
    def peak_phase(self) -> str:
        worst = highest_phase(self)
        if self.out_of_step <= max(self.update, self.sync, self.rollout) * (1 + 1e-9):
            return worst
        return "policies out of step (" + ", ".join(f"{p.policy.name} at its {highest_phase(p)}"
                                                     for p in self.policies) + ")"

    def problems(self) -> list[str]:
        """Why this GPU cannot run the plan; empty when it can, or when the GPU's size is unknown."""
        if self.gpu_bytes is None:
            return []
        found = []
        for p in self.policies:
            room, need = p.kv_room, p.kv_per_token * p.policy.max_model_len
            if room < need:
                found.append(f"{p.policy.name}'s vLLM budget ({gb(p.budget)} = {p.policy.utilization:g} x "
                             f"{gb(self.gpu_bytes)}) leaves {gb(max(0.0, room))} after its weights "
                             f"({gb(p.engine_weights)}) and its start-up profile (at least "
                             f"{gb(p.engine_profile)}), less than the KV cache of one {p.policy.max_model_len}-token "
                             f"sequence ({gb(need)}): vLLM refuses to start")
        if self.peak > self.gpu_bytes:
            names = " + ".join(p.policy.name for p in self.policies)
            found.append(f"{names}: the {self.peak_phase} peaks at {gb(self.peak)} > {gb(self.gpu_bytes)}")
        return found

    @property
    def fits(self) -> bool:
        return not self.problems()


def highest_phase(p: "PolicyMemory | GpuPlan") -> str:
    """The name of the phase that holds the most: of one policy, or of a GPU's totals."""
    phases = {"update": p.update, "weight sync": p.sync, "rollout": p.rollout}
    return max(phases, key=lambda name: phases[name])


def gpu_plans(policies: Sequence[PolicyInput], gpu_bytes: float | None) -> list[GpuPlan]:
    """One plan per kind of GPU: each whole-GPU policy's GPUs, and one GPU shared by the policies that have a share
    of one (Ray packs those onto the same GPU; their updates run at the same time, in parallel)."""
    whole = [p for p in policies if p.gpus >= 1]
    shared = [p for p in policies if 0 < p.gpus < 1]
    plans = [GpuPlan((policy_memory(p, gpu_bytes),), gpu_bytes) for p in whole]
    if shared:
        plans.append(GpuPlan(tuple(policy_memory(p, gpu_bytes) for p in shared), gpu_bytes))
    return plans
