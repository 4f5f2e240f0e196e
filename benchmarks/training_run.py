"""Run a training config end to end and record its figures as JSON.

Used for the quickstart figures and the slow-lane learning benchmark:

    python benchmarks/training_run.py --name quickstart --out benchmarks/results/quickstart.json
    python benchmarks/training_run.py --name quickstart --out benchmarks/results/learning_smollm2.json \\
        training.total_training_steps=30 training.val_freq=10 training.experiment_name=learning_smollm2

    python benchmarks/training_run.py --quick      # tiny random model, 2 short steps (smoke test)

Records wall time, the reward and success curves per step, validation success before and after training,
and step timings. ``--wall-seconds`` and ``--run-dir`` summarise a run made elsewhere (e.g. ``make quickstart``
timed from a fresh clone, install included) instead of training here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine_info  # noqa: E402
from _report import out_dir  # noqa: E402

# --quick checks the script (train, find the run, summarise it), not the figures: the config's own task on the tiny
# random model, two steps with validation before and after, in-process (no Ray to start), nothing exported.
QUICK_OVERRIDES = ["base_models.policy_0.path=tiny-random-smollm2", "training.total_training_steps=2",
                   "training.train_batch_size=2", "rollout.branching=2", "env.max_val_problems=4",
                   "training.val_freq=2", "training.val_before_train=true", "training.export_hf=false",
                   "training.plot=false", "resources.use_ray=false"]


def summarize(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "summary.log").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r["step"] > 0]
    reward_keys = sorted(k for k in steps[0] if k.endswith("/reward_mean") and "/turn_" not in k
                         and not k.startswith("val/"))
    val_keys = sorted({k for r in rows for k in r if k.startswith("val/") and k.endswith("/success_rate")})
    curve = {k: [r.get(k) for r in steps] for k in reward_keys + ["episode/success_rate"]}
    validation = {k: {r["step"]: r[k] for r in rows if r.get(k) is not None} for k in val_keys}
    step_s = [r["timing/step_s"] for r in steps]
    per_epoch = epoch_means(curve, steps_per_epoch(run_dir))
    return {
        "run_dir": str(run_dir),
        "steps": len(steps),
        "reward_first_step": {k: v[0] for k, v in curve.items()},
        "reward_last_step": {k: v[-1] for k, v in curve.items()},
        "reward_mean_first_3": {k: statistics.fmean(v[:3]) for k, v in curve.items()},
        "reward_mean_last_3": {k: statistics.fmean(v[-3:]) for k, v in curve.items()},
        "steps_per_epoch": steps_per_epoch(run_dir),
        "reward_mean_per_epoch": per_epoch,
        "curves": curve,
        "validation_success": validation,
        "step_seconds_median": statistics.median(step_s),
        "generate_seconds_median": statistics.median(r["timing/generate_s"] for r in steps),
        "update_seconds_median": statistics.median(r["timing/update_s"] for r in steps),
    }


def steps_per_epoch(run_dir: Path) -> int | None:
    """Steps that revisit the same problems: a training pool (``env.options.train_pool``) or ``epoch_size``
    divided by the batch size; None when every step draws fresh problems."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / "config.yaml")
    pool = (cfg.env.get("options") or {}).get("train_pool") or cfg.training.get("epoch_size")
    batch = cfg.training.train_batch_size
    return pool // batch if pool and pool % batch == 0 else None


def epoch_means(curve: dict[str, list], epoch_steps: int | None) -> dict[str, list[float]] | None:
    """Mean of each curve over each whole epoch: with a fixed pool, epoch e and e+1 score the same problems."""
    if not epoch_steps:
        return None
    return {
        key: [statistics.fmean(values[i : i + epoch_steps]) for i in range(0, len(values) - epoch_steps + 1,
                                                                          epoch_steps)]
        for key, values in curve.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="quickstart", help="config name in pettingllms/configs/")
    parser.add_argument("--out", help="the JSON to write (required unless --quick, which defaults to a temp folder)")
    parser.add_argument("--quick", action="store_true", help="tiny random model, 2 short steps (smoke test)")
    parser.add_argument("--run-dir", help="summarise this finished run instead of training")
    parser.add_argument("--wall-seconds", type=float, help="wall time measured outside (with --run-dir)")
    parser.add_argument("--command", help="the exact command that produced --run-dir")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.quick:
        args.out = args.out or str(out_dir(None, True) / "training_run.json")
        log_dir = Path(args.out).resolve().parent / "training_run_logs"
        args.overrides = [*QUICK_OVERRIDES, f"training.log_dir={log_dir}", *args.overrides]
    elif not args.out:
        parser.error("--out is required (the JSON to write)")
    if args.run_dir:
        run_dir, wall, command = Path(args.run_dir), args.wall_seconds, args.command
    else:
        command = [sys.executable, "-m", "pettingllms.cli", "train", "--config-name", args.name, *args.overrides]
        start = time.perf_counter()
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        wall = time.perf_counter() - start
        run_dir = Path(output.strip().splitlines()[-1].split("run directory:", 1)[1].strip())
        command = " ".join(["python -m pettingllms.cli train --config-name", args.name, *args.overrides])
    result = {"command": command, "quick": args.quick, "wall_seconds": wall, "machine": machine_info(), **summarize(run_dir)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("wall_seconds", "reward_first_step", "reward_last_step",
                                            "reward_mean_per_epoch", "validation_success", "step_seconds_median")},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
