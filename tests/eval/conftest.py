"""Fixtures for the evaluation tests: offline benchmark files made by the real loaders, the tiny model, one
torch thread (the tiny model gains nothing from more, and on a busy 2-core machine threads contend badly)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """data/math/test/{basic_arithmetic,gsm_symbolic}.parquet (8 rows each) and data/code/test/humaneval.parquet
    (4 rows), written by the loaders behind scripts/dataprocess/load_{math,code}.py."""
    from pettingllms.data import code_sources, math_sources
    from pettingllms.data.loader import main

    root = tmp_path_factory.mktemp("data")
    main(math_sources.domain_spec(), ["--data-root", str(root), "--sources", "basic_arithmetic,gsm_symbolic",
                                      "--train-size", "4", "--test-size", "8"])
    main(code_sources.domain_spec(), ["--data-root", str(root), "--limit", "12", "--humaneval-test-every", "3"])
    return root


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    from pettingllms.models import resolve_model

    return resolve_model("tiny-random-smollm2")


@pytest.fixture(scope="session")
def tiny_codec(tiny_path):
    from pettingllms.models import HFChatCodec

    return HFChatCodec.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def tiny_engine(tiny_path, tiny_codec):
    from pettingllms.models import load_model
    from pettingllms.rollout.hf_engine import HFEngine

    return HFEngine(load_model(tiny_path), tiny_codec, seed=0)
