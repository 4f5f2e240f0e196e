"""A policy worker with dtype=bfloat16: float32 master weights in the learner, bf16 compute in the learner and in the
transformers engine that shares its module; bf16 weights only when asked for, with a warning."""

from __future__ import annotations

import logging

import torch

from settings_support import learner_config
from pettingllms.runtime.layout import resolve_layout
from pettingllms.runtime.spec import WorkerSpec
from pettingllms.runtime.worker import PolicyWorker


def worker(**kwargs) -> PolicyWorker:
    spec = WorkerSpec("policy_0", "tiny-random-smollm2", learner_config(total_steps=1, dtype="bfloat16"),
                      resolve_layout("policy_0", num_gpus=0), dtype="bfloat16", **kwargs)
    w = PolicyWorker(spec)
    w.setup()
    return w


def test_bf16_compute_keeps_fp32_master_weights_and_the_engine_autocasts_like_the_learner():
    w = worker()
    assert {p.dtype for p in w.model.parameters()} == {torch.float32}
    assert w.engine.model is w.model and w.engine.autocast_dtype == torch.bfloat16


def test_bf16_master_weights_only_when_asked_for_and_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="pettingllms.runtime"):
        w = worker(master_weights="bfloat16")
    assert {p.dtype for p in w.model.parameters()} == {torch.bfloat16}
    assert w.engine.autocast_dtype is None  # the module itself is bf16
    assert "updates smaller than bf16's spacing are lost" in caplog.text


def test_a_policy_that_does_not_train_keeps_its_compute_dtype():
    """No learner, no master weights: a frozen bf16 policy holds bf16 weights (half the memory of fp32 copies)."""
    w = worker(trainable=False)
    assert w.learner is None
    assert {p.dtype for p in w.model.parameters()} == {torch.bfloat16}
    assert w.engine.model is w.model and w.engine.autocast_dtype is None
