"""The learner's forward pass: samples in, per-token log-probabilities (and entropies) out.

``ForwardPass`` owns everything between a list of samples and the numbers the loss needs:

- the micro-batch plan: packed rows (``learner/batching.py``) cut to ``micro_batch_max_tokens``, and under data
  parallelism this rank's share of them, padded with passes that change nothing so that every FSDP rank runs as
  many forwards as the others (``learner/data_parallel.py``);
- the model call: the adapter of the sample's stream (only its weights require grad when training), the attention
  masks with sliding windows (``learner/masks.py``), ``dtype=bfloat16`` autocast over whatever weights the model
  holds, the decoder layers compiled where ``optim.compile`` asks (``models/compile.py``), and the LM head only
  over the columns that predict a response token;
- the numbers: float32 logits divided by each sample's sampling temperature, log-probs of the response tokens,
  their entropy, and the raw (temperature 1) log-probs the engine reports;
- the no-grad passes (old log-probs, the KL reference's log-probs), which cut their micro-batches exactly as the
  training passes do, so an on-policy ratio is exactly 1.

Numerics (docs/training.md, "Precision"): every pass runs in train mode with every dropout probability set to 0 at
construction, so old log-probs and the training forward agree exactly, as the engine (which never drops) does.
"""

from __future__ import annotations

import copy
import logging
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import nn

from pettingllms.algo.verl_adapter import entropy_from_logits
from pettingllms.core.errors import ConfigError
from pettingllms.core.types import Sample
from pettingllms.learner.batching import (
    PolicyBatch,
    build_batch,
    micro_batches_by_tokens,
    response_log_probs,
    response_token_values,
    split_mini_batches,
    tempered,
    valid_response_tokens,
)
from pettingllms.learner.config import LearnerConfig
from pettingllms.learner.data_parallel import DataParallel, padded_plan
from pettingllms.learner.logprob_head import ENTROPY, LOG_PROB, RAW, TokenTargets, chunked_head, plain_lm_head
from pettingllms.learner.masks import AttentionLayout
from pettingllms.learner.packing import pack_by_prefix, packed_length
from pettingllms.learner.rollout_check import RolloutAgreement
from pettingllms.learner.streams import Streams
from pettingllms.models.attention import use_grouped_attention
from pettingllms.models.compile import CompiledLayers
from pettingllms.models.lora import adapter_parameters, training_adapter, use_adapter

log = logging.getLogger("pettingllms.learner")
ADAPTERS_DISABLED = "adapters-disabled"


