"""benchmarks/gpu_lent.sh runs only the parts GPU_PARTS names (all of them take longer than one 10-minute call on a
lent machine), and its vLLM parts (streaming, smoke) are skipped, saying so, where vLLM is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_parts_selects_the_parts_and_streaming_without_vllm_says_it_is_skipped(tmp_path):
    env = {**os.environ, "GPU_PARTS": "streaming smoke", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(["bash", "benchmarks/gpu_lent.sh", str(tmp_path / "out")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-2000:]
    assert "gpu_lent: streaming skipped: vLLM is not installed here" in output
    assert "gpu_lent: smoke skipped: vLLM is not installed here" in output
    for part in ("attention", "ipc", "learner", "checkpoint"):
        assert f"gpu_lent: {part} took" not in output  # not named: not run
    assert (tmp_path / "out" / "gpu_lent.log").is_file()
