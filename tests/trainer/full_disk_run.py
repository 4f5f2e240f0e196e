"""Training on a real full disk, for test_faults.py. Run inside a mount namespace where argv[1] is a small tmpfs
(the test starts it under ``unshare -Urm``, so the mount vanishes with the process); prints one line,
``RESULT <json>``, with what each start did:

- ``first``: one step and its checkpoint;
- ``mid_step``: the disk filled completely: step 2's first write, its checkpoint (the step's line of summary.log
  comes after it, with the checkpoint's seconds), runs out of space;
- ``mid_checkpoint``: the disk filled to 8 MB free: step 2 runs, its checkpoint (about 40 MB) runs out of space;
- ``after``: the filler removed: the run resumes and finishes (steps 2 and 3).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pettingllms.entry.train import run_training

sys.path.insert(0, str(Path(__file__).parent))
from test_lifecycle_and_logs import TINY  # noqa: E402

DISK = Path(sys.argv[1])
FILLER = DISK / "filler"
ARGS = TINY + [f"training.log_dir={DISK / 'logs'}", "training.resume=auto", "training.total_training_steps=3",
               "training.save_freq=1", "training.max_ckpt_to_keep=1"]
ONE_STEP = "training.stop_after_steps=1"  # the same config each time: a resume on a full disk rewrites no config.yaml


def fill(leave: int) -> None:
    """Write FILLER until ``leave`` bytes are free (0: until the file system refuses)."""
    FILLER.unlink(missing_ok=True)
    chunk = b"\1" * (1 << 20)
    with FILLER.open("wb", buffering=0) as fh:
        while True:
            room = os.statvfs(DISK).f_bavail * os.statvfs(DISK).f_frsize - leave
            if room <= 0:
                return
            try:
                fh.write(chunk[:room])
            except OSError:
                return


def attempt(*extra: str) -> dict:
    outcome: dict = {"error": None}
    try:
        run_training("train", ARGS + list(extra))
    except Exception as exc:  # noqa: BLE001 - the test reads which error it was
        outcome["error"] = f"{type(exc).__name__}: {exc}"
    (run_dir,) = DISK.glob("logs/default/*/*")
    checkpoints = run_dir / "checkpoints"
    outcome["latest"] = (checkpoints / "latest").read_text().strip()
    outcome["checkpoints"] = sorted(p.name for p in checkpoints.iterdir())
    outcome["summary"] = (run_dir / "summary.log").read_text()
    outcome["train_log"] = (run_dir / "train.log").read_text()
    return outcome


result = {"first": attempt(ONE_STEP)}
fill(0)
result["mid_step"] = attempt(ONE_STEP)
fill(8 << 20)
result["mid_checkpoint"] = attempt(ONE_STEP)
FILLER.unlink()
result["after"] = attempt()
print("RESULT " + json.dumps(result), flush=True)
