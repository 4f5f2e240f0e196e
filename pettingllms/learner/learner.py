"""One policy's optimisation step: PPO-clip over token-budget micro-batches, per-agent LoRA streams, KL, TIS, the LR
schedule.

One call of ``update`` is one training iteration, and the methods below it follow it in this order:

    drop failed and frozen samples; split each stream (``learner/streams.py``) into mini-batches
    old log-probs: from the training forward itself when exactly on-policy, else one no-grad pass up front
    ref log-probs (only when the KL coefficient is > 0): one no-grad pass up front
    rollout check (``learner/rollout_check.py``): the engine's logprobs against the learner's, before the first
        optimiser step
    for epoch in ppo_epochs:
        for k-th mini-batch of every stream:
            zero grads (to None); forward/backward each micro-batch of each stream under its adapter
            clip each stream's gradient; optimizer.step()
    LR scheduler step (once); KL controllers update (once)

Every forward (packing, data-parallel padding passes, temperature, autocast, log-probs and entropy) is
``learner/forward.py``; what a step measured is ``learner/tally.py``; saved state is ``learner/state.py``.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch
from torch import nn

from pettingllms.algo.losses import micro_batch_objective, truncated_importance_weights
from pettingllms.algo.verl_adapter import GlobalBatchInfo, cosine_schedule_with_warmup
from pettingllms.core.types import Sample
from pettingllms.learner.batching import pad_response_values, split_mini_batches
from pettingllms.learner.config import LearnerConfig
from pettingllms.learner.data_parallel import SINGLE_PROCESS, DataParallel
from pettingllms.learner.forward import ForwardPass, training_mode
from pettingllms.learner.gradients import NonfiniteGradientGuard, clip_gradient
from pettingllms.learner.kl import KLControllers
from pettingllms.learner.rollout_check import RolloutAgreement, RolloutCheck
from pettingllms.learner.state import (StateView, export_hf_model, load_sharded, restore, save_sharded,
                                      save_sharded_async, snapshot, stage_sharded)
from pettingllms.learner.streams import Streams
from pettingllms.learner.tally import StepTally, step_metrics


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
        self._loss_settings = config.loss_settings()
        # First: it zeroes dropout and copies the KL reference before anything below touches requires_grad.
        self.forward_pass = ForwardPass(model, config, self.streams, ref_model, pad_token_id=pad_token_id,
                                        data_parallel=data_parallel)
        self.rollout_check = RolloutCheck(config.max_rollout_kl, data_parallel, self.streams.names, policy)
        self._named_trainable = self._collect_trainable()
        if not self._named_trainable:
            raise ValueError("nothing to train: no parameter requires grad (or every adapter is frozen)")
        params = [p for _, p in self._named_trainable]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, eps=config.eps,
                                           weight_decay=config.weight_decay, **adamw_kernel(params))
        self.scheduler = cosine_schedule_with_warmup(self.optimizer, config.warmup_steps, config.total_steps,
                                                     config.min_lr_ratio)
        self.kl = KLControllers(config.kl, self.streams.names)
        self.nonfinite = NonfiniteGradientGuard(config.max_nonfinite_grad_steps, policy)
        self.step = 0
        self._staging: dict[str, torch.Tensor] = {}  # host buffers of an asynchronous checkpoint, reused
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    # ------------------------------------------------------------------ setup

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return self.streams.adapter_names

    @property
    def device(self) -> torch.device:
        return self.forward_pass.device

    @property
    def reference(self) -> nn.Module | str | None:
        """The KL reference: a frozen module, ``"adapters-disabled"``, or None when the KL loss is off."""
        return self.forward_pass.reference

    @property
    def kl_coefs(self) -> dict[str | None, float]:
        """Current KL coefficient per stream (adapter name, or None for a full model); empty when KL is off."""
        return self.kl.coefs

    @property
    def nonfinite_streak(self) -> int:
        """Training steps in a row whose gradient was NaN/inf somewhere."""
        return self.nonfinite.streak

    @property
    def lr(self) -> float:
        """The learning rate the next ``update`` will use."""
        return float(self.optimizer.param_groups[0]["lr"])

    def _collect_trainable(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters the optimiser owns, in a fixed order (optimizer state dicts index them by position)."""
        if not self.streams.uses_lora:
            return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        adapter_params = self.forward_pass.adapter_params
        owned = {id(p) for params in adapter_params.values() for p in params}
        names = {id(p): n for n, p in self.model.named_parameters()}
        for param in self.model.parameters():
            if id(param) not in owned:
                param.requires_grad_(False)  # base weights never train under LoRA
        return [(names[id(p)], p) for name in self.adapter_names if self.streams.trainable(name)
                for p in adapter_params[name]]

    def _stream_params(self, stream: str | None) -> list[nn.Parameter]:
        if stream is None:
            return [p for _, p in self._named_trainable]
        return list(self.forward_pass.adapter_params[stream])

    # ------------------------------------------------------------------ the training step

    def update(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict[str, float]:
        """One training iteration on ``samples`` with one scalar advantage per sample. Returns float metrics.

        Raises ``RolloutMismatchError`` (before any weight moves) when the engine that sampled the batch and the
        learner disagree on the same tokens by more than ``config.max_rollout_kl``.
        """
        started = time.perf_counter()
        check_advantages(samples, advantages)
        by_stream, skipped = self.streams.partition(samples)
        lr = self.lr
        mini_batches = {s: split_mini_batches(idx, self.config.ppo_mini_batch_size) for s, idx in by_stream.items()}
        num_rounds = max((len(m) for m in mini_batches.values()), default=0)
        on_policy = self.config.ppo_epochs == 1 and num_rounds <= 1
        agreement = RolloutAgreement()

        timings = {"old_log_prob_s": 0.0, "ref_log_prob_s": 0.0}
        tally = StepTally()
        with training_mode(self.model):
            inputs = self._fixed_inputs(samples, advantages, by_stream, on_policy, agreement, timings)
            try:
                for epoch in range(self.config.ppo_epochs):
                    for round_index in range(num_rounds):
                        # Round k takes every stream's k-th mini-batch: streams own disjoint weights, so this is one
                        # optimizer step per stream; a stream without a k-th mini-batch keeps grad=None (no move).
                        chunks = {s: m[round_index] for s, m in mini_batches.items() if round_index < len(m)}
                        first = epoch == 0 and round_index == 0
                        check = agreement if (first and inputs.old_log_probs is None) else None
                        self._optimizer_step(inputs, chunks, tally, check)
            finally:
                self.optimizer.zero_grad(set_to_none=True)  # free gradient memory between iterations

        tally.merge_ranks(self.data_parallel, self.streams.names)  # before the KL controllers read it
        self._advance_schedule()
        self.kl.update({s: len(i) for s, i in by_stream.items()}, {s: tally.stream_kl(s) for s in by_stream})
        self.step += 1
        self.nonfinite.after_step(self.step, tally.nonfinite_streams)
        metrics = tally.summary()
        metrics.update(step_metrics(samples, by_stream, skipped, inputs.kl_coefs, lr,
                                    num_rounds * self.config.ppo_epochs, self.adapter_names, tally))
        metrics.update(agreement.metrics(self.streams.names))
        metrics.update(timings)
        metrics["update_s"] = time.perf_counter() - started
        return metrics

    def _fixed_inputs(self, samples: Sequence[Sample], advantages: Sequence[float],
                      by_stream: Mapping[str | None, Sequence[int]], on_policy: bool, agreement: RolloutAgreement,
                      timings: dict[str, float]) -> "_FixedInputs":
        """The old policy's log-probs (one no-grad pass, then the rollout check, unless exactly on-policy), the
        reference's (only with the KL loss on), and the KL coefficients: what every optimiser step of this update
        reads."""
        old_log_probs = None
        old_raw = {} if self.config.tis_cap > 0 else None
        if by_stream and not on_policy:
            t0 = time.perf_counter()
            old_log_probs = self.forward_pass.log_probs_no_grad(samples, by_stream, agreement=agreement,
                                                                raw_out=old_raw)
            timings["old_log_prob_s"] = time.perf_counter() - t0
            self.rollout_check(agreement)
        ref_log_probs = None
        if by_stream and self.kl:
            t0 = time.perf_counter()
            ref_log_probs = self.forward_pass.log_probs_no_grad(samples, by_stream, reference=True)
            timings["ref_log_prob_s"] = time.perf_counter() - t0
        return _FixedInputs(samples, advantages, old_log_probs, old_raw, ref_log_probs, self.kl_coefs)

    def _optimizer_step(self, inputs: "_FixedInputs", chunks: Mapping[str | None, Sequence[int]], tally: StepTally,
                        agreement: RolloutAgreement | None) -> None:
        """Accumulate each stream's mini-batch gradient, clip it per stream, then take one AdamW step.

        ``agreement`` (the on-policy case: no separate old-logprob pass) is tallied from these forwards and checked
        before the step, so a mismatched batch never moves the weights.
        """
        self.optimizer.zero_grad(set_to_none=True)  # None, not 0: AdamW must skip (not decay) idle adapters
        norms = {}
        for stream, indices in chunks.items():
            self._backward_mini_batch(stream, inputs, indices, tally, agreement)
            norms[stream] = clip_gradient(self._stream_params(stream), self.config.grad_clip)
        if agreement is not None:
            self.rollout_check(agreement)
        tally.add_optimizer_step(norms)
        self.optimizer.step()

    def _backward_mini_batch(self, stream: str | None, inputs: "_FixedInputs", indices: Sequence[int],
                             tally: StepTally, agreement: RolloutAgreement | None = None) -> None:
        """Accumulate one mini-batch's gradient over token-budget micro-batches.

        ``GlobalBatchInfo`` carries the mini-batch's token and sequence counts, so each micro-batch loss is
        normalised by the whole mini-batch and the accumulated gradient equals that of one big batch.
        ``inputs.old_log_probs`` None means exactly on-policy: the forward's own detached log-probs serve as old ones
        (and ``agreement``, when given, is tallied from the same forward), and for truncated importance sampling its
        own raw log-probs serve as the old policy's.
        """
        samples, forward = inputs.samples, self.forward_pass
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
        for rows, units in forward.micro_batches(samples, indices):
            if not rows:
                with forward.adapter(stream, train=True):
                    forward.padding_pass(self.model, samples[indices[0]], backward=True)
                continue
            batch = forward.batch([samples[i] for i in rows], [inputs.advantages[i] for i in rows], units)
            width = batch.response_mask.shape[1]
            with forward.adapter(stream, train=True):
                log_probs, entropy, raw = forward.log_probs(self.model, batch, entropy=entropy_mode, raw=want_raw)
                if inputs.old_log_probs is None:
                    old = log_probs.detach()
                    if agreement is not None:
                        agreement.add(stream, raw, batch.rollout_log_probs, batch.rollout_mask)
                else:
                    old = pad_response_values([inputs.old_log_probs[i] for i in rows], width).to(self.device)
                ref = None
                if inputs.ref_log_probs is not None:
                    ref = pad_response_values([inputs.ref_log_probs[i] for i in rows], width).to(self.device)
                weights = None
                if self.config.tis_cap > 0:
                    # The OLD policy against the engine (the PPO ratio handles old -> current), both raw (T = 1):
                    # the quantity the engine reports; the log-ratio is divided by each sample's temperature
                    # (docs/training.md, "Truncated importance sampling").
                    old_raw = raw if inputs.old_log_probs is None else pad_response_values(
                        [inputs.old_raw_log_probs[i] for i in rows], width).to(self.device)
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
                    kl_coef=inputs.kl_coefs.get(stream, 0.0),
                    entropy=entropy,
                    importance_weights=weights,
                )
                # Backward inside the adapter context: gradient checkpointing re-runs the forward here.
                loss.backward()
            mini_batch_pg_loss += parts.pg_loss
            tally.add_micro_batch(stream, parts)
        tally.add_mini_batch(stream, mini_batch_pg_loss)

    def _advance_schedule(self) -> None:
        # One scheduler step per iteration. The last planned iteration already runs at the minimum LR; stepping
        # past total_steps would let the cosine climb back up, so the LR holds there instead.
        if self.step + 1 < self.config.total_steps:
            with warnings.catch_warnings():
                # An iteration with nothing to train (all failed or frozen) makes no optimizer step; the LR still
                # follows the iteration count, which is what torch's ordering warning would complain about.
                warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
                self.scheduler.step()

    # ------------------------------------------------------------------ probes

    def compute_logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        """Response-token log-probs of each sample under the current policy (its adapter under LoRA), no grad.

        At each sample's own sampling temperature (T = 1: the raw logits, what engines report). Empty responses
        give ().
        """
        if self.data_parallel.is_distributed:
            raise RuntimeError("compute_logprobs runs in a single process; an FSDP rank computes only its own share")
        values = self.forward_pass.log_probs_no_grad(samples, self.streams.all_streams(samples))
        return [tuple(values[i].tolist()) if i in values else () for i in range(len(samples))]

    def accumulate_gradients(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict[str, float]:
        """Zero the gradients, then accumulate the on-policy loss gradient of the whole batch (one mini-batch per
        stream) into ``param.grad``. No clipping and no optimiser step: a probe for tests and debugging."""
        check_advantages(samples, advantages)
        by_stream, _ = self.streams.partition(samples)
        self.optimizer.zero_grad(set_to_none=True)
        tally = StepTally()
        with training_mode(self.model):
            for stream, indices in by_stream.items():
                kl_coef, ref = 0.0, None
                if self.kl:
                    kl_coef = self.kl.coefs[stream]
                    ref = self.forward_pass.log_probs_no_grad(samples, {stream: indices}, reference=True)
                inputs = _FixedInputs(samples, advantages, None, None, ref, {stream: kl_coef})
                self._backward_mini_batch(stream, inputs, indices, tally)
        tally.merge_ranks(self.data_parallel, self.streams.names)
        return tally.summary()

    # ------------------------------------------------------------------ state

    def state_view(self) -> StateView:
        """The parts a saved state is read from and restored into (``learner/state.py``)."""
        return StateView(self.model, self.optimizer, self.scheduler, self.kl.controllers, self.adapter_names,
                         self.streams.frozen, self.step, self.nonfinite)

    def state_dict(self) -> dict[str, Any]:
        """An in-memory snapshot (host copies) of everything a resumed run needs: weights (adapters only under
        LoRA), optimiser, scheduler, KL controllers and the step counter. Checkpoints use ``save_sharded``
        instead; RNG state is the checkpoint layer's job."""
        return snapshot(self.state_view())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step = restore(self.state_view(), state)

    def save_sharded(self, directory: str | Path) -> dict[str, Any]:
        """Write the weights and optimiser state with DCP into ``directory`` (a collective); returns the state every
        rank shares, for ``load_sharded`` (``learner/state.py::save_sharded``)."""
        return save_sharded(self.state_view(), directory)

    def save_sharded_async(self, directory: str | Path, process_group: Any) -> tuple[Any, dict[str, Any]]:
        """``save_sharded`` written in a thread once the state is copied to host memory (a collective on
        ``process_group``, a gloo group kept for checkpoints); returns (its future, the meta)."""
        return save_sharded_async(self.state_view(), directory, process_group)

    def stage_sharded(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """A host copy of what ``save_sharded`` writes, and its meta (``learner/state.py::stage_sharded``); the host
        buffers are kept for the next save."""
        return stage_sharded(self.state_view(), self._staging)

    def load_sharded(self, directory: str | Path, meta: Mapping[str, Any]) -> None:
        """Restore what ``save_sharded`` wrote (a collective), whatever the number of ranks that wrote it."""
        self.step = load_sharded(self.state_view(), directory, meta)

    def export_hf(self, dest_dir: str | Path) -> list[Path]:
        """Write loadable Hugging Face weights; returns the folders written.

        Full model: ``save_pretrained`` (safetensors) into ``dest_dir``. LoRA: one peft folder per adapter,
        ``dest_dir/<adapter name>``, whose ``adapter_config.json`` also records ``"pettingllms_agent"``.
        """
        return export_hf_model(self.model, self.adapter_names, dest_dir)


def adamw_kernel(params: Sequence[torch.Tensor]) -> dict[str, bool]:
    """AdamW's implementation: torch's fused CUDA kernel when every parameter lives on a CUDA device (one launch per
    parameter group instead of the foreach path's dozen element-wise kernels: 11% of an update's device time on an
    H100 went to AdamW), else torch's default (foreach on CPU; CPU-offloaded FSDP shards stay there)."""
    return {"fused": True} if params and all(p.is_cuda for p in params) else {}


@dataclass(frozen=True)
class _FixedInputs:
    """What every optimiser step of one update reads, fixed before the first one: the samples and their advantages,
    the old policy's log-probs and raw log-probs (None: exactly on-policy, each forward's own serve), the reference's
    log-probs (None: KL off) and the KL coefficient per stream."""

    samples: Sequence[Sample]
    advantages: Sequence[float]
    old_log_probs: Mapping[int, torch.Tensor] | None
    old_raw_log_probs: Mapping[int, torch.Tensor] | None
    ref_log_probs: Mapping[int, torch.Tensor] | None
    kl_coefs: Mapping[str | None, float]


def check_advantages(samples: Sequence[Sample], advantages: Sequence[float]) -> None:
    if len(advantages) != len(samples):
        raise ValueError(f"{len(advantages)} advantages for {len(samples)} samples; need one per sample")
    for index, value in enumerate(advantages):
        if not math.isfinite(float(value)):
            raise ValueError(f"advantage of sample {index} is {value}; advantages must be finite")
