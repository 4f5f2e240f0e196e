"""The typed config schema. Hydra validates every key and type against it, so a typo fails at start-up.

Every key is documented in docs/training.md. Keys users know from the reference keep their names:
``base_models.policy_0.path``, ``training.{experiment_name,total_training_steps,epoch_size,train_batch_size,
max_prompt_length,max_response_length,val_freq}``, ``env.{name,dataset,benchmark,max_turns}``.

Loaded configs are frozen (``config/frozen.py``): a changed config is a new object made with ``evolve``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from pettingllms.config.frozen import Freezable
from pettingllms.core.choices import (
    DEFAULT_LORA_TARGET_MODULES, DType, EngineKind, GroupFilter, KLType, LossAggMode, NonFiniteReward, PromptFormat,
    RolloutMode, Selection, Specialization, Tracker,
)


@dataclass
class LoraConfig(Freezable):
    rank: int = 0  # 0: no LoRA (full fine-tuning)
    alpha: int = 32
    dropout: float = 0.0
    target_modules: List[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGET_MODULES))


@dataclass
class FSDPConfig(Freezable):
    enabled: bool = False  # train with an FSDP2 worker group even with one rank (always on when num_ranks > 1)
    cpu_offload: bool = False  # sharded weights, gradients and optimizer state in host memory (GPU ranks only)
    reshard_after_forward: bool = True  # free gathered layer weights after the forward (re-gather for backward)


@dataclass
class ModelConfig(Freezable):
    path: str = MISSING  # local dir, hub id, or the alias "smollm2-135m-instruct"
    # compute dtype: float32 | bfloat16 (bf16 autocast over fp32 master weights; engines in bf16)
    dtype: DType = DType.float32
    # the learner's weights and AdamW state; bfloat16 halves memory, loses small updates
    master_weights: DType = DType.float32
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)  # e.g. {enable_thinking: false} for Qwen3
    lora: LoraConfig = field(default_factory=LoraConfig)
    # auto (vLLM when the policy has GPUs, transformers on CPU) | hf (CPU only) | vllm
    engine: EngineKind = EngineKind.auto
    engine_options: Dict[str, Any] = field(default_factory=dict)  # engine keywords, e.g. vLLM gpu_memory_utilization
    # The GPU layout (docs/distributed.md): num_gpus GPUs -> num_gpus FSDP2 ranks (one GPU each) and
    # num_gpus / tensor_parallel vLLM engines of tensor_parallel GPUs each, colocated with the ranks.
    num_gpus: Optional[float] = None  # GPUs for this policy; None = resources.gpus_per_policy (GPU_num); < 1: a share
    tensor_parallel: int = 1  # GPUs per vLLM engine; must divide num_gpus
    num_ranks: int = 0  # FSDP2 ranks; 0 = one per GPU (GPU), 1 (CPU). On CPU, N > 1 runs N gloo ranks
    num_threads: int = 0  # torch threads per rank; 0 = share the CPU budget evenly
    cpus_per_rank: float = 0.0  # Ray CPUs per rank; 0 = num_threads if set, else the CPUs split over all ranks
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class SamplingConfig(Freezable):
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    max_tokens: int = 256  # capped by training.max_response_length


@dataclass
class AgentConfig(Freezable):
    policy: str = "policy_0"  # which base_models entry generates for and learns from this agent
    cls: Optional[str] = None  # override the agent class: registry name or "module:Class"
    trainable: bool = True  # false: the agent acts but its samples are never trained on
    train_sampling: SamplingConfig = field(default_factory=SamplingConfig)
    val_sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.0))
    options: Dict[str, Any] = field(default_factory=dict)  # keyword options for the agent class


@dataclass
class EnvConfig(Freezable):
    name: str = MISSING  # registry name or "module:Class"
    # Training set: a name (data/<domain>/train/<name>.parquet), a .parquet/.jsonl file, a hub id, a list of these,
    # or a {entry: weight} mixture (data/problems.py). None: the env generates its problems.
    dataset: Any = None
    # Validation sets, each reported on its own: a list of names (data/<domain>/test/<name>.parquet), files, hub
    # ids or mixtures. []: the env's own test split, if it generates problems.
    benchmark: Any = field(default_factory=list)
    max_val_problems: int = 0  # use the first N problems of each benchmark (0 = all; procedural: 50)
    max_turns: int = 2
    # The acting agents (L0: one), in the env graph's order; the others do not act. None = all of the env's agents
    agents: Optional[List[str]] = None
    # The agent graph, replacing the env's: stages in order, each a list of agents acting from the same state (a plain
    # name is a one-agent stage), e.g. [[bidder_a, bidder_b], [auctioneer]]. None = the env class's graph
    graph: Optional[List[Any]] = None
    data_root: str = "data"
    options: Dict[str, Any] = field(default_factory=dict)  # keyword options for the env class, checked against it
    # modules to import first (they may register envs); a single name is a one-element list
    imports: List[str] = field(default_factory=list)


@dataclass
class RolloutConfig(Freezable):
    # tree (AT-GRPO) | independent | trajectory (one group per problem and agent, episode returns)
    mode: RolloutMode = RolloutMode.tree
    branching: int = 4  # K: candidates per (turn, agent) node, or episodes per problem when independent
    select: Selection = Selection.greedy  # greedy | sample | first
    val_samples: int = 1  # independent episodes per validation problem


@dataclass
class RewardConfig(Freezable):
    alpha: float = 1.0  # r = alpha * team + local
    # a NaN or infinite team or local reward: error (stop, naming env, agent, turn, problem and output) | drop (out
    # of its group, the loss and branch selection; counted as <prefix>/nonfinite_rewards)
    non_finite: NonFiniteReward = NonFiniteReward.error


@dataclass
class KLConfig(Freezable):
    init_kl_coeff: float = 0.0  # 0: no reference model and no KL term
    kl_type: KLType = KLType["low_var_kl"]  # k1 | k2 | k3 | low_var_kl | abs | mse
    adaptive: bool = False
    kl_target: float = 0.01
    kl_horizon: int = 1000


@dataclass
class RolloutCheckConfig(Freezable):
    max_kl: float = 0.05  # stop when the engine/learner k3 KL on the same tokens exceeds this (per policy, adapter); 0 = off


@dataclass
class AlgorithmConfig(Freezable):
    norm_adv_by_std: bool = True
    filter: GroupFilter = GroupFilter.none  # none | dapo | std | mean
    filter_ratio: float = 0.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0  # dual clip
    loss_agg_mode: LossAggMode = LossAggMode["token-mean"]  # token-mean | token-sum | seq-mean-token-*
    entropy_coeff: float = 0.0
    kl: KLConfig = field(default_factory=KLConfig)
    rollout_check: RolloutCheckConfig = field(default_factory=lambda: RolloutCheckConfig())
    tis_cap: float = 0.0  # truncated importance sampling: token weight min(exp((old - engine) / T), cap); 0 = off


@dataclass
class OptimConfig(Freezable):
    lr: float = 5e-6
    weight_decay: float = 0.01
    warmup_steps: int = 0
    min_lr_ratio: float = 0.3
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    ppo_mini_batch_size: int = 0  # sequences per optimizer step; 0 = the whole step's batch
    micro_batch_max_tokens: int = 8192  # token budget per forward pass (gradient accumulation beyond)
    pack_shared_prompts: bool = True  # forward the K branches of a node as one row sharing the prompt (same logits)
    gradient_checkpointing: bool = False
    # A step whose gradient norm is NaN/inf moves no weight (logged as nonfinite_grad_steps); this many such training
    # steps in a row stop the run with an error. 0 = never stop (each one is still logged as a warning).
    max_nonfinite_grad_steps: int = 3


@dataclass
class TrainingConfig(Freezable):
    experiment_name: str = "default"
    project_name: str = "pettingllms"
    total_training_steps: int = 10
    epoch_size: Optional[int] = None  # problems per epoch; None = the whole dataset. Reshuffled every epoch
    train_batch_size: int = 4  # problems per step
    max_prompt_length: int = 1024
    max_response_length: int = 256
    val_freq: int = 5  # validate every N steps (0: never)
    val_before_train: bool = True
    save_freq: int = 0  # checkpoint every N steps (0: only at the end)
    max_ckpt_to_keep: int = 0  # keep the newest N checkpoints, delete older ones (0: keep all)
    resume: str = "auto"  # auto | none | <path to a checkpoint dir>
    stop_after_steps: int = 0  # stop this process after N more steps (job time limits); resume continues
    seed: int = 0
    logger: List[Tracker] = field(default_factory=lambda: [Tracker.console])  # console | tensorboard | wandb
    log_dir: str = "logs"
    # false: every run directory (training and eval) is owner-only (0700) and checkpoint files 0600; true: the
    # umask's modes (typically readable by group and others), for run directories shared with other users
    share_run_dir: bool = False
    save_samples_freq: int = 0  # every N steps write the step's training samples, by GRPO group, to <run>/samples/
    export_hf: bool = True  # write a Hugging Face directory per policy at the end
    plot: bool = True  # write PNG curves into the run directory at the end


@dataclass
class ResourcesConfig(Freezable):
    num_cpus: int = 0  # CPUs Ray may use; 0 = all of this machine
    gpus_per_policy: float = 0.0  # GPU_num: GPUs for every policy without its own base_models.<p>.num_gpus
    use_ray: bool = True  # false: run the policy workers in the driver process (debugging)
    ray_namespace: str = "pettingllms"
    # GB (1e9 bytes) per GPU for the memory plan (docs/distributed.md); 0 = the visible device's, else unknown
    gpu_memory_gb: float = 0.0


@dataclass
class Config(Freezable):
    # L0 single agent | L1 shared policy | L2 LoRA per agent | L3 model per agent
    specialization: Specialization = Specialization.L1
    # Typed as Any so users can add entries with `+base_models.policy_1.path=...` (OmegaConf 2.3 cannot merge new
    # keys into a dict of dataclasses); ``load.to_schema`` validates each entry against ModelConfig/AgentConfig.
    base_models: Dict[str, Any] = field(default_factory=dict)
    agents: Dict[str, Any] = field(default_factory=dict)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)


@dataclass
class EvalModelConfig(Freezable):
    """Where the evaluated weights come from, besides ``base_models`` (docs/evaluation.md)."""

    checkpoint: Optional[str] = None  # a trainer run dir (its latest checkpoint) or <run>/checkpoints/step_N
    adapters: Optional[str] = None  # a folder of LoRA adapters (<run>/hf/<policy>) on base_models.policy_0.path
    tokenizer: Optional[str] = None  # tokenizer/chat template source when the model dir has none
    server_url: Optional[str] = None  # an OpenAI-compatible server, e.g. http://host:8000/v1 (eval only)
    served_name: Optional[str] = None  # the server's model name; None = base_models.policy_0.path
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the server's API key (optional)
    prompt_format: PromptFormat = PromptFormat.ids  # ids: exact prompt token ids | text: the decoded prompt
    vllm_extras: bool = True  # send vLLM/sglang fields (top_k, return_token_ids); false for strict servers
    request_timeout_s: float = 600.0
    max_concurrency: int = 32  # requests in flight to the server
    max_retries: int = 2  # per request, on connection errors, 429 and 5xx


@dataclass
class EvalConfig(Freezable):
    """Sampling and reporting of ``pettingllms eval``; the same settings for every agent and benchmark."""

    n: int = 1  # independent episodes (samples) per problem
    k: List[int] = field(default_factory=lambda: [1])  # pass@k for each k (1 <= k <= n)
    # Sampling of every agent. None: each agent's own agents.<role>.val_sampling value (max_tokens capped by
    # training.max_response_length), as the trainer's validation samples; a checkpoint's run sets None for every
    # one of these not given on the command line (docs/evaluation.md, "A training run's settings").
    temperature: Optional[float] = 0.0  # 0 = greedy (then n must be 1)
    top_p: Optional[float] = 1.0
    top_k: Optional[int] = 0  # 0 disables top-k
    max_tokens: Optional[int] = 512  # per response
    seed: int = 0  # the local engine's sampling seed
    batch_problems: int = 32  # problems rolled out together (the progress bar advances per batch)
    log_dir: str = "logs/eval"  # run directory: <log_dir>[/<name>]/<date>/<time>
    name: str = ""


@dataclass
class EvalRunConfig(Config):
    """The root of ``pettingllms/configs/eval.yaml``: the training schema (env, agents, base_models) plus the eval sections."""

    model: EvalModelConfig = field(default_factory=EvalModelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def register_schema() -> None:
    """Register the schemas with Hydra's ConfigStore as ``pettingllms_schema`` and ``pettingllms_eval_schema``
    (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="pettingllms_schema", node=Config)
    ConfigStore.instance().store(name="pettingllms_eval_schema", node=EvalRunConfig)
