"""The GPU memory plan's learner estimate against a real learner update's measured peak, on CPU.

The plan (``pettingllms/assembly/memory.py``) adds up, for one micro-batch, the tensors autograd saves (op by op),
the attention masks, the fp32 logits and their backward, the gradients and the AdamW state. This benchmark runs
real ``PolicyLearner.update`` calls and measures what they allocate, so the formulas are checked against the code
they describe rather than fitted to it.

What is measured: PyTorch's CPU allocator reports every allocation and free to the profiler
(``profile_memory=True``); summing them in time order over the second update gives the peak of live tensor bytes
above what lived when it started (the weights and the AdamW state the first update created; gradients were freed).
That is the CPU counterpart of ``torch.cuda.max_memory_allocated``, the quantity the plan estimates per GPU (the
plan's other terms, FSDP, vLLM and process overheads, need a GPU and are not checked here). The process's peak
resident set over a third update (VmHWM, reset before it) is recorded too, but malloc keeps freed memory resident
between updates, so it is judged on tensor bytes.

Workload: each case trains two samples of exactly ``--tokens`` tokens (a 2-token prompt and the rest response),
so each micro-batch is the plan's worst case: one packed row of the whole token budget, every position a logit;
two micro-batches, so the second one's backward runs with the first one's gradients allocated. Cases: full
fine-tuning in fp32 and with bf16 autocast, LoRA (r=16, attention), gradient checkpointing, and a Qwen3-shaped
replica (q/k norms, 151,936-token vocabulary). Result (2026-11-25, 1024 tokens): every case within 0.13%.

    .venv/bin/python benchmarks/memory_plan_check.py [--tokens 1024] [--threads 2] [--quick]

Writes benchmarks/results/memory_plan_check.json (``--quick``: tiny models from a config, a temp folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from _report import learner_config, load_average, out_dir, write_result  # noqa: E402
from pettingllms.assembly import memory  # noqa: E402
from pettingllms.learner.footprint import LearnerSetup, learner_memory
from pettingllms.core.choices import DTYPE_BYTES
from pettingllms.models.shape import ModelShape

TARGET = 0.25  # the issue asks for agreement within +-25%
LORA_RANK = 16
QUICK_MODEL = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2000, "tie_word_embeddings": True,
               "max_position_embeddings": 2048}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    model: str  # an alias or local path, or "quick" (QUICK_MODEL built from its config)
    dtype: str = "float32"
    lora: bool = False
    checkpointing: bool = False


CASES = (
    Case("smollm2-135m fp32 full fine-tune", "smollm2-135m-instruct"),
    Case("smollm2-135m bf16 autocast full fine-tune", "smollm2-135m-instruct", dtype="bfloat16"),
    Case("smollm2-135m fp32 LoRA r=16", "smollm2-135m-instruct", lora=True),
    Case("smollm2-135m fp32 gradient checkpointing", "smollm2-135m-instruct", checkpointing=True),
    Case("qwen3-1.7b replica (tiny trunk, real vocab) fp32 full fine-tune", "tiny-replica-qwen3-1.7b"),
)
QUICK_CASES = (Case("quick fp32 full fine-tune", "quick"), Case("quick fp32 LoRA", "quick", lora=True))


def load(case: Case):
    """(model, config.json dict): the alias's real model in float32 (the learner's master weights), or the quick
    config's random model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pettingllms.models import load_model, resolve_model
    from pettingllms.models.attention import register_attention

    if case.model == "quick":
        torch.manual_seed(0)
        config = AutoConfig.for_model(**QUICK_MODEL)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=register_attention())
        return model, dict(QUICK_MODEL)
    import json

    directory = resolve_model(case.model)
    return load_model(directory, "float32"), json.loads((directory / "config.json").read_text())


def learner_for(case: Case, model, tokens: int):
    from pettingllms.learner import PolicyLearner
    from pettingllms.models import LoraSpec, attach_adapters

    adapters = ()
    if case.lora:
        adapters = ("shared",)
        torch.manual_seed(1)
        model = attach_adapters(model, adapters, LoraSpec(rank=LORA_RANK, alpha=2 * LORA_RANK))
    config = learner_config(total_steps=10, lr=1e-6, micro_batch_max_tokens=tokens, dtype=case.dtype,
                            gradient_checkpointing=case.checkpointing, max_rollout_kl=0.0)
    return PolicyLearner(model, config, adapter_names=adapters)


def samples(count: int, tokens: int, vocab: int, adapter: str | None) -> list:
    """``count`` samples of exactly ``tokens`` tokens: a 2-token prompt each (no two share one), the rest response."""
    from pettingllms.core.types import Sample

    generator = torch.Generator().manual_seed(0)
    out = []
    for index in range(count):
        ids = torch.randint(10, vocab, (tokens,), generator=generator).tolist()
        out.append(Sample(policy="policy_0", agent="a", turn=0, group=(index // 2, 0, "a"), episode=f"e{index}",
                          problem_id=f"p{index}", branch=index % 2, prompt_ids=tuple(ids[:2]),
                          response_ids=tuple(ids[2:]), response_logprobs=tuple(-1.0 for _ in ids[2:]),
                          reward=float(index % 2), adapter=adapter))
    return out


def tensor_peak(fn) -> int:
    """Peak of live CPU tensor bytes above the start while ``fn`` runs (the profiler's allocator events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def rss_peak_increase(fn) -> int:
    """VmHWM after ``fn`` minus the resident set before it (the high-water mark reset first; Linux)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return -1
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) * 1024


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def plan_setup(case: Case, tokens: int) -> LearnerSetup:
    """The plan's learner setup for this case: one process, no FSDP, AdamW's for-loop path and grouped K/V in SDPA
    (what the learner does on CPU)."""
    setup = LearnerSetup(
        world_size=1, sharded=False, compute_bytes=DTYPE_BYTES[case.dtype], weight_bytes=4,
        lora_rank=LORA_RANK if case.lora else 0,
        lora_targets=tuple(memory_targets()) if case.lora else (),
        adapters=1 if case.lora else 0, trained_adapters=1 if case.lora else 0,
        gradient_checkpointing=case.checkpointing, foreach_optimizer=False, expand_kv=False,
    )
    return setup.with_tokens(tokens)


