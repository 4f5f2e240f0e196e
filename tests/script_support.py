"""Running a train script the way a user does, without training: a stub interpreter records its command line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS_DIR = ROOT / "scripts" / "train"
PRINT_ARGS = ROOT / "tests" / "print_args.sh"
GPU_ENV = ("GPU_num", "CUDA_VISIBLE_DEVICES", "CLUSTER_GPUS")


def script_command(script: str, env: dict[str, str], *overrides: str) -> tuple[str, list[str]]:
    """(config name, Hydra overrides) that ``scripts/train/<script>`` hands to ``pettingllms.cli train``.

    env: the GPU environment of the user's shell (GPU_num, CUDA_VISIBLE_DEVICES, CLUSTER_GPUS); the test's own
    values of those are removed first, so the result does not depend on the machine the tests run on.
    """
    run_env = {k: v for k, v in os.environ.items() if k not in GPU_ENV}
    run_env.update(env, PYTHON=str(PRINT_ARGS))
    out = subprocess.run(["bash", str(SCRIPTS_DIR / script), *overrides], env=run_env, capture_output=True, text=True,
                         check=True, timeout=30).stdout.splitlines()
    start = out.index("--config-name")
    return out[start + 1], out[start + 2:]


def script_specs(script: str, env: dict[str, str], *overrides: str):
    """The worker specs (layouts included) of a script's run, from the real config composition and plan."""
    from pettingllms.config.load import compose, to_schema
    from pettingllms.assembly.plan import plan

    name, args = script_command(script, env, *overrides)
    return plan(to_schema(compose(name, args))).worker_specs
