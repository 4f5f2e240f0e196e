"""One policy's learner on one GPU, in arithmetic: what its update holds (weights, gradients, AdamW state, the compute
copy, activations op by op, attention masks, logits) and when, as the learner's code does it (``learner/learner.py``,
``learner/forward.py``, ``learner/sharding.py``). The memory plan (``assembly/memory.py``) composes it with vLLM's
footprint per GPU and phase."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from pettingllms.models.shape import (
    LORA_MODULE_DIMS, ModelShape, linear_parameters, lora_parameters, parameter_count, layer_parameters,
    root_parameters,
)

FP32 = 4
# FSDP2 keeps at most this many decoder layers all-gathered at once: the one computing and the one prefetched.
GATHERED_LAYERS = 2
# logsumexp's backward: the saved logits, the gradient from the picked tokens, and (self - result), its exp and
# grad x exp, all alive at once. The entropy term with a gradient (entropy_coeff > 0) keeps its softmax too and
# runs its own logsumexp backward: see ``logits_copies``.
LOGITS_COPIES = 5
# Without FSDP, a full fine-tune's first update creates AdamW's state among the update's freed blocks, and the
# caching allocator keeps those segments: after the cache release (serving.release_accelerator_cache) PyTorch still
# reserves 5.82 GiB more than it allocates, 0.45 x the AdamW state (gradient checkpointing: 5.07 GiB, 0.40 x), for
# every later rollout. Measured on an H200 (benchmarks/gpu_learner.py, Qwen3-1.7B); FSDP2 (0.01-0.20 GiB) and LoRA
# (0.11 GiB) leave almost none, so the plan counts this share of the AdamW state for the unsharded full case only.
STRANDED_CACHE_SHARE = 0.45


@dataclass(frozen=True)
class LearnerSetup:
    """One policy's learner on one GPU, as the run configures it.

    world_size: FSDP ranks (1 without FSDP). sharded: an FSDP2 group (also with one rank and ``fsdp.enabled``).
    compute_bytes: 2 for bf16 compute, 4 for float32. weight_bytes: the master weights' (and AdamW state's) dtype,
    4 unless ``master_weights=bfloat16``. trainable: the policy trains (else only its weights in compute dtype).
    lora_rank, lora_targets, adapters, trained_adapters: LoRA (rank 0: full fine-tuning).
    tokens: tokens per forward pass; logit_tokens: positions whose logits are computed; mask_elements: entries of
    the packed rows' L x L masks (rows x L^2). gradient_checkpointing, cpu_offload, reshard_after_forward: as set.
    reference_copy: a frozen reference model (KL > 0 on a full model). entropy_grad: entropy_coeff > 0.
    foreach_optimizer: AdamW's foreach path (CUDA), which allocates one temporary the size of the trained shard.
    expand_kv: grouped-query K and V are expanded to every query head before SDPA, as ``models/attention.py`` does
    on CUDA with a mask (for the memory-efficient kernel); on CPU SDPA takes them grouped.
    """

    world_size: int = 1
    sharded: bool = False
    compute_bytes: int = 2
    weight_bytes: int = 4
    trainable: bool = True
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    adapters: int = 0
    trained_adapters: int = 0
    tokens: int = 8192
    logit_tokens: int = 8192
    mask_elements: int = 8192**2
    gradient_checkpointing: bool = False
    cpu_offload: bool = False
    reshard_after_forward: bool = True
    reference_copy: bool = False
    entropy_grad: bool = False
    foreach_optimizer: bool = True
    expand_kv: bool = True
    flex_attention: bool = False  # optim.attention: FlexAttention's block mask, no additive masks, grouped K/V
    logprob_chunk_tokens: int = 0  # the chunked LM head's chunk (learner/logprob_head.py); 0 = dense

    @property
    def logits_at_once(self) -> int:
        """Positions whose fp32 logits exist at once: every logit position, or one chunk of the chunked head (its
        backward recomputes one chunk at a time)."""
        if self.logprob_chunk_tokens:
            return min(self.logit_tokens, self.logprob_chunk_tokens)
        return self.logit_tokens

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def stream_bytes(self) -> int:
        """The residual stream's dtype: the embedding's output. Under FSDP mixed precision the gathered weights are
        bf16, so it is bf16; without FSDP autocast leaves the embedding in the weights' dtype."""
        if self.compute_bytes == 4:
            return 4
        return 2 if (self.sharded or self.weight_bytes == 2) else 4

    def with_tokens(self, tokens: int) -> "LearnerSetup":
        """The worst case at ``tokens`` per forward: one packed row of that many tokens, every one a logit."""
        return dataclasses.replace(self, tokens=tokens, logit_tokens=tokens, mask_elements=tokens * tokens)


