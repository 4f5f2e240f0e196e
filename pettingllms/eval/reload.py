"""Loading an exported model folder back and generating from it: transformers, and vLLM where it is installed.

What ``pettingllms export`` writes must load on its own; the rehearsal (``pettingllms train --rehearse``) checks it
with these. They build their engines directly, not through ``runtime/serving.py`` (where training and evaluation
build theirs), on purpose: the check is that the folder loads as a user's own transformers or vLLM would load it,
with nothing of the run's settings. vLLM's runs in a Python process of its own (``python -m pettingllms.eval.reload``),
as a user's would: none of the caller's Ray, torch threads or engines are in it, and a crash of vLLM's native code is
reported with its signal and the folder instead of ending the caller unexplained.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from pettingllms.core import ConfigError, PettingLLMsError
from pettingllms.core.atomic import atomic_file
from pettingllms.core.native_crashes import exit_status, report_native_crashes
from pettingllms.models.load import refused_as_one_line


def _codec(directory: Path | str):
    """The chat codec of an exported model (or its base), in non-thinking mode where the template has the switch."""
    from pettingllms.models.codec import HFChatCodec
    from pettingllms.models.load import load_tokenizer

    thinking = "enable_thinking" in (load_tokenizer(directory).chat_template or "")
    return HFChatCodec.from_pretrained(directory, {"enable_thinking": False} if thinking else None)


def _prompt(codec) -> list[int]:
    return codec.encode_chat([{"role": "user", "content": "What is 2 + 3?"}])


def _base_of(folder: Path) -> str:
    return json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]


def generate_with_transformers(folder: Path) -> str:
    import torch
    from transformers import AutoModelForCausalLM

    with refused_as_one_line(folder):
        if (folder / "adapter_config.json").is_file():
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(folder, trust_remote_code=False)
            codec = _codec(_base_of(folder))
        else:
            model, codec = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False), _codec(folder)
    ids = torch.tensor([_prompt(codec)])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
    if out.shape[1] <= ids.shape[1]:
        raise ConfigError(f"the export in {folder} generated nothing in transformers")
    return codec.decode(out[0, ids.shape[1]:].tolist())


def generate_with_vllm(folder: Path) -> str:
    """The export generating in vLLM, in a fresh Python process; its failure or crash raises ``ConfigError``."""
    with tempfile.TemporaryDirectory(prefix="pettingllms-reload-") as tmp:
        result = Path(tmp) / "result.json"
        run = subprocess.run([sys.executable, "-m", "pettingllms.eval.reload", str(folder), str(result)], check=False)
        answer = json.loads(result.read_text()) if result.is_file() else {}
    if "error" in answer:
        raise ConfigError(answer["error"])
    if run.returncode != 0 or "text" not in answer:
        raise ConfigError(vllm_process_failure(folder, run.returncode, answer.get("text")))
    return answer["text"]


def vllm_process_failure(folder: Path, returncode: int, text: str | None) -> str:
    when = "before generating" if text is None else f"after generating {text!r}"
    return (f"vLLM's process reloading the export in {folder} ended with {exit_status(returncode)} {when}; its output "
            f"is above (a native crash prints every thread's Python stack there)")


def _generate_with_vllm_here(folder: Path) -> str:
    from pettingllms.core.types import GenerationRequest, SamplingParams
    from pettingllms.rollout.vllm import VLLMEngine

    adapter = (folder / "adapter_config.json").is_file()
    base = _base_of(folder) if adapter else folder
    options = {"max_model_len": 512, "llm_options": {"enforce_eager": True, "block_size": 32}}
    if adapter:
        rank = json.loads((folder / "adapter_config.json").read_text())["r"]
        from pettingllms.runtime.serving import vllm_lora_rank

        options.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(rank))
    codec = _codec(base)
    with VLLMEngine(base, dtype="float32", codec=codec, **options) as engine:
        if adapter:
            engine.add_adapter("exported", folder)
        request = GenerationRequest("rehearse", tuple(_prompt(codec)), 1,
                                    SamplingParams(temperature=0.0, max_tokens=4), "exported" if adapter else None)
        (result,) = engine.generate([request])
    completion = result.completions[0]
    if completion.failed or not completion.token_ids:
        raise ConfigError(f"the export in {folder} generated nothing in vLLM ({completion.finish_reason})")
    return completion.text


def main(argv: Sequence[str]) -> int:
    """``python -m pettingllms.eval.reload FOLDER RESULT_JSON``: generate_with_vllm's process."""
    report_native_crashes()
    folder, result = Path(argv[0]), Path(argv[1])
    try:
        answer = {"text": _generate_with_vllm_here(folder)}
    except PettingLLMsError as error:
        answer = {"error": str(error)}
    with atomic_file(result) as tmp:
        tmp.write_text(json.dumps(answer))
    return 0 if "text" in answer else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
