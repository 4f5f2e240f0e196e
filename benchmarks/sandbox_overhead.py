"""Per-run overhead of the sandbox layers against a bare subprocess, on a trivial program.

    python benchmarks/sandbox_overhead.py [--runs N]
    python benchmarks/sandbox_overhead.py --quick     # 3 runs per layer, into a temp folder (smoke test)

Writes benchmarks/results/sandbox_overhead.json (or ``--out``). The bare baseline runs the same interpreter with the same
flags (``python -s main.py`` in a temp dir) as the layer it is compared with, so the difference is the
sandbox's own cost: bwrap or namespaces, the launcher, rlimits, private uid, work dir, output capture.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import out_dir  # noqa: E402

from pettingllms.core.errors import InfrastructureError  # noqa: E402
from pettingllms.sandbox import FALLBACK, STRONG, Sandbox  # noqa: E402
from pettingllms.sandbox.diagnostics import machine_info  # noqa: E402

PROGRAM = "pass\n"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "sandbox_overhead.json")


def summarise(seconds: list[float]) -> dict:
    ms = sorted(s * 1000 for s in seconds)
    return {
        "runs": len(ms),
        "median_ms": round(statistics.median(ms), 2),
        "p90_ms": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 2),
        "min_ms": round(ms[0], 2),
    }


def time_interleaved(calls: dict, runs: int) -> dict[str, list[float]]:
    """Alternate the calls run by run, so a load change on a shared machine hits all of them alike."""
    for call in calls.values():
        call()  # warm-up: page cache, probing
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(runs):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times


def bare_run(python: str) -> None:
    with tempfile.TemporaryDirectory() as work:
        main = os.path.join(work, "main.py")
        with open(main, "w") as f:
            f.write(PROGRAM)
        subprocess.run([python, "-s", main], cwd=work, stdin=subprocess.DEVNULL, capture_output=True, check=True)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="3 runs per layer, written to a temp folder (smoke test)")
    parser.add_argument("--out", help=f"the JSON to write (default {OUT})")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = 3
    args.out = args.out or str(out_dir(None, args.quick) / "sandbox_overhead.json")

    load_at_start = round(os.getloadavg()[0], 2)
    layers = {}
    for layer in (STRONG, FALLBACK):
        sandbox = Sandbox(layer)
        try:
            plan = sandbox.plan()
        except InfrastructureError as exc:
            layers[layer] = {"available": False, "reason": str(exc)}
            continue

        def sandboxed(sandbox=sandbox):
            result = sandbox.run(PROGRAM)
            assert result.verdict == "ok" and result.exit_code == 0, result

        python = plan.interpreter.executable
        times = time_interleaved({"bare": lambda python=python: bare_run(python), "sandboxed": sandboxed}, args.runs)
        bare, boxed = summarise(times["bare"]), summarise(times["sandboxed"])
        layers[layer] = {
            "available": True,
            "interpreter": python,
            "privileged_runner": plan.privileged,
            "bare_subprocess": bare,
            "sandboxed": boxed,
            "overhead_median_ms": round(boxed["median_ms"] - bare["median_ms"], 2),
            "overhead_p90_ms": round(boxed["p90_ms"] - bare["p90_ms"], 2),
        }
        print(f"{layer:8s} {python}: bare median {bare['median_ms']} ms p90 {bare['p90_ms']} ms | "
              f"sandboxed median {boxed['median_ms']} ms p90 {boxed['p90_ms']} ms | "
              f"overhead median {layers[layer]['overhead_median_ms']} ms")
    report = {"benchmark": "sandbox_overhead", "quick": args.quick, "program": PROGRAM.strip(), "load_average_1m_at_start": load_at_start,
              "machine": machine_info(), "layers": layers}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
