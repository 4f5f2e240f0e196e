"""Driver memory over a 50-step training run (issue #7, benchmark 5).

A real ``Trainer.fit`` on the tiny random SmolLM2 model (``toy_targets``, two agents on one shared policy,
tree mode, validation every 10 steps, a checkpoint at the end). By default the policy worker runs in a Ray
actor, as in every training run (``resources.use_ray=true``), and the driver's RSS is what the loop itself
keeps: rollouts, samples, metrics. ``--in-process`` runs the worker inside the driver (the debugging mode,
``resources.use_ray=false``), so the RSS also covers the model, optimiser and engine, and torch's allocator
churn; it writes driver_memory_in_process.json. ``--malloc-trim`` returns freed heap to the OS before each
reading, which separates memory the allocator keeps from memory still referenced.
RSS (psutil; /proc/self/status where psutil is missing) is sampled right after every step. Growth is reported
from step 1 and from step 5 (after the allocator and the optimiser state have settled) to the last step.
Target: growth from step 5 to step 50 below 5%.

    python benchmarks/driver_memory.py [--steps 50] [--in-process [--malloc-trim]]
    python benchmarks/driver_memory.py --quick

Writes benchmarks/results/driver_memory.json (or ``--out-dir``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import linear_fit, load_average, median, out_dir, write_result  # noqa: E402

NAME = "driver_memory"
TARGET = 0.05
BASELINE_STEP = 5


def rss_bytes() -> int:
    """This process's resident set size."""
    try:
        import psutil
    except ImportError:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("cannot read this process's RSS: no psutil and no VmRSS in /proc/self/status")
    return psutil.Process().memory_info().rss


def trim_heap() -> None:
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def growth(samples: Sequence[dict], from_step: int) -> float:
    """Relative RSS change from ``from_step`` to the last sampled step."""
    by_step = {s["step"]: s["rss_bytes"] for s in samples}
    start, end = by_step[from_step], samples[-1]["rss_bytes"]
    return (end - start) / start


def trend_growth(samples: Sequence[dict], from_step: int) -> float:
    """Growth from ``from_step`` to the last step along a least-squares line through every sample in between.

    The allocator keeps and returns freed blocks unevenly, so single-step RSS readings scatter by several
    percent; the fitted line shows a steady leak without depending on where two single readings fall.
    """
    tail = [s for s in samples if s["step"] >= from_step]
    fit = linear_fit([s["step"] for s in tail], [s["rss_bytes"] for s in tail])
    start = fit["slope"] * from_step + fit["intercept"]
    return fit["slope"] * (tail[-1]["step"] - from_step) / start


def window_growth(samples: Sequence[dict], from_step: int, width: int = 5) -> float:
    """Median RSS of the last ``width`` steps against the median of ``width`` steps from ``from_step``."""
    first = [s["rss_bytes"] for s in samples if from_step <= s["step"] < from_step + width]
    last = [s["rss_bytes"] for s in samples[-width:]]
    return median(last) / median(first) - 1.0


