"""One single-agent, single-turn GRPO step: our Trainer against TRL's GRPOTrainer, side by side (issue #7, 3;
issue #25: TRL at its best).

Workload: the math env's reasoner alone (L0, one turn) on B offline GSM-style problems (reasoning-gym
gsm_symbolic), SmolLM2-135M with fp32 weights on CPU, K completions per prompt of at most T new tokens, plain
temperature-1 sampling (top_k=0, top_p=1.0 on both sides), no KL and no reference model, one optimizer update
per step. Both sides see the very same chat messages (the reasoner's one-shot prompt) for the very same B
problems at every step, with the same torch thread count.

- Ours: ``Trainer.step`` (rollout with the executor and HFEngine, rewards, groups and advantages, the
  learner's update), in-process (``resources.use_ray=false``), timed around the call.
- TRL: ``GRPOTrainer`` with ``num_generations=K``, ``max_completion_length=T``, its own math-verify accuracy
  reward, in .venv-trl (``bash benchmarks/trl/setup.sh``), timed from ``on_step_begin`` to ``on_step_end`` by
  benchmarks/trl/trl_step.py, in several configurations (``trl_configurations``): its recommended defaults
  (gradient checkpointing, bf16 autocast, one batch), the same in fp32, and faster ones without checkpointing
  (one batch of B x K rows; micro-batches of K rows accumulated over B). Each step is one generation round of
  B x K completions and exactly one optimizer update in every configuration.

Each TRL configuration runs in a process of its own, one after the other, capped at ``--memory-cap-gb`` of
address space so that a configuration too big for the machine fails with an allocation error (recorded)
instead of waking the OOM killer. Each gets one untimed warm-up step (none with --quick) and ``--repeats``
timed ones; one of our steps runs before each configuration's block (once its trainer is built) and one
after the last (at least ``--repeats`` in all, after our own warm-up), so load drift hits both sides.
Figure: our median step time / the fastest TRL configuration's; target <= 0.75.

Then, with our side closed, TRL runs alone (``trl_step.py --standalone``) in the fastest configuration on the
same prompts, and on short arithmetic prompts, to tell the harness's effect from the workload's.

    python benchmarks/trl_compare.py [--problems 4] [--generations 8] [--max-tokens 64] [--repeats 3]
    python benchmarks/trl_compare.py --quick

Writes benchmarks/results/trl_compare.json (or ``--out-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from _report import end_child, load_average, median, out_dir, write_result  # noqa: E402

NAME = "trl_compare"
TARGET = 0.75
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
TRL_WORKER = ROOT / "benchmarks" / "trl" / "trl_step.py"
DATASET = "trl_compare"
LEARNING_RATE = 1e-6
WEIGHT_DECAY = 0.01
MAX_GRAD_NORM = 1.0
# The TRL process's address-space cap. The machine has 24 GB, shared with our side (~3 GB) and the system; a
# process over this fails an allocation and the run records it.
MEMORY_CAP_GB = 16.0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--problems", type=int, default=4, help="B: prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="K: completions per prompt")
    parser.add_argument("--max-tokens", type=int, default=64, help="T: max new tokens per completion")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per TRL configuration (and at least ours)")
    parser.add_argument("--warm-up", type=int, default=1, choices=(0, 1),
                        help="untimed first step per side and configuration")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configurations", nargs="+", metavar="NAME",
                        help="measure only these TRL configurations (default: all of trl_configurations)")
    parser.add_argument("--memory-cap-gb", type=float, default=MEMORY_CAP_GB,
                        help="address-space cap of the TRL process (a configuration above it is recorded as failed)")
    parser.add_argument("--quick", action="store_true", help="tiny random model and tiny sizes (smoke test)")
    parser.add_argument("--out-dir")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.problems, args.generations, args.max_tokens, args.repeats = "tiny-random-smollm2", 2, 2, 8, 1
        args.warm_up = 0  # the smoke checks the machinery, not the figures: one step per configuration
    return args


def trl_configurations(problems: int, generations: int) -> list[dict]:
    """The TRL configurations measured, each one generation round of B x K completions and one optimizer update
    per step. ``grpo`` holds the GRPOConfig arguments that differ from TRL's defaults for this configuration;
    the workload's own (K, T, sampling, optimizer) are added by ``trl_grpo_args``."""
    rows = problems * generations
    one_batch = {"per_device_train_batch_size": rows, "gradient_accumulation_steps": 1}
    # One prompt's K completions per micro-batch, accumulated over the B prompts into one update.
    micro = {"per_device_train_batch_size": generations, "gradient_accumulation_steps": problems}
    fp32, no_checkpointing = {"bf16": False}, {"gradient_checkpointing": False}
    return [
        {"name": "trl_defaults", "grpo": dict(one_batch),
         "about": "TRL's recommended setup: its GRPOConfig defaults (gradient checkpointing, bf16 autocast over the "
                  "fp32 weights), the step's B x K rows in one batch"},
        {"name": "defaults_fp32", "grpo": {**one_batch, **fp32},
         "about": "TRL's defaults (gradient checkpointing), fp32 like ours, one batch"},
        {"name": "one_batch_fp32", "grpo": {**one_batch, **fp32, **no_checkpointing},
         "about": "no gradient checkpointing, fp32, one batch of B x K rows"},
        {"name": "micro_batches_fp32", "grpo": {**micro, **fp32, **no_checkpointing},
         "about": f"no gradient checkpointing, fp32, micro-batches of K={generations} rows x B={problems} accumulated"},
        {"name": "micro_batches_bf16", "grpo": {**micro, "bf16": True, **no_checkpointing},
         "about": f"no gradient checkpointing, bf16 autocast, micro-batches of K={generations} x B={problems}"},
    ]


