"""One learner update on tree-shaped samples: shared-prompt packing on vs off, full fine-tuning and LoRA.

Workload (the quickstart's shape): ``--nodes`` tree nodes of K=4 branches on the packaged SmolLM2-135M; each
node has a ~100-token chat prompt (the arith_duo one-shot prompt) and responses of 20-30 tokens. Runs are paired
(packed, unpacked, packed, ...) and medians of ``--repeats`` are reported, with the tokens each forward processed.

    .venv/bin/python benchmarks/update_packing.py [--nodes 8] [--repeats 3] [--threads 2]
    .venv/bin/python benchmarks/update_packing.py --quick    # tiny random model, 2 nodes, 1 repeat (smoke test)

Writes benchmarks/results/update_packing.json (or ``--out-dir``; ``--quick``: a temp folder).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from _machine import machine_info  # noqa: E402
from _report import learner_config, out_dir  # noqa: E402
from pettingllms.core.types import Sample  # noqa: E402
from pettingllms.learner import PolicyLearner  # noqa: E402
from pettingllms.learner.packing import pack_by_prefix, packed_length  # noqa: E402
from pettingllms.models import HFChatCodec, LoraSpec, attach_adapters, load_model, resolve_model  # noqa: E402

K = 4
MODEL, QUICK_MODEL = "smollm2-135m-instruct", "tiny-random-smollm2"


def tree_samples(codec, nodes: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    samples = []
    for node in range(nodes):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        prompt = codec.encode_chat([
            {"role": "user", "content": "What is 7 + 5? Put the final answer in \\boxed{}."},
            {"role": "assistant", "content": "7 + 5 = 12. The answer is \\boxed{12}."},
            {"role": "user", "content": f"What is {a} + {b}? Put the final answer in \\boxed{{}}."},
        ])
        for branch in range(K):
            response = tuple(rng.randint(100, 40000) for _ in range(rng.randint(20, 30)))
            samples.append(Sample(
                policy="policy_0", agent="solver", turn=0, group=(node, 0, "solver"), episode=f"e{node}",
                problem_id=f"p{node}", branch=branch, prompt_ids=tuple(prompt), response_ids=response,
                response_logprobs=tuple(-1.0 for _ in response), reward=float(branch % 2),
            ))
    return samples


def time_update(model, samples, advantages, pack: bool, lora: bool) -> float:
    adapters = ("shared",) if lora else ()
    # The samples' logprobs are made up (no engine sampled them): the rollout check would refuse them, so it is off.
    config = learner_config(total_steps=100, lr=1e-6, pack_shared_prompts=pack, micro_batch_max_tokens=8192,
                            max_rollout_kl=0.0)
    learner = PolicyLearner(model, config, adapter_names=adapters)
    if lora:
        samples = [Sample(**{**s.__dict__, "adapter": "shared"}) for s in samples]
    start = time.perf_counter()
    learner.update(samples, advantages)
    return time.perf_counter() - start


@dataclass
class Workload:
    """One update's tree samples on the packaged model, as this benchmark and ``learner_compile.py`` take them."""

    args: argparse.Namespace
    model_name: str
    model_dir: Path
    samples: list[Sample]
    advantages: list[float]
    load_start: float

    def command(self, script: str) -> str:
        a = self.args
        return (f"python benchmarks/{script} --nodes {a.nodes} --repeats {a.repeats} --threads {a.threads}"
                + (" --quick" if a.quick else ""))

    def machine(self) -> dict:
        return {**machine_info(), "torch_threads": self.args.threads, "load_average_at_start": self.load_start,
                "load_average_at_end": os.getloadavg()[0]}


def workload(argv: Sequence[str] | None) -> Workload:
    """The command line both benchmarks share (``--nodes --repeats --threads --quick --out-dir``), the torch
    threads set, the model resolved and the tree samples made, with alternating advantages."""
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
    return Workload(args, model_name, model_dir, samples, advantages, load_start)


def main(argv: Sequence[str] | None = None) -> dict:
    work = workload(argv)
    args, model_name, model_dir, samples, advantages = (work.args, work.model_name, work.model_dir, work.samples,
                                                        work.advantages)
    unpacked_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    packed_tokens = sum(packed_length(samples, unit) for unit in pack_by_prefix(samples))
    results = {}
    for mode in ("full", "lora"):
        model = load_model(model_dir, dtype="float32")
        if mode == "lora":
            spec = LoraSpec(32, 64, 0.0, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
            model = attach_adapters(model, ["shared"], spec)
        runs = {"packed": [], "unpacked": []}
        time_update(model, samples[:K], advantages[:K], True, mode == "lora")  # warm-up
        for _ in range(args.repeats):
            for name, pack in (("packed", True), ("unpacked", False)):
                runs[name].append(round(time_update(model, samples, advantages, pack, mode == "lora"), 3))
        medians = {name: statistics.median(values) for name, values in runs.items()}
        results[mode] = {
            "seconds": runs,
            "median_seconds": medians,
            "speedup": round(medians["unpacked"] / medians["packed"], 2),
        }
        print(mode, json.dumps(results[mode]))
        del model
    report = {
        "command": work.command("update_packing.py"),
        "quick": args.quick,
        "machine": work.machine(),
        "workload": {"model": model_name, "nodes": args.nodes, "branches": K,
                     "samples": len(samples), "prompt_tokens": len(samples[0].prompt_ids),
                     "response_tokens": sum(len(s.response_ids) for s in samples),
                     "forward_tokens_unpacked": unpacked_tokens, "forward_tokens_packed": packed_tokens},
        "results": results,
    }
    path = out_dir(args.out_dir, args.quick) / "update_packing.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
