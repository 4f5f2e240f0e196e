"""The skeleton both local engines share (``rollout/local_engine.py``): unknown adapters refused, bad prompts failed
alone, a failing batch retried request by request; and it is the only home of that logic."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pettingllms.core.errors import ConfigError
from pettingllms.core.types import FINISH_ERROR, FINISH_STOP, Completion, GenerationRequest, SamplingParams
from pettingllms.rollout.local_engine import refuse_unknown_adapters, run_or_retry_one_by_one, screen_prompts

log = logging.getLogger("test_local_engine")
PACKAGE = Path(__file__).resolve().parents[2] / "pettingllms"


def request(rid: str, ids=(1, 2, 3), n: int = 1, adapter: str | None = None) -> GenerationRequest:
    return GenerationRequest(rid, tuple(ids), n, SamplingParams(temperature=0.0, max_tokens=2), adapter)


def test_a_failing_batch_is_retried_one_by_one_and_only_the_culprit_fails(caplog):
    batch = [request("a"), request("poison", n=3), request("b", n=2)]
    calls = []

    def run(items):
        calls.append([r.request_id for r in items])
        if any(r.request_id == "poison" for r in items):
            raise RuntimeError("poisoned batch")
        return [[Completion((7,), (-0.5,), "x", FINISH_STOP)] * r.n for r in items]

    with caplog.at_level(logging.ERROR):
        done = run_or_retry_one_by_one(batch, run, lambda r: r, lambda r: r.n, log, "generation")
    assert calls == [["a", "poison", "b"], ["a"], ["poison"], ["b"]]
    assert [[c.finish_reason for c in d] for d in done] == [[FINISH_STOP], [FINISH_ERROR] * 3, [FINISH_STOP] * 2]
    assert all(c.token_ids == () and c.failed for c in done[1])
    assert "retrying them one by one" in caplog.text and "request poison" in caplog.text


def test_bad_prompts_fail_alone_and_unknown_adapters_are_refused(caplog):
    requests = [request("ok"), request("outside", ids=(1, 99)), request("long", ids=(1,) * 8, n=2)]
    with caplog.at_level(logging.ERROR):
        completions, runnable = screen_prompts(requests, vocab_size=50, context_window=8, log=log)
    assert runnable == [0] and completions[0] == []
    assert [len(c) for c in completions[1:]] == [1, 2] and all(c.failed for c in completions[1] + completions[2])
    assert "outside [0, 50)" in caplog.text and "fills the model's context window (8)" in caplog.text
    with pytest.raises(ConfigError, match=r"LoRA adapters \['carol'\] that the engine lacks \(it has \['alice'\]\)"):
        refuse_unknown_adapters([request("r", adapter="carol")], {"alice"}, "the engine")


def test_the_skeleton_and_the_serving_of_a_policy_each_have_one_home():
    """No engine writes its own retry or prompt screening; engines are built and weights pushed only in
    runtime/serving.py (eval/reload.py loads an export the way a user would, on purpose without it)."""
    def files_with(text: str) -> list[str]:
        return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if text in p.read_text())

    assert files_with("retrying them one by one") == ["rollout/local_engine.py"]
    assert files_with("not generated: %s") == ["rollout/local_engine.py"]
    assert files_with("HFEngine(model") == ["runtime/serving.py"]
    assert files_with(".sync_weights(") == ["runtime/serving.py"]
    assert files_with("VLLMEngine(") == ["eval/reload.py", "rollout/vllm/engine.py", "runtime/serving.py"]
