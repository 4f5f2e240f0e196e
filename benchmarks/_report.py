"""The JSON every issue-#7 benchmark writes, and the small helpers they share.

Each result file holds: the command that made it, the machine (with the load average before and after the
run: the machine is shared, so a figure taken under load says so), the workload config, the raw samples, their
medians, the measured figure against its target, and pass/fail.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine_info  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REQUIRED_FIELDS = ("benchmark", "command", "quick", "machine", "config", "samples", "medians", "measured",
                   "target", "ratio_to_target", "passed")
OPERATORS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "<": lambda a, b: a < b}


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``)."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def out_dir(requested: str | None, quick: bool) -> Path:
    """Where to write: the requested folder; else benchmarks/results, or a temp folder for --quick runs, so a
    smoke run never overwrites real figures."""
    if requested:
        return Path(requested)
    return Path(tempfile.gettempdir()) / "pettingllms-bench-quick" if quick else RESULTS_DIR


def learner_config(*, total_steps: int, dtype: str = "float32", **fields: Any):
    """A ``LearnerConfig`` with the config schema's defaults (through the plan, as a training run builds it) and
    ``fields`` replaced: the learner has no defaults of its own, so a benchmark names only what it varies."""
    import dataclasses

    from pettingllms.assembly.plan import learner_config_of
    from pettingllms.config.schema import Config

    return dataclasses.replace(learner_config_of(Config(), dtype), total_steps=total_steps, **fields)


def end_child(process: subprocess.Popen, timeout: float, farewell: str = "") -> None:
    """Stop a benchmark's child process that reads commands from its stdin: send ``farewell`` (if any), close its
    stdin, wait up to ``timeout`` seconds, then kill it."""
    if process.poll() is not None:
        return
    if process.stdin:
        if farewell:
            process.stdin.write(farewell)
        process.stdin.close()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def linear_fit(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """Least squares y ~ slope * x + intercept. Returns slope, intercept and R^2 (1 - SS_res / SS_tot)."""
    n = len(x)
    if n < 2:
        raise ValueError("a fit needs at least two points")
    mean_x, mean_y = sum(x) / n, sum(y) / n
    sxx = sum((a - mean_x) ** 2 for a in x)
    sxy = sum((a - mean_x) * (b - mean_y) for a, b in zip(x, y))
    slope = sxy / sxx if sxx else 0.0
    intercept = mean_y - slope * mean_x
    ss_res = sum((b - (slope * a + intercept)) ** 2 for a, b in zip(x, y))
    ss_tot = sum((b - mean_y) ** 2 for b in y)
    return {"slope": slope, "intercept": intercept, "r2": 1.0 - ss_res / ss_tot if ss_tot else 1.0}


def write_result(
    name: str,
    argv: Sequence[str],
    *,
    quick: bool,
    directory: Path,
    config: dict[str, Any],
    samples: Any,
    medians: dict[str, Any],
    measured: float,
    target: float,
    op: str,
    metric: str,
    load_before: list[float],
    threads: int,
    notes: Sequence[str] = (),
    extra: dict[str, Any] | None = None,
    also_required: dict[str, bool] | None = None,
    script: str | None = None,
) -> Path:
    """Write ``<directory>/<name>.json`` and print a one-line verdict. ``op`` compares measured to target;
    ``also_required`` names further conditions that must all hold for a pass (recorded in the JSON);
    ``script`` is the benchmark's file name when it differs from ``name`` (one script, several result files)."""
    if op not in OPERATORS:
        raise ValueError(f"op must be one of {sorted(OPERATORS)}, got {op!r}")
    machine = machine_info()
    machine.update({"torch_threads": threads, "load_average_before": load_before,
                    "load_average_after": load_average(), "niceness": os.nice(0)})
    report = {
        "benchmark": name,
        "command": " ".join(["python", f"benchmarks/{script or name}.py", *map(shlex.quote, argv)]),
        "quick": quick,
        "machine": machine,
        "config": config,
        "samples": samples,
        "medians": medians,
        "metric": metric,
        "measured": round(float(measured), 4),
        "target": {"op": op, "value": target},
        "ratio_to_target": round(float(measured) / target, 4) if target else None,
        "also_required": dict(also_required or {}),
        "passed": bool(OPERATORS[op](measured, target)) and all((also_required or {}).values()),
        "notes": list(notes),
        **(extra or {}),
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    verdict = "PASS" if report["passed"] else "MISS"
    print(f"{name}: {metric} = {report['measured']} (target {op} {target}) {verdict}; load "
          f"{load_before[0]:.2f} -> {machine['load_average_after'][0]:.2f}; wrote {path}")
    return path