@dataclass(frozen=True)
class Term:
    label: str
    bytes: float
    note: str = ""


def trained_parameters(shape: ModelShape, setup: LearnerSetup) -> int:
    if not setup.trainable:
        return 0
    if setup.lora:
        return setup.trained_adapters * lora_parameters(shape, setup.lora_rank, setup.lora_targets)
    return parameter_count(shape)


def weight_parameters(shape: ModelShape, setup: LearnerSetup) -> int:
    """Every parameter the learner's module holds: the base model and every attached adapter."""
    return parameter_count(shape) + setup.adapters * lora_parameters(shape, setup.lora_rank, setup.lora_targets)


def layer_activation_bytes(shape: ModelShape, setup: LearnerSetup) -> float:
    """Bytes autograd saves per token in one decoder layer (Llama/Qwen, SDPA attention, no dropout), op by op.

    c = compute bytes, s = residual stream bytes, f = 4. RMSNorm (x.float(), x * rsqrt(mean(x^2)), weight * x):
    f x width for its fp32 input, f per row for the rsqrt, plus the normalised x (for the weight's gradient) when
    the norm weights train. A linear layer saves its input only when its weight trains (or a LoRA adapter's A reads
    it); layers reading the same input share it when no cast is needed (s == c), else each keeps its own cast.
    Attention saves q and k after RoPE, v, the output (o_proj's input) and a float per head (logsumexp); k and v
    at the query heads' width when they are expanded (``expand_kv``).
    The MLP saves gate (SiLU's input), SiLU's output and up (the product's inputs), and the product when down_proj
    saves its input. LoRA adds each targeted module's A output (B's input), r wide.
    """
    c, s, f = setup.compute_bytes, setup.stream_bytes, FP32
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    full = setup.trainable and not setup.lora
    targets = set(setup.lora_targets) if setup.lora else set()

    def saves(module: str) -> bool:
        return full or module in targets

    def inputs(width: int, modules: Sequence[str]) -> float:
        savers = [m for m in modules if saves(m)]
        if not savers:
            return 0.0
        return c * width * (1 if s == c else len(savers))

    def norm(width: int, rows: int, dtype_bytes: int) -> float:
        return f * width + f * rows + (dtype_bytes * width if full else 0)

    total = 2 * norm(h, 1, s)
    total += inputs(h, ("q_proj", "k_proj", "v_proj")) + inputs(h, ("gate_proj", "up_proj"))
    if shape.qk_norm:
        total += norm(q, shape.heads, c) + norm(kv, shape.kv_heads, c)
    kv_saved = q if setup.expand_kv else kv
    total += c * (q + kv_saved) + c * kv_saved + c * q + f * shape.heads  # q, k after RoPE; v; output; logsumexp
    total += 3 * c * i + (c * i if saves("down_proj") else 0)
    if setup.lora:
        total += c * setup.lora_rank * len(targets & set(LORA_MODULE_DIMS))
    return total


