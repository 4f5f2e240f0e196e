"""Load a model directory (or any spec ``resolve_model`` accepts) as a torch module and tokenizer.

A model directory is loaded as it is (``model_directory``): a run resolves each model once and passes the
directory on.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from pettingllms.core.errors import ConfigError, DamagedCheckpointError, UnsafeCheckpointError
from pettingllms.models.attention import register_attention
from pettingllms.models.lora import LoraSpec, attach_adapters
from pettingllms.models.resolve import model_directory

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'float32' | 'bfloat16' (or the torch dtype itself) -> torch dtype; anything else is a ConfigError."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ConfigError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPES)}")


def load_model(
    path: Path | str,
    dtype: str | torch.dtype = "float32",
    lora: LoraSpec | None = None,
    adapter_names: Sequence[str] = (),
) -> nn.Module:
    """Load a causal LM from a directory, hub id or alias, with grouped-query SDPA attention.

    The attention implementation is ``pettingllms_sdpa`` (see ``pettingllms.models.attention``): the
    same maths as transformers' "sdpa" without copying K/V per query group under a padding mask.

    With ``lora``, returns a ``peft.PeftModel`` with one fresh adapter per name in ``adapter_names``
    (base weights frozen, adapters trainable; see ``pettingllms.models.lora``). Without it, a plain
    transformers model with every weight trainable. ``from_pretrained`` returns the module in eval mode;
    the learner switches it to train mode, the engine restores whatever mode it found.
    """
    torch_dtype = parse_dtype(dtype)
    names = tuple(adapter_names)
    if lora is None and names:
        raise ConfigError(f"adapter_names {list(names)} given without a LoRA spec")
    if lora is not None and not names:
        raise ConfigError("a LoRA spec needs at least one adapter name (one per agent, or one shared)")
    directory = model_directory(path)
    with refused_as_one_line(directory):
        model = AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch_dtype, attn_implementation=register_attention(), trust_remote_code=False
        )
    if lora is not None:
        model = attach_adapters(model, names, lora)
    return model


def load_tokenizer(path: Path | str):
    """The model's tokenizer, left padding, with a chat template (ConfigError if it has none)."""
    directory = model_directory(path)
    with refused_as_one_line(directory):
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False)
    if not tokenizer.chat_template:
        raise ConfigError(f"the tokenizer in {directory} has no chat template; chat agents need one")
    tokenizer.padding_side = "left"
    return tokenizer


def check_model_folder(directory: Path | str) -> None:
    """Read a model folder's config (an architecture that exists only as the folder's own code is refused) and every
    safetensors header (not the tensors: a damaged or crafted file is refused), each in one line, before anything
    loads the weights (``--dry-run``)."""
    from safetensors import safe_open
    from transformers import AutoConfig

    if (Path(directory) / "config.json").is_file():
        with refused_as_one_line(directory):
            AutoConfig.from_pretrained(directory, trust_remote_code=False)
    for path in sorted(Path(directory).glob("*.safetensors")):
        with refused_as_one_line(directory), safe_open(str(path), "pt"):
            pass


@contextmanager
def refused_as_one_line(directory: Path | str):
    """A model folder that asks to run its own code, or whose weights file is not valid safetensors, is refused in
    one line naming the folder. transformers is always told ``trust_remote_code=False``: never a prompt, never the
    folder's code (a shared or downloaded checkpoint is data)."""
    try:
        yield
    except ValueError as exc:
        if "trust_remote_code" not in str(exc):
            raise
        raise UnsafeCheckpointError(
            f"{directory}: its config.json maps the model to code shipped in the folder (auto_map), which pettingllms "
            "never runs (trust_remote_code stays off); use a model whose architecture transformers has built in") from None
    except Exception as exc:
        if type(exc).__name__ != "SafetensorError":
            raise
        raise DamagedCheckpointError(f"{directory}: a weights file is not valid safetensors ({exc}); the folder is "
                                     "damaged or was not written by save_pretrained") from None