def trl_grpo_args(args: argparse.Namespace, configuration: dict) -> dict:
    """The GRPOConfig arguments of one configuration: the workload's, the same in every configuration and
    matching our side, then the configuration's own."""
    workload = {"num_generations": args.generations, "max_completion_length": args.max_tokens,
                "learning_rate": LEARNING_RATE, "lr_scheduler_type": "constant", "weight_decay": WEIGHT_DECAY,
                "max_grad_norm": MAX_GRAD_NORM, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                "beta": 0.0}  # no reference model, like our side (KL off)
    return {**workload, **configuration["grpo"]}


def problems(count: int) -> list[dict]:
    from pettingllms.data.math_sources import PROCEDURAL_SOURCES

    return PROCEDURAL_SOURCES["gsm_symbolic"].generate("train", count, 0)


def short_prompts(count: int) -> tuple[list[list[dict]], list[str]]:
    """Short arithmetic questions (a few dozen prompt tokens, short answers): the standalone workload that
    tells the workload's share of TRL's step time from the harness's."""
    pairs = [(17 + 13 * i, 25 + 7 * i) for i in range(count)]
    messages = [[{"role": "user", "content": f"What is {a} + {b}? Put the final answer in \\boxed{{}}."}]
                for a, b in pairs]
    return messages, [str(a + b) for a, b in pairs]


