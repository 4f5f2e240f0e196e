"""Prefix packing in the update: one learner update on a real multi-turn rollout, its samples packed three ways.

Workload: the quickstart (the vault task: a reader and an opener, up to 2 turns, the packaged SmolLM2-135M in
fp32, one full model: ``lora.rank=0``), B problems of one step, rolled out by the real executor and engine in
``tree`` mode (AT-GRPO: K branches per node) and in ``trajectory`` mode (the peers' multi-turn GRPO: K episodes
per problem). Each rollout's samples are then trained on, one ``PolicyLearner.update`` per packing:

- ``prefix``: what the learner does now (``learner/packing.py``): a row is the token trie of its prompts, so
  the system prompt, the task and earlier turns are forwarded once for every sample that shares them;
- ``identical``: what it did before: only samples with identical prompts share a row (a tree node's K branches);
  reproduced here by ``identical_prompt_units``;
- ``unpacked``: one row per sample (``optim.pack_shared_prompts=false``).

Repeats are rounds of the three, in rotated order; medians of ``--repeats``. Target (registered with this file,
before its first full run): in trajectory mode the prefix-packed update takes <= 0.8 x the identical-prompt one.

    .venv/bin/python benchmarks/prefix_packing.py [--problems 8] [--repeats 3] [--threads 2]
    .venv/bin/python benchmarks/prefix_packing.py --quick    # tiny random model, 2 problems, 1 repeat

Writes benchmarks/results/prefix_packing.json (or ``--out-dir``; ``--quick``: a temp folder).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from _report import learner_config, load_average, median, out_dir, write_result  # noqa: E402
from pettingllms.core.types import Sample  # noqa: E402
from pettingllms.learner import PolicyLearner  # noqa: E402
from pettingllms.learner import forward as learner_forward  # noqa: E402
from pettingllms.learner.packing import learner_temperature, pack_by_prefix, packed_length  # noqa: E402

NAME = "prefix_packing"
TARGET = 0.8
POLICY = "policy_0"
PACKINGS = ("prefix", "identical", "unpacked")


def identical_prompt_units(samples: Sequence[Sample], max_tokens: int | None = None) -> list[list[int]]:
    """The packing before prefix packing: samples with identical prompt ids (and temperature) share a row, in
    first-seen order; a group over ``max_tokens`` is split, each part repeating the prompt."""
    by_prompt: dict[tuple, list[int]] = {}
    for index, sample in enumerate(samples):
        by_prompt.setdefault((tuple(sample.prompt_ids), learner_temperature(sample)), []).append(index)
    units: list[list[int]] = []
    for (prompt, _), indices in by_prompt.items():
        unit, length = [], len(prompt)
        for index in indices:
            extra = len(samples[index].response_ids)
            if unit and max_tokens is not None and length + extra > max_tokens:
                units.append(unit)
                unit, length = [], len(prompt)
            unit.append(index)
            length += extra
        units.append(unit)
    return units


@contextmanager
def packing(name: str) -> Iterator[None]:
    """The learner's packing for one update: ``identical`` swaps in ``identical_prompt_units``."""
    if name != "identical":
        yield
        return
    original = learner_forward.pack_by_prefix
    learner_forward.pack_by_prefix = identical_prompt_units
    try:
        yield
    finally:
        learner_forward.pack_by_prefix = original


def rollout(args: argparse.Namespace, mode: str) -> tuple[list[Sample], dict]:
    """One training step's rollout of the quickstart in ``mode`` (seeded), by the real executor and engine."""
    from pettingllms.assembly.plan import plan
    from pettingllms.config.load import compose, to_schema
    from pettingllms.models import HFChatCodec, load_model, resolve_model
    from pettingllms.rollout.executor import Executor
    from pettingllms.rollout.hf_engine import HFEngine
    from pettingllms.rollout.policy_client import LocalPolicyClient

    overrides = [f"base_models.{POLICY}.path={args.model}", f"base_models.{POLICY}.lora.rank=0",
                 f"rollout.mode={mode}", f"rollout.branching={args.branching}"]
    run_plan = plan(to_schema(compose("quickstart", overrides)))
    model_dir = resolve_model(args.model)
    codec = HFChatCodec.from_pretrained(model_dir)
    engine = HFEngine(load_model(model_dir, dtype="float32"), codec, seed=0)
    executor = Executor(run_plan.env, run_plan.agent_specs, {POLICY: LocalPolicyClient(engine, codec)},
                        run_plan.executor_config)
    problems = list(run_plan.env.procedural_problems("train", args.problems))
    result = executor.run(problems, seeds=list(range(len(problems))))
    return list(result.samples), {"config": "quickstart", "overrides": overrides}


