"""``HFEngine``: the CPU-default rollout engine, a KV-cache decode loop over a transformers causal LM.

Why our own loop rather than ``model.generate``:
- per-row sampling settings (temperature, top-k, top-p, max_tokens) inside one batch;
- exact token ids and their log-probabilities recorded as they are sampled;
- finished rows leave the batch (their KV cache rows are dropped, and left padding no other row needs
  is trimmed), so a batch stops paying for completions that already ended;
- a request's ``n`` samples share one prompt prefill: its KV cache is computed once and repeated n times, and so do
  the requests of one batch that repeat a prompt (with the same adapter);
- the KV cache is preallocated per batch (``rollout/kv_cache.py``): a step writes one position instead of
  re-concatenating the whole cache as transformers' DynamicCache does.
Models from ``pettingllms.models.load_model`` also use grouped-query SDPA attention
(``pettingllms.models.attention``), which avoids copying K/V per query head at every step.

Log-probability convention (the learner computes the same quantity):
    logprob[t] = log_softmax(logits[t].float())[token[t]]
i.e. the model's raw logits in float32, temperature 1, no top-k/top-p filtering, whatever temperature or
filter the token was sampled with. Every response token has one, including the final eos token (it is
part of ``token_ids`` so the policy learns to stop).

Sampling, per row (``rollout/sampling.py``): temperature 0 is greedy (argmax of the raw logits); otherwise
logits / temperature, then top-k (0 = off), then top-p over the top-k-renormalised distribution (1.0 = off), then
one draw (inverse CDF, one uniform per row) from the engine's own ``torch.Generator``; ``get_rng_state`` /
``set_rng_state`` make a resumed run sample exactly as the original. Nothing falls back to library
defaults. Prompts of the context window's length or longer fail; max_tokens is clipped so that prompt +
response fit the window.

Requests are cut into batches under a token budget (rows x (longest prompt + largest max_tokens) <=
max_batch_tokens) and a row cap, whatever LoRA adapter each names (None = base weights): a batch whose rows name
several adapters runs each row through its own (``models/lora_rows.py``: all adapters' low-rank terms in two
matrix products per layer), so an L2 call
with every agent's requests decodes them together instead of one adapter after another. Results come back in
request order. A batch that raises is retried request by request; a request
that still fails (or has an invalid prompt) gets ``finish_reason="error"`` completions with no tokens, and
the exception is logged with its traceback (``rollout/local_engine.py``, shared with the vLLM engine).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.nn as nn

from pettingllms.core.errors import ConfigError
from pettingllms.core.types import FINISH_LENGTH, FINISH_STOP, Completion, GenerationRequest, GenerationResult
from pettingllms.models.lora import adapter_names
from pettingllms.models.lora_rows import per_row_adapters
from pettingllms.rollout.kv_cache import keep_rows, new_kv_cache
from pettingllms.rollout.local_engine import refuse_unknown_adapters, run_or_retry_one_by_one, screen_prompts
from pettingllms.rollout.sampling import sample_tokens, token_logprobs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Unit:
    """A slice of one request's samples that runs in one batch: ``rows`` samples of request ``index``."""

    index: int
    request: GenerationRequest
    rows: int
    max_new: int  # max_tokens, clipped to the model's context window