class OurSide:
    """Our real Trainer on an L0 config; ``step()`` runs and times one ``Trainer.step``."""

    def __init__(self, args: argparse.Namespace, rows: list[dict], workdir: Path, steps: int) -> None:
        from pettingllms.config.load import compose, to_schema
        from pettingllms.data.math_sources import REQUIRED
        from pettingllms.data.sources import write_rows
        from pettingllms.trainer.trainer import Trainer

        write_rows(rows, workdir / "data", "math", "train", DATASET, REQUIRED)
        sampling = f"{{temperature: 1.0, top_p: 1.0, top_k: 0, max_tokens: {args.max_tokens}}}"
        self.overrides = [
            "specialization=L0", "env.agents=[reasoner]", "env.max_turns=1",
            f"env.data_root={workdir / 'data'}", f"env.dataset={DATASET}", "env.benchmark=[]",
            f"base_models.policy_0.path={args.model}", "base_models.policy_0.dtype=float32",
            f"agents.reasoner.train_sampling={sampling}",
            f"rollout.branching={args.generations}", "rollout.mode=tree",
            f"training.train_batch_size={args.problems}", f"training.max_response_length={args.max_tokens}",
            f"training.total_training_steps={steps}", "training.val_freq=0",
            "training.val_before_train=false", "training.export_hf=false", "training.plot=false",
            "training.resume=none", f"training.log_dir={workdir / 'logs'}", "training.experiment_name=trl_compare",
            f"optim.lr={LEARNING_RATE}", "optim.warmup_steps=0", "optim.min_lr_ratio=1.0",
            f"optim.weight_decay={WEIGHT_DECAY}", f"optim.grad_clip={MAX_GRAD_NORM}",
            "resources.use_ray=false", f"resources.num_cpus={args.threads}",
        ]
        self.trainer = Trainer(to_schema(compose("math", self.overrides)))
        self.steps = 0

    def step(self) -> dict:
        import torch

        self.steps += 1
        start = time.perf_counter()
        metrics = self.trainer.step(self.steps).metrics
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "mean_completion_length": metrics["policy_0/reasoner/response_length_mean"],
                "sequences": metrics["policy_0/reasoner/samples"], "reward": metrics["policy_0/reasoner/reward_mean"],
                "generate_s": metrics["timing/generate_s"], "update_s": metrics["timing/update_s"],
                "threads": torch.get_num_threads()}

    def prompt_messages(self, rows: list[dict]) -> list[list[dict]]:
        """The reasoner's turn-0 chat messages for each problem: exactly what our side sends to its policy."""
        from pettingllms.core import Problem

        env, agent = self.trainer.plan.env, self.trainer.plan.agent_specs["reasoner"].agent
        return [[dict(m) for m in agent.observe(env.reset(Problem(r["id"], r), 0), 0)] for r in rows]

    def prompt_lengths(self, messages: list[list[dict]]) -> list[int]:
        """Prompt token counts with the policy's own chat codec (the one its engine is fed through)."""
        from pettingllms.runtime.serving import policy_codec

        codec = policy_codec(self.trainer.policies.specs["policy_0"])
        return [len(codec.encode_chat(m)) for m in messages]

    def close(self) -> None:
        self.trainer.close()


class TRLRunFailed(Exception):
    """A TRL configuration failed: inside the worker (e.g. an allocation over the memory cap), or the worker died
    (e.g. killed by the kernel for memory)."""


def trl_settings(args: argparse.Namespace, run: dict, workdir: Path) -> dict:
    """The worker's settings file: ``run`` is {name, grpo, prompts, solutions}; it gets warm-up + repeats steps."""
    from pettingllms.models import resolve_model

    return {"model_dir": str(resolve_model(args.model)), "threads": args.threads,
            "output_dir": str(workdir / "trl_out"), "memory_cap_gb": args.memory_cap_gb,
            "steps": args.warm_up + args.repeats, **run}


