"""The learner's half of a GPU training step, on a real GPU, with no vLLM and no Ray: what ``gpu_smoke.py`` cannot
reach on a machine where vLLM is not installed.

    python benchmarks/gpu_learner.py                      # a CUDA GPU; full-size Qwen3-1.7B replica
    python benchmarks/gpu_learner.py --quick              # CPU, tiny replica: checks the script, not the figures

The run: the policy of ``scripts/train/math/math_L1_prompt.sh``, composed as the script composes it (its config
name, its DEFAULTS read from the script, ``resources.gpus_per_policy=1``), planned by ``pettingllms.assembly.plan``
(the GPU memory plan that ``--dry-run`` prints), and built by ``PolicyWorker.setup`` exactly as a training rank
builds it (bf16 compute over fp32 master weights, on ``cuda:0``) with one difference: the engine it hosts is
``WeightSink``, which holds a bf16 copy of every weight on the GPU and copies each streamed tensor into it (what
vLLM's weight loader does), since vLLM is what the lent machine lacks. Then ``PolicyWorker.update``, the real
step's learner half: update, the allocator cache's release, the weights streamed in bf16 to the engine.

The model: a full-size random-weight replica of the script's Qwen/Qwen3-1.7B (``pettingllms/models/replicas.py``:
its config, tied head stored in shard 2, tensor names, chat template), written locally; no hub needed.

Each update trains 4 samples of L tokens, L chosen so the learner packs two per micro-batch and each micro-batch is
the memory plan's worst case (``micro_batch_max_tokens`` tokens in one packed row, every position a logit); two
micro-batches, so the second one's backward runs with the first one's gradients allocated. The first update creates
the AdamW state; ``--repeats`` more are measured.

Cases: ``single`` (GPU_num=1 as shipped: one rank, no FSDP), ``fsdp`` (``fsdp.enabled=true``: FSDP2 over NCCL with
one rank: the mixed-precision policy and the DTensor all-gather stream that every multi-GPU run uses), ``lora``
(``math_L2_lora.sh``: one adapter per agent over the fp32 base), ``checkpointing`` (``single`` with
``optim.gradient_checkpointing=true``), ``chunked`` (``single`` with ``optim.logprob_chunk_tokens=1024``: the LM
head's fp32 logits a chunk at a time, ``learner/logprob_head.py``) and ``chunked_sdpa`` (``chunked`` with
``optim.attention=sdpa``: the dense-mask SDPA instead of the default FlexAttention on CUDA, ``learner/masks.py``)
and ``compiled`` (``chunked`` with ``optim.compile=true``: each decoder layer's forward compiled, ``models/compile.py``;
its warm-up update, ``updates[0]``, compiles).
Every case but ``chunked_sdpa`` runs FlexAttention on a GPU (``optim.attention=auto``).

Measured per case: update and sync seconds (medians), trained tokens/s, the peak allocated during the update above
what was allocated before it (``torch.cuda.max_memory_allocated``) against the plan's learner estimate for the same
micro-batch (``pettingllms/assembly/memory.py``), the cache the release gives back, and the sync's peak above its
start (one tensor at a time, never the whole model). Writes benchmarks/results/gpu_learner.json.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from _report import load_average, median, out_dir, write_result  # noqa: E402

NAME = "gpu_learner"
SCRIPTS = ROOT / "scripts" / "train" / "math"
MODEL_ID = "Qwen/Qwen3-1.7B"
TARGET = 0.25  # |measured / estimated - 1| of the update's peak, as memory_plan_check judges the CPU figures
# case: (train script, overrides on top of it)
CASES = {
    "single": ("math_L1_prompt.sh", []),
    "fsdp": ("math_L1_prompt.sh", ["base_models.policy_0.fsdp.enabled=true"]),
    "lora": ("math_L2_lora.sh", []),  # one LoRA adapter per agent: the adapters stream, the base stays
    "checkpointing": ("math_L1_prompt.sh", ["optim.gradient_checkpointing=true"]),
    "chunked": ("math_L1_prompt.sh", ["optim.logprob_chunk_tokens=1024"]),  # the LM head 1,024 tokens at a time
    # chunked with the dense-mask SDPA (the learner's attention before FlexAttention became the GPU default): the
    # paired baseline of ``chunked``
    "chunked_sdpa": ("math_L1_prompt.sh", ["optim.logprob_chunk_tokens=1024", "optim.attention=sdpa"]),
    # chunked with each decoder layer's forward compiled (regional compilation, models/compile.py): the element-wise
    # work between the matrix products fused; paired with ``chunked``
    "compiled": ("math_L1_prompt.sh", ["optim.logprob_chunk_tokens=1024", "optim.compile=true"]),
}
# --quick: CPU, tiny replica, short lengths (the script's CPU override too: float32 without a GPU).
QUICK_OVERRIDES = ["resources.gpus_per_policy=0", "base_models.policy_0.dtype=float32",
                   "training.max_prompt_length=48", "training.max_response_length=16",
                   "optim.micro_batch_max_tokens=64"]
GiB = 2**30


def script_config(path: Path) -> tuple[str, list[str]]:
    """(CONFIG_NAME, DEFAULTS) of a train script, read from the script itself."""
    text = path.read_text()
    name = re.search(r"^CONFIG_NAME=(\S+)", text, re.M)
    block = re.search(r"^DEFAULTS=\((.*?)^\)", text, re.M | re.S)
    if name is None or block is None:
        raise SystemExit(f"{path}: no CONFIG_NAME= or DEFAULTS=( ... ) found")
    return name.group(1), re.findall(r'"([^"]+)"', block.group(1))


class WeightSink:
    """An engine that only receives weights: a copy of every streamed tensor on the device, in the engines' dtype,
    filled by ``sync_weights`` as vLLM's loader fills its parameters. The copy is allocated at the first sync (from
    the names and shapes ``check_weights`` is given) and stays, as vLLM's weights do. Records each sync's seconds and
    its peak above its start, and the highest allocation before it (the update's)."""

    sleep_enabled = False

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype = dtype
        self.device = device
        self.weights: dict[str, torch.Tensor] = {}
        self.update_peak = 0
        self.update_peak_reserved = 0
        self.syncs: list[dict[str, float]] = []

    def check_weights(self, shapes: Mapping[str, Sequence[int]]) -> None:
        if not self.weights:
            self.weights = {n: torch.empty(tuple(s), dtype=self.dtype, device=self.device) for n, s in shapes.items()}
        wrong = sorted(n for n, s in shapes.items() if n not in self.weights or tuple(self.weights[n].shape) != tuple(s))
        if wrong:
            raise ValueError(f"weights the engine does not hold, or holds in another shape: {wrong[:5]}")

    def add_adapter(self, name: str, tensors: Mapping[str, torch.Tensor], config: Any = None) -> None:
        """A LoRA adapter's tensors (the base weights never change); kept as copies, as vLLM keeps a loaded LoRA."""
        if self.device.type == "cuda":  # adapters are small: the peak so far is the update's
            self.update_peak, self.update_peak_reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        self.weights.update({f"{name}.{key}": t.detach().to(self.device, copy=True) for key, t in tensors.items()})

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        cuda = self.device.type == "cuda"
        if cuda:
            self.update_peak, self.update_peak_reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated() if cuda else 0
        started = time.perf_counter()
        moved = 0
        for name, tensor in named_tensors:
            self.weights[name].copy_(tensor)
            moved += tensor.numel() * tensor.element_size()
            del tensor
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        self.syncs.append({"seconds": seconds, "gb": moved / 1e9,
                           "peak_above_start_gib": (torch.cuda.max_memory_allocated() - start) / GiB if cuda else 0.0})


def compose(script: str, model_dir: str, extra: Sequence[str], quick: bool):
    from pettingllms.entry.train import load_config

    config_name, defaults = script_config(SCRIPTS / script)
    gpus = [] if quick else ["resources.gpus_per_policy=1"]
    return load_config(config_name, [*defaults, *gpus, f"base_models.policy_0.path={model_dir}", *extra,
                                     *(QUICK_OVERRIDES if quick else [])])


def trained_samples(learner, tokens_per_sample: int, count: int, vocab: int, agent: str, adapter: str | None) -> list:
    """``count`` samples of exactly ``tokens_per_sample`` tokens (a 2-token prompt, the rest response), their
    rollout log-probs the learner's own (so the per-step rollout check sees what a bf16 engine would give)."""
    from pettingllms.core.types import Sample

    generator = torch.Generator().manual_seed(0)
    samples = []
    for index in range(count):
        ids = torch.randint(10, vocab, (tokens_per_sample,), generator=generator).tolist()
        samples.append(Sample(policy="policy_0", agent=agent, turn=0, group=(index // 2, 0, agent), adapter=adapter,
                              episode=f"e{index}", problem_id=f"p{index // 2}", branch=index % 2,
                              prompt_ids=tuple(ids[:2]), response_ids=tuple(ids[2:]),
                              response_logprobs=tuple(0.0 for _ in ids[2:]), reward=float(index % 2)))
    return on_policy(learner, samples)


def on_policy(learner, samples: list) -> list:
    """The samples with the current policy's log-probs as their rollout log-probs, as a fresh rollout of an engine
    in sync would give them (the learner's per-step rollout check compares the two, and refuses stale ones)."""
    logprobs = learner.compute_logprobs(samples)
    return [replace(s, response_logprobs=tuple(lp)) for s, lp in zip(samples, logprobs)]


def run_case(name: str, args: argparse.Namespace) -> dict:
    from pettingllms.learner.footprint import learner_memory
    from pettingllms.assembly.plan import plan
    from pettingllms.models.load import parse_dtype
    from pettingllms.runtime.serving import release_accelerator_cache
    from pettingllms.runtime.worker import PolicyWorker

    started = time.perf_counter()
    script, extra = CASES[name]
    cfg = compose(script, args.model_dir, extra, args.quick)
    run_plan = plan(cfg)
    spec = run_plan.worker_specs[0].resolved()
    policy = run_plan.memory.policies[0] if run_plan.memory is not None else None
    mbt = int(spec.learner.micro_batch_max_tokens)
    longest = int(cfg.training.max_prompt_length) + int(cfg.training.max_response_length)
    per_batch = math.ceil(mbt / longest)  # samples of mbt / per_batch tokens fill each micro-batch exactly
    tokens = mbt // per_batch
    print(f"[{name}] layout: {spec.layout.num_ranks} rank(s), sharded={spec.layout.sharded}, dtype={spec.dtype}, "
          f"master weights {spec.learner_weights_dtype}; micro-batch {per_batch} x {tokens} tokens", flush=True)
    if run_plan.memory is not None:
        print(run_plan.memory.describe(), flush=True)

    worker = PolicyWorker(spec)
    address, port = worker.rendezvous()
    device = torch.device("cuda", 0) if spec.layout.uses_gpus else torch.device("cpu")
    sink = WeightSink(parse_dtype(spec.dtype), device)
    loaded = time.perf_counter()
    worker.setup(address if spec.layout.sharded else None, port if spec.layout.sharded else None, engine=sink)
    setup_s = time.perf_counter() - loaded
    vocab = int(worker.model.config.vocab_size) if hasattr(worker.model, "config") else 1000
    agent, agent_spec = next((role, a) for role, a in run_plan.agent_specs.items() if a.policy == spec.policy)
    batch = trained_samples(worker.learner, tokens, 2 * per_batch, vocab, agent, agent_spec.adapter)
    advantages = [1.0 if s.branch else -1.0 for s in batch]

    rows = []
    for repeat in range(args.repeats + 1):
        batch = on_policy(worker.learner, batch)  # each update trains on samples of the policy it updates
        release_accelerator_cache()  # as a real update starts: the last sync released the cache before the rollout
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        repeat_syncs = len(sink.syncs)
        step_started = time.perf_counter()
        metrics = worker.update(batch, advantages)
        step_s = time.perf_counter() - step_started
        row = {"repeat": repeat, "step_s": step_s, "update_s": metrics["timing/update_s"],
               "sync_s": metrics["timing/sync_s"], "pg_loss": metrics.get("pg_loss"),
               "grad_norm": metrics.get("grad_norm"),
               "allocated_before_gb": before / GiB,
               "update_peak_above_start_gb": (sink.update_peak - before) / GiB if device.type == "cuda" else None,
               "update_peak_reserved_gb": sink.update_peak_reserved / GiB,
               "stream": sink.syncs[-1] if len(sink.syncs) > repeat_syncs else None,  # full models only
               **{k: v for k, v in metrics.items() if k.startswith("memory/")}}
        rows.append(row)
        print(f"[{name}] update {repeat}: update {row['update_s']:.2f} s, sync {row['sync_s']:.3f} s, peak above "
              f"start {row['update_peak_above_start_gb'] or 0:.2f} GiB, released "
              f"{metrics.get('memory/cache_released_gb', 0):.2f} GB", flush=True)
    measured = rows[1:]  # the first update also creates the AdamW state and warms the kernels
    profile = profile_update(worker, on_policy(worker.learner, batch), advantages, device) if args.profile else None

    result: dict[str, Any] = {
        "case": name, "script": f"scripts/train/math/{script}", "overrides": extra,
        "layout_sharded": spec.layout.sharded, "lora_adapters": list(spec.lora_names), "dtype": str(spec.dtype), "master_weights": spec.learner_weights_dtype,
        "micro_batch": {"samples": per_batch, "tokens_per_sample": tokens, "tokens": per_batch * tokens},
        "samples_per_update": len(batch), "setup_s": setup_s, "updates": rows,
        "update_s_median": median([r["update_s"] for r in measured]),
        "sync_s_median": median([r["sync_s"] for r in measured]),
        "tokens_per_s": len(batch) * tokens / median([r["update_s"] for r in measured]),
        "sync_gb": sink.syncs[-1]["gb"] if sink.syncs else 0.0,
        # a full model's stream alone (the rest of sync_s: the cache release before it, gc.collect included)
        "stream_s_median": median([r["stream"]["seconds"] for r in measured]) if sink.syncs else None,
        "stream_peak_above_start_gib": median([r["stream"]["peak_above_start_gib"] for r in measured])
        if sink.syncs else None,
        "seconds": time.perf_counter() - started,
    }
    if args.profile:
        result["profile"] = profile  # None on CPU: the profiled update ran, with no device time to rank
    if policy is not None and device.type == "cuda":
        estimate = learner_memory(policy.shape, policy.learner.with_tokens(per_batch * tokens))
        peak = median([r["update_peak_above_start_gb"] for r in measured])
        planned = (estimate.peak - estimate.resident) / GiB
        result.update({
            "plan_resident_gib": estimate.resident / GiB, "plan_peak_gib": estimate.peak / GiB,
            "plan_peak_above_resident_gib": planned, "measured_peak_above_start_gib": peak,
            "ratio_measured_to_plan": peak / planned if planned else float("nan"),
            "plan_terms_gib": {t.label: t.bytes / GiB for t in estimate.terms},
            "plan_policy_total_gib": run_plan.memory.plans[0].peak / GiB if run_plan.memory.plans else None,
            "update_peak_reserved_gib": median([r["update_peak_reserved_gb"] for r in measured]),
        })
    worker.close()
    del worker, sink, batch
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


KERNEL_KINDS = (  # (kind, substrings of a CUDA kernel's name), first match wins
    ("attention", ("flex", "fmha", "attention", "flash", "triton_tem_fused")),
    # inductor's generated kernels (optim.compile): pointwise, reduction and persistent-reduction fusions, named
    # after what they fuse (triton_red_fused_add_mean_mul_pow_rsqrt_0 is an RMSNorm): before "norm" and "copy"
    ("compiled fusion", ("triton_poi_", "triton_red_", "triton_per_")),
    ("matmul", ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas", "splitk")),
    ("optimizer", ("multi_tensor", "adam", "fused_adam")),
    # dtype casts run as copy kernels (bfloat16_copy_kernel_cuda); not "cast": generic element-wise kernels are
    # named ...gpu_kernel_impl_nocast<...> (the first H100 profile counted those here)
    ("copy and cast", ("memcpy", "memset", "copy_kernel", "convert")),
    ("reduction", ("reduce", "softmax", "logsumexp", "norm")),
)


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in lowered for k in keys)), "element-wise and other")