class ForwardPass:
    """One policy's forwards over samples: its model, its KL reference, and the micro-batches they run on.

    Built before anything touches ``requires_grad`` or gradient checkpointing: it zeroes dropout and takes the
    reference copy (see ``PolicyLearner`` for ``ref_model``).
    """

    def __init__(
        self,
        model: nn.Module,
        config: LearnerConfig,
        streams: Streams,
        ref_model: nn.Module | str | None,
        *,
        pad_token_id: int,
        data_parallel: DataParallel,
    ) -> None:
        self.model = model
        self.config = config
        self.streams = streams
        self.pad_token_id = pad_token_id
        self.data_parallel = data_parallel
        self.attention = AttentionLayout.of(model)
        # FlexAttention (block masks that skip what the mask hides) on CUDA; it has no backward on CPU.
        self.flex = config.attention == "flex" or (config.attention == "auto" and self.device.type == "cuda")
        if self.flex:
            use_grouped_attention(model)  # the attention function that takes a block mask (models/attention.py)
        if config.logprob_chunk_tokens:
            plain_lm_head(model)  # refused at construction, not at the first update
        if config.compile and self.flex and self.device.type != "cuda":
            raise ConfigError("optim.compile=true with optim.attention=flex needs CUDA: inductor's CPU FlexAttention "
                              "template does not build (torch 2.13); use optim.attention=auto or sdpa here")
        # Regional compilation (optim.compile): the layers' compiled forward, in place only during the passes below.
        self.compiled_layers = CompiledLayers(model, len(streams.adapter_names)) if config.compile else None
        disabled = zero_dropout(model)
        if disabled:
            log.warning("dropout is not applied in RL updates (the engine samples without it, and old and new "
                        "logprobs must agree): set to 0 in %s", ", ".join(disabled[:6]) + (" ..." if len(disabled) > 6
                                                                                          else ""))
        # The reference copy must be taken before gradient checkpointing or requires_grad changes touch the model.
        self.reference = self._make_reference(ref_model)
        # A reference module runs compiled too: at step 0 its log-probs then equal the policy's exactly.
        self.compiled_reference = (CompiledLayers(self.reference) if config.compile
                                   and isinstance(self.reference, nn.Module) else None)
        # Every adapter's parameters, so a pass can switch all but one off (models/lora.py::training_adapter).
        self.adapter_params = {name: [p for _, p in adapter_parameters(model, name)]
                               for name in streams.adapter_names}

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _make_reference(self, ref_model: nn.Module | str | None) -> nn.Module | str | None:
        if not self.config.kl.enabled:
            return None  # no KL term: no reference, no extra forward, no extra memory
        if ref_model is None:
            ref_model = ADAPTERS_DISABLED if self.streams.uses_lora else copy.deepcopy(self.model)
        if isinstance(ref_model, str):
            if ref_model != ADAPTERS_DISABLED:
                raise ValueError(f"ref_model must be a module, None or {ADAPTERS_DISABLED!r}, got {ref_model!r}")
            if not self.streams.uses_lora:
                raise ValueError(f"ref_model={ADAPTERS_DISABLED!r} needs LoRA adapters (adapter_names is empty)")
            return ref_model
        ref_model.eval()
        ref_model.requires_grad_(False)
        return ref_model

    # ------------------------------------------------------------------ one model call

    @contextmanager
    def adapter(self, stream: str | None, *, train: bool) -> Iterator[None]:
        """Forward (and backward) through ``stream``'s adapter; only its weights require grad when ``train``. The
        compiled layers (``optim.compile``) stay in place for the whole block: gradient checkpointing's recompute
        in the backward must run the forward that saved its tensors."""
        with ExitStack() as stack:
            if self.compiled_layers is not None:
                stack.enter_context(self.compiled_layers.active())
            if self.streams.uses_lora:
                trainable = train and self.streams.trainable(stream)
                stack.enter_context(training_adapter(self.model, stream, self.adapter_params, trainable))
            yield

    def batch(self, samples: Sequence[Sample], advantages: Sequence[float] | None = None,
              units: Sequence[Sequence[int]] | None = None) -> PolicyBatch:
        """``samples`` packed into one micro-batch on the model's device."""
        return build_batch(samples, advantages, pad_token_id=self.pad_token_id, units=units,
                           dense_mask=not self.flex).to(self.device)

    def _autocast(self) -> Any:
        if self.config.dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _forward(self, model: nn.Module, batch: PolicyBatch) -> torch.Tensor:
        """The model's output ``logits`` over row columns ``batch.head_columns`` (the LM head skips every other
        column): the logits, or what a head standing in for it returns (``learner/logprob_head.py``)."""
        if self.flex:
            if self.device.type != "cuda" and torch.is_grad_enabled():
                raise ConfigError("optim.attention=flex: FlexAttention has no backward on CPU, so the learner cannot "
                                  "train with it here; use optim.attention=auto (flex on CUDA, sdpa elsewhere) or sdpa")
            masks = self.attention.block_masks(batch.visible_until, batch.position_ids)
        else:
            masks = self.attention.masks(batch.attention_mask, batch.position_ids)
        compiled = self.compiled_layers if model is self.model else self.compiled_reference
        with self._autocast(), compiled.active() if compiled is not None else nullcontext():
            output = model(
                input_ids=batch.input_ids,
                attention_mask=masks,
                position_ids=batch.position_ids,
                use_cache=False,
                logits_to_keep=batch.head_columns,
            )
        return output.logits

    def _logits(self, model: nn.Module, batch: PolicyBatch) -> tuple[torch.Tensor, int]:
        """float32 logits (R, C, V) of row columns ``batch.head_columns``."""
        return self._forward(model, batch).float()

    def log_probs(
        self, model: nn.Module, batch: PolicyBatch, *, entropy: str = "none", raw: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(log-probs, entropy, raw log-probs), each (N, T) over the samples' response tokens.

        log-probs: of ``softmax(logits / T)`` with each sample's sampling temperature T (the policy the loss
        trains); entropy: of that distribution, when ``entropy`` is "grad" or "detached"; raw: at temperature 1
        (what engines report; for the rollout check), detached, when ``raw``. Logits are upcast to fp32 first, so
        bf16 autocast does not round the log-probs.
        """
        if self.config.logprob_chunk_tokens:
            return self._chunked_log_probs(model, batch, entropy=entropy, raw=raw)
        logits = self._logits(model, batch)
        scaled = tempered(logits, batch)
        log_probs = response_log_probs(scaled, batch)
        entropies = None
        if entropy == "grad":
            entropies = _response_entropy(scaled, batch)
        elif entropy == "detached":
            with torch.no_grad():
                entropies = _response_entropy(scaled.detach(), batch)
        raw_log_probs = None
        if raw:
            with torch.no_grad():
                raw_log_probs = log_probs.detach() if scaled is logits else response_log_probs(
                    logits.detach(), batch)
        return log_probs, entropies, raw_log_probs

    def _chunked_log_probs(
        self, model: nn.Module, batch: PolicyBatch, *, entropy: str, raw: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``log_probs`` through the chunked LM head (``learner/logprob_head.py``): the same values, without the
        float32 logits of the whole micro-batch."""
        valid = valid_response_tokens(batch)  # (N, T)
        columns = batch.logit_index
        rows = batch.sample_rows.unsqueeze(1).expand_as(columns)
        targets = TokenTargets(rows=rows[valid], columns=columns[valid], ids=batch.response_ids[valid],
                               temperatures=batch.row_temperatures.to(rows.device)[rows[valid]],
                               entropy=entropy, raw=raw)
        with chunked_head(plain_lm_head(model), targets, self.config.logprob_chunk_tokens):
            values = self._forward(model, batch)[0]  # (M, 3): log-prob, entropy, raw log-prob of each valid token
        per_token = values.new_zeros((*valid.shape, values.shape[-1])).index_put((valid,), values)
        log_probs = per_token[..., LOG_PROB]
        entropies = None
        if entropy == "grad":
            entropies = per_token[..., ENTROPY]
        elif entropy == "detached":
            entropies = per_token[..., ENTROPY].detach()
        return log_probs, entropies, per_token[..., RAW].detach() if raw else None

    def padding_pass(self, model: nn.Module, sample: Sample, *, backward: bool) -> None:
        """A forward (and backward) that changes nothing, run where another rank has a real micro-batch.

        Called in the same adapter context as the real pass, so the same parameters get (zero) gradients and
        FSDP reduce-scatters the same tensors on every rank.
        """
        log_probs, _, _ = self.log_probs(model, self.batch([sample]))
        if backward:
            (log_probs.sum() * 0.0).backward()

    # ------------------------------------------------------------------ the micro-batch plan

    def micro_batches(self, samples: Sequence[Sample], indices: Sequence[int]) -> Iterator[tuple[list[int], list]]:
        """This rank's micro-batches of ``indices`` (all of them in a single process).

        Under data parallelism every rank yields the same number of micro-batches: a rank with less work yields
        ``([], [])`` padding entries, for which the caller runs ``padding_pass`` (FSDP gathers weights in every
        forward, so the ranks' passes must pair up).
        """
        if not self.data_parallel.is_distributed:
            yield from self._packed_micro_batches(samples, indices)
            return
        shares = self.data_parallel.shares(samples, indices, self.config.ppo_mini_batch_size)
        plans = [list(self._packed_micro_batches(samples, share)) for share in shares]
        yield from padded_plan(plans, self.data_parallel.rank, ([], []))

    def _micro_batches_of_mini_batches(
        self, samples: Sequence[Sample], indices: Sequence[int]
    ) -> Iterator[tuple[list[int], list]]:
        """The micro-batches of every mini-batch of ``indices``, exactly as the training passes cut them, so a no-grad
        pass computes the very same forwards (bit for bit: the on-policy ratio is exactly 1)."""
        for chunk in split_mini_batches(indices, self.config.ppo_mini_batch_size):
            yield from self.micro_batches(samples, chunk)

    def _packed_micro_batches(
        self, samples: Sequence[Sample], indices: Sequence[int]
    ) -> Iterator[tuple[list[int], list]]:
        """Split ``indices`` into micro-batches of packed rows that fit ``micro_batch_max_tokens``.

        Yields ``(rows, units)``: the sample indices of one micro-batch, and its packing units as positions into
        ``rows``. With ``pack_shared_prompts`` samples whose prompts share a prefix share a row (``learner/packing.py``);
        without, every sample is a row.
        """
        subset = [samples[i] for i in indices]
        budget = self.config.micro_batch_max_tokens
        if self.config.pack_shared_prompts:
            units = pack_by_prefix(subset, max_tokens=budget)
        else:
            units = [[i] for i in range(len(subset))]
        lengths = [packed_length(subset, unit) for unit in units]
        for group in micro_batches_by_tokens(lengths, budget):
            rows: list[int] = []
            local_units: list[list[int]] = []
            for unit_index in group:
                local_units.append(list(range(len(rows), len(rows) + len(units[unit_index]))))
                rows.extend(indices[i] for i in units[unit_index])
            yield rows, local_units

    # ------------------------------------------------------------------ no-grad passes

    @torch.no_grad()
    def log_probs_no_grad(
        self,
        samples: Sequence[Sample],
        by_stream: Mapping[str | None, Sequence[int]],
        *,
        reference: bool = False,
        agreement: RolloutAgreement | None = None,
        raw_out: dict[int, torch.Tensor] | None = None,
    ) -> dict[int, torch.Tensor]:
        """Per-sample response log-probs (len_i,) on CPU under the policy (or the reference), keyed by index.

        Same mode as the training forward (train mode, dropout zeroed). ``agreement``: also tally the rollout check.
        ``raw_out``: also fill it with each sample's raw (temperature 1) log-probs, for truncated importance sampling.
        """
        out: dict[int, torch.Tensor] = {}
        model = self.reference if reference and isinstance(self.reference, nn.Module) else self.model
        for stream, indices in by_stream.items():
            for rows, units in self._micro_batches_of_mini_batches(samples, indices):
                if reference and self.reference == ADAPTERS_DISABLED:
                    context = use_adapter(self.model, None)
                elif reference:
                    context = nullcontext()
                else:
                    context = self.adapter(stream, train=False)
                if not rows:
                    with context:
                        self.padding_pass(model, samples[indices[0]], backward=False)
                    continue
                batch = self.batch([samples[i] for i in rows], units=units)
                with context:
                    log_probs, _, raw = self.log_probs(model, batch, raw=agreement is not None or raw_out is not None)
                if agreement is not None:
                    agreement.add(stream, raw, batch.rollout_log_probs, batch.rollout_mask)
                log_probs = log_probs.float().cpu()
                raw = raw.float().cpu() if raw_out is not None else None
                for row, index in enumerate(rows):
                    out[index] = log_probs[row, : len(samples[index].response_ids)].clone()
                    if raw is not None:
                        raw_out[index] = raw[row, : len(samples[index].response_ids)].clone()
        return out


