"""``pettingllms export``: write a trainer checkpoint as Hugging Face folders (``pettingllms/eval/export.py``)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pettingllms.core import PettingLLMsError
from pettingllms.entry import console_logging


def export_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="pettingllms export",
        description="Write a checkpoint's policies as Hugging Face folders (full models with their tokenizer, or "
                    "LoRA adapters; --merge-lora merges each adapter into a full model).",
    )
    parser.add_argument("checkpoint", help="a run directory (its latest checkpoint) or <run>/checkpoints/step_N")
    parser.add_argument("--out", help="output directory (default: <step dir>/hf); one folder per policy")
    parser.add_argument("--merge-lora", action="store_true",
                        help="one full model per LoRA adapter, the adapter merged into the base weights")
    parser.add_argument("--trust-run-code", action="store_true",
                        help="import the modules and classes the run's config.yaml names (env.imports, "
                             "module:Class); without it such a run is refused: a run directory is data")
    args = parser.parse_args(argv)
    console_logging()
    from pettingllms.eval.export import export_checkpoint

    try:
        exported = export_checkpoint(args.checkpoint, args.out, args.merge_lora, args.trust_run_code)
    except PettingLLMsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for item in exported:
        state = "trained" if item.trained else "base weights (not trained in this run)"
        for folder in item.folders:
            print(f"{item.policy}: {folder} ({state})")
    return 0