class TRLWorker:
    """One TRL configuration in its own .venv-trl process (a fresh process per configuration, so memory one leaves
    behind, a failed one's above all, never counts against the next one's cap)."""

    def __init__(self, args: argparse.Namespace, run: dict, workdir: Path, standalone: bool = False) -> None:
        if not TRL_PYTHON.is_file():
            raise SystemExit(f"{TRL_PYTHON} not found: run `bash benchmarks/trl/setup.sh` first")
        self.standalone = standalone
        stem = ("standalone_" if standalone else "") + run["name"].replace("/", "_")
        path = workdir / f"trl_{stem}.json"
        path.write_text(json.dumps(trl_settings(args, run, workdir)))
        self.log = open(workdir / f"trl_{stem}_stderr.log", "w")
        command = [str(TRL_PYTHON), str(TRL_WORKER), str(path)] + (["--standalone"] if standalone else [])
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL if standalone else subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=ROOT)

    def read(self, wanted: str) -> dict:
        """The payload of the worker's next ``TRL_<wanted>`` line; a failure raises TRLRunFailed."""
        for line in self.process.stdout:
            if line.startswith("TRL_FAILED "):
                raise TRLRunFailed(json.loads(line[len("TRL_FAILED "):])["error"])
            if line.startswith(f"TRL_{wanted} "):
                return json.loads(line[len(wanted) + 5:])
        self.log.flush()
        tail = Path(self.log.name).read_text()[-1000:]
        code = self.process.wait()
        why = " (SIGKILL: the machine ran out of memory, or someone killed it)" if code == -9 else ""
        raise TRLRunFailed(f"the TRL worker exited (code {code}){why} before TRL_{wanted}: {tail}")

    def ready(self) -> dict:
        """Wait until the trainer is built (the worker is then idle, waiting for ``go``)."""
        return self.read("READY")

    def step(self) -> dict:
        if not self.standalone:
            self.process.stdin.write("go\n")
            self.process.stdin.flush()
        return self.read("STEP")

    def done(self) -> dict:
        return self.read("DONE")

    def close(self) -> None:
        end_child(self.process, timeout=60)
        self.log.close()


def measure_configuration(args: argparse.Namespace, run: dict, workdir: Path, ours_step=None,
                          standalone: bool = False) -> dict:
    """One configuration's block in its own worker: its trainer built, one of our steps (``ours_step``, while the
    worker waits, idle), TRL's warm-up and timed steps. A failure is recorded in ``error``."""
    result = {"name": run["name"], "ready": None, "warm_up": None, "timed": [], "error": None}
    worker = TRLWorker(args, run, workdir, standalone)
    try:
        result["ready"] = worker.ready()
        if ours_step is not None:
            ours_step()
        result["warm_up"] = worker.step() if args.warm_up else None
        for _ in range(args.repeats):
            result["timed"].append(worker.step())
            print({run["name"]: round(result["timed"][-1]["seconds"], 2)}, flush=True)
        result["peak_rss_gb"] = worker.done()["peak_rss_gb"]
    except TRLRunFailed as failure:
        result["error"] = str(failure)
        print(f"TRL configuration {run['name']} failed: {failure}", flush=True)
    finally:
        worker.close()
    return result


# --------------------------------------------------------------------------------------------- the figures
def configuration_summary(result: dict, configuration: dict | None = None) -> dict:
    """One TRL run's figures: median step time over its timed steps (None if it failed), what it generated."""
    timed = result["timed"]
    ready = result.get("ready") or {}
    summary = {"name": result["name"], "error": result["error"],
               "step_s_median": median([t["seconds"] for t in timed]) if timed and not result["error"] else None,
               "step_s": [t["seconds"] for t in timed],
               "warm_up_s": (result["warm_up"] or {}).get("seconds"),
               "mean_completion_length_median": median([t["mean_completion_length"] for t in timed]) if timed else None,
               "clipped_ratio_median": median([t["clipped_ratio"] for t in timed]) if timed else None,
               "peak_rss_gb": result.get("peak_rss_gb"), "threads": ready.get("threads"),
               "prompt_lengths": ready.get("prompt_lengths")}
    if configuration is not None:
        summary.update({"about": configuration["about"], "settings": configuration["grpo_args"],
                        "gradient_checkpointing": ready.get("gradient_checkpointing"), "bf16": ready.get("bf16")})
    return summary


def fastest(summaries: list[dict]) -> dict:
    """The configuration with the lowest median step time among those that ran."""
    ran = [s for s in summaries if s["step_s_median"] is not None]
    if not ran:
        failures = "; ".join(f"{s['name']}: {s['error']}" for s in summaries)
        raise RuntimeError(f"no TRL configuration completed: {failures}")
    return min(ran, key=lambda s: s["step_s_median"])


def tokens_per_step(prompt_lengths: list[int], generations: int, mean_completion_length: float) -> float:
    """Tokens TRL's step runs through the model: every completion with its own copy of its prompt."""
    return generations * (sum(prompt_lengths) + len(prompt_lengths) * mean_completion_length)