class training_mode:
    """Train mode for the body (every learner pass: dropout is zeroed, so this only matters for checkpointing and
    modules that really branch on ``training``); the model's previous mode afterwards."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.was_training = self.model.training
        self.model.train()

    def __exit__(self, *exc_info) -> None:
        self.model.train(self.was_training)


def zero_dropout(model: nn.Module) -> list[str]:
    """Set every dropout probability of ``model`` to 0 (``nn.Dropout`` modules, attention-dropout attributes,
    peft's LoRA dropout, config values); returns the names of those that were above 0."""
    disabled = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            disabled.append(name or type(module).__name__)
            module.p = 0.0
        for attribute in ("attention_dropout", "dropout", "dropout_p"):
            value = getattr(module, attribute, None)
            if isinstance(value, float) and value > 0:
                disabled.append(f"{name}.{attribute}")
                setattr(module, attribute, 0.0)
    config = getattr(model, "config", None)
    for attribute in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                      "dropout", "hidden_dropout_prob", "attention_probs_dropout_prob"):
        value = getattr(config, attribute, None) if config is not None else None
        if isinstance(value, float) and value > 0:
            disabled.append(f"config.{attribute}")
            setattr(config, attribute, 0.0)
    return disabled


def _response_entropy(logits: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
    """Entropy (N, T) of the distribution predicting each response token; 0.0 beyond a response.

    logits: (R, C, V) for row columns ``batch.head_columns``. The softmax over the vocabulary is the costly part, so
    it runs once per packed column (a shared prompt column once, not once per response).
    """
    column_entropy = entropy_from_logits(logits)  # (R, C)
    values = response_token_values(column_entropy, batch)
    return values.masked_fill(~valid_response_tokens(batch), 0.0)
