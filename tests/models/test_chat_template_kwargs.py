"""``base_models.<policy>.chat_template_kwargs`` reaches the chat template: the codec passes the variables (Qwen3's
``enable_thinking: false`` adds an empty think block to the generation prompt), refuses the ones it sets itself, and
every config that trains a Qwen3 model sets non-thinking mode, as the reference runs every agent; the trainer's plan
hands the variables to every policy's workers and the driver's codec."""

from __future__ import annotations

import copy

import pytest

from pettingllms.core.errors import ConfigError
from pettingllms.models import HFChatCodec

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]

# The part of Qwen3's chat template that reads the variable (its generation prompt).
QWEN3_STYLE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


@pytest.fixture(scope="module")
def qwen3_style_tokenizer(tiny_dir):
    tokenizer = copy.deepcopy(HFChatCodec.from_pretrained(tiny_dir).tokenizer)
    tokenizer.chat_template = QWEN3_STYLE
    return tokenizer


def test_the_codec_passes_chat_template_kwargs_to_the_template(qwen3_style_tokenizer):
    thinking = HFChatCodec(qwen3_style_tokenizer)
    plain = HFChatCodec(qwen3_style_tokenizer, chat_template_kwargs={"enable_thinking": False})
    with_default = qwen3_style_tokenizer.decode(thinking.encode_chat(MESSAGES))
    non_thinking = qwen3_style_tokenizer.decode(plain.encode_chat(MESSAGES))
    assert with_default.endswith("<|im_start|>assistant\n")
    assert non_thinking == with_default + "<think>\n\n</think>\n\n"


@pytest.mark.parametrize("key", ["add_generation_prompt", "tokenize", "conversation"])
def test_keys_the_codec_sets_itself_are_refused(qwen3_style_tokenizer, key):
    with pytest.raises(ConfigError, match=key):
        HFChatCodec(qwen3_style_tokenizer, chat_template_kwargs={key: True})


def test_from_pretrained_takes_the_kwargs(tiny_dir):
    codec = HFChatCodec.from_pretrained(tiny_dir, {"enable_thinking": False})
    assert codec.chat_template_kwargs == {"enable_thinking": False}


def _qwen3_configs() -> list[tuple[str, list[str]]]:
    """(config name, overrides) of every shipped config that trains Qwen3: domain configs and experiment presets."""
    from pettingllms.config.load import CONFIG_DIR

    found = []
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        if "Qwen3" in path.read_text() and path.stem not in ("eval",):
            found.append((path.stem, []))
    for path in sorted((CONFIG_DIR / "experiment").glob("*.yaml")):
        if "Qwen3" in path.read_text():
            found.append(("train", [f"+experiment={path.stem}"]))
    return found


def test_there_are_qwen3_configs_to_check():
    names = {name if not overrides else overrides[0] for name, overrides in _qwen3_configs()}
    assert {"math", "code", "+experiment=paper_math", "+experiment=paper_code"} <= names


@pytest.mark.parametrize("name, overrides", _qwen3_configs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_qwen3_config_runs_non_thinking_and_every_policy_gets_it(name, overrides):
    from pettingllms.entry.train import load_config
    from pettingllms.assembly.plan import plan

    cfg = load_config(name, overrides)
    assert cfg.base_models["policy_0"].chat_template_kwargs == {"enable_thinking": False}
    for level in ("L1", "L3"):  # L3: every agent's own copy of the policy keeps the setting
        cfg = load_config(name, [*overrides, f"specialization={level}"])
        specs = plan(cfg).worker_specs
        assert specs and all(spec.chat_template_kwargs == {"enable_thinking": False} for spec in specs), level


def test_a_policy_worker_encodes_with_its_policys_kwargs():
    """The worker's codec (the driver's, for in-process workers) is built from the spec's kwargs."""
    from settings_support import learner_config
    from pettingllms.runtime.layout import resolve_layout
    from pettingllms.runtime.spec import WorkerSpec
    from pettingllms.runtime.worker import PolicyWorker

    spec = WorkerSpec("policy_0", "tiny-random-smollm2", learner_config(total_steps=1),
                      resolve_layout("policy_0", num_gpus=0), chat_template_kwargs={"enable_thinking": False})
    assert PolicyWorker(spec).codec.chat_template_kwargs == {"enable_thinking": False}