def head_activation_bytes(shape: ModelShape, setup: LearnerSetup) -> float:
    """Bytes per token saved after the last layer: the final RMSNorm, the output head's input (when the head trains)
    and the input ids and positions (int64)."""
    c, s, f, h = setup.compute_bytes, setup.stream_bytes, FP32, shape.hidden
    full = setup.trainable and not setup.lora
    total = f * h + f + (s * h if full else 0) + 2 * 8
    if full:
        total += s * h if s == c else c * h * setup.logit_tokens / max(1, setup.tokens)
    return total


def checkpoint_bytes(shape: ModelShape, setup: LearnerSetup) -> float:
    """Gradient checkpointing keeps each decoder layer's input (the residual stream) for the recompute."""
    return shape.layers * setup.stream_bytes * shape.hidden * setup.tokens


def mlp_gradient_bytes(shape: ModelShape, setup: LearnerSetup) -> float:
    """Gradient temporaries of a layer's backward beyond what it saved. At the gated product's backward the
    gradients of the product, of SiLU's output and of up (intermediate-sized, compute dtype) exist next to the saved
    gate, SiLU output and up; when down_proj trains, its saved copy of the product was released just before."""
    full = setup.trainable and not setup.lora
    down_saved = full or (setup.lora and "down_proj" in setup.lora_targets)
    return (2 if down_saved else 3) * setup.compute_bytes * shape.intermediate * setup.tokens


def dense_mask_bytes(setup: LearnerSetup) -> float:
    """The batch's bool rows x L x L mask (``learner/batching.py``); FlexAttention's batches carry none."""
    return 0.0 if setup.flex_attention else float(setup.mask_elements)


def mask_bytes(shape: ModelShape, setup: LearnerSetup) -> float:
    """The dense bool mask plus the additive copy in the compute dtype that SDPA makes from it and saves in every
    layer (one layer at a time under gradient checkpointing). FlexAttention's block mask instead: four int32 tensors
    of counts and indices per 128 x 128 block (``mask_elements / 1024`` bytes; 64 KB for a row of 8,192 tokens)."""
    if setup.flex_attention:
        return setup.mask_elements / 1024
    layers = 1 if setup.gradient_checkpointing else shape.layers
    return setup.mask_elements * (1 + setup.compute_bytes * layers)


def logits_copies(setup: LearnerSetup) -> int:
    """fp32 logits-sized tensors alive at the logits' peak: 5 (``LOGITS_COPIES``); an entropy bonus with a gradient
    also keeps its softmax and adds the gradient of its own logsumexp and softmax path: 7."""
    return LOGITS_COPIES + (2 if setup.entropy_grad else 0)


def logits_bytes(shape: ModelShape, setup: LearnerSetup) -> float:
    return logits_copies(setup) * setup.logits_at_once * shape.vocab * FP32


def compute_copy_bytes(shape: ModelShape, setup: LearnerSetup) -> float:
    """The weights in the compute dtype while a forward and backward run, beyond the master weights.

    FSDP2 with bf16 over float32 (MixedPrecisionPolicy) all-gathers ``GATHERED_LAYERS`` decoder layers at a time,
    and the root module (embedding, final norm, untied head) stays gathered from its forward to its backward (FSDP2
    does not reshard the root after forward); with ``reshard_after_forward=false`` every layer stays gathered.
    FSDP2 with the weights already in the compute dtype gathers the same, in that dtype. Without FSDP, bf16
    autocast over float32 weights keeps a bf16 cast of every matmul weight for the backward (with gradient
    checkpointing only the recomputed layer's and the head's); nothing otherwise.
    """
    weight_dtype = setup.weight_bytes if setup.trainable else setup.compute_bytes
    adapter_params = setup.adapters * lora_parameters(shape, setup.lora_rank, setup.lora_targets) / shape.layers
    if setup.sharded:
        layers = shape.layers if not setup.reshard_after_forward else min(GATHERED_LAYERS, shape.layers)
        return setup.compute_bytes * (layers * (layer_parameters(shape) + adapter_params) + root_parameters(shape))
    if setup.compute_bytes < weight_dtype:
        if setup.gradient_checkpointing:
            head = shape.vocab * shape.hidden
            return setup.compute_bytes * ((linear_parameters(shape) - head) / shape.layers + head)
        return setup.compute_bytes * linear_parameters(shape)
    return 0.0


