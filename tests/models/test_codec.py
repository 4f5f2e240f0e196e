"""HFChatCodec: the chat template gives the prompt ids; decode drops special tokens; eos/pad ids."""

import pytest

from pettingllms.core.errors import ConfigError
from pettingllms.models import HFChatCodec

MESSAGES = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 2 + 3?"},
]


@pytest.fixture(scope="module")
def codec(tiny_dir):
    return HFChatCodec.from_pretrained(tiny_dir)


def test_encode_chat_returns_plain_ints_from_the_chat_template(codec):
    ids = codec.encode_chat(MESSAGES)
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    text = codec.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou add numbers.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids == codec.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_template_adds_its_default_system_prompt_only_when_none_is_given(codec):
    text = codec.tokenizer.decode(codec.encode_chat(MESSAGES[1:]))
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_decode_round_trips_text_and_drops_special_tokens(codec):
    text = "The answer is 5.\nDone: 2 + 3 = 5"
    ids = codec.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert codec.decode(ids) == text
    eos = next(iter(codec.eos_token_ids))
    assert codec.decode(ids + [eos]) == text
    assert "<|im_start|>" not in codec.decode(codec.encode_chat(MESSAGES))


def test_eos_and_pad_ids(codec):
    assert codec.eos_token_ids == frozenset({2})  # <|im_end|>, the end of an assistant turn
    assert codec.pad_token_id == 0 and codec.pad_token_id not in codec.eos_token_ids


def test_eos_ids_can_be_replaced_or_extended(codec):
    assert HFChatCodec(codec.tokenizer, eos_token_ids=[7, 9]).eos_token_ids == {7, 9}
    assert HFChatCodec(codec.tokenizer, extra_eos_token_ids=[0]).eos_token_ids == {0, 2}


def test_a_tokenizer_without_chat_template_is_refused(tiny_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    tokenizer.chat_template = None
    with pytest.raises(ConfigError, match="chat template"):
        HFChatCodec(tokenizer)
