"""One learner update with the decoder layers compiled (``optim.compile=true``) against the eager layers.

Workload: the update of ``update_packing.py`` (``--nodes`` tree nodes of K=4 branches, ~100-token chat prompts,
responses of 20-30 tokens, packed shared prompts) on the packaged SmolLM2-135M, full fine-tune in float32 (the CPU
dtype; on a GPU, bf16 autocast: ``gpu_learner.py``'s ``compiled`` case). Each mode gets its own learner over its own
copy of the weights; a warm-up update each (the compiled one compiles there: its seconds are reported), then
updates alternate (eager, compiled, eager, ...) and medians of ``--repeats`` are reported, with the largest
difference between the two learners' log-probs of the same samples.

    .venv/bin/python benchmarks/learner_compile.py [--nodes 8] [--repeats 3] [--threads 2]
    .venv/bin/python benchmarks/learner_compile.py --quick    # tiny random model, 2 nodes, 1 repeat (smoke test)

Writes benchmarks/results/learner_compile.json (or ``--out-dir``; ``--quick``: a temp folder).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from _machine import machine_info  # noqa: E402
from _report import learner_config, out_dir  # noqa: E402
from pettingllms.learner import PolicyLearner  # noqa: E402
from pettingllms.models import HFChatCodec, load_model, resolve_model  # noqa: E402
from update_packing import MODEL, QUICK_MODEL, tree_samples  # noqa: E402


def make_learner(model_dir, compiled: bool) -> PolicyLearner:
    # The samples' logprobs are made up (no engine sampled them): the rollout check would refuse them, so it is off.
    config = learner_config(total_steps=100, lr=1e-6, micro_batch_max_tokens=8192, max_rollout_kl=0.0,
                            compile=compiled)
    return PolicyLearner(load_model(model_dir, dtype="float32"), config)


def timed_update(learner: PolicyLearner, samples, advantages) -> float:
    start = time.perf_counter()
    learner.update(samples, advantages)
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny random model, 2 nodes, 1 repeat (smoke test)")
    parser.add_argument("--out-dir", help="where to write the JSON (default benchmarks/results)")
    args = parser.parse_args(argv)
    model_name = QUICK_MODEL if args.quick else MODEL
    if args.quick:
        args.nodes, args.repeats = 2, 1
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    model_dir = resolve_model(model_name)
    samples = tree_samples(HFChatCodec.from_pretrained(model_dir), args.nodes)
    advantages = [1.0 if s.branch % 2 else -1.0 for s in samples]
    learners = {"eager": make_learner(model_dir, False), "compiled": make_learner(model_dir, True)}
    # Before any update both hold the same weights: their log-probs of the same samples differ only by the kernels.
    logprobs = {name: learner.compute_logprobs(samples) for name, learner in learners.items()}
    difference = max(abs(a - b) for x, y in zip(logprobs["eager"], logprobs["compiled"]) for a, b in zip(x, y))
    warm_up = {name: round(timed_update(learner, samples, advantages), 3) for name, learner in learners.items()}
    runs: dict[str, list[float]] = {name: [] for name in learners}
    for _ in range(args.repeats):
        for name, learner in learners.items():
            runs[name].append(round(timed_update(learner, samples, advantages), 3))
    medians = {name: statistics.median(values) for name, values in runs.items()}
    result = {
        "seconds": runs,
        "median_seconds": medians,
        "compiled_to_eager": round(medians["compiled"] / medians["eager"], 3),
        "warm_up_seconds": warm_up,
        "max_abs_logprob_difference": difference,
    }
    print(json.dumps(result))
    report = {
        "command": f"python benchmarks/learner_compile.py --nodes {args.nodes} --repeats {args.repeats} "
                   f"--threads {args.threads}" + (" --quick" if args.quick else ""),
        "quick": args.quick,
        "machine": {**machine_info(), "torch_threads": args.threads, "load_average_at_start": load_start,
                    "load_average_at_end": os.getloadavg()[0]},
        "workload": {"model": model_name, "dtype": "float32", "nodes": args.nodes, "samples": len(samples),
                     "prompt_tokens": len(samples[0].prompt_ids),
                     "response_tokens": sum(len(s.response_ids) for s in samples)},
        "result": result,
    }
    path = out_dir(args.out_dir, args.quick) / "learner_compile.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
