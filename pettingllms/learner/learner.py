"""One policy's optimiser step: PPO-clip over token-budget micro-batches, per-agent LoRA routing, state dicts.

Work is organised in *streams*. Under LoRA (L2) each adapter is a stream: its samples are forwarded with only
that adapter active, its loss is normalised over its own tokens and its gradient is clipped on its own, so an
agent's update is the same whether or not other agents' samples share the batch. Without LoRA (L0, L1, L3)
there is one stream holding every sample.

One call of ``update`` is one training iteration:

    drop failed and frozen samples; split each stream into mini-batches
    old log-probs: from the training forward itself when exactly on-policy, else one no-grad pass up front
    ref log-probs (only when the KL coefficient is > 0): one no-grad pass up front
    for epoch in ppo_epochs:
        for k-th mini-batch of every stream:
            zero grads (to None); forward/backward each micro-batch of each stream under its adapter
            clip each stream's gradient; optimizer.step()
    LR scheduler step (once); KL controllers update (once)
"""

from __future__ import annotations

import copy
import math
import re
import time
import warnings
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch
from torch import nn

from pettingllms.algo.losses import ObjectiveParts, PPOLossSettings, micro_batch_objective
from pettingllms.algo.verl_adapter import (
    GlobalBatchInfo,
    adaptive_kl_controller,
    cosine_schedule_with_warmup,
    entropy_from_logits,
    fixed_kl_controller,
)
from pettingllms.core.types import Sample
from pettingllms.learner.adapters import AdapterContext, adapter_parameters, peft_adapter_context
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
    valid_response_tokens,
)
from pettingllms.learner.config import LearnerConfig
from pettingllms.learner.fsdp import SINGLE_PROCESS, DataParallel, padded_plan

