"""The GPU memory plan: what one GPU holds for each policy during the update, the weight sync and the rollout, and
whether that fits the GPU. ``--dry-run`` prints it, every GPU run logs it before anything loads, and a plan that
cannot fit is refused with the arithmetic and the fixes, most effective first (docs/distributed.md, "GPU memory plan").

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
- the weight sync gathers one full tensor at a time on the GPU (in the compute dtype for a full model) and moves
  it to host memory; its chunks (engine option ``sync_chunk_mb``) live in host shared memory, not on the GPU.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pettingllms.core.errors import ConfigError
from pettingllms.learner.footprint import (
    GATHERED_LAYERS, STRANDED_CACHE_SHARE, LearnerMemory, LearnerSetup, learner_memory,
)
from pettingllms.core.choices import DTYPE_BYTES
from pettingllms.models.shape import KNOWN_MODEL_TYPES, ModelShape, layer_parameters, model_config, parameter_count
from pettingllms.rollout.vllm.footprint import (DEFAULT_GPU_MEMORY_UTILIZATION, kv_bytes_per_token, vllm_batch,
                                                vllm_kv_room, vllm_profile_bytes)


GB = 1e9  # the printout's unit
GIB = 2**30
MIB = 2**20
FP32 = 4

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



# ----------------------------------------------------------------------------------------------------- per GPU
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

    @property
    def config_name(self) -> str:
        """The ``base_models.<name>`` its settings come from (a pool worker's are its policy's)."""
        return self.snapshot_of or self.name


def _with_twins(policies: Sequence[PolicyInput], target: PolicyInput, **changes: Any) -> list[PolicyInput]:
    """``policies`` with ``changes`` made to ``target`` and to every input configured by the same
    ``base_models.<p>`` (its opponent-pool worker), as a change of that config key would."""
    return [dataclasses.replace(q, **changes) if q.config_name == target.config_name else q for q in policies]


def _without_pools_of(policies: Sequence[PolicyInput], names: set[str]) -> list[PolicyInput]:
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
        layer_parameters(policy.shape) * policy.engine_bytes / policy.tensor_parallel
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
        worst = _highest_phase(self)
        if self.out_of_step <= max(self.update, self.sync, self.rollout) * (1 + 1e-9):
            return worst
        return "policies out of step (" + ", ".join(f"{p.policy.name} at its {_highest_phase(p)}"
                                                     for p in self.policies) + ")"

    def problems(self) -> list[str]:
        """Why this GPU cannot run the plan; empty when it can, or when the GPU's size is unknown."""
        if self.gpu_bytes is None:
            return []
        found = []
        for p in self.policies:
            room, need = p.kv_room, p.kv_per_token * p.policy.max_model_len
            if room < need:
                found.append(f"{p.policy.name}'s vLLM budget ({_gb(p.budget)} = {p.policy.utilization:g} x "
                             f"{_gb(self.gpu_bytes)}) leaves {_gb(max(0.0, room))} after its weights "
                             f"({_gb(p.engine_weights)}) and its start-up profile (at least "
                             f"{_gb(p.engine_profile)}), less than the KV cache of one {p.policy.max_model_len}-token "
                             f"sequence ({_gb(need)}): vLLM refuses to start")
        if self.peak > self.gpu_bytes:
            found.append(f"the {self.peak_phase} peaks at {_gb(self.peak)} > {_gb(self.gpu_bytes)}")
        return found

    @property
    def fits(self) -> bool:
        return not self.problems()


def _highest_phase(p: "PolicyMemory | GpuPlan") -> str:
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


# ----------------------------------------------------------------------------------------------------- fixes
LOGPROB_CHUNK_FIX = 1024  # the chunk the plan offers: 0.6 GB of fp32 logits per copy at Qwen3's vocabulary
# gpu_memory_utilization=auto: never above this (vLLM's own default is 0.9), and this much under the largest budget
# that fits, for what the plan does not count (fragmentation, a library's workspace).
AUTO_MAX_UTILIZATION = 0.9
AUTO_MARGIN = 0.03
@dataclass(frozen=True)
class Fix:
    overrides: str  # what to add to the command line
    peak: float  # the worst GPU's peak with it
    fits: bool


