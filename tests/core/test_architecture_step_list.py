"""docs/architecture.md's "One training step" list is the order ``Trainer.step`` runs: each call the page names,
found in the method's source, comes in the page's order (a reordered or renamed step fails here)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from pettingllms.trainer.trainer import Trainer

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
# What the page writes for a step -> what Trainer.step calls for it.
STEPS = {
    "DataCursor": "self.cursor.next_batch(",
    "Executor.run": "self.executor.run(",
    "route samples of trainable agents": ".trainable and not sample.frozen:",
    "score_samples": "score_samples(",
    "PolicyGroup.update": "self.policies.update(",
    "PolicyGroup.snapshot": "self.policies.snapshot(",
    "metrics": "sample_metrics(",
}


def test_the_documented_step_list_is_the_order_trainer_step_runs():
    section = DOC.read_text().split("## One training step", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^\d+\. (.*(?:\n   .*)*)", section, re.M)
    assert len(items) >= len(STEPS)
    documented = [next(i for i, item in enumerate(items) if name in item) for name in STEPS]
    assert documented == sorted(documented), "the page lists the steps in another order"
    source = inspect.getsource(Trainer.step)
    positions = [source.index(call) for call in STEPS.values()]
    assert positions == sorted(positions), "Trainer.step runs the steps in another order than the page lists"
