"""The paper's claim at CPU scale: AT-GRPO against trajectory GRPO and single-agent GRPO, on held-out problems.

    python benchmarks/learning_claims.py              # the pre-registered run (3 methods x 3 seeds: ~3 h, busy 2 cores)
    python benchmarks/learning_claims.py --quick      # a short end-to-end check (1 seed, tiny budget; slow lane)
    python benchmarks/learning_claims.py --seeds 2    # some of the seeds; runs already finished are kept (below)

Every finished run is appended to ``<log-dir>/runs.jsonl`` at once; a later invocation with the same settings reads
it and runs only the (method, seed) pairs missing there, so a run cut off mid-way loses at most the run in progress.

PRE-REGISTRATION (written and committed before the first full run; not to be changed after seeing results; if
it must change, the first result is kept and both are reported):

- Task: the ``vault`` env (pettingllms/envs/vault/env.py), up to 2 turns. Two agents: the reader holds a card with
  its half of a code among two distractor numbers and must tell it to the opener, who must type its own half first,
  then the reader's, as ``CODE: <digits>``. Neither can open the vault alone. A failed attempt is shown to both in
  the next turn. Team reward 1 when the vault opens; the reader's local reward 1 when it relays the right number.
  Training draws fresh problems every step (train seed space); evaluation uses 64 problems of the disjoint test
  seed space, never trained on.
- Model and learner: the packaged SmolLM2-135M-Instruct, float32 on the 2-core CPU; LoRA rank 32 (alpha 64) on every
  linear layer of attention and MLP; AdamW lr 3e-4, 1 warmup step, then constant (min_lr_ratio 1.0), so every method
  sees the same learning rate whatever its step count; PPO clip 0.2, one optimiser step per training step, no KL.
  Sampling in training: temperature 0.5, no top-k/top-p, at most 12 tokens per response; alpha = 1.
- Methods (the only differences between them):
  1. ``at_grpo``: tree rollouts, K=4 candidates at every (turn, agent) node, groups per (problem, turn, agent),
     per-role policies (L2: one LoRA adapter per agent on the shared base);
  2. ``trajectory``: K=4 independent episodes per problem, one group per (problem, agent) over the episodes, every
     sample scored with its episode's return (``rollout.mode=trajectory``), per-role policies (L2), as the peers'
     multi-turn GRPO;
  3. ``single_agent``: the same task done by one agent (``env.options.players=1``: the solo player holds the card
     and the opener's half and types the code), K=4 episodes per problem, trajectory-level groups (standard GRPO
     over K rollouts), one LoRA adapter (L0).
- Budget: 3,000 generated training tokens per run (the sum of every sampled response's length; validation excluded).
  Each run trains steps of 4 problems until the cumulative count reaches the budget; the step that crosses it is
  completed (reported: tokens actually used). Held-out evaluation (64 test problems, greedy, independent episodes,
  up to 2 turns) before training and after each 600 tokens (at the first step that reaches 600, 1200, ...), and at
  the end.
- Seeds: 0, 1 and 2 for every method (``training.seed``: data order, LoRA initialisation, sampling).
- Metric: held-out team success rate (the vault opened), greedy. Primary: the mean over the evaluation points after
  the start (the area under the held-out curve per token; rewards learning fast within the budget). Secondary: the
  final held-out success. Reported per method: mean and standard deviation over the 3 seeds, and the per-seed values.
- Comparison reported: AT-GRPO minus trajectory GRPO, and AT-GRPO minus single-agent GRPO, on both metrics. A method
  "wins" when its seed mean exceeds the other's by more than the larger of the two across-seed standard deviations;
  otherwise the comparison is reported as not separated at this scale. Reported whichever way it falls.
- Sizing pilot (before this pre-registration): one quickstart run (L1, tree, batch 8) went from 0.25 to 0.97 held-out
  success in 20 steps (~11,000 generated tokens), with training success at 1.0 after ~2,300 tokens; the budget above
  is set small enough that the methods are still learning within it.

Writes ``benchmarks/results/learning_claims.json`` (command, machine, seeds, every run's curve) and
``benchmarks/results/learning_claims.png`` (held-out success against generated tokens, per method).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine_info  # noqa: E402
from _report import load_average, out_dir  # noqa: E402

NAME = "learning_claims"
COMMON = [
    "base_models.policy_0.path=smollm2-135m-instruct", "base_models.policy_0.dtype=float32",
    "base_models.policy_0.lora.rank=32", "base_models.policy_0.lora.alpha=64",
    "base_models.policy_0.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    "env.name=vault", "env.max_turns=2", "env.max_val_problems=64",
    "rollout.branching=4", "rollout.select=greedy", "reward.alpha=1.0",
    "optim.lr=3e-4", "optim.warmup_steps=1", "optim.min_lr_ratio=1.0",
    "training.total_training_steps=400", "training.train_batch_size=4", "training.max_prompt_length=320",
    "training.max_response_length=12", "training.val_freq=0", "training.val_before_train=false",
    "training.export_hf=false", "training.plot=false", "training.resume=none", "training.logger=[]",
    "resources.use_ray=false",
]
TRAIN_SAMPLING = "{temperature: 0.5, top_p: 1.0, top_k: 0, max_tokens: 12}"
VAL_SAMPLING = "{temperature: 0.0, top_p: 1.0, top_k: 0, max_tokens: 12}"
METHODS = {
    "at_grpo": ["specialization=L2", "rollout.mode=tree",
                *(f"+agents.{a}.{k}={v}" for a in ("reader", "opener")
                  for k, v in (("train_sampling", TRAIN_SAMPLING), ("val_sampling", VAL_SAMPLING)))],
    "trajectory": ["specialization=L2", "rollout.mode=trajectory",
                   *(f"+agents.{a}.{k}={v}" for a in ("reader", "opener")
                     for k, v in (("train_sampling", TRAIN_SAMPLING), ("val_sampling", VAL_SAMPLING)))],
    "single_agent": ["specialization=L0", "+env.options.players=1", "rollout.mode=trajectory",
                     f"+agents.solo.train_sampling={TRAIN_SAMPLING}", f"+agents.solo.val_sampling={VAL_SAMPLING}"],
}
SEEDS = (0, 1, 2)
BUDGET, EVERY = 3000, 600


def run(method: str, seed: int, budget: int, every: int, log_dir: Path, extra: Sequence[str] = ()) -> dict:
    """One training run to the token budget, evaluating on the held-out problems along the way."""
    from pettingllms.entry.train import load_config
    from pettingllms.trainer.trainer import Trainer

    overrides = _overrides(method, seed, log_dir, extra)
    trainer = Trainer(load_config("train", overrides))
    started = time.perf_counter()
    try:
        curve = [(0, _held_out(trainer.validate(0)))]
        tokens, step, next_eval = 0, 0, every
        while tokens < budget:
            step += 1
            result = trainer.step(step)
            tokens += int(result.metrics["rollout/generated_tokens"])
            if tokens >= next_eval or tokens >= budget:
                curve.append((tokens, _held_out(trainer.validate(step))))
                while next_eval <= tokens:
                    next_eval += every
    finally:
        trainer.close()
    after = [value for _, value in curve[1:]]
    return {"method": method, "seed": seed, "steps": step, "tokens": tokens, "curve": curve,
            "auc": statistics.fmean(after), "final": curve[-1][1], "seconds": time.perf_counter() - started,
            "overrides": overrides}


def _overrides(method: str, seed: int, log_dir: Path, extra: Sequence[str]) -> list[str]:
    return [*COMMON, *METHODS[method], f"training.seed={seed}", f"training.log_dir={log_dir}",
            f"training.experiment_name={method}_seed{seed}", *extra]


def _held_out(metrics: dict[str, float]) -> float:
    return float(metrics["val/procedural/success_rate"])


def append_run(record: Path, result: dict, budget: int, every: int, extra: Sequence[str]) -> None:
    """Keep a finished run at once, with what it was run with (so only a run of the same settings is reused)."""
    record.parent.mkdir(parents=True, exist_ok=True)
    with record.open("a") as fh:
        fh.write(json.dumps({**result, "budget_tokens": budget, "eval_every_tokens": every, "extra": list(extra)})
                 + "\n")


def finished_runs(record: Path, budget: int, every: int, extra: Sequence[str]) -> dict[tuple[str, int], dict]:
    """The runs of ``record`` (``<log_dir>/runs.jsonl``) made with these settings and this version's overrides,
    by (method, seed)."""
    if not record.is_file():
        return {}
    done = {}
    for line in record.read_text().splitlines():
        r = json.loads(line)
        settings = (r.pop("budget_tokens"), r.pop("eval_every_tokens"), r.pop("extra"))
        same = settings == (budget, every, list(extra)) and r["method"] in METHODS
        if same and r["overrides"] == _overrides(r["method"], r["seed"], record.parent, extra):
            done[(r["method"], r["seed"])] = r
    return done


def summarize(runs: Sequence[dict]) -> dict:
    out: dict = {}
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        out[method] = {metric: {"mean": statistics.fmean(r[metric] for r in mine),
                                "std": statistics.stdev([r[metric] for r in mine]) if len(mine) > 1 else 0.0,
                                "per_seed": [r[metric] for r in mine]}
                       for metric in ("auc", "final")}
    comparisons = {}
    for other in ("trajectory", "single_agent"):
        if "at_grpo" not in out or other not in out:
            continue
        for metric in ("auc", "final"):
            a, b = out["at_grpo"][metric], out[other][metric]
            margin = max(a["std"], b["std"])
            diff = a["mean"] - b["mean"]
            verdict = "at_grpo wins" if diff > margin else (f"{other} wins" if -diff > margin else "not separated")
            comparisons[f"at_grpo - {other} ({metric})"] = {"difference": diff, "margin": margin, "verdict": verdict}
    return {"methods": out, "comparisons": comparisons}


def plot(runs: Sequence[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"at_grpo": "tab:blue", "trajectory": "tab:orange", "single_agent": "tab:green"}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    labelled = set()
    for r in runs:
        xs, ys = zip(*r["curve"])
        label = None if r["method"] in labelled else r["method"]
        labelled.add(r["method"])
        ax.plot(xs, ys, marker="o", markersize=3, color=colors[r["method"]], alpha=0.8, label=label)
    ax.set_xlabel("generated training tokens")
    ax.set_ylabel("held-out success (64 problems, greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("vault, SmolLM2-135M on CPU: AT-GRPO vs trajectory GRPO vs single agent")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, a tiny budget: checks the pipeline only")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--out-dir")
    parser.add_argument("--log-dir", default="logs/learning_claims")
    parser.add_argument("--seeds", nargs="+", type=int, help=f"default: {list(SEEDS)} ({SEEDS[0]} with --quick)")
    args = parser.parse_args(argv)
    seeds = args.seeds or (SEEDS[:1] if args.quick else SEEDS)
    budget, every = (120, 60) if args.quick else (BUDGET, EVERY)
    extra = ["env.max_val_problems=8"] if args.quick else []  # --quick checks the pipeline, not the figures
    load_before = load_average()
    started = time.perf_counter()
    record = Path(args.log_dir) / "runs.jsonl"
    done = finished_runs(record, budget, every, extra)
    runs = []
    for seed in seeds:
        for method in args.methods:
            if (method, seed) in done:
                result = done[(method, seed)]
                print(f"{method} seed {seed}: kept from {record}", flush=True)
            else:
                result = run(method, seed, budget, every, Path(args.log_dir), extra)
                append_run(record, result, budget, every, extra)
            runs.append(result)
            print(f"{method} seed {seed}: {result['steps']} steps, {result['tokens']} tokens, held-out "
                  f"{' -> '.join(f'{v:.2f}' for _, v in result['curve'])}", flush=True)
    report = {
        "benchmark": NAME,
        "command": " ".join(["python", "benchmarks/learning_claims.py", *argv]),
        "quick": args.quick,
        "machine": {**machine_info(), "load_before": load_before, "load_after": load_average()},
        "config": {"budget_tokens": budget, "eval_every_tokens": every, "seeds": list(seeds),
                   "methods": {m: METHODS[m] for m in args.methods}, "common": COMMON},
        "wall_seconds": time.perf_counter() - started,
        "runs": runs,
        **summarize(runs),
    }
    directory = out_dir(args.out_dir, args.quick)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{NAME}.json").write_text(json.dumps(report, indent=1))
    plot(runs, directory / f"{NAME}.png")
    for key, value in report["comparisons"].items():
        print(f"{key}: {value['difference']:+.3f} (margin {value['margin']:.3f}): {value['verdict']}")
    print(f"wrote {directory / (NAME + '.json')} and {NAME}.png")
    return report


if __name__ == "__main__":
    main()