@dataclass(frozen=True)
class LearnerMemory:
    """A learner's bytes on one GPU: ``terms`` for the printout, ``resident`` (its tensors between updates),
    ``peak`` (during one), ``largest_tensor`` (the biggest full tensor the weight sync gathers), ``moments`` (what
    the peak is the largest of) and ``stranded`` (cache the release before the rollout cannot return)."""

    terms: tuple[Term, ...]
    resident: float
    peak: float
    largest_tensor: float
    moments: tuple[Term, ...] = ()
    stranded: float = 0.0

    @property
    def kept(self) -> float:
        """What the learner holds on the GPU while the engine syncs and generates."""
        return self.resident + self.stranded


def update_moments(shape: ModelShape, setup: LearnerSetup) -> tuple[Term, ...]:
    """What a micro-batch adds on top of the weights, gradients and AdamW state at the three moments that can be
    the update's peak.

    logits backward: the compute copy, every saved activation (or, with gradient checkpointing, every layer's
    input), the head's, the masks and ``logits_copies`` fp32 logits; first layer backward: the logits are gone,
    the layer's gradient temporaries come (with checkpointing: that layer recomputed, with its additive mask);
    optimizer step: AdamW's foreach path allocates one temporary the size of the trained shard (on GPU).
    """
    copy = compute_copy_bytes(shape, setup)
    layer = layer_activation_bytes(shape, setup) * setup.tokens
    head = head_activation_bytes(shape, setup) * setup.tokens
    masks = mask_bytes(shape, setup)
    logits = logits_bytes(shape, setup)
    temps = mlp_gradient_bytes(shape, setup)
    if setup.gradient_checkpointing:
        kept = checkpoint_bytes(shape, setup) + dense_mask_bytes(setup)  # layer inputs and the bool mask
        logits_moment = copy + kept + head + logits
        layer_moment = copy + kept + layer + masks - dense_mask_bytes(setup) + temps
    else:
        logits_moment = copy + shape.layers * layer + head + masks + logits
        layer_moment = copy + shape.layers * layer + masks + temps
    gpu = 0.0 if setup.cpu_offload else 1.0
    step = gpu * trained_parameters(shape, setup) * setup.weight_bytes / setup.world_size \
        if setup.foreach_optimizer else 0.0
    return (Term("logits backward", logits_moment), Term("layer backward", layer_moment),
            Term("optimizer step", step))