def _evaluate(policies: Sequence[PolicyInput], gpu_bytes: float) -> tuple[float, bool]:
    plans = gpu_plans(policies, gpu_bytes)
    return max(plan.peak for plan in plans), all(plan.fits for plan in plans)


def _tokens(policy: PolicyInput, budget: int) -> PolicyInput:
    tokens = max(budget, policy.longest_sample)
    return dataclasses.replace(policy, micro_batch_max_tokens=budget, learner=policy.learner.with_tokens(tokens))


def _learner(policy: PolicyInput, **changes: Any) -> PolicyInput:
    return dataclasses.replace(policy, learner=dataclasses.replace(policy.learner, **changes))


def fixes(policies: Sequence[PolicyInput], gpu_bytes: float) -> list[Fix]:
    """Each change that lowers the worst GPU's peak, alone, with the value that fits where there is one; sorted by
    the peak it leaves (the most effective first). When none fits alone, all of them together come last."""
    found: list[Fix] = []
    trained = [p for p in policies if p.learner.trainable]

    def add(text: str, changed: Sequence[PolicyInput]) -> None:
        peak, fits = _evaluate(changed, gpu_bytes)
        found.append(Fix(text, peak, fits))

    current = min((p.micro_batch_max_tokens for p in trained), default=0)
    longest = max((p.longest_sample for p in trained), default=0)
    if trained and current > longest:
        # Below the longest sample (max_prompt_length + max_response_length) a forward still holds that sample.
        fitting = _largest(longest, current - 1, lambda n: _evaluate([_tokens(p, n) for p in policies], gpu_bytes)[1])
        if fitting is not None:
            budget = max(longest, fitting // 256 * 256) if fitting >= 512 else fitting
            add(f"optim.micro_batch_max_tokens={budget}", [_tokens(p, budget) for p in policies])
        else:
            add(f"optim.micro_batch_max_tokens={longest} (no lower: one sample of training.max_prompt_length + "
                "max_response_length tokens is one forward)", [_tokens(p, longest) for p in policies])
    if any(not p.learner.gradient_checkpointing for p in trained):
        add("optim.gradient_checkpointing=true", [_learner(p, gradient_checkpointing=True) for p in policies])
    if any(not p.learner.logprob_chunk_tokens for p in trained):
        add(f"optim.logprob_chunk_tokens={LOGPROB_CHUNK_FIX} (the LM head's fp32 logits {LOGPROB_CHUNK_FIX} tokens at "
            "a time)", [_learner(p, logprob_chunk_tokens=LOGPROB_CHUNK_FIX) for p in policies])
    whole = [p for p in trained if p.gpus >= 1]
    if whole:
        step = math.lcm(*(p.tensor_parallel for p in whole))
        start = int(max(p.gpus for p in whole))
        choices = [g for g in range(start + step, max(64, 8 * start) + 1, step)]
        fitting = _smallest(choices, lambda g: _evaluate(_with_gpus(policies, g), gpu_bytes)[1])
        gpus = fitting if fitting is not None else choices[-1]
        add(f"GPU_num={gpus} (resources.gpus_per_policy={gpus}: more FSDP ranks, smaller shards)",
            _with_gpus(policies, gpus))
    elif any(0 < p.gpus < 1 for p in trained):
        add("GPU_num=1 (a GPU of its own for every policy)", _with_gpus(policies, 1))
    full = [p for p in trained if not p.learner.lora]
    if full:
        changed = _without_pools_of([_lora(p) if p in full else p for p in policies], {p.name for p in full})
        names = ", ".join(p.name for p in full)
        add(f"specialization=L2 (LoRA rank 16 on {names}, one adapter per agent; or base_models.<policy>.lora."
            "rank=16 for one shared adapter)", changed)
    pooled = {p.snapshot_of for p in policies if p.snapshot_of}
    configured = [p for p in policies if not p.snapshot_of]  # one per base_models.<p> key
    for p in configured:
        if p.name in pooled:  # its opponent pool's engine is one GPU's: tensor parallelism is refused there
            continue
        if p.gpus >= 1 and p.gpus % (2 * p.tensor_parallel) == 0 and engine_short(p, gpu_bytes):
            tp = p.tensor_parallel * 2
            while p.gpus % (2 * tp) == 0 and engine_short(dataclasses.replace(p, tensor_parallel=tp), gpu_bytes):
                tp *= 2
            add(f"base_models.{p.name}.tensor_parallel={tp} (vLLM's weights split over {tp} GPUs: room for its KV "
                "cache)",
                [dataclasses.replace(q, tensor_parallel=tp) if q is p else q for q in policies])
    for p in configured:
        if p.longest_sample and p.max_model_len > p.longest_sample and engine_short(p, gpu_bytes):
            add(f"++base_models.{p.name}.engine_options.max_model_len={p.longest_sample} (vLLM reserves room for one "
                f"sequence of {p.max_model_len} tokens; this run's prompt + response is at most {p.longest_sample})",
                _with_twins(policies, p, max_model_len=p.longest_sample))
    for p in trained:
        if not p.learner.cpu_offload:
            enable = "" if p.learner.sharded else f"base_models.{p.name}.fsdp.enabled=true "
            changed = [_learner(q, cpu_offload=True, sharded=True) if q is p else q for q in policies]
            add(f"{enable}base_models.{p.name}.fsdp.cpu_offload=true (weights, gradients, AdamW state in host "
                "memory; slower)", changed)
    for p in configured:
        utilization = _utilization(policies, p, gpu_bytes)
        if utilization is not None and utilization != p.utilization:
            add(f"++base_models.{p.name}.engine_options.gpu_memory_utilization={utilization:g} (vLLM's budget: "
                "less KV cache)", _with_twins(policies, p, utilization=utilization))
    found.sort(key=lambda fix: (not fix.fits, fix.peak))
    if found and not any(fix.fits for fix in found):
        together = _all_together(policies, gpu_bytes)
        peak, fits = _evaluate(together, gpu_bytes)
        found.append(Fix("all of these together (LoRA, checkpointing, chunked logits, CPU offload, the smallest "
                         "micro-batch)", peak,
                         fits))
    return found


def _largest(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in [low, high] with fits(n) (fits is monotone: true up to some n), or None."""
    if high < low or not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _smallest(choices: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    for choice in choices:
        if fits(choice):
            return choice
    return None


def _with_gpus(policies: Sequence[PolicyInput], gpus: int) -> list[PolicyInput]:
    """Whole-GPU (and shared-GPU) trained policies with ``gpus`` GPUs each: one FSDP rank per GPU."""
    out = []
    for p in policies:
        if p.gpus <= 0 or not (p.learner.trainable or p.snapshot_of):
            out.append(p)
            continue
        share = p.utilization / p.gpus if p.gpus < 1 else p.utilization
        if p.snapshot_of:  # an opponent-pool worker: one rank, the GPUs of one of its policy's engines
            out.append(dataclasses.replace(p, gpus=1.0, utilization=share))
            continue
        sharded = gpus > 1 or p.learner.sharded
        out.append(dataclasses.replace(p, gpus=float(gpus), utilization=share,
                                       learner=dataclasses.replace(p.learner, world_size=gpus, sharded=sharded)))
    return out


def _lora(policy: PolicyInput, rank: int = 16) -> PolicyInput:
    from pettingllms.core.choices import DEFAULT_LORA_TARGET_MODULES

    return _learner(policy, lora_rank=rank, lora_targets=tuple(DEFAULT_LORA_TARGET_MODULES), adapters=1,
                    trained_adapters=1, reference_copy=False)


def size_auto_engines(policies: Sequence[PolicyInput], gpu_bytes: float | None) -> list[PolicyInput]:
    """Each policy with ``gpu_memory_utilization=auto`` gets the largest budget (two decimals, at most
    ``AUTO_MAX_UTILIZATION``) with which every GPU fits, less ``AUTO_MARGIN`` for what the plan does not see; one
    that cannot fit at any budget keeps the default, and the plan's refusal names the fixes. Needs the GPU's size."""
    policies = list(policies)
    auto = [p.name for p in policies if p.auto_utilization]
    if not auto:
        return policies
    if gpu_bytes is None:
        raise ConfigError(f"engine_options.gpu_memory_utilization=auto (policies {auto}) sizes vLLM from the GPU "
                          "memory plan, which needs the GPU's size: set resources.gpu_memory_gb (or run where the "
                          "GPU is visible)")
    for index, policy in enumerate(policies):
        if not policy.auto_utilization:
            continue
        best = _utilization(policies, policy, gpu_bytes, ceiling=AUTO_MAX_UTILIZATION)
        if best is not None and best - AUTO_MARGIN > 0:
            policies[index] = dataclasses.replace(policy, utilization=round(best - AUTO_MARGIN, 2))
    return policies


def planned_utilizations(memory: "MemoryPlan | None") -> dict[str, float]:
    """Policy -> the budget the plan gave an ``auto`` engine, for its worker spec."""
    if memory is None:
        return {}
    return {p.name: p.utilization for p in memory.policies if p.auto_utilization}


def _utilization(policies: Sequence[PolicyInput], policy: PolicyInput, gpu_bytes: float,
                 ceiling: float = 0.95) -> float | None:
    """A gpu_memory_utilization (two decimals) for ``policy`` with which every GPU fits, or None."""
    def with_value(value: float) -> list[PolicyInput]:
        return _with_twins(policies, policy, utilization=value)

    candidates = [v / 100 for v in range(round(ceiling * 100), 0, -1)]
    for value in candidates:  # the largest that fits: the most KV cache
        if _evaluate(with_value(value), gpu_bytes)[1]:
            return value
    return None


def _all_together(policies: Sequence[PolicyInput], gpu_bytes: float) -> list[PolicyInput]:
    out = []
    policies = _without_pools_of(policies, {p.name for p in policies if p.learner.trainable and not p.learner.lora})
    for p in policies:
        if p.learner.trainable:
            p = _tokens(p, 1)
            p = _learner(p, gradient_checkpointing=True, cpu_offload=True, sharded=True,
                         logprob_chunk_tokens=p.learner.logprob_chunk_tokens or LOGPROB_CHUNK_FIX)
            if not p.learner.lora:
                p = _lora(p)
        out.append(p)
    return out


# ----------------------------------------------------------------------------------------------------- printout
def assumptions() -> list[str]:
    """What the plan assumes, printed under it."""
    released = (
        "between the update and the engine's wake-up the learner empties its CUDA cache "
        "(serving.release_accelerator_cache): the sync and the rollout hold its resident state only, and without "
        f"FSDP a full fine-tune's cache kept after release ({STRANDED_CACHE_SHARE:g} x its AdamW state, which the "
        "release cannot return)"
    )
    return [
        "per GPU, GB = 1e9 bytes; worst-case micro-batch: one packed row of the whole token budget, every position "
        "a logit",
        "activations counted op by op for Llama/Qwen layers; attention (optim.attention): the memory-efficient SDPA "
        "kernel with the learner's mask and grouped K/V expanded to every query head, or FlexAttention with a block "
        "mask and grouped K/V (models/attention.py), no O(L^2) scores either way; checked against CPU updates "
        "(benchmarks/memory_plan_check.py) and CUDA updates of Qwen3-1.7B on an H200 and an H100 "
        "(benchmarks/gpu_learner.py: the allocated peak at 0.96-1.00 of the estimate)",
        f"FSDP2 keeps {GATHERED_LAYERS} layers gathered (computing + prefetched) and the root (embedding, head) "
        "from its forward to its backward; its reduce-scatter buffers come after the logits' peak",
        f"outside PyTorch's allocator and vLLM's budget: learner process {LEARNER_PROCESS_BYTES / GB:.2f} GB, vLLM "
        f"process {ENGINE_PROCESS_BYTES / GB:.2f} GB (CUDA context, cuBLAS, NCCL, CUDA graphs; the learner's "
        "and vLLM's measured on an H200); the update adds the caching allocator's reserve above its allocated "
        f"peak ({ALLOCATOR_RESERVE:.0%}, the largest measured on an H200 rounded up)",
        "vLLM holds its whole budget when awake (weights, KV cache, its activations) and nothing while asleep "
        "(level 2 full model, level 1 LoRA: weights and KV cache leave the GPU)",
        "vLLM starts only when its budget, less its weights and its start-up profile (one forward of "
        "max_num_batched_tokens tokens and the sampler's logits of max_num_seqs rows, vllm.LLM's defaults for the "
        "GPU's size unless llm_options sets them), holds one max_model_len sequence of KV cache; the profile counted "
        "is a floor (older samplers' float32 copies, CUDA graphs and memory outside torch come off the KV cache too)",
        released,
        "weight sync: one full tensor gathered at a time on the GPU; its chunks (engine option sync_chunk_mb) go "
        "through host shared memory",
    ]


def _gb(value: float) -> str:
    return f"{value / GB:.2f} GB"


def _line(label: str, value: float, note: str = "", indent: int = 4) -> str:
    text = f"{' ' * indent}{label:<{30 - indent}}{value / GB:>8.2f} GB"
    return f"{text}   {note}" if note else text


def format_plan(plans: Sequence[GpuPlan], gpu_source: str, unplanned: Sequence[str] = ()) -> str:
    """The per-GPU table: every term in GB with where it comes from, the phases, the peak and the headroom."""
    gpu_bytes = plans[0].gpu_bytes if plans else None
    size = f"{_gb(gpu_bytes)} per GPU ({gpu_source})" if gpu_bytes is not None else \
        f"GPU size unknown ({gpu_source}): needs only, nothing checked"
    lines = [f"GPU memory plan, per GPU: {size}"]
    for plan in plans:
        lines += _format_gpu(plan)
    lines += [f"  {text}" for text in unplanned]
    lines.append("  assumptions:")
    lines += [f"    - {text}" for text in assumptions()]
    return "\n".join(lines)


def _format_gpu(plan: GpuPlan) -> list[str]:
    lines = []
    head = plan.policies[0].policy
    if len(plan.policies) == 1:
        gpus = f"each of its {head.gpus:g} GPUs" if head.gpus > 1 else "its GPU"
        lines.append(f"  {head.name}: {head.model} ({head.source}); {gpus} holds:")
    else:
        lines.append(f"  one GPU shared by {', '.join(p.policy.name for p in plan.policies)}:")
    for p in plan.policies:
        lines += _format_policy(p, plan, shared=len(plan.policies) > 1)
    if plan.gpu_bytes is None:
        lines.append(_line("peak", plan.peak, f"({plan.peak_phase}); GPU size unknown: set resources.gpu_memory_gb "
                                              "to check it", 2))
    else:
        verdict = "fits" if plan.fits else "does NOT fit"
        lines.append(_line("peak", plan.peak, f"({plan.peak_phase}) of {_gb(plan.gpu_bytes)}: {verdict}, headroom "
                                              f"{(plan.gpu_bytes - plan.peak) / GB:.2f} GB", 2))
    return lines


def _format_policy(p: PolicyMemory, plan: GpuPlan, shared: bool) -> list[str]:
    inp, learner, setup = p.policy, p.learner, p.policy.learner
    lines = []
    if shared:
        lines.append(f"   {inp.name}: {inp.model} ({inp.source}), {inp.gpus:g} of the GPU")
    kind = "not trained" if not setup.trainable else "full fine-tune" if not setup.lora else \
        f"LoRA r={setup.lora_rank}, {setup.adapters} adapter(s)"
    compute = {2: "bf16", 4: "fp32"}[setup.compute_bytes]
    shard = f"FSDP over {setup.world_size} ranks" if setup.sharded else "no FSDP"
    tokens = f", {setup.tokens} tokens per forward" if setup.trainable else ""
    if inp.module_on_host:  # an opponent-pool worker with vLLM: nothing of its module on the GPU
        lines.append(_line("module", 0.0, f"in host memory: {inp.snapshot_of}'s past versions are staged there on "
                                          "their way to vLLM", 4))
    else:
        lines.append(f"    learner ({kind}, {compute} compute, {shard}{tokens}):")
        lines += [_line(t.label, t.bytes, t.note, 6) for t in learner.terms]
    if setup.trainable:
        moment = max(learner.moments, key=lambda m: m.bytes)
        lines.append(_line("update peak", learner.peak, f"weights + gradients + AdamW + the {moment.label} moment "
                                                        f"({moment.bytes / GB:.2f} GB)", 6))
    room = max(0.0, p.kv_room) if plan.gpu_bytes is not None else 0.0
    tokens, seqs = vllm_batch(plan.gpu_bytes, inp.batched_tokens, inp.max_seqs)
    sized = f" (auto: the largest that fits, less {AUTO_MARGIN:g})" if inp.auto_utilization else ""
    lines.append(f"    vLLM (TP={inp.tensor_parallel}, gpu_memory_utilization {inp.utilization:g}{sized}, "
                 f"max_model_len {inp.max_model_len}):")
    budget = f"{inp.utilization:g} x the GPU" if plan.gpu_bytes is not None else "unknown GPU size: weights only"
    lines.append(_line("budget (when awake)", max(p.budget, p.engine_weights), budget, 6))
    lines.append(_line("weights", p.engine_weights, f"{parameter_count(inp.shape) / 1e9:.3g} B params x "
                                                    f"{inp.engine_bytes} B / TP {inp.tensor_parallel}", 8))
    lines.append(_line("start-up profile", p.engine_profile, f"at least: one forward of {tokens} tokens and "
                                                             f"{min(tokens, seqs)} rows of logits", 8))
    lines.append(_line("KV cache", room, f"at most about {room / p.kv_per_token:,.0f} tokens at {p.kv_per_token:,} "
                                         "B/token", 8))
    lines.append(_line("process overheads", LEARNER_PROCESS_BYTES + ENGINE_PROCESS_BYTES,
                       "learner + vLLM processes, in every phase (both measured on an H200)", 4))
    kept = "kept (resident + cache kept after release)" if learner.stranded else "resident"
    if setup.trainable:
        lines.append(_line("phase: update", p.update,
                           f"learner's update peak + {ALLOCATOR_RESERVE:.0%} allocator reserve + overheads; vLLM asleep",
                           4))
        lines.append(_line("phase: weight sync", p.sync, f"learner {kept} + vLLM weights + "
                                                         f"{p.sync_transient / GB:.2f} GB in flight + overheads", 4))
    held = "" if inp.module_on_host else f"learner {kept} + "
    lines.append(_line("phase: rollout", p.rollout, f"{held}vLLM budget + overheads", 4))
    return lines


# ----------------------------------------------------------------------------------------------------- the run
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
                lines.append(f"  {fix.overrides}: peak {_gb(fix.peak)}{'' if fix.fits else ', not enough'}")
        return "\n".join(lines)


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
        module_on_host=spec.module_on_host,
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
