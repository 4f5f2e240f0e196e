"""Shared fixtures for model tests: the converted SmolLM2 alias and the tiny random model.

The first session on a machine converts the packaged GGUF (~45 s, once per cache); later sessions
reuse ~/.cache/pettingllms (or $PETTINGLLMS_CACHE).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub downloads on these machines

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One thread: these models are tiny, and on a shared 2-core machine more threads only contend."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def smollm2_dir():
    from pettingllms.models import resolve_model

    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_dir(smollm2_dir):
    from pettingllms.models import resolve_model

    return resolve_model("tiny-random-smollm2")