class HFEngine:
    """RolloutEngine over a transformers causal LM (optionally a peft model with one adapter per agent).

    model: the learner's own module (no copy: a weight update is visible to the next ``generate``).
    codec: supplies ``eos_token_ids``, ``pad_token_id`` and ``decode``.
    seed: seeds the engine's private ``torch.Generator`` (the global RNG is never used).
    max_batch_tokens: bound on rows x (longest prompt + largest max_tokens) in one batch; bounds KV memory.
    max_batch_rows: bound on the number of sequences decoded together.
    autocast_dtype: run every forward under ``torch.autocast`` with this dtype (bfloat16 when the policy computes in
        bf16 over float32 master weights: the engine then computes exactly as the learner's forward does).
    """

    def __init__(
        self,
        model: nn.Module,
        codec,
        *,
        seed: int = 0,
        max_batch_tokens: int = 32768,
        max_batch_rows: int = 64,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        if max_batch_tokens < 1 or max_batch_rows < 1:
            raise ConfigError(
                f"max_batch_tokens and max_batch_rows must be >= 1, got {max_batch_tokens} and {max_batch_rows}"
            )
        self.model = model
        self.codec = codec
        self.max_batch_tokens = int(max_batch_tokens)
        self.max_batch_rows = int(max_batch_rows)
        self.eos_ids = torch.tensor(sorted(codec.eos_token_ids), dtype=torch.long)
        self.pad_id = int(codec.pad_token_id)
        config = model.config
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.context_window = int(getattr(config, "max_position_embeddings", 0) or 0) or None
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        self.autocast_dtype = autocast_dtype

    # ---- RNG state, for exact resumption ----

    def get_rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    # ---- the RolloutEngine protocol ----

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Completions for every request, in request order (``n`` completions each)."""
        requests = list(requests)
        refuse_unknown_adapters(requests, adapter_names(self.model), "the model")
        completions, runnable = screen_prompts(requests, self.vocab_size, self.context_window, logger)
        units = [unit for index in runnable for unit in self._units(index, requests[index])]
        with self._generation_mode():
            for batch in self._plan_batches(units):
                done = run_or_retry_one_by_one(batch, self._run_batch, lambda u: u.request, lambda u: u.rows, logger)
                for unit, unit_done in zip(batch, done):
                    completions[unit.index].extend(unit_done)
        return [GenerationResult(r.request_id, tuple(c)) for r, c in zip(requests, completions)]

    # ---- planning ----

    def _units(self, index: int, request: GenerationRequest) -> list[_Unit]:
        """Split a request's n samples into slices that each fit the token budget (at least one row)."""
        max_new = request.sampling.max_tokens
        if self.context_window is not None:
            max_new = min(max_new, self.context_window - len(request.prompt_ids))
        per_row = len(request.prompt_ids) + max_new
        cap = max(1, min(self.max_batch_rows, self.max_batch_tokens // per_row))
        sizes = [cap] * (request.n // cap) + ([request.n % cap] if request.n % cap else [])
        return [_Unit(index, request, rows, max_new) for rows in sizes]

    def _plan_batches(self, units: list[_Unit]) -> list[list[_Unit]]:
        """Greedy packing in prompt-length order (less padding) under the row and token budgets."""
        batches: list[list[_Unit]] = []
        current: list[_Unit] = []
        for unit in sorted(units, key=lambda u: len(u.request.prompt_ids)):
            candidate = current + [unit]
            if current and not self._fits(candidate):
                batches.append(current)
                candidate = [unit]
            current = candidate
        if current:
            batches.append(current)
        return batches

    def _fits(self, units: list[_Unit]) -> bool:
        rows = sum(u.rows for u in units)
        longest = max(len(u.request.prompt_ids) for u in units) + max(u.max_new for u in units)
        return rows <= self.max_batch_rows and rows * longest <= self.max_batch_tokens

    # ---- running ----

    @contextmanager
    def _generation_mode(self) -> Iterator[None]:
        """eval() + inference_mode for the call; every submodule's train/eval flag restored afterwards."""
        modes = [(module, module.training) for module in self.model.modules()]
        self.model.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            for module, training in modes:
                module.training = training

    def _run_batch(self, batch: list[_Unit]) -> list[list[Completion]]:
        """Prefill each distinct (prompt, adapter) of the batch once (a request's n samples, and requests that repeat
        a prompt: the K episodes of a problem at their first turn), repeat it per sample, decode all rows until each
        one ends."""
        distinct: dict[tuple, int] = {}
        unit_prefill = torch.tensor([distinct.setdefault((u.request.prompt_ids, u.request.adapter), len(distinct))
                                     for u in batch])
        prefill_adapters = [adapter for _, adapter in distinct]
        prompts, prompt_mask, positions = left_pad([prompt for prompt, _ in distinct], self.pad_id)
        capacity = prompts.shape[1] + max(u.max_new for u in batch)
        cache = new_kv_cache(self.model.config, capacity)
        unit_adapters = [u.request.adapter for u in batch]
        with per_row_adapters(self.model, unit_adapters) as router:
            logits = self._forward(prompts, prompt_mask, positions, cache, _routing(router, prefill_adapters))

            row_unit = torch.repeat_interleave(torch.arange(len(batch)), torch.tensor([u.rows for u in batch]))
            row_prefill = unit_prefill[row_unit]
            mask = keep_rows(cache, prompt_mask, row_prefill)
            logits, next_position = logits[row_prefill], positions[row_prefill, -1] + 1
            params = _row_params(batch, row_unit)
            row_adapters = None if router is None else [unit_adapters[u] for u in row_unit.tolist()]
            tokens, logprobs, lengths, stopped = self._decode(logits, mask, next_position, cache, params,
                                                              router, row_adapters)
        return self._completions(batch, row_unit, tokens, logprobs, lengths, stopped)

    def _forward(self, input_ids, attention_mask, position_ids, cache, routing=None) -> torch.Tensor:
        """One model call; returns float32 logits of the last position, [rows, vocab]. ``routing``: the forward's
        keyword arguments for a batch that mixes adapters (``RowRouter.forward_kwargs``), else None."""
        autocast = (torch.autocast(device_type=input_ids.device.type, dtype=self.autocast_dtype)
                    if self.autocast_dtype is not None else nullcontext())
        routing = routing or {}
        with autocast:
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
                **routing,
            )
        return out.logits[:, -1, :].float()

    def _decode(self, logits, mask, next_position, cache, params, router=None, adapters=None):
        """The decode loop. Rows leave the batch (and the KV cache) as soon as they finish.

        logits: [B, V] for the first response token; mask: [B, T] attention mask of the cache;
        next_position: [B] position id of the next token; router, adapters: when the batch mixes adapters, its
        ``RowRouter`` and each row's adapter.
        Returns tokens [B, M], logprobs [B, M], lengths [B] and stopped [B] (True = ended with eos), indexed by
        original row.
        """
        rows = logits.shape[0]
        max_new = int(params["max_tokens"].max())
        tokens = torch.full((rows, max_new), self.pad_id, dtype=torch.long)
        logprobs = torch.zeros((rows, max_new), dtype=torch.float32)
        lengths = torch.zeros(rows, dtype=torch.long)
        stopped = torch.zeros(rows, dtype=torch.bool)
        active = torch.arange(rows)  # original row index of each row still in the batch
        for step in range(max_new):
            sampled = sample_tokens(
                logits, params["temperature"][active], params["top_k"][active], params["top_p"][active], self.generator
            )
            tokens[active, step] = sampled
            logprobs[active, step] = token_logprobs(logits, sampled)
            ended_eos = torch.isin(sampled, self.eos_ids)
            finished = ended_eos | (params["max_tokens"][active] <= step + 1)
            if bool(finished.any()):
                lengths[active[finished]] = step + 1
                stopped[active[finished]] = ended_eos[finished]
                keep = (~finished).nonzero().squeeze(1)
                if keep.numel() == 0:
                    break
                active, sampled, next_position = active[keep], sampled[keep], next_position[keep]
                mask = keep_rows(cache, mask, keep)
                if adapters is not None:
                    adapters = [adapters[row] for row in keep.tolist()]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            logits = self._forward(sampled[:, None], mask, next_position[:, None], cache, _routing(router, adapters))
            next_position = next_position + 1
        return tokens, logprobs, lengths, stopped

    def _completions(self, batch, row_unit, tokens, logprobs, lengths, stopped) -> list[list[Completion]]:
        done: list[list[Completion]] = [[] for _ in batch]
        for row, unit in enumerate(row_unit.tolist()):
            length = int(lengths[row])
            ids = tuple(tokens[row, :length].tolist())
            done[unit].append(
                Completion(
                    token_ids=ids,
                    logprobs=tuple(logprobs[row, :length].tolist()),
                    text=self.codec.decode(ids),
                    finish_reason=FINISH_STOP if bool(stopped[row]) else FINISH_LENGTH,
                )
            )
        return done


# ---- batch helpers ----


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad prompts to one length.

    Returns input_ids [R, L] (long), attention_mask [R, L] (long, 0 on padding) and position_ids [R, L]
    (0 at each prompt's first real token; padding positions hold 0 and are masked anyway).
    """
    longest = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, longest - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, longest - len(prompt) :] = 1
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def _row_params(batch: list[_Unit], row_unit: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-row sampling settings, [B] each, from the units' requests."""
    settings = [u.request.sampling for u in batch]
    per_unit = {
        "temperature": torch.tensor([s.temperature for s in settings], dtype=torch.float32),
        "top_k": torch.tensor([s.top_k for s in settings], dtype=torch.long),
        "top_p": torch.tensor([s.top_p for s in settings], dtype=torch.float32),
        "max_tokens": torch.tensor([u.max_new for u in batch], dtype=torch.long),
    }
    return {name: values[row_unit] for name, values in per_unit.items()}


def _routing(router, names) -> dict:
    """A forward's keyword arguments for rows using ``names`` (each row's adapter), or none without a router."""
    return {} if router is None else router.forward_kwargs(names)