def learner_memory(shape: ModelShape, setup: LearnerSetup) -> LearnerMemory:
    """The learner's terms. Gradients are freed between updates (``zero_grad(set_to_none=True)``); during one they
    exist from the first backward on, so the peak counts them with the activations of a later micro-batch."""
    w = setup.world_size
    gpu = 0.0 if setup.cpu_offload else 1.0  # fsdp.cpu_offload: shards, gradients and AdamW state in host memory
    weight_dtype = setup.weight_bytes if setup.trainable else setup.compute_bytes
    params, trained = weight_parameters(shape, setup), trained_parameters(shape, setup)
    name = {4: "fp32", 2: "bf16"}
    shard = f" / {w} ranks" if w > 1 else ""
    where = " (in host memory: fsdp.cpu_offload)" if setup.cpu_offload else ""
    note = f"{params / 1e9:.3g} B params x {weight_dtype} B{shard}{where}"
    if setup.lora and setup.trainable:
        note += f"; the LoRA base included, {trained / 1e6:.3g} M adapter params train"
    terms = [Term(f"{name[weight_dtype]} weights" + (" (master)" if setup.trainable else ""),
                  gpu * params * weight_dtype / w, note)]
    grads = adam = reference = 0.0
    if setup.trainable:
        grads = gpu * trained * weight_dtype / w
        adam = gpu * 2 * trained * weight_dtype / w
        terms.append(Term("gradients", grads, f"{trained / 1e9:.3g} B trained params x {weight_dtype} B{shard}; "
                                              "freed after the update (zero_grad(set_to_none=True))"))
        terms.append(Term("AdamW state", adam, f"2 x {weight_dtype} B per trained param{shard}"))
        if setup.reference_copy:
            reference = gpu * parameter_count(shape) * weight_dtype / w
            terms.append(Term("KL reference model", reference,
                              f"a frozen copy{shard} (algorithm.kl.init_kl_coeff > 0)"))
    base = terms[0].bytes + reference
    if not setup.trainable:
        return LearnerMemory(tuple(terms), base, base, 0.0)
    stranded = 0.0 if setup.sharded or setup.lora else STRANDED_CACHE_SHARE * adam
    if stranded:
        terms.append(Term("cache kept after release", stranded,
                          f"{STRANDED_CACHE_SHARE:g} x the AdamW state: allocator segments the cache release cannot "
                          "return (no FSDP; measured on an H200)"))
    copy = compute_copy_bytes(shape, setup)
    if setup.sharded:
        held = "every layer" if not setup.reshard_after_forward else f"{min(GATHERED_LAYERS, shape.layers)} layers"
        copy_note = f"FSDP all-gathers {held} (computing + prefetched) + the embedding/head, in " \
            f"{name[setup.compute_bytes]}"
    elif copy:
        copy_note = "bf16 casts of the matmul weights autocast keeps for the backward (no FSDP)"
    else:
        copy_note = "none: the weights already are in the compute dtype"
    layer = layer_activation_bytes(shape, setup)
    if setup.gradient_checkpointing:
        acts, acts_note = checkpoint_bytes(shape, setup), f"{setup.tokens} tokens x {shape.layers} layer inputs x " \
            f"{setup.stream_bytes * shape.hidden:,} B (gradient checkpointing; + 1 layer of {layer:,.0f} B/token " \
            "when recomputed)"
    else:
        acts, acts_note = shape.layers * layer * setup.tokens, f"{setup.tokens} tokens x {shape.layers} layers x " \
            f"{layer:,.0f} B (no gradient checkpointing)"
    acts += head_activation_bytes(shape, setup) * setup.tokens
    terms += [
        Term(f"{name[setup.compute_bytes]} compute copy", copy, copy_note),
        Term("activations", acts, acts_note + " + the final norm and head"),
        Term("attention masks", mask_bytes(shape, setup),
             "FlexAttention: a block mask of 128 x 128 blocks (no dense mask, no additive copy)"
             if setup.flex_attention else
             f"{setup.mask_elements:,} mask entries x (1 B bool + {setup.compute_bytes} B additive copy in "
             f"{1 if setup.gradient_checkpointing else shape.layers} layer(s))"),
        Term("logits", logits_bytes(shape, setup), f"{logits_copies(setup)} x {setup.logits_at_once} tokens x "
                                                   f"{shape.vocab:,} vocab x 4 B (fp32; logsumexp backward"
                                                   + (", one chunk of optim.logprob_chunk_tokens)"
                                                      if setup.logprob_chunk_tokens else ")")),
    ]
    moments = update_moments(shape, setup)
    peak = base + grads + adam + max(m.bytes for m in moments)
    # The weight sync's largest full tensor: the embedding (or head) in the compute dtype for a full model; an
    # adapter's widest LoRA matrix, in the master dtype, under LoRA.
    largest = shape.vocab * shape.hidden * setup.compute_bytes if not setup.lora else \
        max(shape.hidden, shape.intermediate) * setup.lora_rank * weight_dtype
    return LearnerMemory(tuple(terms), base + adam, peak, float(largest), moments, stranded)
