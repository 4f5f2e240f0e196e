"""Fixtures for learner tests: a ~60k-parameter random Llama, peft LoRA adapters, hand-made samples."""

from __future__ import annotations

from typing import Callable, Sequence

import pytest
import torch

VOCAB = 256


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The tiny model's matmuls gain nothing from threads, and one thread stays fast when other processes share
    the two cores (two spinning OpenMP threads on a busy machine ran these tests ~10x slower)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)


def tiny_lora(seed: int = 0, names: Sequence[str] = ("alice", "bob")):
    """A peft model with one LoRA adapter per name; LoRA B is zero, so it starts equal to the base model."""
    from peft import LoraConfig, get_peft_model

    base = tiny_llama(seed)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    torch.manual_seed(seed + 1)
    model = get_peft_model(base, lora, adapter_name=names[0])
    for name in names[1:]:
        model.add_adapter(name, lora)
    return model


@pytest.fixture
def make_model() -> Callable:
    return tiny_llama


@pytest.fixture
def make_lora_model() -> Callable:
    return tiny_lora


def sample(
    prompt: Sequence[int],
    response: Sequence[int],
    *,
    agent: str = "alice",
    adapter: str | None = None,
    failed: bool = False,
    policy: str = "policy_0",
    index: int = 0,
    logprobs: Sequence[float] | None = None,
    temperature: float = 1.0,
):
    from pettingllms.core.types import Sample

    return Sample(
        policy=policy,
        agent=agent,
        turn=0,
        group=(index // 4, 0, agent),
        episode=f"ep{index}",
        problem_id=f"p{index // 4}",
        branch=index % 4,
        prompt_ids=tuple(prompt),
        response_ids=tuple(response),
        # The engine's logprobs; none by default (no engine here: the rollout check has nothing to compare).
        response_logprobs=tuple(logprobs) if logprobs is not None else (),
        temperature=temperature,
        reward=0.0,
        adapter=adapter,
        failed=failed,
    )


def random_samples(count: int, seed: int = 0, *, agent: str = "alice", adapter: str | None = None, start: int = 0):
    """``count`` samples with random ids; prompt lengths 3..8 and response lengths 2..9, so padding varies."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        prompt_len = int(torch.randint(3, 9, (1,), generator=generator))
        response_len = int(torch.randint(2, 10, (1,), generator=generator))
        ids = torch.randint(1, VOCAB, (prompt_len + response_len,), generator=generator).tolist()
        out.append(
            sample(ids[:prompt_len], ids[prompt_len:], agent=agent, adapter=adapter, index=start + i)
        )
    return out


@pytest.fixture
def make_sample() -> Callable:
    return sample


@pytest.fixture
def make_samples() -> Callable:
    return random_samples
