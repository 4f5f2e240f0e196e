"""``HFChatCodec``: chat messages -> exact prompt token ids (the model's chat template), ids -> text.

Token ids produced here are what the engine consumes and what the learner trains on: nothing downstream
re-tokenizes text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Iterable, Sequence

from pettingllms.core.errors import ConfigError
from pettingllms.core.types import Message

# Chat end-of-turn tokens of common template families. Any of them present in a tokenizer's vocabulary
# ends generation, besides the tokenizer's own eos token.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")


class HFChatCodec:
    """ChatCodec over a Hugging Face tokenizer.

    eos_token_ids: ids that end a generation: the tokenizer's eos, known end-of-turn tokens in its vocab,
        plus ``extra_eos_token_ids`` (e.g. a generation_config's eos list). Pass ``eos_token_ids`` to
        replace the derived set entirely.
    pad_token_id: the tokenizer's pad id (its eos id when it has none). Padding is always masked; build
        masks from lengths, never from ``ids != pad_token_id`` (pad may equal an eos id for some models).
    chat_template_kwargs: extra variables for the chat template, e.g. ``{"enable_thinking": False}`` for Qwen3's
        non-thinking mode (what the reference sets for every agent); ``base_models.<policy>.chat_template_kwargs``.
    """

    def __init__(
        self,
        tokenizer,
        *,
        eos_token_ids: Iterable[int] | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        chat_template_kwargs: Mapping | None = None,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; a chat codec needs one"
            )
        self.tokenizer = tokenizer
        if eos_token_ids is None:
            eos_token_ids = _derived_eos_ids(tokenizer) | set(extra_eos_token_ids)
        self.eos_token_ids: frozenset[int] = frozenset(int(i) for i in eos_token_ids)
        if not self.eos_token_ids:
            raise ConfigError("the codec has no end-of-sequence token id; generation could never stop")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ConfigError("the tokenizer has neither a pad nor an eos token")
        self.pad_token_id: int = int(pad)
        self.chat_template_kwargs: dict = dict(chat_template_kwargs or {})
        reserved = sorted(set(self.chat_template_kwargs) & {"add_generation_prompt", "tokenize", "conversation"})
        if reserved:
            raise ConfigError(f"chat_template_kwargs may not set {reserved}: the codec sets them itself")

    @classmethod
    def from_pretrained(cls, path: Path | str, chat_template_kwargs: Mapping | None = None) -> "HFChatCodec":
        """Codec for a model directory/spec; also honours generation_config.json's eos ids."""
        from pettingllms.models.load import load_tokenizer
        from pettingllms.models.resolve import model_directory

        directory = model_directory(path)
        return cls(load_tokenizer(directory), extra_eos_token_ids=_generation_config_eos_ids(directory),
                   chat_template_kwargs=chat_template_kwargs)

    @property
    def chat_template(self) -> str | None:
        """The template's source (what the gateway reads to tell whether it defines tools)."""
        template = self.tokenizer.chat_template
        return template if isinstance(template, str) else None

    def encode_chat(self, messages: Sequence[Message], tools: Sequence[Mapping] | None = None) -> list[int]:
        """Prompt ids: chat template applied, generation prompt (assistant header) appended. ``tools``: OpenAI tool
        schemas, rendered by a template that defines them (messages may then carry ``tool_calls`` and ``tool``
        replies, which the template renders too)."""
        extra = {"tools": [dict(tool) for tool in tools]} if tools else {}
        encoded = self.tokenizer.apply_chat_template(
            [dict(message) for message in messages], add_generation_prompt=True, tokenize=True,
            **extra, **self.chat_template_kwargs,
        )
        # transformers 5 returns a BatchEncoding (a Mapping) here; 4.x returned the id list itself.
        ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
        if ids and isinstance(ids[0], list):  # a batch of one
            (ids,) = ids
        return [int(i) for i in ids]

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` with special tokens (eos, end-of-turn) removed."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def __repr__(self) -> str:
        return (
            f"HFChatCodec({getattr(self.tokenizer, 'name_or_path', '?')!r}, "
            f"eos_token_ids={sorted(self.eos_token_ids)}, pad_token_id={self.pad_token_id})"
        )


def _derived_eos_ids(tokenizer) -> set[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    ids.update(int(vocab[token]) for token in END_OF_TURN_TOKENS if token in vocab)
    return ids


def _generation_config_eos_ids(directory: Path) -> set[int]:
    try:
        config = json.loads((Path(directory) / "generation_config.json").read_text())
    except (OSError, ValueError):
        return set()
    eos = config.get("eos_token_id")
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(i) for i in eos}