def overrides(steps: int, use_ray: bool, workdir: Path, quick: bool) -> list[str]:
    return [
        "base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=2",
        "specialization=L1", "rollout.branching=4", f"training.train_batch_size={2 if quick else 4}",
        "training.max_response_length=8", "+agents.alice.train_sampling.max_tokens=8",
        "+agents.bob.train_sampling.max_tokens=8", f"training.total_training_steps={steps}",
        # --quick validates once, at the end: every 8//5 = 1 step it spent most of its time validating.
        f"training.val_freq={steps if quick else max(1, steps // 5)}", "training.val_before_train=false",
        "env.max_val_problems=8",
        "training.export_hf=false", "training.plot=false", "training.resume=none", f"training.log_dir={workdir}",
        "training.logger=[]", "optim.lr=1e-4", f"resources.use_ray={str(use_ray).lower()}", "resources.num_cpus=2",
    ]


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--in-process", action="store_true",
                        help="policy worker inside the driver (resources.use_ray=false): RSS includes the model")
    parser.add_argument("--quick", action="store_true", help="6 steps, smaller batches, one validation (smoke test)")
    parser.add_argument("--malloc-trim", action="store_true",
                        help="diagnostic: return freed heap to the OS (glibc malloc_trim) before each reading, to "
                             "tell memory the allocator keeps from memory that is still referenced")
    parser.add_argument("--out-dir")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = BASELINE_STEP + 1
    if args.steps <= BASELINE_STEP:
        parser.error(f"--steps must be more than {BASELINE_STEP} (growth is reported from step {BASELINE_STEP})")
    from pettingllms.config.load import compose, to_schema
    from pettingllms.trainer.trainer import Trainer

    load_before = load_average()
    samples: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="driver_memory_") as tmp:
        config_overrides = overrides(args.steps, not args.in_process, Path(tmp), args.quick)
        before_setup = rss_bytes()
        trainer = Trainer(to_schema(compose("train", config_overrides)))
        after_setup = rss_bytes()
        step = trainer.step

        def sampled_step(index: int):
            start = time.perf_counter()
            result = step(index)
            if args.malloc_trim:
                trim_heap()
            samples.append({"step": index, "rss_bytes": rss_bytes(), "step_s": time.perf_counter() - start})
            return result

        trainer.step = sampled_step  # fit() calls it once per step; validation and checkpoints run as usual
        start = time.perf_counter()
        trainer.fit()
        wall = time.perf_counter() - start
    after_run = rss_bytes()
    from_1, from_5 = growth(samples, 1), growth(samples, BASELINE_STEP)
    trend_5, window_5 = trend_growth(samples, BASELINE_STEP), window_growth(samples, BASELINE_STEP)
    after_baseline = [s["rss_bytes"] for s in samples if s["step"] >= BASELINE_STEP]
    mib = 1 << 20
    medians = {"rss_mib_step_1": samples[0]["rss_bytes"] / mib,
               f"rss_mib_step_{BASELINE_STEP}": samples[BASELINE_STEP - 1]["rss_bytes"] / mib,
               "rss_mib_last_step": samples[-1]["rss_bytes"] / mib, "peak_rss_mib": max(s["rss_bytes"] for s in samples) / mib,
               "growth_from_step_1": from_1, f"growth_from_step_{BASELINE_STEP}": from_5,
               "rss_mib_before_setup": before_setup / mib, "rss_mib_after_setup": after_setup / mib,
               "rss_mib_after_fit": after_run / mib, "wall_s": wall,
               f"trend_growth_from_step_{BASELINE_STEP}": trend_5, f"window_growth_from_step_{BASELINE_STEP}": window_5,
               f"rss_spread_from_step_{BASELINE_STEP}": (max(after_baseline) - min(after_baseline)) / median(after_baseline)}
    config = {"model": "tiny-random-smollm2", "env": "toy_targets", "specialization": "L1", "steps": args.steps,
              "use_ray": not args.in_process, "malloc_trim": args.malloc_trim, "overrides": config_overrides,
              "rss_source": "psutil" if _has_psutil() else "/proc/self/status"}
    notes = [f"RSS growth from step 1: {from_1:+.2%}; from step {BASELINE_STEP}: {from_5:+.2%} (to step {args.steps})",
             f"from step {BASELINE_STEP}, along a fitted line: {trend_5:+.2%}; median of the last 5 steps against "
             f"steps {BASELINE_STEP}-{BASELINE_STEP + 4}: {window_5:+.2%}; single readings spread over "
             f"{medians[f'rss_spread_from_step_{BASELINE_STEP}']:.1%} of the median"]
    name = f"{NAME}_in_process" if args.in_process else NAME
    path = write_result(name, argv, script=NAME, quick=args.quick, directory=out_dir(args.out_dir, args.quick), config=config,
                        samples=samples, medians=medians, measured=from_5, target=TARGET, op="<",
                        metric=f"relative driver RSS growth from step {BASELINE_STEP} to step {args.steps}",
                        load_before=load_before, threads=2, notes=notes)
    return {"path": str(path), "medians": medians}


def _has_psutil() -> bool:
    import importlib.util

    return importlib.util.find_spec("psutil") is not None


if __name__ == "__main__":
    main()
