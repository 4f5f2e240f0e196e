"""What both local engines (``HFEngine``, ``VLLMEngine``) do around their model, written once.

- an unknown adapter is a configuration bug: the whole call is refused (``refuse_unknown_adapters``) rather than
  masking every sample;
- a request whose prompt cannot run (token ids outside the vocabulary, or a prompt that fills the context window)
  gets ``error`` completions and a log line, and the others run (``screen_prompts``);
- a batch that raises is retried request by request; a request that still fails gets ``error`` completions and
  its traceback is logged (``run_or_retry_one_by_one``).
A request that was not generated, by these engines or by the server client, has ``failed_completions``.
"""

from __future__ import annotations

import logging
from typing import Callable, Collection, Sequence, TypeVar

from pettingllms.core.errors import ConfigError
from pettingllms.core.types import FINISH_ERROR, Completion, GenerationRequest

Item = TypeVar("Item")


def refuse_unknown_adapters(requests: Sequence[GenerationRequest], known: Collection[str], holder: str,
                            fix: str = "") -> None:
    """ConfigError naming the adapters that ``requests`` ask for and ``holder`` (the model, the engine) lacks."""
    unknown = sorted({r.adapter for r in requests if r.adapter is not None} - set(known))
    if unknown:
        raise ConfigError(f"requests name LoRA adapters {unknown} that {holder} lacks (it has {sorted(known)}){fix}")


def prompt_problem(prompt_ids: Sequence[int], vocab_size: int, context_window: int | None) -> str | None:
    """Why a prompt cannot run, or None."""
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size:
        return f"prompt has token ids outside [0, {vocab_size})"
    if context_window is not None and len(prompt_ids) >= context_window:
        return f"prompt of {len(prompt_ids)} tokens fills the model's context window ({context_window})"
    return None


def screen_prompts(requests: Sequence[GenerationRequest], vocab_size: int, context_window: int | None,
                   log: logging.Logger) -> tuple[list[list[Completion]], list[int]]:
    """(each request's completions so far: ``error`` ones for a prompt that cannot run, else empty; the indices
    of the requests to run)."""
    completions: list[list[Completion]] = [[] for _ in requests]
    runnable = []
    for index, request in enumerate(requests):
        problem = prompt_problem(request.prompt_ids, vocab_size, context_window)
        if problem:
            log.error("request %s not generated: %s", request.request_id, problem)
            completions[index] = failed_completions(request.n)
        else:
            runnable.append(index)
    return completions, runnable


def run_or_retry_one_by_one(batch: Sequence[Item], run: Callable[[list[Item]], list[list[Completion]]],
                            request_of: Callable[[Item], GenerationRequest], rows_of: Callable[[Item], int],
                            log: logging.Logger, what: str = "generation") -> list[list[Completion]]:
    """``run(batch)``; if it raises, each item alone; an item that still fails gets ``rows_of(item)`` error
    completions. Returns one list of completions per item, in order."""
    try:
        return run(list(batch))
    except Exception:
        ids = [request_of(item).request_id for item in batch]
        if len(batch) == 1:
            log.exception("%s failed for request %s; its samples are marked failed", what, ids[0])
            return [failed_completions(rows_of(batch[0]))]
        log.exception("%s failed for a batch of requests %s; retrying them one by one", what, ids)
        return [run_or_retry_one_by_one([item], run, request_of, rows_of, log, what)[0] for item in batch]


def failed_completions(n: int) -> list[Completion]:
    """``n`` completions of a request that was not generated (``finish_reason="error"``, no tokens)."""
    return [Completion(token_ids=(), logprobs=(), text="", finish_reason=FINISH_ERROR) for _ in range(n)]