def profile_update(worker, batch, advantages, device, top: int = 25) -> dict[str, Any] | None:
    """One more ``PolicyWorker.update`` under the profiler: where the update's time goes, from the CUDA kernels'
    own rows only (an operator's row and its kernel's would count the same time twice): each kind's kernel time and
    share, the ``top`` kernels, and the kernels' total against the update's wall time (the rest: the GPU waiting for
    the host: launches, Python, synchronisations)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        worker.update(batch, advantages)
        if cuda:
            torch.cuda.synchronize(device)
    wall_s = time.perf_counter() - started
    if not cuda:  # no device time to rank: the CPU run only checks that the profiled update runs
        return None
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0]
    total_us = sum(e.self_device_time_total for e in kernels) or 1.0
    kinds: dict[str, float] = {}
    for event in kernels:
        kind = kernel_kind(event.key)
        kinds[kind] = kinds.get(kind, 0.0) + event.self_device_time_total
    ranked = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:top]
    return {
        "wall_s_profiled": wall_s, "kernel_s": total_us / 1e6,
        "kinds": {kind: {"s": us / 1e6, "share": us / total_us} for kind, us in sorted(kinds.items(),
                                                                                  key=lambda kv: -kv[1])},
        "top_kernels": [{"kernel": e.key[:160], "calls": e.count, "s": e.self_device_time_total / 1e6,
                         "share": e.self_device_time_total / total_us, "kind": kernel_kind(e.key)} for e in ranked],
    }


def build_model(args: argparse.Namespace) -> str:
    """The model folder: ``--model`` as given, or a replica of the script's model built under a temp folder."""
    if args.model:
        return args.model
    if args.quick:
        return "tiny-replica-qwen3-1.7b"
    from pettingllms.models.replicas import build_replica

    dest = Path(args.replica_cache) / MODEL_ID.replace("/", "--")
    if not (dest / "config.json").is_file():
        started = time.perf_counter()
        build_replica(MODEL_ID, dest, size="full", tokenizer_dir=args.tokenizer_dir)
        print(f"built a full-size replica of {MODEL_ID} in {time.perf_counter() - started:.0f} s: {dest}", flush=True)
    return str(dest)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--model", default=None, help="a local model folder or alias (default: a full-size replica)")
    parser.add_argument("--tokenizer-dir", default=None,
                        help="a converted SmolLM2 folder the replica takes its BPE from (default: the packaged one)")
    parser.add_argument("--replica-cache", default=str(Path(tempfile.gettempdir()) / "pettingllms-replicas"))
    parser.add_argument("--repeats", type=int, default=3, help="measured updates per case (after one warm-up)")
    parser.add_argument("--profile", action="store_true",
                        help="GPU: one more update per case under the profiler; kernel time by kind and the top kernels go in the JSON")
    parser.add_argument("--quick", action="store_true", help="CPU, tiny replica: checks the script, not the figures")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    if not args.quick and not torch.cuda.is_available():
        sys.exit("gpu_learner needs a CUDA GPU (this torch sees none); --quick checks the script on CPU")
    device = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__} if not args.quick else {"gpu": None}
    load_before = load_average()
    args.model_dir = build_model(args)
    cases = {}
    for name in args.cases:
        cases[name] = run_case(name, args)
        summary = {k: v for k, v in cases[name].items() if k not in ("updates", "plan_terms_gib", "overrides")}
        print(f"[{name}] {summary}", flush=True)
    ratios = [c["ratio_measured_to_plan"] for c in cases.values() if "ratio_measured_to_plan" in c]
    worst = max((abs(r - 1.0) for r in ratios), default=float("nan"))
    write_result(NAME, argv, quick=args.quick, directory=out_dir(args.out_dir, args.quick),
                 config={"scripts": {n: CASES[n][0] for n in args.cases}, "model": MODEL_ID, "cases": args.cases,
                         "repeats": args.repeats, **device},
                 samples=list(cases.values()),
                 medians={name: {k: c[k] for k in ("update_s_median", "sync_s_median", "tokens_per_s")}
                          for name, c in cases.items()},
                 measured=worst, target=TARGET, op="<=",
                 metric="worst |measured / planned - 1| of the update's peak GPU memory above its start",
                 load_before=load_before, threads=torch.get_num_threads(),
                 notes=["the engine is WeightSink (a bf16 copy of the weights on the GPU), not vLLM: vLLM was not "
                        "installed where this ran; generation and vLLM's sleep and wake are not measured here"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