ADAPTERS_DISABLED = "adapters-disabled"
STATE_FORMAT = 1

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
        adapter_context: ``(model, name | None) -> context manager`` that activates one adapter or disables them
            all; defaults to peft's ``set_adapter``/``disable_adapter``.
        frozen: agent or adapter names that are never updated: their samples are skipped and a frozen adapter's
            weights are left out of the optimiser.
        policy: when given, every sample's ``policy`` field must equal it.
        pad_token_id: any valid id; padding never reaches the loss.
        data_parallel: this process's rank among the FSDP ranks of the policy (``pettingllms.learner.fsdp``). Every
            rank gets the whole batch, trains on its own share of each mini-batch, and normalises the loss by the
            whole mini-batch's token count; ``model`` must then be sharded with ``fsdp.shard_model``.
    """

    def __init__(
        self,
        model: nn.Module,
        config: LearnerConfig,
        adapter_names: Sequence[str] = (),
        ref_model: nn.Module | str | None = None,
        *,
        adapter_context: AdapterContext | None = None,
        frozen: Iterable[str] = (),
        policy: str | None = None,
        pad_token_id: int = 0,
        data_parallel: DataParallel = SINGLE_PROCESS,
    ) -> None:
        config.validate()
        self.data_parallel = data_parallel
        self.model = model
        self.config = config
        self.adapter_names = tuple(adapter_names)
        if len(set(self.adapter_names)) != len(self.adapter_names):
            raise ValueError(f"duplicate adapter names: {self.adapter_names}")
        self.frozen = frozenset(frozen)
        self.policy = policy
        self.pad_token_id = pad_token_id
        self._adapter_context = adapter_context or peft_adapter_context
        self._streams: tuple[str | None, ...] = self.adapter_names if self.uses_lora else (None,)
        self._loss_settings = PPOLossSettings(
            loss_agg_mode=config.loss_agg_mode,
            clip_ratio_low=config.clip_ratio_low,
            clip_ratio_high=config.clip_ratio_high,
            clip_ratio_c=config.clip_ratio_c,
            entropy_coeff=config.entropy_coeff,
            kl_type=config.kl.type,
        )

        # The reference copy must be taken before gradient checkpointing or requires_grad changes touch the model.
        self._reference = self._make_reference(ref_model)
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
        self.kl_controllers = [self._make_kl_controller() for _ in self._streams] if config.kl.enabled else []
        self.step = 0
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    # ------------------------------------------------------------------ setup

    @property
    def uses_lora(self) -> bool:
        return bool(self.adapter_names)

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
        return {stream: float(c.value) for stream, c in zip(self._streams, self.kl_controllers)}

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
        self._adapter_params: dict[str, list[tuple[str, nn.Parameter]]] = {}
        if not self.uses_lora:
            return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self._adapter_params = {name: adapter_parameters(self.model, name) for name in self.adapter_names}
        owned = {id(p) for params in self._adapter_params.values() for _, p in params}
        for _, param in self.model.named_parameters():
            if id(param) not in owned:
                param.requires_grad_(False)  # base weights never train under LoRA
        return [
            (n, p) for name in self.adapter_names if name not in self.frozen for n, p in self._adapter_params[name]
        ]

    def _make_kl_controller(self) -> Any:
        kl = self.config.kl
        if kl.adaptive:
            return adaptive_kl_controller(kl.coef, kl.target, kl.horizon)
        return fixed_kl_controller(kl.coef)

    def _stream_params(self, stream: str | None) -> list[nn.Parameter]:
        if stream is None:
            return [p for _, p in self._named_trainable]
        return [p for _, p in self._adapter_params[stream]]

    # ------------------------------------------------------------------ routing

    def _stream_of(self, index: int, sample: Sample) -> str | None:
        where = f"sample {index} (policy {sample.policy!r}, agent {sample.agent!r}, episode {sample.episode!r})"
        if self.policy is not None and sample.policy != self.policy:
            raise ValueError(f"{where} belongs to another policy; this learner trains {self.policy!r}")
        if not self.uses_lora:
            if sample.adapter is not None:
                raise ValueError(f"{where} names adapter {sample.adapter!r} but this policy has no LoRA adapters")
            return None
        if sample.adapter is None:
            raise ValueError(
                f"{where} has no adapter; under LoRA every sample must name its agent's adapter, "
                f"one of {list(self.adapter_names)}"
            )
        if sample.adapter not in self.adapter_names:
            raise ValueError(f"{where} names unknown adapter {sample.adapter!r}; known: {list(self.adapter_names)}")
        return sample.adapter

    def _is_frozen(self, sample: Sample) -> bool:
        return sample.agent in self.frozen or (sample.adapter is not None and sample.adapter in self.frozen)

    def _partition(self, samples: Sequence[Sample]) -> tuple[dict[str | None, list[int]], dict[str, int]]:
        """Trainable sample indices per stream (stream order), and counts of what was skipped and why."""
        by_stream: dict[str | None, list[int]] = {stream: [] for stream in self._streams}
        skipped = {"num_failed_skipped": 0, "num_frozen_skipped": 0}
        for index, sample in enumerate(samples):
            stream = self._stream_of(index, sample)
            if sample.failed or not sample.response_ids:
                skipped["num_failed_skipped"] += 1
            elif self._is_frozen(sample):
                skipped["num_frozen_skipped"] += 1
            else:
                by_stream[stream].append(index)
        return {s: idx for s, idx in by_stream.items() if idx}, skipped

    # ------------------------------------------------------------------ forward passes

    @contextmanager
    def _adapter_active(self, stream: str | None, *, train: bool) -> Iterator[None]:
        """Forward (and backward) with ``stream``'s adapter; only its weights require grad when ``train``."""
        if not self.uses_lora:
            yield
            return
        with self._adapter_context(self.model, stream):
            # peft's switching toggles requires_grad on its own terms; set exactly what this pass needs (only the
            # active, unfrozen adapter, and only when training) and put the flags back afterwards.
            saved = [(param, param.requires_grad) for params in self._adapter_params.values() for _, param in params]
            for name, params in self._adapter_params.items():
                wanted = train and name == stream and name not in self.frozen
                for _, param in params:
                    param.requires_grad_(wanted)
            try:
                yield
            finally:
                for param, flag in saved:
                    param.requires_grad_(flag)

    def _autocast(self) -> Any:
        if self.config.dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _response_log_probs(
        self, model: nn.Module, batch: PolicyBatch, *, entropy: str = "none"
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (N, T) of each sample's response tokens; entropy (N, T) when ``entropy`` is "grad" or "detached".

        The LM head runs only from the earliest column that predicts a response token (``logits_to_keep``); a
        packed row puts its shared prompt first, so this skips nearly every prompt position. Logits are upcast to
        fp32 before the softmax so bf16 autocast does not round the log-probs.
        """
        first_col = batch.first_logit_column
        seq_len = batch.input_ids.shape[1]
        with self._autocast():
            output = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
                logits_to_keep=seq_len - first_col,
            )
        logits = output.logits.float()  # column c holds the logits at row column first_col + c
        del output
        log_probs = response_log_probs(logits, batch, first_col)
        entropies = None
        if entropy == "grad":
            entropies = _response_entropy(logits, batch, first_col)
        elif entropy == "detached":
            with torch.no_grad():
                entropies = _response_entropy(logits.detach(), batch, first_col)
        return log_probs, entropies

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

    def _padding_pass(self, model: nn.Module, sample: Sample, *, backward: bool) -> None:
        """A forward (and backward) that changes nothing, run where another rank has a real micro-batch.

        Called in the same adapter context as the real pass, so the same parameters get (zero) gradients and
        FSDP reduce-scatters the same tensors on every rank.
        """
        batch = build_batch([sample], pad_token_id=self.pad_token_id).to(self.device)
        log_probs, _ = self._response_log_probs(model, batch)
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

    @contextmanager
    def _eval_mode(self, model: nn.Module) -> Iterator[None]:
        was_training = model.training
        model.eval()
        try:
            yield
        finally:
            model.train(was_training)

    @torch.no_grad()
    def _log_probs_no_grad(
        self, samples: Sequence[Sample], by_stream: Mapping[str | None, Sequence[int]], *, reference: bool = False
    ) -> dict[int, torch.Tensor]:
        """Per-sample response log-probs (len_i,) on CPU under the policy (or the reference), keyed by index."""
        out: dict[int, torch.Tensor] = {}
        model = self._reference if reference and isinstance(self._reference, nn.Module) else self.model
        for stream, indices in by_stream.items():
            for rows, units in self._micro_batches(samples, indices):
                if reference and self._reference == ADAPTERS_DISABLED:
                    context = self._adapter_context(self.model, None)
                elif reference:
                    context = nullcontext()
                else:
                    context = self._adapter_active(stream, train=False)
                if not rows:
                    with self._eval_mode(model), context:
                        self._padding_pass(model, samples[indices[0]], backward=False)
                    continue
                batch = build_batch([samples[i] for i in rows], pad_token_id=self.pad_token_id, units=units)
                batch = batch.to(self.device)
                with self._eval_mode(model), context:
                    log_probs, _ = self._response_log_probs(model, batch)
                log_probs = log_probs.float().cpu()
                for row, index in enumerate(rows):
                    out[index] = log_probs[row, : len(samples[index].response_ids)].clone()
        return out

    def compute_logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        """Response-token log-probs of each sample under the current policy (its adapter under LoRA), no grad.

        Raw logits (temperature 1), the same quantity the rollout engine reports. Empty responses give ().
        """
        if self.data_parallel.is_distributed:
            raise RuntimeError("compute_logprobs runs in a single process; an FSDP rank computes only its own share")
        by_stream: dict[str | None, list[int]] = defaultdict(list)
        for index, sample in enumerate(samples):
            stream = self._stream_of(index, sample)
            if sample.response_ids:
                by_stream[stream].append(index)
        values = self._log_probs_no_grad(samples, by_stream)
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
        tally: "_Tally",
    ) -> None:
        """Accumulate one mini-batch's gradient over token-budget micro-batches.

        ``GlobalBatchInfo`` carries the mini-batch's token and sequence counts, so each micro-batch loss is
        normalised by the whole mini-batch and the accumulated gradient equals that of one big batch.
        ``old_log_probs`` None means exactly on-policy: the forward's own detached log-probs serve as old ones.
        """
        # ``indices`` is the whole mini-batch on every rank, so these counts are global; dp_size undoes FSDP's
        # averaging of gradients over ranks.
        global_batch = GlobalBatchInfo(
            batch_num_tokens=sum(len(samples[i].response_ids) for i in indices),
            global_batch_size=len(indices),
            dp_size=self.data_parallel.world_size,
        )
        entropy_mode = "grad" if self.config.entropy_coeff > 0 else "detached"
        mini_batch_pg_loss = 0.0
        for rows, units in self._micro_batches(samples, indices):
            if not rows:
                with self._adapter_active(stream, train=True):
                    self._padding_pass(self.model, samples[indices[0]], backward=True)
                continue
            batch = build_batch(
                [samples[i] for i in rows], [advantages[i] for i in rows], pad_token_id=self.pad_token_id, units=units
            ).to(self.device)
            width = batch.response_mask.shape[1]
            with self._adapter_active(stream, train=True):
                log_probs, entropy = self._response_log_probs(self.model, batch, entropy=entropy_mode)
                if old_log_probs is None:
                    old = log_probs.detach()
                else:
                    old = pad_response_values([old_log_probs[i] for i in rows], width).to(self.device)
                ref = None
                if ref_log_probs is not None:
                    ref = pad_response_values([ref_log_probs[i] for i in rows], width).to(self.device)
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
        by_stream, _ = self._partition(samples)
        self.optimizer.zero_grad(set_to_none=True)
        tally = _Tally()
        was_training = self.model.training
        self.model.train()
        try:
            for stream, indices in by_stream.items():
                kl_coef, ref = self._kl_inputs(samples, stream, indices)
                self._backward_mini_batch(stream, samples, advantages, indices, None, ref, kl_coef, tally)
        finally:
            self.model.train(was_training)
        tally.merge_ranks(self.data_parallel, self._streams)
        return tally.summary()

    def _kl_inputs(
        self, samples: Sequence[Sample], stream: str | None, indices: Sequence[int]
    ) -> tuple[float, dict[int, torch.Tensor] | None]:
        if not self.kl_controllers:
            return 0.0, None
        coef = float(self.kl_controllers[self._streams.index(stream)].value)
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
        """One training iteration on ``samples`` with one scalar advantage per sample. Returns float metrics."""
        started = time.perf_counter()
        self._check_advantages(samples, advantages)
        by_stream, skipped = self._partition(samples)
        lr = self.lr
        mini_batches = {s: split_mini_batches(idx, self.config.ppo_mini_batch_size) for s, idx in by_stream.items()}
        num_rounds = max((len(m) for m in mini_batches.values()), default=0)
        on_policy = self.config.ppo_epochs == 1 and num_rounds <= 1

        timings = {"old_log_prob_s": 0.0, "ref_log_prob_s": 0.0}
        old_log_probs = None
        if by_stream and not on_policy:
            t0 = time.perf_counter()
            old_log_probs = self._log_probs_no_grad(samples, by_stream)
            timings["old_log_prob_s"] = time.perf_counter() - t0
        ref_log_probs = None
        if by_stream and self.kl_controllers:
            t0 = time.perf_counter()
            ref_log_probs = self._log_probs_no_grad(samples, by_stream, reference=True)
            timings["ref_log_prob_s"] = time.perf_counter() - t0
        kl_coefs = {s: float(c.value) for s, c in zip(self._streams, self.kl_controllers)}

        tally = _Tally()
        was_training = self.model.training
        self.model.train()
        try:
            for _ in range(self.config.ppo_epochs):
                for round_index in range(num_rounds):
                    # Round k takes every stream's k-th mini-batch: streams own disjoint weights, so this is one
                    # optimizer step per stream, and a stream without a k-th mini-batch keeps grad=None (no move).
                    chunks = {s: m[round_index] for s, m in mini_batches.items() if round_index < len(m)}
                    self._optimizer_step(samples, advantages, chunks, old_log_probs, ref_log_probs, kl_coefs, tally)
        finally:
            self.optimizer.zero_grad(set_to_none=True)  # free gradient memory between iterations
            self.model.train(was_training)

        tally.merge_ranks(self.data_parallel, self._streams)  # before the KL controllers read it
        self._advance_schedule()
        self._update_kl_controllers(by_stream, samples, tally)
        self.step += 1
        metrics = tally.summary()
        metrics.update(self._step_metrics(samples, by_stream, skipped, kl_coefs, lr, num_rounds, tally))
        metrics.update(timings)
        metrics["update_s"] = time.perf_counter() - started
        return metrics

    def _optimizer_step(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[float],
        chunks: Mapping[str | None, Sequence[int]],
        old_log_probs: Mapping[int, torch.Tensor] | None,
        ref_log_probs: Mapping[int, torch.Tensor] | None,
        kl_coefs: Mapping[str | None, float],
        tally: "_Tally",
    ) -> None:
        """Accumulate each stream's mini-batch gradient, clip it per stream, then take one AdamW step."""
        self.optimizer.zero_grad(set_to_none=True)  # None, not 0: AdamW must skip (not decay) idle adapters
        norms = {}
        for stream, indices in chunks.items():
            self._backward_mini_batch(
                stream, samples, advantages, indices, old_log_probs, ref_log_probs, kl_coefs.get(stream, 0.0), tally
            )
            norms[stream] = self._clip_stream(stream)
        tally.add_optimizer_step(norms)
        self.optimizer.step()

    def _advance_schedule(self) -> None:
        # One scheduler step per iteration. The last planned iteration already runs at the minimum LR; stepping
        # past total_steps would let the cosine climb back up, so the LR holds there instead.
        if self.step + 1 < self.config.total_steps:
            with warnings.catch_warnings():
                # An iteration with nothing to train (all failed or frozen) makes no optimizer step; the LR still
                # follows the iteration count, which is what torch's ordering warning would complain about.
                warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
                self.scheduler.step()

    def _update_kl_controllers(
        self, by_stream: Mapping[str | None, Sequence[int]], samples: Sequence[Sample], tally: "_Tally"
    ) -> None:
        for stream, controller in zip(self._streams, self.kl_controllers):
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
        tally: "_Tally",
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

    def _model_state(self) -> dict[str, torch.Tensor]:
        if self.uses_lora:
            return {n: p.detach().clone() for name in self.adapter_names for n, p in self._adapter_params[name]}
        return {n: t.detach().clone() for n, t in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """A snapshot (copied tensors) of everything a resumed run needs: weights (adapters only under LoRA),
        optimiser, scheduler, KL controllers and the step counter. RNG state is the checkpoint layer's job."""
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            "adapter_names": list(self.adapter_names),
            "frozen": sorted(self.frozen),
            "model": self._model_state(),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "scheduler": copy.deepcopy(self.scheduler.state_dict()),
            "kl_coefs": [float(c.value) for c in self.kl_controllers],
        }

    def check_saved_state(self, state: Mapping[str, Any], expected_format: int, what: str) -> None:
        """Raise unless ``state`` (a saved learner state, whole or sharded) fits this learner: format, adapters,
        frozen adapters and whether the KL loss is on."""
        if state.get("format") != expected_format:
            raise ValueError(f"{what} format {state.get('format')!r} is not {expected_format}")
        if list(state["adapter_names"]) != list(self.adapter_names) or sorted(state["frozen"]) != sorted(self.frozen):
            raise ValueError(
                f"{what} was saved with adapters {state['adapter_names']} (frozen {state['frozen']}); "
                f"this learner has {list(self.adapter_names)} (frozen {sorted(self.frozen)})"
            )
        if len(state["kl_coefs"]) != len(self.kl_controllers):
            raise ValueError(f"{what} and this learner disagree on whether the KL loss is on")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.check_saved_state(state, STATE_FORMAT, "learner state")
        self._load_model_state(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for controller, value in zip(self.kl_controllers, state["kl_coefs"]):
            controller.value = value
        self.step = int(state["step"])

    def _load_model_state(self, weights: Mapping[str, torch.Tensor]) -> None:
        if not self.uses_lora:
            self.model.load_state_dict(weights, strict=True)
            return
        params = {n: p for name in self.adapter_names for n, p in self._adapter_params[name]}
        missing, unexpected = sorted(set(params) - set(weights)), sorted(set(weights) - set(params))
        if missing or unexpected:
            raise ValueError(f"adapter weights do not match: missing {missing[:5]}, unexpected {unexpected[:5]}")
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(weights[name])

    def export_hf(self, dest_dir: str | Path) -> list[Path]:
        """Write loadable Hugging Face weights; returns the folders written.

        Full model: ``save_pretrained`` (safetensors) into ``dest_dir``. LoRA: one peft folder per adapter,
        ``dest_dir/<adapter name>``, whose ``adapter_config.json`` also records ``"pettingllms_agent"``.
        """
        return export_hf_model(self.model, self.adapter_names, dest_dir)


def export_hf_model(model: nn.Module, adapter_names: Sequence[str], dest_dir: str | Path) -> list[Path]:
    """``PolicyLearner.export_hf`` for any unsharded module (e.g. an FSDP policy's full engine copy)."""
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    if not adapter_names:
        model.save_pretrained(dest)
        return [dest]
    written = []
    for name in adapter_names:
        # peft writes a non-"default" adapter into <dir>/<name> and "default" into <dir> itself.
        target_parent = dest / name if name == "default" else dest
        model.save_pretrained(target_parent, selected_adapters=[name])
        folder = dest / name
        _tag_adapter_config(folder / "adapter_config.json", name)
        written.append(folder)
    return written


def _response_entropy(logits: torch.Tensor, batch: PolicyBatch, first_column: int) -> torch.Tensor:
    """Entropy (N, T) of the distribution predicting each response token; 0.0 beyond a response.

    logits: (R, C, V) for row columns ``first_column ..``. The softmax over the vocabulary is the costly part, so
    it runs once per packed column (a shared prompt column once, not once per response).
    """
    column_entropy = entropy_from_logits(logits)  # (R, C)
    values = response_token_values(column_entropy, batch, first_column)
    return values.masked_fill(~valid_response_tokens(batch), 0.0)


def _tag_adapter_config(path: Path, agent: str) -> None:
    import json

    config = json.loads(path.read_text())
    config["pettingllms_agent"] = agent
    path.write_text(json.dumps(config, indent=2, sort_keys=True))


_TOKEN_WEIGHTED = ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "kl_token_mean", "entropy_token_mean")


class _Tally:
    """Sums of per-micro-batch values, turned into step metrics at the end."""

    def __init__(self) -> None:
        self.tokens = 0
        self.weighted: dict[str, float] = defaultdict(float)
        self.mini_batch_losses: list[float] = []
        self.kl_loss = 0.0
        self.entropy_loss = 0.0
        self.stream_tokens: dict[Any, int] = defaultdict(int)
        self.stream_kl_sum: dict[Any, float] = defaultdict(float)
        self.grad_norms: dict[Any, list[float]] = defaultdict(list)
        self.step_grad_norms: list[float] = []

    def add_micro_batch(self, stream: str | None, parts: ObjectiveParts) -> None:
        n = parts.num_tokens
        self.tokens += n
        for key in _TOKEN_WEIGHTED:
            self.weighted[key] += getattr(parts, key) * n
        self.kl_loss += parts.kl_loss
        self.entropy_loss += parts.entropy_loss
        self.stream_tokens[stream] += n
        self.stream_kl_sum[stream] += parts.kl_token_mean * n

    def add_mini_batch(self, stream: str | None, pg_loss: float) -> None:
        self.mini_batch_losses.append(pg_loss)

    def merge_ranks(self, data_parallel: DataParallel, streams: Sequence[str | None]) -> None:
        """Turn this rank's sums into sums over every data-parallel rank (a collective; no-op in one process).

        Losses come out of verl multiplied by the number of ranks (it undoes FSDP's gradient averaging), so their
        sums are divided by it. Gradient norms are already global (FSDP computes them over every shard).
        """
        if not data_parallel.is_distributed:
            return
        keys = _TOKEN_WEIGHTED  # fixed, not the dict's keys: a rank that ran only padding passes has none
        flat = [float(self.tokens), self.kl_loss, self.entropy_loss, *self.mini_batch_losses]
        flat += [self.weighted[k] for k in keys]
        flat += [float(self.stream_tokens[s]) for s in streams] + [self.stream_kl_sum[s] for s in streams]
        total = iter(data_parallel.all_reduce_sum(flat))
        ranks = data_parallel.world_size
        self.tokens = int(round(next(total)))
        self.kl_loss = next(total) / ranks
        self.entropy_loss = next(total) / ranks
        self.mini_batch_losses = [next(total) / ranks for _ in self.mini_batch_losses]
        for key in keys:
            self.weighted[key] = next(total)
        for stream in streams:
            self.stream_tokens[stream] = int(round(next(total)))
        for stream in streams:
            self.stream_kl_sum[stream] = next(total)

    def add_optimizer_step(self, norms: Mapping[str | None, float]) -> None:
        """Pre-clip gradient norms of the streams in one optimizer step (disjoint parameters)."""
        for stream, norm in norms.items():
            self.grad_norms[stream].append(norm)
        self.step_grad_norms.append(math.sqrt(sum(n * n for n in norms.values())))

    def stream_kl(self, stream: str | None) -> float:
        tokens = self.stream_tokens.get(stream, 0)
        return self.stream_kl_sum[stream] / tokens if tokens else 0.0

    def stream_grad_norm(self, stream: str | None) -> float:
        norms = self.grad_norms.get(stream, [])
        return sum(norms) / len(norms) if norms else 0.0

    def summary(self) -> dict[str, float]:
        def mean_over_tokens(key: str) -> float:
            return self.weighted[key] / self.tokens if self.tokens else 0.0

        count = len(self.mini_batch_losses)
        step_norms = self.step_grad_norms
        return {
            "pg_loss": sum(self.mini_batch_losses) / count if count else 0.0,
            "pg_clipfrac": mean_over_tokens("pg_clipfrac"),
            "pg_clipfrac_lower": mean_over_tokens("pg_clipfrac_lower"),
            "ppo_kl": mean_over_tokens("ppo_kl"),
            "kl": mean_over_tokens("kl_token_mean"),
            "kl_loss": self.kl_loss / count if count else 0.0,
            "entropy": mean_over_tokens("entropy_token_mean"),
            "entropy_loss": self.entropy_loss / count if count else 0.0,
            "grad_norm": sum(step_norms) / len(step_norms) if step_norms else 0.0,
        }
