"""One policy's optimiser step: PPO-clip over token-budget micro-batches, per-agent LoRA streams, rollout checks.

One call of ``update`` is one training iteration:

    drop failed and frozen samples; split each stream (``learner/streams.py``) into mini-batches
    old log-probs: from the training forward itself when exactly on-policy, else one no-grad pass up front
    ref log-probs (only when the KL coefficient is > 0): one no-grad pass up front
    rollout check: the engine's logprobs against the learner's, before the first optimiser step
    for epoch in ppo_epochs:
        for k-th mini-batch of every stream:
            zero grads (to None); forward/backward each micro-batch of each stream under its adapter
            clip each stream's gradient; optimizer.step()
    LR scheduler step (once); KL controllers update (once)

Numerics (docs/training.md, "Precision"): every forward runs in train mode with every dropout probability set to 0
at construction (old logprobs and the training forward then agree exactly, as the engine does); ``dtype=bfloat16``
autocasts the forward and backward to bf16 over whatever weights the model holds (float32 master weights by
default); each sample's logits are divided by its sampling temperature; sliding-window models get their window in
the learner's masks (``learner/masks.py``).
"""

from __future__ import annotations

import copy
import logging
import math
import re
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch
from torch import nn

from pettingllms.algo.losses import PPOLossSettings, micro_batch_objective, truncated_importance_weights
from pettingllms.algo.verl_adapter import (
    GlobalBatchInfo,
    adaptive_kl_controller,
    cosine_schedule_with_warmup,
    entropy_from_logits,
    fixed_kl_controller,
)
from pettingllms.core.errors import NonFiniteGradientError, RolloutMismatchError
from pettingllms.core.types import Sample
from pettingllms.learner.batching import (
    PolicyBatch,
    build_batch,
    micro_batches_by_tokens,
    pack_by_prompt,
    packed_length,
    pad_response_values,
    response_log_probs,
    response_token_values,
    split_mini_batches,
    tempered,
    valid_response_tokens,
)
from pettingllms.learner.config import LearnerConfig
from pettingllms.learner.data_parallel import SINGLE_PROCESS, DataParallel, padded_plan
from pettingllms.learner.masks import AttentionLayout
from pettingllms.learner.state import export_hf_model, restore, snapshot
from pettingllms.learner.streams import Streams
from pettingllms.learner.tally import RolloutAgreement, StepTally
from pettingllms.models.lora import adapter_parameters, training_adapter, use_adapter

log = logging.getLogger("pettingllms.learner")
ADAPTERS_DISABLED = "adapters-disabled"


