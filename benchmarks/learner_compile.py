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

import json
import os
import statistics
import time
from typing import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _report import learner_config, out_dir  # noqa: E402
from pettingllms.learner import PolicyLearner  # noqa: E402
from pettingllms.models import load_model  # noqa: E402
from update_packing import workload  # noqa: E402


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
    work = workload(argv)
    args, samples, advantages = work.args, work.samples, work.advantages
    model_dir = work.model_dir
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
        "command": work.command("learner_compile.py"),
        "quick": args.quick,
        "machine": work.machine(),
        "workload": {"model": work.model_name, "dtype": "float32", "nodes": args.nodes, "samples": len(samples),
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
