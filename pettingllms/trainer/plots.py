"""PNG curves of a run from its summary.log: rewards, success, episode and response length, KL, validation."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

PANELS = {
    "reward": lambda k: k.endswith("/reward_mean") and "/turn_" not in k and not k.startswith("val/"),
    "success rate": lambda k: k == "episode/success_rate" or (k.startswith("val/") and k.endswith("success_rate")),
    "episode length (turns)": lambda k: k.endswith("turns_mean") and not k.startswith("val/"),
    "response length (tokens)": lambda k: k.endswith("/response_length_mean") and not k.startswith("val/"),
    "KL": lambda k: k.endswith("/actor/kl") or k.endswith("/actor/ppo_kl"),
}


def read_summary(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "summary.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_summary(run_dir)
    series: dict[str, dict[str, list]] = defaultdict(lambda: {"x": [], "y": []})
    for row in rows:
        for key, value in row.items():
            if key != "step" and value is not None:
                series[key]["x"].append(row["step"])
                series[key]["y"].append(value)
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(8, 3 * len(PANELS)), sharex=True)
    for ax, (title, wanted) in zip(axes, PANELS.items()):
        for key in sorted(k for k in series if wanted(k)):
            style = "o--" if key.startswith("val/") else "-"
            ax.plot(series[key]["x"], series[key]["y"], style, label=key, markersize=4)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="best")
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    out = Path(out) if out else run_dir / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
