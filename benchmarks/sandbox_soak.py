"""Soak: thousands of short programs through a SandboxPool; zombies, survivors, fds and RSS before/after.

    python benchmarks/sandbox_soak.py [--programs 2000] [--workers 4]

Writes benchmarks/results/sandbox_soak.json. tests/sandbox/test_soak.py runs the same measurement
(pettingllms.sandbox.diagnostics.soak) with 200 programs by default and 2000 under -m slow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pettingllms.sandbox.diagnostics import machine_info, soak  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "sandbox_soak.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    figures = soak(args.programs, max_workers=args.workers)
    figures["flat"] = (figures["wrong_result_count"] == 0 and figures["zombie_children_after"] == 0
                       and figures["surviving_marked_processes"] == 0 and figures["leftover_work_dirs"] == 0
                       and figures["open_fds_after"] <= figures["open_fds_before"])
    report = {"benchmark": "sandbox_soak", "machine": machine_info(), **figures}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps(figures, indent=2))
    print(f"wrote {args.out}")
    if not figures["flat"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
