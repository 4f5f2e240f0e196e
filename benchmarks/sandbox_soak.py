"""Soak: thousands of short programs through a SandboxPool; zombies, survivors, fds and RSS before/after.

    python benchmarks/sandbox_soak.py [--programs 2000] [--workers 4]
    python benchmarks/sandbox_soak.py --quick     # 40 programs, 2 workers, into a temp folder (smoke test)

Writes benchmarks/results/sandbox_soak.json (or ``--out``). tests/sandbox/test_soak.py runs the same measurement
(pettingllms.sandbox.diagnostics.soak) with 200 programs by default and 2000 under -m slow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import out_dir  # noqa: E402

from pettingllms.sandbox.diagnostics import fd_count_is_flat, machine_info, soak  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "sandbox_soak.json")


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="40 programs, 2 workers, to a temp folder (smoke test)")
    parser.add_argument("--out", help=f"the JSON to write (default {OUT})")
    args = parser.parse_args(argv)
    if args.quick:
        args.programs, args.workers = 40, 2
    args.out = args.out or str(out_dir(None, args.quick) / "sandbox_soak.json")
    figures = soak(args.programs, max_workers=args.workers)
    figures["flat"] = (figures["wrong_result_count"] == 0 and figures["zombie_children_after"] == 0
                       and figures["surviving_marked_processes"] == 0 and figures["leftover_work_dirs"] == 0
                       and fd_count_is_flat(figures))
    report = {"benchmark": "sandbox_soak", "quick": args.quick, "machine": machine_info(), **figures}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps(figures, indent=2))
    print(f"wrote {args.out}")
    if not figures["flat"]:
        sys.exit(1)
    return report


if __name__ == "__main__":
    main()