def standalone_comparison(in_harness: dict, alone: dict, short: dict, generations: int) -> dict:
    """TRL alone against TRL in the harness (same configuration and prompts), and the short-prompt workload
    against the harness's, as ratios of median step times and of the tokens each step runs through the model."""
    def ratio(a, b):
        return a / b if a and b else None

    tokens = {name: tokens_per_step(run["prompt_lengths"], generations, run["mean_completion_length_median"])
              if run["step_s_median"] else None for name, run in (("harness_prompts", alone), ("short_prompts", short))}
    return {"configuration": in_harness["name"], "in_harness_step_s": in_harness["step_s_median"],
            "alone_step_s": alone["step_s_median"], "alone_short_prompts_step_s": short["step_s_median"],
            "alone_over_in_harness": ratio(alone["step_s_median"], in_harness["step_s_median"]),
            "threads": {"in_harness": in_harness["threads"], "alone": alone["threads"]},
            "clipped_ratio": {"in_harness": in_harness["clipped_ratio_median"], "alone": alone["clipped_ratio_median"],
                              "alone_short_prompts": short["clipped_ratio_median"]},
            "tokens_per_step": tokens,
            "harness_over_short_prompts": {"step_s": ratio(alone["step_s_median"], short["step_s_median"]),
                                           "tokens": ratio(tokens["harness_prompts"], tokens["short_prompts"])}}


def comparison_notes(c: dict) -> list[str]:
    notes = []
    if c["alone_over_in_harness"]:
        notes.append(f"TRL alone on the harness's prompts ({c['configuration']}): {c['alone_step_s']:.1f} s/step vs "
                     f"{c['in_harness_step_s']:.1f} s in the harness (x{c['alone_over_in_harness']:.2f}); threads "
                     f"{c['threads']['alone']} vs {c['threads']['in_harness']}; clipped ratio "
                     f"{c['clipped_ratio']['alone']} vs {c['clipped_ratio']['in_harness']}")
    ratios = c["harness_over_short_prompts"]
    if ratios["step_s"]:
        notes.append(f"TRL alone on short arithmetic prompts: {c['alone_short_prompts_step_s']:.1f} s/step "
                     f"(clipped ratio {c['clipped_ratio']['alone_short_prompts']}); the harness's prompts take "
                     f"x{ratios['step_s']:.2f} the time for x{ratios['tokens']:.2f} the tokens through the model")
    return notes


