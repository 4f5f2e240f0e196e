"""Benchmark lane: each benchmark script runs end to end with ``--quick`` and writes a complete JSON.

Quick runs use the tiny random model and tiny sizes, so their figures mean nothing; what is checked is that
the script really runs its measurement and reports it in the agreed shape, with a verdict that matches the
numbers. Run with ``make test-bench`` (``pytest -m bench tests/benchmarks``); CI runs it after the default lane.
tests/benchmarks/test_bench_lane.py fails when a script in benchmarks/ has no such test here.
"""

from __future__ import annotations

import importlib.util
import json
import operator
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
COMPARE = {">=": operator.ge, "<=": operator.le, "<": operator.lt}


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (its folder on the path, for its ``_report`` and sibling imports)."""
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_quick(name: str, out: Path) -> dict:
    """Call benchmarks/<name>.py's main with --quick into ``out``, return the JSON it wrote (``_report``'s shape)."""
    load_benchmark(name).main(["--quick", "--out-dir", str(out)])
    report = json.loads((out / f"{name}.json").read_text())
    check_common_fields(report, name)
    return report


def check_common_fields(report: dict, name: str, script: str | None = None) -> None:
    """``script``: the benchmark's file name when one script writes several results (``name`` is each result's)."""
    from _report import REQUIRED_FIELDS

    missing = [f for f in REQUIRED_FIELDS if f not in report]
    assert not missing, f"{name}.json lacks {missing}"
    assert report["benchmark"] == name and report["quick"] is True
    assert f"benchmarks/{script or name}.py" in report["command"] and "--quick" in report["command"]
    machine = report["machine"]
    for key in ("cpu_count", "torch", "load_average_before", "load_average_after", "torch_threads"):
        assert key in machine, key
    assert len(machine["load_average_before"]) == 3
    assert isinstance(report["measured"], float)
    target = report["target"]
    expected = COMPARE[target["op"]](report["measured"], target["value"]) and all(report["also_required"].values())
    assert report["passed"] is expected
    assert report["samples"] and report["medians"] and report["config"]


@pytest.mark.bench
def test_rollout_efficiency_quick(tmp_path):
    report = run_quick("rollout_efficiency", tmp_path)
    for sample in report["samples"]:
        assert sample["tokens"] > 0 and sample["calls"] >= 1
        # The bare replay starts from the executor's RNG state with the executor's own requests: same tokens.
        assert sample["identical_completions"] is True
        assert sample["ratio"] == pytest.approx(sample["bare_s"] / sample["executor_s"])


@pytest.mark.bench
def test_naive_loop_quick(tmp_path):
    report = run_quick("naive_loop", tmp_path)
    for sample in report["samples"]:
        executor, naive = sample["executor"], sample["naive"]
        assert executor["tokens"] > 0 and naive["tokens"] > 0
        assert naive["calls"] > executor["calls"]  # one call per candidate vs one per flush


@pytest.mark.bench
def test_scaling_quick(tmp_path):
    report = run_quick("scaling", tmp_path)
    fits = report["medians"]["fits"]
    assert {"vs_generated_tokens", "vs_episodes"} <= set(fits)
    assert all({"slope", "intercept", "r2"} <= set(f) for f in fits.values())
    steps = [s for row in report["samples"] for s in row["steps"]]
    assert len(steps) == len(report["config"]["sweep"]) * report["config"]["repeats"]
    assert all(s["generated_tokens"] > 0 and s["step_s"] > 0 for s in steps)


@pytest.mark.bench
def test_driver_memory_quick(tmp_path):
    report = run_quick("driver_memory", tmp_path)
    samples = report["samples"]
    assert [s["step"] for s in samples] == list(range(1, report["config"]["steps"] + 1))
    assert all(s["rss_bytes"] > 0 for s in samples)
    assert "growth_from_step_1" in report["medians"] and "growth_from_step_5" in report["medians"]


@pytest.mark.bench
def test_trl_compare_quick(tmp_path):
    if not (ROOT / ".venv-trl" / "bin" / "python").is_file():
        pytest.skip("TRL venv missing: run `bash benchmarks/trl/setup.sh` first")
    report = run_quick("trl_compare", tmp_path)
    ours = report["samples"]["ours"]["timed"]
    configurations = report["trl_configurations"]
    assert len(ours) == len(configurations) + 1 and all(s["seconds"] > 0 for s in ours)
    assert {c["name"] for c in configurations} == {"trl_defaults", "defaults_fp32", "one_batch_fp32",
                                                   "micro_batches_fp32", "micro_batches_bf16"}
    for c in configurations:  # every configuration ran its timed steps, as configured
        assert c["error"] is None and c["step_s_median"] > 0 and len(c["step_s"]) == report["config"]["repeats"]
        assert c["threads"] == report["config"]["threads"] and c["peak_rss_gb"] > 0
        assert c["gradient_checkpointing"] == c["settings"].get("gradient_checkpointing", True)  # TRL's default
        assert c["bf16"] == c["settings"].get("bf16", True)
    best = min(configurations, key=lambda c: c["step_s_median"])
    assert report["fastest_trl_configuration"] == best["name"]
    assert report["ratio"] == report["ours_step_s_median"] / best["step_s_median"] == report["medians"]["ratio"]
    alone, short = report["standalone"]
    assert alone["name"] == f"{best['name']}/harness_prompts" and alone["step_s_median"] > 0
    assert alone["prompt_lengths"] == report["config"]["prompt_lengths"]["trl"]
    assert short["step_s_median"] > 0 and sum(short["prompt_lengths"]) < sum(alone["prompt_lengths"])
    lengths = report["config"]["prompt_lengths"]
    assert lengths["ours"] == lengths["trl"]  # both sides tokenize the same chat messages identically


@pytest.mark.bench
def test_memory_plan_check_quick(tmp_path):
    report = run_quick("memory_plan_check", tmp_path)
    rows = report["samples"]
    assert [r["case"] for r in rows] == report["config"]["cases"] and len(rows) == 2  # full fine-tune and LoRA
    for r in rows:
        assert r["measured_peak_increase_mb"] > 0 and r["estimated_peak_increase_mb"] > 0
        assert r["ratio_measured_to_estimate"] == pytest.approx(
            r["measured_peak_increase_mb"] / r["estimated_peak_increase_mb"], rel=0.01)
    assert report["measured"] == pytest.approx(max(abs(r["ratio_measured_to_estimate"] - 1) for r in rows), abs=1e-4)


@pytest.mark.bench
def test_engine_throughput_quick(tmp_path):
    report = load_benchmark("engine_throughput").main(["--quick", "--out-dir", str(tmp_path)])
    assert json.loads((tmp_path / "engine_throughput.json").read_text()) == report
    assert report["quick"] is True and report["workload"]["max_new_tokens"] == 8
    completions = report["workload"]["prompts"] * report["workload"]["samples_per_prompt"]
    for dtype in ("float32", "bfloat16"):
        result = report["results"][dtype]
        for side in ("engine", "generate"):
            (run,) = result["runs"][side]
            assert run["completions"] == completions and 0 < run["tokens"] <= completions * 8
        summary = result["summary"]
        assert summary["speedup_wall"] == round(
            summary["generate"]["median_seconds"] / summary["engine"]["median_seconds"], 2)


@pytest.mark.bench
def test_prefix_packing_quick(tmp_path):
    report = run_quick("prefix_packing", tmp_path)
    for mode in ("tree", "trajectory"):
        workload = report["config"]["workloads"][mode]
        tokens = workload["forward_tokens"]
        # Real rollouts of the quickstart: the prefix trie forwards fewer tokens than identical prompts, which
        # forward fewer than one row per sample; every packing holds every response token.
        assert workload["response_tokens"] < tokens["prefix"] < tokens["identical"] < tokens["unpacked"]
        assert workload["rows"]["unpacked"] == workload["samples"] > 0
        assert all(len(report["samples"][mode][name]) == 1 for name in ("prefix", "identical", "unpacked"))
        medians = report["medians"][mode]
        assert medians["prefix_over_identical"] == round(medians["prefix"] / medians["identical"], 3)
    assert report["measured"] == report["medians"]["trajectory"]["prefix_over_identical"]


@pytest.mark.bench
def test_update_packing_quick(tmp_path):
    report = load_benchmark("update_packing").main(["--quick", "--out-dir", str(tmp_path)])
    assert json.loads((tmp_path / "update_packing.json").read_text()) == report
    workload = report["workload"]
    assert report["quick"] is True and workload["samples"] == workload["nodes"] * 4
    # K=4 branches share each node's prompt: packed, each prompt goes through the forward once instead of 4 times
    # (and the nodes' one-shot prefix once per row: their prompts differ only in the question's numbers).
    saved = workload["forward_tokens_unpacked"] - workload["forward_tokens_packed"]
    assert saved > 3 * workload["nodes"] * (workload["prompt_tokens"] - 10)
    for mode in ("full", "lora"):
        result = report["results"][mode]
        assert all(len(result["seconds"][side]) == 1 and result["seconds"][side][0] > 0 for side in ("packed", "unpacked"))
        assert result["speedup"] == round(result["median_seconds"]["unpacked"] / result["median_seconds"]["packed"], 2)


@pytest.mark.bench
def test_learner_compile_quick(tmp_path):
    report = load_benchmark("learner_compile").main(["--quick", "--out-dir", str(tmp_path)])
    assert json.loads((tmp_path / "learner_compile.json").read_text()) == report
    result = report["result"]
    assert report["quick"] is True and report["workload"]["samples"] == report["workload"]["nodes"] * 4
    assert all(len(result["seconds"][mode]) == 1 and result["seconds"][mode][0] > 0 for mode in ("eager", "compiled"))
    assert result["compiled_to_eager"] == round(result["median_seconds"]["compiled"] / result["median_seconds"]["eager"], 3)
    assert result["max_abs_logprob_difference"] < 1e-4  # the same weights: only the kernels differ


@pytest.mark.bench
def test_sandbox_overhead_quick(tmp_path):
    out = tmp_path / "sandbox_overhead.json"
    report = load_benchmark("sandbox_overhead").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == report and report["quick"] is True
    available = [layer for layer in report["layers"].values() if layer["available"]]
    assert available, report["layers"]  # the fallback layer works wherever the tests run
    for layer in available:
        assert layer["bare_subprocess"]["runs"] == layer["sandboxed"]["runs"] == 3
        assert layer["overhead_median_ms"] == pytest.approx(
            layer["sandboxed"]["median_ms"] - layer["bare_subprocess"]["median_ms"], abs=0.011)


@pytest.mark.bench
def test_sandbox_soak_quick(tmp_path):
    out = tmp_path / "sandbox_soak.json"
    report = load_benchmark("sandbox_soak").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report)) and report["quick"] is True
    assert report["flat"] is True and report["wrong_result_count"] == 0 and report["zombie_children_after"] == 0


@pytest.mark.bench
def test_training_run_quick(tmp_path):
    out = tmp_path / "training_run.json"
    assert load_benchmark("training_run").main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["quick"] is True and report["steps"] == 2 and report["wall_seconds"] > 0
    assert Path(report["run_dir"]).is_relative_to(tmp_path)  # the quick run's logs stay beside its JSON
    assert all(len(curve) == 2 for curve in report["curves"].values())
    validation = report["validation_success"]
    assert validation and all(sorted(map(int, by_step)) == [0, 2] for by_step in validation.values())


@pytest.mark.bench
def test_gpu_smoke_quick(tmp_path):
    """Without a GPU, --quick runs the L1 train script as gpu_smoke runs it (its budget overrides, its reading of the
    step rows); the GPU figures themselves need a GPU and vLLM."""
    load_benchmark("gpu_smoke").main(["--quick", "--out-dir", str(tmp_path)])
    report = json.loads((tmp_path / "gpu_smoke.json").read_text())
    assert report["quick"] is True and report["device"] == {"gpu": None} and report["config"]["parts"] == ["L1"]
    l1 = report["L1"]
    assert l1["script"] == "scripts/train/math/math_L1_prompt.sh" and [s["step"] for s in l1["steps"]] == [1, 2]
    assert all(s["update_s"] > 0 and s["step_s"] >= s["update_s"] for s in l1["steps"])
    assert l1["medians"]["update_s"] == l1["steps"][1]["update_s"]  # the first step (warm-up) is left out
    assert l1["engine_start_s"] == []  # the transformers engine on CPU: no vLLM start to time
    assert l1["sync_transports"] == [] and l1["sync_fallback"] is False  # nor a vLLM sync
    assert all(set(s["policy_sync_phases"]) <= {"policy_0"} for s in l1["steps"])


def test_gpu_smoke_reads_vllm_engine_starts_from_the_runs_output(tmp_path):
    """The start-up seconds come from VLLMEngine's own log line as a Ray actor prints it; the output still reaches
    the console, and a failing script still raises."""
    import subprocess

    import re

    smoke = load_benchmark("gpu_smoke")
    source = (Path(__file__).resolve().parents[2] / "pettingllms" / "rollout" / "vllm" / "engine.py").read_text()
    (form,) = re.findall(r'"(vLLM engine for [^"]*started in %\.1f s)"', source)  # the engine's own log format
    line = form % ("/m", "cuda", 1, 4096, "1,234", 44.2)
    (transport_form,) = re.findall(r'"(weight syncs go over %s: %s)"', source)
    sync_line = transport_form % ("cuda_ipc", "the CUDA IPC round trip returned the pattern")
    script = tmp_path / "run.sh"
    script.write_text(f"echo '(PolicyWorker pid=1) INFO {line}'\necho '(PolicyWorker pid=2) INFO "
                      f"{line.replace('44.2', '3.5')}'\necho '(PolicyWorker pid=1) INFO engine.py:396] {sync_line}'\n"
                      "echo done\n")
    assert smoke.run_echoing(["bash", str(script)], {}) == {
        "engine_start_s": [44.2, 3.5], "sync_transports": [("cuda_ipc", "the CUDA IPC round trip returned the pattern")]}
    script.write_text("exit 3\n")
    with pytest.raises(subprocess.CalledProcessError):
        smoke.run_echoing(["bash", str(script)], {})


@pytest.mark.bench
def test_logprob_head_quick(tmp_path):
    report = run_quick("logprob_head", tmp_path)
    for name in ("dense", "chunked"):
        sample = report["samples"][name]
        assert sample["peak_growth_mib"] >= 0 and len(sample["seconds"]) == report["config"]["repeats"]
    planned = {name: report["samples"][name]["planned_logits_mib"] for name in ("dense", "chunked")}
    assert planned["chunked"] < planned["dense"]  # one chunk of logits instead of every position's


@pytest.mark.bench
def test_gpu_probe_quick(tmp_path):
    """Each part writes its own result: the flex block mask equals the learner's dense mask, flex's forward equals
    the masked SDPA's, the transfer's checksums agree, and the three checkpoint writes ran."""
    load_benchmark("gpu_probe").main(["--quick", "--repeats", "2", "--out-dir", str(tmp_path)])
    reports = {}
    for part in ("attention", "ipc", "checkpoint"):
        assert not (tmp_path / f"gpu_probe_{part}.error.txt").exists()
        reports[part] = json.loads((tmp_path / f"gpu_probe_{part}.json").read_text())
        check_common_fields(reports[part], f"gpu_probe_{part}", script="gpu_probe")
    attention = reports["attention"]["samples"]
    assert attention["block_mask_equals_learner_mask"] is True
    assert attention["differences"]["out"]["max_abs"] < 1e-4
    ipc = reports["ipc"]["samples"]
    assert ipc["shm"]["checksums_worst_relative"] == 0.0 and ipc["tensors"] > 10
    checkpoint = reports["checkpoint"]["samples"]
    assert checkpoint["async_eight_threads"]["complete_s"] >= checkpoint["async_eight_threads"]["blocking_s"] > 0
    assert checkpoint["trainer_async"]["blocking_s"] > 0 and checkpoint["trainer_async"]["write_s"] > 0


@pytest.mark.bench
def test_rollout_streaming_quick(tmp_path):
    report = load_benchmark("rollout_streaming").main(["--quick", "--out-dir", str(tmp_path)])
    written = json.loads((tmp_path / "rollout_streaming_hf.json").read_text())
    check_common_fields(written, "rollout_streaming_hf", script="rollout_streaming")
    (pair,) = written["samples"]
    for mode in ("barrier", "streaming"):
        assert pair[mode]["tokens"] > 0 and 0.0 <= pair[mode]["engine_idle_share"] <= 1.0
    assert pair["streaming"]["engine_calls"] > pair["barrier"]["engine_calls"]  # it did not wait for everyone
    assert written["also_required"]["equal_tokens"] is (pair["barrier"]["tokens"] == pair["streaming"]["tokens"])
    assert report["medians"]["ratio"] == written["measured"]


@pytest.mark.bench
def test_checkpoint_blocking_quick(tmp_path):
    report = load_benchmark("checkpoint_blocking").main(["--quick", "--out-dir", str(tmp_path)])
    written = json.loads((tmp_path / "checkpoint_blocking.json").read_text())
    check_common_fields(written, "checkpoint_blocking")
    (pair,) = written["samples"]["pairs"]
    assert pair["sync_s"] > 0 and 0 < pair["async_blocking_s"] <= pair["async_complete_s"]
    assert written["samples"]["checkpoint_bytes"] > 0
    assert written["measured"] == report["medians"]["ratio"] == round(pair["async_blocking_s"] / pair["sync_s"], 3)