class PolicyLearner:
    """Trains one policy. ``model`` is a causal LM (or a peft model carrying ``adapter_names``).

    Args:
        model: the policy. Under LoRA a peft model with every adapter in ``adapter_names`` attached.
        config: hyper-parameters; ``config.total_steps`` is the number of ``update`` calls the schedule spans.
        adapter_names: one LoRA adapter per agent (L2); empty for a full model.
        ref_model: reference for the KL loss, used only when ``config.kl.coef > 0``. None picks the default:
            ``"adapters-disabled"`` (the same model with its adapters off) under LoRA, or a frozen deep copy of
            ``model`` as it is now for a full model. Build the learner from the initial weights and then
            ``load_state_dict`` so that the copy is the true initial policy.
        frozen: agent or adapter names that are never updated: their samples are skipped and a frozen adapter's
            weights are left out of the optimiser.
        policy: when given, every sample's ``policy`` field must equal it (named in the rollout check's error).
        pad_token_id: any valid id; padding never reaches the loss.
        data_parallel: this process's rank among the FSDP ranks of the policy (``learner/data_parallel.py``). Every
            rank gets the whole batch, trains on its own share of each mini-batch, and normalises the loss by the
            whole mini-batch's token count; ``model`` must then be sharded with ``learner.sharding.shard_model``.
    """

    def __init__(
        self,
        model: nn.Module,
        config: LearnerConfig,
        adapter_names: Sequence[str] = (),
        ref_model: nn.Module | str | None = None,
        *,
        frozen: Iterable[str] = (),
        policy: str | None = None,
        pad_token_id: int = 0,
        data_parallel: DataParallel = SINGLE_PROCESS,
    ) -> None:
        config.validate()
        self.data_parallel = data_parallel
        self.model = model
        self.config = config
        self.streams = Streams(adapter_names, frozen, policy)
        self.pad_token_id = pad_token_id
        self._loss_settings = PPOLossSettings(
            loss_agg_mode=config.loss_agg_mode,
            clip_ratio_low=config.clip_ratio_low,
            clip_ratio_high=config.clip_ratio_high,
            clip_ratio_c=config.clip_ratio_c,
            entropy_coeff=config.entropy_coeff,
            kl_type=config.kl.type,
        )
        self._attention = AttentionLayout.of(model)
        disabled = zero_dropout(model)
        if disabled:
            log.warning("dropout is not applied in RL updates (the engine samples without it, and old and new "
                        "logprobs must agree): set to 0 in %s", ", ".join(disabled[:6]) + (" ..." if len(disabled) > 6
                                                                                          else ""))
        # The reference copy must be taken before gradient checkpointing or requires_grad changes touch the model.
        self._reference = self._make_reference(ref_model)
        self._adapter_params = {name: [p for _, p in adapter_parameters(model, name)] for name in self.adapter_names}
        self._named_trainable = self._collect_trainable()
        if not self._named_trainable:
            raise ValueError("nothing to train: no parameter requires grad (or every adapter is frozen)")
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self._named_trainable],
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
        self.scheduler = cosine_schedule_with_warmup(
            self.optimizer, config.warmup_steps, config.total_steps, config.min_lr_ratio
        )
        self.kl_controllers = [self._make_kl_controller() for _ in self.streams.names] if config.kl.enabled else []
        self.step = 0
        self.nonfinite_streak = 0  # training steps in a row whose gradient was NaN/inf somewhere
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    # ------------------------------------------------------------------ setup

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return self.streams.adapter_names

    @property
    def frozen(self) -> frozenset[str]:
        return self.streams.frozen

    @property
    def policy(self) -> str | None:
        return self.streams.policy

    @property
    def uses_lora(self) -> bool:
        return self.streams.uses_lora

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def reference(self) -> nn.Module | str | None:
        """The KL reference: a frozen module, ``"adapters-disabled"``, or None when the KL loss is off."""
        return self._reference

    @property
    def kl_coefs(self) -> dict[str | None, float]:
        """Current KL coefficient per stream (adapter name, or None for a full model); empty when KL is off."""
        return {stream: float(c.value) for stream, c in zip(self.streams.names, self.kl_controllers)}

    @property
    def lr(self) -> float:
        """The learning rate the next ``update`` will use."""
        return float(self.optimizer.param_groups[0]["lr"])

    def _make_reference(self, ref_model: nn.Module | str | None) -> nn.Module | str | None:
        if not self.config.kl.enabled:
            return None  # no KL term: no reference, no extra forward, no extra memory
        if ref_model is None:
            ref_model = ADAPTERS_DISABLED if self.uses_lora else copy.deepcopy(self.model)
        if isinstance(ref_model, str):
            if ref_model != ADAPTERS_DISABLED:
                raise ValueError(f"ref_model must be a module, None or {ADAPTERS_DISABLED!r}, got {ref_model!r}")
            if not self.uses_lora:
                raise ValueError(f"ref_model={ADAPTERS_DISABLED!r} needs LoRA adapters (adapter_names is empty)")
            return ref_model
        ref_model.eval()
        ref_model.requires_grad_(False)
        return ref_model

    def _collect_trainable(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters the optimiser owns, in a fixed order (optimizer state dicts index them by position)."""
        if not self.uses_lora:
            return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        owned = {id(p) for params in self._adapter_params.values() for p in params}
        names = {id(p): n for n, p in self.model.named_parameters()}
        for param in self.model.parameters():
            if id(param) not in owned:
                param.requires_grad_(False)  # base weights never train under LoRA
        return [(names[id(p)], p) for name in self.adapter_names if self.streams.trainable(name)
                for p in self._adapter_params[name]]

    def _make_kl_controller(self) -> Any:
        kl = self.config.kl
        if kl.adaptive:
            return adaptive_kl_controller(kl.coef, kl.target, kl.horizon)
        return fixed_kl_controller(kl.coef)

    def _stream_params(self, stream: str | None) -> list[nn.Parameter]:
        if stream is None:
            return [p for _, p in self._named_trainable]
        return list(self._adapter_params[stream])

    # ------------------------------------------------------------------ forward passes

    def _pass_context(self, stream: str | None, *, train: bool):
        """Forward (and backward) through ``stream``'s adapter; only its weights require grad when ``train``."""
        if not self.uses_lora:
            return nullcontext()
        trainable = train and self.streams.trainable(stream)
        return training_adapter(self.model, stream, self._adapter_params, trainable)

    def _autocast(self) -> Any:
        if self.config.dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _forward_logits(self, model: nn.Module, batch: PolicyBatch) -> tuple[torch.Tensor, int]:
        """float32 logits (R, C, V) of row columns ``first_col ..`` (the LM head skips every column before it)."""
        first_col = batch.first_logit_column
        seq_len = batch.input_ids.shape[1]
        with self._autocast():
            output = model(
                input_ids=batch.input_ids,
                attention_mask=self._attention.masks(batch.attention_mask, batch.position_ids),
                position_ids=batch.position_ids,
                use_cache=False,
                logits_to_keep=seq_len - first_col,
            )
        return output.logits.float(), first_col

    def _response_log_probs(
        self, model: nn.Module, batch: PolicyBatch, *, entropy: str = "none", raw: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(log-probs, entropy, raw log-probs), each (N, T) over the samples' response tokens.

        log-probs: of ``softmax(logits / T)`` with each sample's sampling temperature T (the policy the loss
        trains); entropy: of that distribution, when ``entropy`` is "grad" or "detached"; raw: at temperature 1
        (what engines report; for the rollout check), detached, when ``raw``. Logits are upcast to fp32 first, so
        bf16 autocast does not round the log-probs.
        """
        logits, first_col = self._forward_logits(model, batch)
        scaled = tempered(logits, batch)
        log_probs = response_log_probs(scaled, batch, first_col)
        entropies = None
        if entropy == "grad":
            entropies = _response_entropy(scaled, batch, first_col)
        elif entropy == "detached":
            with torch.no_grad():
                entropies = _response_entropy(scaled.detach(), batch, first_col)
        raw_log_probs = None
        if raw:
            with torch.no_grad():
                raw_log_probs = log_probs.detach() if scaled is logits else response_log_probs(
                    logits.detach(), batch, first_col)
        return log_probs, entropies, raw_log_probs

    def _micro_batches(self, samples: Sequence[Sample], indices: Sequence[int]) -> Iterator[tuple[list[int], list]]:
        """This rank's micro-batches of ``indices`` (all of them in a single process).

        Under data parallelism every rank yields the same number of micro-batches: a rank with less work yields
        ``([], [])`` padding entries, for which the caller runs a pass that contributes nothing (FSDP gathers
        weights in every forward, so the ranks' passes must pair up).
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
            yield from self._micro_batches(samples, chunk)

    def _padding_pass(self, model: nn.Module, sample: Sample, *, backward: bool) -> None:
        """A forward (and backward) that changes nothing, run where another rank has a real micro-batch.

        Called in the same adapter context as the real pass, so the same parameters get (zero) gradients and
        FSDP reduce-scatters the same tensors on every rank.
        """
        batch = build_batch([sample], pad_token_id=self.pad_token_id).to(self.device)
        log_probs, _, _ = self._response_log_probs(model, batch)
        if backward:
            (log_probs.sum() * 0.0).backward()

    def _packed_micro_batches(
        self, samples: Sequence[Sample], indices: Sequence[int]
    ) -> Iterator[tuple[list[int], list]]:
        """Split ``indices`` into micro-batches of packed rows that fit ``micro_batch_max_tokens``.

        Yields ``(rows, units)``: the sample indices of one micro-batch, and its packing units as positions into
        ``rows``. With ``pack_shared_prompts`` samples sharing a prompt share a row; without, every sample is a row.
        """
        subset = [samples[i] for i in indices]
        budget = self.config.micro_batch_max_tokens
        if self.config.pack_shared_prompts:
            units = pack_by_prompt(subset, max_tokens=budget)
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

    @torch.no_grad()
    def _log_probs_no_grad(
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
        model = self._reference if reference and isinstance(self._reference, nn.Module) else self.model
        for stream, indices in by_stream.items():
            for rows, units in self._micro_batches_of_mini_batches(samples, indices):
                if reference and self._reference == ADAPTERS_DISABLED:
                    context = use_adapter(self.model, None)
                elif reference:
                    context = nullcontext()
                else:
                    context = self._pass_context(stream, train=False)
                if not rows:
                    with context:
                        self._padding_pass(model, samples[indices[0]], backward=False)
                    continue
                batch = build_batch([samples[i] for i in rows], pad_token_id=self.pad_token_id, units=units)
                batch = batch.to(self.device)
                with context:
                    log_probs, _, raw = self._response_log_probs(
                        model, batch, raw=agreement is not None or raw_out is not None)
                if agreement is not None:
                    agreement.add(stream, raw, batch.rollout_log_probs, batch.rollout_mask)
                log_probs = log_probs.float().cpu()
                raw = raw.float().cpu() if raw_out is not None else None
                for row, index in enumerate(rows):
                    out[index] = log_probs[row, : len(samples[index].response_ids)].clone()
                    if raw is not None:
                        raw_out[index] = raw[row, : len(samples[index].response_ids)].clone()
        return out

    def compute_logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        """Response-token log-probs of each sample under the current policy (its adapter under LoRA), no grad.

        At each sample's own sampling temperature (T = 1: the raw logits, what engines report). Empty responses
        give ().
        """
        if self.data_parallel.is_distributed:
            raise RuntimeError("compute_logprobs runs in a single process; an FSDP rank computes only its own share")
        values = self._log_probs_no_grad(samples, self.streams.all_streams(samples))
        return [tuple(values[i].tolist()) if i in values else () for i in range(len(samples))]

    # ------------------------------------------------------------------ gradients

    def _backward_mini_batch(
        self,
        stream: str | None,
        samples: Sequence[Sample],
        advantages: Sequence[float],
        indices: Sequence[int],
        old_log_probs: Mapping[int, torch.Tensor] | None,
        ref_log_probs: Mapping[int, torch.Tensor] | None,
        kl_coef: float,
        tally: StepTally,
        agreement: RolloutAgreement | None = None,
        old_raw_log_probs: Mapping[int, torch.Tensor] | None = None,
    ) -> None:
        """Accumulate one mini-batch's gradient over token-budget micro-batches.

        ``GlobalBatchInfo`` carries the mini-batch's token and sequence counts, so each micro-batch loss is
        normalised by the whole mini-batch and the accumulated gradient equals that of one big batch.
        ``old_log_probs`` None means exactly on-policy: the forward's own detached log-probs serve as old ones (and
        ``agreement``, when given, is tallied from the same forward). ``old_raw_log_probs``: the old policy's raw
        log-probs from that pass, for truncated importance sampling (on-policy: the forward's own).
        """
        # ``indices`` is the whole mini-batch on every rank, so these counts are global; dp_size undoes FSDP's
        # averaging of gradients over ranks.
        global_batch = GlobalBatchInfo(
            batch_num_tokens=sum(len(samples[i].response_ids) for i in indices),
            global_batch_size=len(indices),
            dp_size=self.data_parallel.world_size,
        )
        entropy_mode = "grad" if self.config.entropy_coeff > 0 else "detached"
        want_raw = agreement is not None or self.config.tis_cap > 0
        mini_batch_pg_loss = 0.0
        for rows, units in self._micro_batches(samples, indices):
            if not rows:
                with self._pass_context(stream, train=True):
                    self._padding_pass(self.model, samples[indices[0]], backward=True)
                continue
            batch = build_batch(
                [samples[i] for i in rows], [advantages[i] for i in rows], pad_token_id=self.pad_token_id, units=units
            ).to(self.device)
            width = batch.response_mask.shape[1]
            with self._pass_context(stream, train=True):
                log_probs, entropy, raw = self._response_log_probs(self.model, batch, entropy=entropy_mode,
                                                                    raw=want_raw)
                if old_log_probs is None:
                    old = log_probs.detach()
                    if agreement is not None:
                        agreement.add(stream, raw, batch.rollout_log_probs, batch.rollout_mask)
                else:
                    old = pad_response_values([old_log_probs[i] for i in rows], width).to(self.device)
                ref = None
                if ref_log_probs is not None:
                    ref = pad_response_values([ref_log_probs[i] for i in rows], width).to(self.device)
                weights = None
                if self.config.tis_cap > 0:
                    # The OLD policy against the engine (the PPO ratio handles old -> current), both raw (T = 1):
                    # the quantity the engine reports; the log-ratio is divided by each sample's temperature
                    # (docs/training.md, "Truncated importance sampling").
                    old_raw = raw if old_log_probs is None else pad_response_values(
                        [old_raw_log_probs[i] for i in rows], width).to(self.device)
                    weights = truncated_importance_weights(
                        old_raw, batch.rollout_log_probs, batch.rollout_mask, self.config.tis_cap,
                        batch.row_temperatures[batch.sample_rows])
                loss, parts = micro_batch_objective(
                    log_probs,
                    old,
                    batch.advantages,
                    batch.response_mask,
                    self._loss_settings,
                    global_batch,
                    ref_log_probs=ref,
                    kl_coef=kl_coef,
                    entropy=entropy,
                    importance_weights=weights,
                )
                # Backward inside the adapter context: gradient checkpointing re-runs the forward here.
                loss.backward()
            mini_batch_pg_loss += parts.pg_loss
            tally.add_micro_batch(stream, parts)
        tally.add_mini_batch(stream, mini_batch_pg_loss)

    def _clip_stream(self, stream: str | None) -> float:
        """Clip ``stream``'s gradient by its own norm; returns the norm before clipping (NaN/inf: grads dropped)."""
        params = [p for p in self._stream_params(stream) if p.grad is not None]
        if not params:
            return 0.0
        max_norm = self.config.grad_clip if self.config.grad_clip is not None else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if not math.isfinite(norm):
            for param in params:
                param.grad = None  # AdamW skips grad-less params: a bad batch leaves the weights untouched
        return norm

    def accumulate_gradients(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict[str, float]:
        """Zero the gradients, then accumulate the on-policy loss gradient of the whole batch (one mini-batch per
        stream) into ``param.grad``. No clipping and no optimiser step: a probe for tests and debugging."""
        self._check_advantages(samples, advantages)
        by_stream, _ = self.streams.partition(samples)
        self.optimizer.zero_grad(set_to_none=True)
        tally = StepTally()
        with _training_mode(self.model):
            for stream, indices in by_stream.items():
                kl_coef, ref = self._kl_inputs(samples, stream, indices)
                self._backward_mini_batch(stream, samples, advantages, indices, None, ref, kl_coef, tally)
        tally.merge_ranks(self.data_parallel, self.streams.names)
        return tally.summary()

    def _kl_inputs(
        self, samples: Sequence[Sample], stream: str | None, indices: Sequence[int]
    ) -> tuple[float, dict[int, torch.Tensor] | None]:
        if not self.kl_controllers:
            return 0.0, None
        coef = float(self.kl_controllers[self.streams.names.index(stream)].value)
        return coef, self._log_probs_no_grad(samples, {stream: indices}, reference=True)

    @staticmethod
    def _check_advantages(samples: Sequence[Sample], advantages: Sequence[float]) -> None:
        if len(advantages) != len(samples):
            raise ValueError(f"{len(advantages)} advantages for {len(samples)} samples; need one per sample")
        for index, value in enumerate(advantages):
            if not math.isfinite(float(value)):
                raise ValueError(f"advantage of sample {index} is {value}; advantages must be finite")

    # ------------------------------------------------------------------ the training step

    def update(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict[str, float]:
        """One training iteration on ``samples`` with one scalar advantage per sample. Returns float metrics.

        Raises ``RolloutMismatchError`` (before any weight moves) when the engine that sampled the batch and the
        learner disagree on the same tokens by more than ``config.max_rollout_kl``.
        """
        started = time.perf_counter()
        self._check_advantages(samples, advantages)
        by_stream, skipped = self.streams.partition(samples)
        lr = self.lr
        mini_batches = {s: split_mini_batches(idx, self.config.ppo_mini_batch_size) for s, idx in by_stream.items()}
        num_rounds = max((len(m) for m in mini_batches.values()), default=0)
        on_policy = self.config.ppo_epochs == 1 and num_rounds <= 1
        agreement = RolloutAgreement()

        timings = {"old_log_prob_s": 0.0, "ref_log_prob_s": 0.0}
        tally = StepTally()
        with _training_mode(self.model):
            old_log_probs = None
            old_raw = {} if self.config.tis_cap > 0 else None
            if by_stream and not on_policy:
                t0 = time.perf_counter()
                old_log_probs = self._log_probs_no_grad(samples, by_stream, agreement=agreement, raw_out=old_raw)
                timings["old_log_prob_s"] = time.perf_counter() - t0
                self._check_rollout(agreement)
            ref_log_probs = None
            if by_stream and self.kl_controllers:
                t0 = time.perf_counter()
                ref_log_probs = self._log_probs_no_grad(samples, by_stream, reference=True)
                timings["ref_log_prob_s"] = time.perf_counter() - t0
            kl_coefs = {s: float(c.value) for s, c in zip(self.streams.names, self.kl_controllers)}
            try:
                for epoch in range(self.config.ppo_epochs):
                    for round_index in range(num_rounds):
                        # Round k takes every stream's k-th mini-batch: streams own disjoint weights, so this is one
                        # optimizer step per stream; a stream without a k-th mini-batch keeps grad=None (no move).
                        chunks = {s: m[round_index] for s, m in mini_batches.items() if round_index < len(m)}
                        first = epoch == 0 and round_index == 0
                        check = agreement if (first and old_log_probs is None) else None
                        self._optimizer_step(samples, advantages, chunks, old_log_probs, ref_log_probs, kl_coefs,
                                             tally, check, old_raw)
            finally:
                self.optimizer.zero_grad(set_to_none=True)  # free gradient memory between iterations

        tally.merge_ranks(self.data_parallel, self.streams.names)  # before the KL controllers read it
        self._advance_schedule()
        self._update_kl_controllers(by_stream, tally)
        self.step += 1
        self._count_nonfinite_gradients(tally)
        metrics = tally.summary()
        metrics.update(self._step_metrics(samples, by_stream, skipped, kl_coefs, lr, num_rounds, tally))
        metrics.update(agreement.metrics(self.streams.names))
        metrics.update(timings)
        metrics["update_s"] = time.perf_counter() - started
        return metrics

    def _count_nonfinite_gradients(self, tally: StepTally) -> None:
        """Warn about a step whose gradient was NaN/inf (its update was dropped), and stop after
        ``config.max_nonfinite_grad_steps`` such steps in a row: a run whose weights no longer move must not go on
        looking healthy. Every rank sees the same global norms, so every rank takes the same decision."""
        if not tally.nonfinite_streams:
            self.nonfinite_streak = 0
            return
        self.nonfinite_streak += 1
        limit = self.config.max_nonfinite_grad_steps
        streams = sorted({f"adapter {s}" if s else "the model" for s in tally.nonfinite_streams})
        message = (f"policy {self.streams.policy or '?'} step {self.step}: the gradient norm was NaN/inf for "
                   f"{', '.join(streams)} in {len(tally.nonfinite_streams)} optimizer step(s); those updates were "
                   f"dropped ({self.nonfinite_streak} step(s) in a row")
        if limit and self.nonfinite_streak >= limit:
            raise NonFiniteGradientError(
                f"{message}, optim.max_nonfinite_grad_steps={limit}). Usual causes: a learning rate too high, "
                "bf16 overflow in the loss, or an attention kernel's NaN backward (docs/distributed.md); "
                "raise optim.max_nonfinite_grad_steps (0: never stop) to keep going")
        log.warning("%s; the run stops at %s)", message, limit if limit else "never (max_nonfinite_grad_steps=0")

    def _optimizer_step(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[float],
        chunks: Mapping[str | None, Sequence[int]],
        old_log_probs: Mapping[int, torch.Tensor] | None,
        ref_log_probs: Mapping[int, torch.Tensor] | None,
        kl_coefs: Mapping[str | None, float],
        tally: StepTally,
        agreement: RolloutAgreement | None,
        old_raw_log_probs: Mapping[int, torch.Tensor] | None = None,
    ) -> None:
        """Accumulate each stream's mini-batch gradient, clip it per stream, then take one AdamW step.

        ``agreement`` (the on-policy case: no separate old-logprob pass) is tallied from these forwards and checked
        before the step, so a mismatched batch never moves the weights.
        """
        self.optimizer.zero_grad(set_to_none=True)  # None, not 0: AdamW must skip (not decay) idle adapters
        norms = {}
        for stream, indices in chunks.items():
            self._backward_mini_batch(stream, samples, advantages, indices, old_log_probs, ref_log_probs,
                                      kl_coefs.get(stream, 0.0), tally, agreement, old_raw_log_probs)
            norms[stream] = self._clip_stream(stream)
        if agreement is not None:
            self._check_rollout(agreement)
        tally.add_optimizer_step(norms)
        self.optimizer.step()

    def _check_rollout(self, agreement: RolloutAgreement) -> None:
        """Merge the agreement over ranks (every rank takes the same decision) and stop on a mismatch."""
        agreement.merge_ranks(self.data_parallel, self.streams.names)
        limit = self.config.max_rollout_kl
        if limit <= 0:
            return
        for stream in self.streams.names:
            figures = agreement.of(stream)
            if figures is None or figures[2] <= limit:
                continue
            tokens, abs_diff, k3 = figures
            where = f"policy {self.policy!r}" if self.policy else "this policy"
            if stream is not None:
                where += f", adapter {stream!r}"
            raise RolloutMismatchError(
                f"{where}: the rollout engine's logprobs disagree with the learner's on the same {tokens:.0f} tokens "
                f"(mean |delta logprob| {abs_diff:.4f}, k3 KL {k3:.4f} > algorithm.rollout_check.max_kl={limit:g}), "
                f"so the engine is not sampling from the policy being trained. Likely causes: a weight sync that did "
                f"not reach the engine (see timing/sync_s), an adapter delivered under another agent's name (L2), or "
                f"a precision mismatch between engine and learner (dtype, kernels). The update was not applied. "
                f"Raise the threshold only after ruling these out"
            )

    def _advance_schedule(self) -> None:
        # One scheduler step per iteration. The last planned iteration already runs at the minimum LR; stepping
        # past total_steps would let the cosine climb back up, so the LR holds there instead.
        if self.step + 1 < self.config.total_steps:
            with warnings.catch_warnings():
                # An iteration with nothing to train (all failed or frozen) makes no optimizer step; the LR still
                # follows the iteration count, which is what torch's ordering warning would complain about.
                warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
                self.scheduler.step()

    def _update_kl_controllers(self, by_stream: Mapping[str | None, Sequence[int]], tally: StepTally) -> None:
        for stream, controller in zip(self.streams.names, self.kl_controllers):
            if stream in by_stream:
                controller.update(current_kl=tally.stream_kl(stream), n_steps=len(by_stream[stream]))

    def _step_metrics(
        self,
        samples: Sequence[Sample],
        by_stream: Mapping[str | None, Sequence[int]],
        skipped: Mapping[str, int],
        kl_coefs: Mapping[str | None, float],
        lr: float,
        num_rounds: int,
        tally: StepTally,
    ) -> dict[str, float]:
        metrics: dict[str, float] = {
            "lr": lr,
            "num_sequences": float(sum(len(i) for i in by_stream.values())),
            "num_tokens": float(sum(len(samples[i].response_ids) for idx in by_stream.values() for i in idx)),
            "num_optimizer_steps": float(num_rounds * self.config.ppo_epochs),
            "kl_coef": (sum(kl_coefs.values()) / len(kl_coefs)) if kl_coefs else 0.0,
            **{key: float(value) for key, value in skipped.items()},
        }
        if self.uses_lora:
            for name in self.adapter_names:
                indices = by_stream.get(name, ())
                prefix = f"adapter/{name}/"
                metrics[prefix + "num_sequences"] = float(len(indices))
                metrics[prefix + "num_tokens"] = float(sum(len(samples[i].response_ids) for i in indices))
                metrics[prefix + "grad_norm"] = tally.stream_grad_norm(name)
                if name in kl_coefs:
                    metrics[prefix + "kl_coef"] = kl_coefs[name]
        return metrics

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """An in-memory snapshot (host copies) of everything a resumed run needs: weights (adapters only under
        LoRA), optimiser, scheduler, KL controllers and the step counter. Checkpoints use DCP instead
        (``learner/state.py``); RNG state is the checkpoint layer's job."""
        return snapshot(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        restore(self, state)

    def export_hf(self, dest_dir: str | Path) -> list[Path]:
        """Write loadable Hugging Face weights; returns the folders written.

        Full model: ``save_pretrained`` (safetensors) into ``dest_dir``. LoRA: one peft folder per adapter,
        ``dest_dir/<adapter name>``, whose ``adapter_config.json`` also records ``"pettingllms_agent"``.
        """
        return export_hf_model(self.model, self.adapter_names, dest_dir)


class _training_mode:
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


def _response_entropy(logits: torch.Tensor, batch: PolicyBatch, first_column: int) -> torch.Tensor:
    """Entropy (N, T) of the distribution predicting each response token; 0.0 beyond a response.

    logits: (R, C, V) for row columns ``first_column ..``. The softmax over the vocabulary is the costly part, so
    it runs once per packed column (a shared prompt column once, not once per response).
    """
    column_entropy = entropy_from_logits(logits)  # (R, C)
    values = response_token_values(column_entropy, batch, first_column)
    return values.masked_fill(~valid_response_tokens(batch), 0.0)