def forward_tokens(samples: Sequence[Sample], units: Sequence[Sequence[int]]) -> int:
    return sum(packed_length(samples, unit) for unit in units)


def time_update(model_dir: Path, samples: Sequence[Sample], name: str, budget: int) -> float:
    from pettingllms.models import load_model

    model = load_model(model_dir, dtype="float32")
    # Advantages are made up (the update's cost does not depend on them); the samples' engine logprobs are real,
    # and the rollout check stays on.
    advantages = [1.0 if i % 2 else -1.0 for i in range(len(samples))]
    config = learner_config(total_steps=100, lr=1e-6, pack_shared_prompts=name != "unpacked",
                            micro_batch_max_tokens=budget)
    learner = PolicyLearner(model, config)
    with packing(name):
        start = time.perf_counter()
        learner.update(samples, advantages)
        return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--problems", type=int, default=8, help="B: problems of the step (the quickstart's 8)")
    parser.add_argument("--branching", type=int, default=4, help="K (the quickstart's 4)")
    parser.add_argument("--budget", type=int, default=1024, help="micro_batch_max_tokens (the quickstart's 1024)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny random model, 2 problems, 1 repeat (smoke test)")
    parser.add_argument("--out-dir", help="where to write the JSON (default benchmarks/results)")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.problems, args.repeats = "tiny-random-smollm2", 2, 1
    torch.set_num_threads(args.threads)
    load_before = load_average()
    from pettingllms.models import resolve_model

    model_dir = resolve_model(args.model)
    samples_out, medians, workloads = {}, {}, {}
    for mode in ("tree", "trajectory"):
        samples, settings = rollout(args, mode)
        units = {"prefix": pack_by_prefix(samples, args.budget),
                 "identical": identical_prompt_units(samples, args.budget),
                 "unpacked": [[i] for i in range(len(samples))]}
        workloads[mode] = {
            **settings, "samples": len(samples),
            "response_tokens": sum(len(s.response_ids) for s in samples),
            "forward_tokens": {name: forward_tokens(samples, units[name]) for name in PACKINGS},
            "rows": {name: len(units[name]) for name in PACKINGS},
        }
        print(mode, workloads[mode])
        time_update(model_dir, samples[:4], "prefix", args.budget)  # warm-up
        runs: dict[str, list[float]] = {name: [] for name in PACKINGS}
        for repeat in range(args.repeats):
            order = PACKINGS[repeat % 3:] + PACKINGS[:repeat % 3]
            for name in order:
                runs[name].append(round(time_update(model_dir, samples, name, args.budget), 3))
            print(mode, {name: values[-1] for name, values in runs.items()})
        samples_out[mode] = runs
        medians[mode] = {name: median(values) for name, values in runs.items()}
        medians[mode]["prefix_over_identical"] = round(medians[mode]["prefix"] / medians[mode]["identical"], 3)
        medians[mode]["prefix_over_unpacked"] = round(medians[mode]["prefix"] / medians[mode]["unpacked"], 3)
    config = {"model": args.model, "dtype": "float32", "problems": args.problems, "branching": args.branching,
              "micro_batch_max_tokens": args.budget, "repeats": args.repeats, "threads": args.threads,
              "workloads": workloads}
    notes = [f"tree mode: prefix / identical-prompt packing = {medians['tree']['prefix_over_identical']} "
             f"(no target: its nodes' K branches were packed before)"]
    path = write_result(NAME, argv, quick=args.quick, directory=out_dir(args.out_dir, args.quick), config=config,
                        samples=samples_out, medians=medians,
                        measured=medians["trajectory"]["prefix_over_identical"], target=TARGET, op="<=",
                        metric="trajectory mode: update seconds, prefix / identical-prompt packing (medians)",
                        load_before=load_before, threads=args.threads, notes=notes)
    return {"path": str(path), "medians": medians}


if __name__ == "__main__":
    main()
