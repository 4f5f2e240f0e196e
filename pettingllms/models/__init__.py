"""Model files, loading, LoRA adapters and the chat codec for the transformers (CPU default) stack.

``resolve_model`` turns a spec (local directory, hub id, or a built-in alias) into a local HF model
directory; ``load_model`` / ``load_tokenizer`` load it; ``attach_adapters`` / ``use_adapter`` manage one
LoRA adapter per agent; ``HFChatCodec`` turns chat messages into the exact prompt token ids.
"""

from pettingllms.models.codec import HFChatCodec
from pettingllms.models.load import load_model, load_tokenizer
from pettingllms.models.lora import LoraSpec, adapter_names, attach_adapters, use_adapter
from pettingllms.models.aliases import cache_root
from pettingllms.models.resolve import ALIASES, resolve_model
from pettingllms.models.tiny import build_tiny_model

__all__ = [
    "ALIASES",
    "HFChatCodec",
    "LoraSpec",
    "adapter_names",
    "attach_adapters",
    "build_tiny_model",
    "cache_root",
    "load_model",
    "load_tokenizer",
    "resolve_model",
    "use_adapter",
]
