"""``pettingllms export CKPT``: a trainer checkpoint as Hugging Face folders that transformers and vLLM load.

    pettingllms export <run dir | run/checkpoints/step_N> [--out DIR] [--merge-lora]

For every policy of the run (``<out>/<policy>/``):
- a full model: ``save_pretrained`` (safetensors, config) plus the tokenizer and chat template, loadable and
  servable on its own;
- LoRA adapters (L2: one per agent; L1/L3 with LoRA: one shared): one peft folder per adapter,
  ``<out>/<policy>/<adapter>/``, tagged with its agent, to load on the base model; with ``--merge-lora`` instead
  one full model per adapter with the adapter merged into the base weights (``merge_and_unload``), tokenizer
  included.
The weights come from the checkpoint's DCP shards, whatever number of ranks wrote them; nothing else of the run
is needed but its ``config.yaml``, read as data: a run that names modules to import is refused unless
``--trust-run-code`` (``eval/run_code.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from pettingllms.core import ConfigError
from pettingllms.eval.checkpoints import read_run_config, resolve_checkpoint
from pettingllms.eval.run_code import code_settings, refuse_run_code
from pettingllms.runtime import checkpoints as ckpt
from pettingllms.runtime.spec import WorkerSpec

log = logging.getLogger("pettingllms.eval")


@dataclass(frozen=True)
class Exported:
    policy: str
    folders: tuple[str, ...]
    trained: bool  # False: the policy was frozen in that run and keeps its base weights


def export_checkpoint(checkpoint: str | Path, out: str | Path | None = None, merge_lora: bool = False,
                      trust_run_code: bool = False) -> list[Exported]:
    """Write every policy of a checkpoint as Hugging Face folders under ``out`` (default ``<step dir>/hf``)."""
    from pettingllms.assembly.plan import plan

    step_dir, run_dir = resolve_checkpoint(str(checkpoint))
    run = read_run_config(run_dir)
    if not trust_run_code:
        refuse_run_code(code_settings(run), run_dir, "--trust-run-code")
    # exporting needs no GPU; an opponent-pool worker (a full model's past versions) is no policy of the run's
    specs = [spec for spec in plan(run, check_memory=False).resolved().worker_specs if not spec.snapshot_of]
    target = Path(out).expanduser() if out else step_dir / "hf"
    return [_export_policy(spec, ckpt.policy_dir(step_dir, spec.policy), target / spec.policy, merge_lora)
            for spec in specs]


def _export_policy(spec: WorkerSpec, folder: Path, dest: Path, merge_lora: bool) -> Exported:
    from pettingllms.learner.state import export_hf_model
    from pettingllms.models import load_model
    from pettingllms.runtime.serving import policy_codec
    from pettingllms.runtime.worker import save_tokenizer_beside

    if not folder.is_dir():
        raise ConfigError(f"the checkpoint has no state for policy {spec.policy!r} (expected {folder})")
    model = load_model(spec.directory, spec.dtype, spec.lora, spec.lora_names)
    loaded = ckpt.load_trained_weights(model, folder, spec.policy, spec.lora_names)
    codec = policy_codec(spec)
    if spec.lora_names and merge_lora:
        folders = [_merged(model, name, dest / name, codec) for name in spec.lora_names]
    else:
        folders = save_tokenizer_beside(export_hf_model(model, spec.lora_names, dest), codec)
    log.info("exported policy %s (%s) to %s", spec.policy, "trained" if loaded else "base weights", dest)
    return Exported(spec.policy, tuple(str(f) for f in folders), loaded is not None)


def _merged(model, adapter: str, dest: Path, codec) -> str:
    """One full model: the base weights with ``adapter`` merged in (the peft model itself is left unchanged)."""
    import copy

    single = copy.deepcopy(model)
    single.set_adapter(adapter)
    for other in list(single.peft_config):
        if other != adapter:
            single.delete_adapter(other)
    merged = single.merge_and_unload()
    dest.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(dest)
    codec.tokenizer.save_pretrained(dest)
    return str(dest)
