"""Every script in benchmarks/ has a ``--quick`` smoke in the benchmark lane (``pytest -m bench``, ``make test-bench``,
run by CI after the default lane), so a refactor that breaks a benchmark fails CI and a new benchmark cannot arrive
without one. This check itself is cheap and runs in the default lane."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def benchmark_names(folder: Path) -> list[str]:
    """The benchmark scripts: ``folder/*.py`` except the helpers they share (``_report.py``, ``_machine.py``)."""
    return sorted(path.stem for path in folder.glob("*.py") if not path.name.startswith("_"))


def bench_lane_tests() -> list[str]:
    """The node ids the lane runs, as pytest selects them (its marker, parametrisation and all)."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "bench", "-p", "no:cacheprovider",
         "tests/benchmarks"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [line.strip() for line in run.stdout.splitlines() if "::" in line]


def benchmarks_without_smoke(benchmarks: list[str], node_ids: list[str]) -> list[str]:
    """The benchmarks that no lane test names. A test covers ``name`` when it is called ``test_<name>_quick...`` or
    is parametrised with ``name`` as its id (``test_quick[<name>]``): names are underscore-separated, so a looser
    match would let ``test_rollout_efficiency_quick`` cover a benchmark called ``rollout``."""
    tests = [node.split("::", 1)[1] for node in node_ids]
    return [name for name in benchmarks
            if not any(test.startswith(f"test_{name}_quick") or test.endswith(f"[{name}]") for test in tests)]


def test_every_benchmark_has_a_quick_smoke_in_the_bench_lane():
    names = benchmark_names(BENCHMARKS)
    assert "rollout_efficiency" in names and "_report" not in names
    missing = benchmarks_without_smoke(names, bench_lane_tests())
    assert not missing, (
        f"benchmarks without a smoke in the benchmark lane: {missing}; add a test named test_<benchmark>_quick..., "
        "marked @pytest.mark.bench, in tests/benchmarks that runs the script with --quick "
        "(see tests/benchmarks/test_bench_smoke.py)")


def test_a_benchmark_is_covered_only_by_a_quick_test_named_after_it():
    lane = ["tests/benchmarks/test_bench_smoke.py::test_scaling_quick",
            "tests/benchmarks/test_x.py::test_quick[naive_loop]",
            "tests/benchmarks/test_x.py::test_rollout_efficiency_quick_runs",
            "tests/benchmarks/test_x.py::test_driver_memory_plan"]
    assert benchmarks_without_smoke(["scaling", "naive_loop", "rollout_efficiency", "rollout", "driver_memory",
                                     "lora_vs_shared"], lane) == ["rollout", "driver_memory", "lora_vs_shared"]


def test_only_the_shared_helpers_are_left_out(tmp_path):
    for name in ("_report.py", "_machine.py", "new_bench.py", "notes.md"):
        (tmp_path / name).write_text("")
    assert benchmark_names(tmp_path) == ["new_bench"]