def ours_steps(repeats: int, configurations: int) -> int:
    """Our timed steps: one before each TRL configuration's block and one after the last, at least ``repeats``."""
    return max(repeats, configurations + 1)


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    load_before = load_average()
    rows = problems(args.problems)
    configurations = trl_configurations(args.problems, args.generations)
    if args.configurations:
        unknown = sorted(set(args.configurations) - {c["name"] for c in configurations})
        if unknown:
            raise SystemExit(f"unknown TRL configurations {unknown}; known: {[c['name'] for c in configurations]}")
        configurations = [c for c in configurations if c["name"] in args.configurations]
    for configuration in configurations:
        configuration["grpo_args"] = trl_grpo_args(args, configuration)
    ours_timed_steps = ours_steps(args.repeats, len(configurations))
    ours_samples: dict = {"warm_up": None, "timed": []}
    with tempfile.TemporaryDirectory(prefix="trl_compare_") as tmp:
        ours = OurSide(args, rows, Path(tmp), args.warm_up + ours_timed_steps)
        messages = ours.prompt_messages(rows)
        solutions = [str(r["answer"]) for r in rows]
        runs = [{"name": c["name"], "grpo": c["grpo_args"], "prompts": messages, "solutions": solutions}
                for c in configurations]

        def ours_step() -> None:
            ours_samples["timed"].append(ours.step())
            print({"ours": round(ours_samples["timed"][-1]["seconds"], 2)}, flush=True)

        try:
            ours_samples["warm_up"] = ours.step() if args.warm_up else None
            side_by_side = [measure_configuration(args, run, Path(tmp), ours_step) for run in runs]
            while len(ours_samples["timed"]) < ours_timed_steps:
                ours_step()
            prompt_lengths = {"ours": ours.prompt_lengths(messages),
                              "trl": next((r["ready"]["prompt_lengths"] for r in side_by_side if r["ready"]), None)}
        finally:
            ours.close()
        summaries = [configuration_summary(r, c) for r, c in zip(side_by_side, configurations)]
        best = fastest(summaries)
        best_configuration = next(c for c in configurations if c["name"] == best["name"])
        short_messages, short_solutions = short_prompts(args.problems)
        standalone = [measure_configuration(args, run, Path(tmp), standalone=True) for run in [
            {"name": f"{best['name']}/harness_prompts", "grpo": best_configuration["grpo_args"], "prompts": messages,
             "solutions": solutions},
            {"name": f"{best['name']}/short_prompts", "grpo": best_configuration["grpo_args"],
             "prompts": short_messages, "solutions": short_solutions}]]
    alone, short = (configuration_summary(r) for r in standalone)
    comparison = standalone_comparison(best, alone, short, args.generations)
    ours_seconds = [s["seconds"] for s in ours_samples["timed"]]
    ours_median = median(ours_seconds)
    ratio = ours_median / best["step_s_median"]
    medians = {
        "ours_step_s": ours_median,
        **{f"trl_{s['name']}_step_s": s["step_s_median"] for s in summaries},
        "fastest_trl_step_s": best["step_s_median"],
        "ratio": ratio,
        "ours_mean_completion_length": median([s["mean_completion_length"] for s in ours_samples["timed"]]),
        "ours_generate_s": median([s["generate_s"] for s in ours_samples["timed"]]),
        "ours_update_s": median([s["update_s"] for s in ours_samples["timed"]]),
        "trl_standalone_step_s": alone["step_s_median"],
        "trl_standalone_short_prompts_step_s": short["step_s_median"],
    }
    failed = [s["name"] for s in summaries if s["error"]]
    notes = [f"prompt token counts, ours vs TRL: {prompt_lengths['ours']} vs {prompt_lengths['trl']}",
             f"fastest TRL configuration: {best['name']} ({best['about']})",
             *[f"{name} did not complete under the {args.memory_cap_gb} GB address-space cap (or failed): "
               f"{next(s['error'] for s in summaries if s['name'] == name)}" for name in failed],
             *comparison_notes(comparison)]
    config = {"model": args.model, "weights": "float32", "problems": args.problems, "generations": args.generations,
              "max_tokens": args.max_tokens, "repeats": args.repeats, "warm_up": args.warm_up,
              "ours_timed_steps": ours_timed_steps,
              "threads": args.threads, "memory_cap_gb": args.memory_cap_gb,
              "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0}, "learning_rate": LEARNING_RATE,
              "weight_decay": WEIGHT_DECAY, "max_grad_norm": MAX_GRAD_NORM, "kl": "off (beta=0)",
              "our_overrides": ours.overrides, "optimizer_updates_per_step": 1,
              "trl_reward": "trl.rewards.accuracy_reward", "prompt_lengths": prompt_lengths,
              "trl_version": _trl_version()}
    samples = {"ours": ours_samples, "trl": side_by_side, "standalone": standalone}
    extra = {"trl_configurations": summaries, "ours_step_s_median": ours_median, "ratio": ratio,
             "fastest_trl_configuration": best["name"], "standalone": [alone, short],
             "standalone_comparison": comparison}
    path = write_result(NAME, argv, quick=args.quick, directory=out_dir(args.out_dir, args.quick), config=config,
                        samples=samples, medians=medians, measured=ratio, target=TARGET, op="<=",
                        metric="our median step time / the fastest TRL configuration's median step time",
                        load_before=load_before, threads=args.threads, notes=notes, extra=extra)
    return {"path": str(path), "medians": medians}


def _trl_version() -> str:
    out = subprocess.run([str(TRL_PYTHON), "-c", "import trl; print(trl.__version__)"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
