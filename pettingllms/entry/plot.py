"""``pettingllms plot RUN_DIR [--out PNG]``: training curves of a run directory (read from its summary.log)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pettingllms.core import PettingLLMsError


def plot_command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="pettingllms plot",
        description="Draw reward, success rate, episode length, response length and KL curves (per policy and "
                    "agent, with validation points) from a run directory's summary.log.",
    )
    parser.add_argument("run_dir", help="a run directory: logs/<experiment_name>/<date>/<time>/")
    parser.add_argument("--out", default=None, help="output PNG (default: RUN_DIR/curves.png)")
    args = parser.parse_args(list(argv))

    from pettingllms.trainer.plots import plot_run

    try:
        result = plot_run(args.run_dir, args.out)
    except PettingLLMsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for title, keys in result.panels.items():
        print(f"{title}: {len(keys)} series" + (f" ({', '.join(keys)})" if keys else ""))
    print(f"wrote {result.path}")
    return 0
