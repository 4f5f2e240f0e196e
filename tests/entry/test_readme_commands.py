"""The README's math-on-CPU commands run exactly as written (slow lane: a real two-step run of SmolLM2-135M)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def readme_block(after: str) -> list[str]:
    """The commands of the first ```bash block after the line starting with ``after`` (continuations joined)."""
    text = README.read_text()
    start = text.index(after)
    block = re.search(r"```bash\n(.*?)```", text[start:], flags=re.S).group(1)
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_cpu_math_block_is_the_loader_then_the_train_script():
    commands = readme_block("Math, from data to a trained checkpoint, on CPU")
    assert [c.split()[:2] for c in commands] == [[".venv/bin/python", "scripts/dataprocess/load_math.py"],
                                                 ["bash", "scripts/train/math/math_L1_prompt.sh"]]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # SmolLM2 on CPU: ~5 min on a quiet 2-core machine, several times that under load
def test_the_readme_cpu_math_commands_run_as_written(tmp_path, run_shell):
    """In a copy of the checkout (the commands write data/ and logs/ relative to it), with the checkout's venv."""
    checkout = tmp_path / "checkout"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    for name in files:
        source = REPO / name
        if source.is_file():
            target = checkout / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode)
    (checkout / ".venv").symlink_to(REPO / ".venv")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    for command in readme_block("Math, from data to a trained checkpoint, on CPU"):
        code, out, err = run_shell(command, checkout, env, timeout=3000)
        assert code == 0, f"{command}\n{out[-4000:]}\n{err[-4000:]}"
    (run_dir,) = checkout.glob("logs/math_L1_prompt/*/*")
    rows = [json.loads(line) for line in (run_dir / "summary.log").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "val/gsm_symbolic/success_rate" in rows[0] and "policy_0/reasoner/reward_mean" in rows[1]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000002"
    log = (run_dir / "train.log").read_text()
    assert "step 1/2" in log and "step 2/2" in log