def memory_targets():
    from pettingllms.core.choices import DEFAULT_LORA_TARGET_MODULES

    return DEFAULT_LORA_TARGET_MODULES


def run_case(case: Case, tokens: int) -> dict:
    started = time.perf_counter()
    model, config = load(case)
    shape = ModelShape.from_config(config)
    learner = learner_for(case, model, tokens)
    batch = samples(2, tokens, shape.vocab, "shared" if case.lora else None)
    advantages = [1.0, -1.0]
    learner.update(batch, advantages)  # creates the AdamW state; the plan's resident state from here on
    start_bytes = sum(p.numel() * p.element_size() for p in learner.model.parameters()) + sum(
        t.numel() * t.element_size() for state in learner.optimizer.state.values() for t in state.values()
        if torch.is_tensor(t))
    measured = tensor_peak(lambda: learner.update(batch, advantages))
    rss = rss_peak_increase(lambda: learner.update(batch, advantages))
    estimate = learner_memory(shape, plan_setup(case, tokens))
    estimated = estimate.peak - estimate.resident
    moments = {m.label: round(m.bytes / 1e6, 1) for m in estimate.moments}
    return {
        "case": case.name, "model": case.model, "dtype": case.dtype, "lora_rank": LORA_RANK if case.lora else 0,
        "gradient_checkpointing": case.checkpointing, "tokens_per_micro_batch": tokens, "micro_batches": 2,
        "params": sum(p.numel() for p in learner.model.parameters()),
        "resident_at_start_mb": round(start_bytes / 1e6, 1),
        "plan_resident_mb": round(estimate.resident / 1e6, 1),
        "measured_peak_increase_mb": round(measured / 1e6, 1),
        "estimated_peak_increase_mb": round(estimated / 1e6, 1),
        "ratio_measured_to_estimate": round(measured / estimated, 4),
        "measured_peak_total_mb": round((start_bytes + measured) / 1e6, 1),
        "estimated_peak_total_mb": round(estimate.peak / 1e6, 1),
        "ratio_total": round((start_bytes + measured) / estimate.peak, 4),
        "rss_peak_increase_mb": round(rss / 1e6, 1) if rss >= 0 else None,
        "estimate_terms_mb": {t.label: round(t.bytes / 1e6, 1) for t in estimate.terms},
        "estimate_moments_mb": moments,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per micro-batch (each sample's length)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny models: checks the script, not the figures")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokens = 128 if args.quick else args.tokens
    load_before = load_average()
    rows = []
    cases = QUICK_CASES if args.quick else CASES
    for case in cases:
        rows.append(run_case(case, tokens))
        row = rows[-1]
        print(f"{row['case']}: measured +{row['measured_peak_increase_mb']} MB, estimated "
              f"+{row['estimated_peak_increase_mb']} MB (ratio {row['ratio_measured_to_estimate']}); "
              f"{row['seconds']} s", flush=True)
        report(args, argv, tokens, rows, len(cases), load_before)  # after every case: a long run keeps what it has
    return 0


def report(args, argv, tokens: int, rows: list[dict], planned: int, load_before: list[float]) -> None:
    worst = max(abs(r["ratio_measured_to_estimate"] - 1.0) for r in rows)
    partial = [] if len(rows) == planned else [f"partial: {len(rows)} of {planned} cases so far"]
    write_result(
        "memory_plan_check", argv if argv is not None else sys.argv[1:], quick=args.quick,
        directory=out_dir(args.out_dir, args.quick),
        config={"tokens_per_micro_batch": tokens, "samples_per_update": 2, "cases": [r["case"] for r in rows],
                "measure": "peak live CPU tensor bytes above the start of the second update (profiler allocator "
                           "events); RSS high-water mark recorded beside it"},
        samples=rows,
        medians={"ratio_measured_to_estimate": {r["case"]: r["ratio_measured_to_estimate"] for r in rows}},
        measured=worst, target=TARGET, op="<=", metric="worst |measured / estimated - 1| of the peak increase",
        load_before=load_before, threads=args.threads,
        notes=[
            "CPU only: FSDP sharding, the bf16 all-gathers, CUDA kernels' workspaces, vLLM and the processes' "
            "overheads are in the plan but not checked here",
            "the increase excludes the weights and AdamW state (exact by construction); the totals include them",
            "RSS: the high-water mark over a third update minus the resident set at its start, which already holds "
            "what malloc kept from the earlier updates (so it reads lower than the tensor figure, not higher); "
            "shown, not judged",
            *partial,
        ],
    )


if __name__ == "__main__":
    raise SystemExit(main())
