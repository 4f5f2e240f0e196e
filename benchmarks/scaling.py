"""Step time as B, K, agents and turns grow (issue #7, benchmark 4).

Each config is a real ``Trainer.step`` (tree rollout, advantages, update) on the ``toy_targets`` env (agents
``alice`` and ``bob`` acting in sequence each turn; ``threshold=2.0`` so no episode ends early and the turn
count is exact), in-process, SmolLM2-135M in fp32 with small token budgets. Per config: one untimed warm-up
step, then ``--repeats`` timed steps; every timed step records its wall time, the generated (response)
tokens, the prompt tokens, the sequences and the episodes (tree mode: one per problem).

The sweep moves one factor at a time from a base (B=2 problems, K=4, 1 agent, 1 turn, 16 tokens), raises the
token budget at fixed episodes, and includes configs with the same number of sequences but 1 to 8 episodes,
so that tokens and episodes are not collinear. Least-squares fits of step time against generated tokens and
against episodes report slope, intercept and R^2. Expected: linear in generated tokens (R^2 >= 0.9), and
tokens explain step time better than episodes do.

    python benchmarks/scaling.py [--repeats 2] [--model smollm2-135m-instruct]
    python benchmarks/scaling.py --quick

Writes benchmarks/results/scaling.json (or ``--out-dir``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import linear_fit, load_average, median, out_dir, write_result  # noqa: E402

NAME = "scaling"
TARGET_R2 = 0.9
AGENTS = ("alice", "bob")


@dataclass(frozen=True)
class Point:
    problems: int  # B
    branching: int  # K
    agents: int
    turns: int
    max_tokens: int

    @property
    def sequences(self) -> int:
        return self.problems * self.branching * self.agents * self.turns


FULL_SWEEP = [
    Point(2, 4, 1, 1, 16),  # base
    Point(1, 4, 1, 1, 16), Point(4, 4, 1, 1, 16), Point(8, 4, 1, 1, 16),  # B
    Point(2, 2, 1, 1, 16), Point(2, 8, 1, 1, 16),  # K
    Point(2, 4, 2, 1, 16),  # agents
    Point(2, 4, 1, 2, 16), Point(2, 4, 1, 3, 16),  # turns
    Point(2, 4, 1, 1, 32), Point(2, 4, 1, 1, 64),  # more tokens, same episodes
    Point(8, 2, 1, 1, 16), Point(1, 4, 2, 2, 16),  # 16 sequences with 8 and with 1 episode
    Point(4, 4, 2, 2, 16),  # everything up
]
QUICK_SWEEP = [Point(1, 2, 1, 1, 4), Point(2, 2, 1, 1, 4), Point(1, 2, 2, 1, 4)]


def overrides_for(point: Point, model: str, steps: int, threads: int, workdir: Path) -> list[str]:
    roles = AGENTS[: point.agents]
    return [
        "env.name=toy_targets", "+env.options.threshold=2.0", f"env.max_turns={point.turns}",
        f"env.agents=[{','.join(roles)}]", f"specialization={'L0' if point.agents == 1 else 'L1'}",
        f"base_models.policy_0.path={model}", "base_models.policy_0.dtype=float32",
        *[f"agents.{r}.train_sampling.max_tokens={point.max_tokens}" for r in roles],
        f"rollout.branching={point.branching}", "rollout.mode=tree",
        f"training.train_batch_size={point.problems}", f"training.max_response_length={point.max_tokens}",
        f"training.total_training_steps={steps}", "training.val_freq=0", "training.val_before_train=false",
        "training.export_hf=false", "training.plot=false", "training.resume=none",
        f"training.log_dir={workdir}", "training.logger=[]", "optim.lr=1e-6",
        "resources.use_ray=false", f"resources.num_cpus={threads}",
    ]


def measure(point: Point, model: str, repeats: int, threads: int, workdir: Path) -> list[dict]:
    """Warm-up step, then ``repeats`` timed steps of a fresh Trainer for this config."""
    from pettingllms.config.load import compose, to_schema
    from pettingllms.trainer.trainer import Trainer

    trainer = Trainer(to_schema(compose("train", overrides_for(point, model, repeats + 1, threads, workdir))))
    rollouts: list = []
    trainer.executor.run = recording(trainer.executor.run, rollouts)
    steps = []
    try:
        for step in range(1, repeats + 2):
            start = time.perf_counter()
            metrics = trainer.step(step).metrics
            seconds = time.perf_counter() - start
            samples, episodes = rollouts[-1].samples, rollouts[-1].episodes
            steps.append({"step": step, "step_s": seconds, "generate_s": metrics["timing/generate_s"],
                          "update_s": metrics["timing/update_s"],
                          "generated_tokens": sum(len(s.response_ids) for s in samples),
                          "prompt_tokens": sum(len(s.prompt_ids) for s in samples),
                          "sequences": len(samples), "episodes": len(episodes)})
    finally:
        trainer.close()
    return steps[1:]  # the first step is the warm-up


def recording(run, into: list):
    """``run`` that also appends each result to ``into`` (to count a step's tokens exactly)."""

    def wrapped(*args, **kwargs):
        result = run(*args, **kwargs)
        into.append(result)
        return result

    return wrapped


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per config (after one warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny random model, three tiny configs")
    parser.add_argument("--out-dir")
    args = parser.parse_args(argv)
    sweep = FULL_SWEEP
    if args.quick:
        args.model, args.repeats, sweep = "tiny-random-smollm2", 1, QUICK_SWEEP
    import torch

    torch.set_num_threads(args.threads)
    load_before = load_average()
    samples = []
    with tempfile.TemporaryDirectory(prefix="scaling_") as tmp:
        for point in sweep:
            steps = measure(point, args.model, args.repeats, args.threads, Path(tmp))
            row = {"config": asdict(point), "steps": steps,
                   "median_step_s": median([s["step_s"] for s in steps]),
                   "median_generated_tokens": median([s["generated_tokens"] for s in steps])}
            print(row["config"], {k: round(v, 2) for k, v in row.items() if k.startswith("median")})
            samples.append(row)
    timed = [s for row in samples for s in row["steps"]]
    step_s = [s["step_s"] for s in timed]
    fits = {
        "vs_generated_tokens": linear_fit([s["generated_tokens"] for s in timed], step_s),
        "vs_total_tokens": linear_fit([s["generated_tokens"] + s["prompt_tokens"] for s in timed], step_s),
        "vs_episodes": linear_fit([s["episodes"] for s in timed], step_s),
        "vs_sequences": linear_fit([s["sequences"] for s in timed], step_s),
    }
    r2_tokens, r2_episodes = fits["vs_generated_tokens"]["r2"], fits["vs_episodes"]["r2"]
    medians = {"per_config_step_s": {_label(row["config"]): row["median_step_s"] for row in samples},
               "fits": fits}
    notes = [f"R^2 of step time vs generated tokens {r2_tokens:.3f}, vs episodes {r2_episodes:.3f}, vs sequences "
             f"{fits['vs_sequences']['r2']:.3f}, vs prompt+generated tokens {fits['vs_total_tokens']['r2']:.3f}",
             f"slope {1000 * fits['vs_generated_tokens']['slope']:.2f} ms per generated token, intercept "
             f"{fits['vs_generated_tokens']['intercept']:.2f} s"]
    config = {"env": "toy_targets (threshold 2.0: no early termination)", "model": args.model, "dtype": "float32",
              "repeats": args.repeats, "threads": args.threads, "mode": "tree", "sweep": [asdict(p) for p in sweep],
              "episodes": "tree mode: one episode per problem (B)"}
    path = write_result(NAME, argv, quick=args.quick, directory=out_dir(args.out_dir, args.quick), config=config,
                        samples=samples, medians=medians, measured=r2_tokens, target=TARGET_R2, op=">=",
                        metric="R^2 of a linear fit of step time on generated tokens (every timed step)",
                        load_before=load_before, threads=args.threads, notes=notes,
                        also_required={"tokens_explain_more_than_episodes": r2_tokens > r2_episodes})
    return {"path": str(path), "medians": medians}


def _label(config: dict) -> str:
    return "B{problems}_K{branching}_A{agents}_T{turns}_M{max_tokens}".format(**config)


if __name__ == "__main__":
    main()
