"""Fixtures for the opt-in vLLM lane (``make test-vllm``): one shared vLLM engine on the tiny model, on CPU.

vLLM is imported only inside fixtures, never at module level: in the default lane (the main .venv, without
vLLM) these modules are still collected before the ``vllm_cpu`` marker deselects them, and must not fail.
vLLM on 2 cores starts slowly, so one engine (LoRA on, float32, a small context and KV cache) serves every
test of the lane; tests that change its weights or adapters restore them before they return.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # vLLM loads the model from a local folder, offline
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU; the default takes far more
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

CONTEXT = 256  # tokens: prompts here are <= 41 tokens, responses <= 6
LORA_RANK = 8
TINY_SHAPE = {"hidden": 64, "layers": 2, "heads": 2}
LAYER_SCALE = 8.0


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """The transformers reference runs beside vLLM's engine process on a 2-core machine: keep it to one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tokenizer_dir():
    """The packaged SmolLM2 (converted once into the pettingllms cache): tokenizer and base config."""
    from pettingllms.models import resolve_model

    return resolve_model("smollm2-135m-instruct")


def write_tiny(dest, tokenizer_dir, seed: int):
    """The tiny random SmolLM2 of the alias ``tiny-random-smollm2``, with 2 heads of size 32 and louder layers.

    vLLM's CPU attention kernels take head sizes 32, 64, 80, ... only; the alias has 4 heads of 16. Same
    hidden size, layers, tokenizer and embedding (3.2M parameters), so it is just as fast. Its layers'
    matrices are scaled by LAYER_SCALE: at the initial scale the tied embedding dominates and greedy decoding
    of *any* such checkpoint repeats the prompt's last token, so a weight sync could not show in the outputs.
    """
    from safetensors.torch import load_file, save_file

    from pettingllms.models.tiny import write_tiny_model

    write_tiny_model(dest, tokenizer_dir=tokenizer_dir, **TINY_SHAPE, seed=seed)
    weights_file = str(dest / "model.safetensors")
    weights = load_file(weights_file)
    for name, tensor in weights.items():
        if ".layers." in name and tensor.dim() == 2:
            weights[name] = tensor * LAYER_SCALE
    save_file(weights, weights_file, metadata={"format": "pt"})
    return dest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tokenizer_dir):
    return write_tiny(tmp_path_factory.mktemp("tiny-hd32"), tokenizer_dir, seed=0)


@pytest.fixture(scope="session")
def codec(tiny_dir):
    from pettingllms.models import HFChatCodec

    return HFChatCodec.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def engine(tiny_dir, codec):
    from pettingllms.rollout.vllm import INSTALL_HINT, VLLMEngine

    pytest.importorskip("vllm", reason=INSTALL_HINT)
    engine = VLLMEngine(
        tiny_dir,
        dtype="float32",
        seed=0,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=LORA_RANK,
        enable_sleep_mode=True,  # dropped on CPU with a log line; sleep()/wake_up() become no-ops
        max_model_len=CONTEXT,
        codec=codec,
        # enforce_eager: no torch.compile warm-up (minutes on 2 cores, for nothing here). block_size 32 (the
        # CPU default is 128): the tests' 40-token prompts then fill a KV block, so prefix caching engages.
        llm_options={"enforce_eager": True, "block_size": 32},
    )
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hf_model(tiny_dir):
    """The same checkpoint in transformers, float32: the reference for ids and logprobs."""
    from pettingllms.models import load_model

    return load_model(tiny_dir, "float32")


@pytest.fixture(scope="session")
def other_model(tmp_path_factory, tokenizer_dir):
    """A second checkpoint of the same shape (another seed): what a weight sync loads."""
    from pettingllms.models import load_model

    return load_model(write_tiny(tmp_path_factory.mktemp("tiny-hd32-seed1"), tokenizer_dir, seed=1), "float32")


@pytest.fixture(scope="session")
def peft_model(tiny_dir):
    """The tiny model with two LoRA adapters whose B matrices are random (fresh ones would equal the base)."""
    from pettingllms.models import LoraSpec, load_model

    model = load_model(tiny_dir, "float32", LoraSpec(rank=LORA_RANK, alpha=16.0), ("alice", "bob"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    return model
