"""One single-agent, single-turn GRPO step: our Trainer against TRL's GRPOTrainer, side by side (issue #7, 3).

Workload: the math env's reasoner alone (L0, one turn) on B offline GSM-style problems (reasoning-gym
gsm_symbolic), SmolLM2-135M in fp32 on CPU, K completions per prompt of at most T new tokens, plain
temperature-1 sampling (top_k=0, top_p=1.0 on both sides), no KL and no reference model, gradient
checkpointing off, one optimizer update per step. Both sides see the very same chat messages (the reasoner's
one-shot prompt) for the very same B problems at every step.

- Ours: ``Trainer.step`` (rollout with the executor and HFEngine, rewards, groups and advantages, the
  learner's update), in-process (``resources.use_ray=false``), timed around the call.
- TRL: ``GRPOTrainer`` with ``num_generations=K``, ``max_completion_length=T``, its own math-verify accuracy
  reward, in .venv-trl (``bash benchmarks/trl/setup.sh``), timed from ``on_step_begin`` to ``on_step_end`` by
  benchmarks/trl/trl_step.py. Each step is one generation round of B x K completions and exactly one
  optimizer update, accumulated over B micro-batches of K rows (``per_device_train_batch_size=K``,
  ``gradient_accumulation_steps=B``; TRL shuffles the generated rows before splitting them).
  In one batch of B x K rows (no accumulation) TRL's fp32 backward on the default workload needs about 18 GB
  and was killed by the OOM killer on this 24 GB machine; our learner splits its update by a token budget
  (``optim.micro_batch_max_tokens``, default) in the same way.
Both processes stay up; steps alternate (ours, TRL, ours, TRL, ...) after one untimed warm-up step each, and
each side uses the same torch thread count. Figure: median step time, ours / TRL; target <= 0.75.

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

from _report import load_average, median, out_dir, write_result  # noqa: E402

NAME = "trl_compare"
TARGET = 0.75
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
TRL_WORKER = ROOT / "benchmarks" / "trl" / "trl_step.py"
DATASET = "trl_compare"
LEARNING_RATE = 1e-6
WEIGHT_DECAY = 0.01
MAX_GRAD_NORM = 1.0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--problems", type=int, default=4, help="B: prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="K: completions per prompt")
    parser.add_argument("--max-tokens", type=int, default=64, help="T: max new tokens per completion")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per side")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny random model and tiny sizes (smoke test)")
    parser.add_argument("--out-dir")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.problems, args.generations, args.max_tokens, args.repeats = "tiny-random-smollm2", 2, 2, 8, 1
    return args


def problems(count: int) -> list[dict]:
    from pettingllms.data.math_sources import PROCEDURAL_SOURCES

    return PROCEDURAL_SOURCES["gsm_symbolic"].generate("train", count, 0)


class OurSide:
    """Our real Trainer on an L0 config; ``step()`` runs and times one ``Trainer.step``."""

    def __init__(self, args: argparse.Namespace, rows: list[dict], workdir: Path) -> None:
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
            f"training.total_training_steps={args.repeats + 1}", "training.val_freq=0",
            "training.val_before_train=false", "training.export_hf=false", "training.plot=false",
            "training.resume=none", f"training.log_dir={workdir / 'logs'}", "training.experiment_name=trl_compare",
            f"optim.lr={LEARNING_RATE}", "optim.warmup_steps=0", "optim.min_lr_ratio=1.0",
            f"optim.weight_decay={WEIGHT_DECAY}", f"optim.grad_clip={MAX_GRAD_NORM}",
            "resources.use_ray=false", f"resources.num_cpus={args.threads}",
        ]
        self.trainer = Trainer(to_schema(compose("math", self.overrides)))
        self.steps = 0
        self.sequences = args.problems * args.generations

    def step(self) -> dict:
        self.steps += 1
        start = time.perf_counter()
        metrics = self.trainer.step(self.steps).metrics
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "mean_completion_length": metrics["policy_0/reasoner/response_length_mean"],
                "sequences": metrics["policy_0/reasoner/samples"], "reward": metrics["policy_0/reasoner/reward_mean"],
                "generate_s": metrics["timing/generate_s"], "update_s": metrics["timing/update_s"]}

    def prompt_messages(self, rows: list[dict]) -> list[list[dict]]:
        """The reasoner's turn-0 chat messages for each problem: exactly what our side sends to its policy."""
        from pettingllms.core import Problem

        env, agent = self.trainer.plan.env, self.trainer.plan.agent_specs["reasoner"].agent
        return [[dict(m) for m in agent.observe(env.reset(Problem(r["id"], r), 0), 0)] for r in rows]

    def prompt_lengths(self, messages: list[list[dict]]) -> list[int]:
        codec = self.trainer.policies.workers["policy_0"].codec
        return [len(codec.encode_chat(m)) for m in messages]

    def close(self) -> None:
        self.trainer.close()


class TRLSide:
    """TRL's GRPOTrainer in .venv-trl, driven one step at a time over stdin/stdout."""

    def __init__(self, args: argparse.Namespace, messages: list[list[dict]], rows: list[dict], workdir: Path) -> None:
        from pettingllms.models import resolve_model

        if not TRL_PYTHON.is_file():
            raise SystemExit(f"{TRL_PYTHON} not found: run `bash benchmarks/trl/setup.sh` first")
        settings = {
            "model_dir": str(resolve_model(args.model)), "prompts": messages,
            "solutions": [str(r["answer"]) for r in rows], "num_generations": args.generations,
            "max_completion_length": args.max_tokens, "steps": args.repeats + 1,
            "per_device_train_batch_size": args.generations, "gradient_accumulation_steps": args.problems,
            "learning_rate": LEARNING_RATE, "weight_decay": WEIGHT_DECAY, "max_grad_norm": MAX_GRAD_NORM,
            "temperature": 1.0, "top_p": 1.0, "top_k": 0, "threads": args.threads,
            "output_dir": str(workdir / "trl_out"),
        }
        path = workdir / "trl_settings.json"
        path.write_text(json.dumps(settings))
        self.log = open(workdir / "trl_stderr.log", "w")
        self.process = subprocess.Popen([str(TRL_PYTHON), str(TRL_WORKER), str(path)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=ROOT)
        self.ready = self._read("TRL_READY ")

    def step(self) -> dict:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        return self._read("TRL_STEP ")

    def _read(self, marker: str) -> dict:
        for line in self.process.stdout:
            if line.startswith(marker):
                return json.loads(line[len(marker):])
        self.log.flush()
        tail = Path(self.log.name).read_text()[-3000:]
        raise RuntimeError(f"the TRL worker exited (code {self.process.wait()}) before {marker.strip()}:\n{tail}")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    load_before = load_average()
    rows = problems(args.problems)
    with tempfile.TemporaryDirectory(prefix="trl_compare_") as tmp:
        ours = OurSide(args, rows, Path(tmp))
        messages = ours.prompt_messages(rows)
        trl = TRLSide(args, messages, rows, Path(tmp))
        try:
            warm_up = {"ours": ours.step(), "trl": trl.step()}
            samples = []
            for _ in range(args.repeats):
                pair = {"ours": ours.step(), "trl": trl.step()}
                pair["ratio"] = pair["ours"]["seconds"] / pair["trl"]["seconds"]
                print({side: v if isinstance(v, float) else {k: round(x, 3) if isinstance(x, float) else x
                                                            for k, x in v.items()} for side, v in pair.items()})
                samples.append(pair)
            prompt_lengths = {"ours": ours.prompt_lengths(messages), "trl": trl.ready["prompt_lengths"]}
        finally:
            trl.close()
            ours.close()
    medians = {
        "ours_step_s": median([s["ours"]["seconds"] for s in samples]),
        "trl_step_s": median([s["trl"]["seconds"] for s in samples]),
        "ours_mean_completion_length": median([s["ours"]["mean_completion_length"] for s in samples]),
        "trl_mean_completion_length": median([s["trl"]["mean_completion_length"] for s in samples]),
        "ours_generate_s": median([s["ours"]["generate_s"] for s in samples]),
        "ours_update_s": median([s["ours"]["update_s"] for s in samples]),
        "ratio_of_medians": None,
        "paired_ratio": median([s["ratio"] for s in samples]),
    }
    medians["ratio_of_medians"] = medians["ours_step_s"] / medians["trl_step_s"]
    notes = [f"prompt token counts, ours vs TRL: {prompt_lengths['ours']} vs {prompt_lengths['trl']}",
             "completion lengths differ by sampling; ms per generated token is in medians for reference"]
    seq = args.problems * args.generations
    medians["ours_ms_per_completion_token"] = 1000 * medians["ours_step_s"] / (seq * medians["ours_mean_completion_length"])
    medians["trl_ms_per_completion_token"] = 1000 * medians["trl_step_s"] / (seq * medians["trl_mean_completion_length"])
    config = {"model": args.model, "dtype": "float32", "problems": args.problems, "generations": args.generations,
              "max_tokens": args.max_tokens, "repeats": args.repeats, "threads": args.threads,
              "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0}, "learning_rate": LEARNING_RATE,
              "weight_decay": WEIGHT_DECAY, "max_grad_norm": MAX_GRAD_NORM, "kl": "off (beta=0)",
              "gradient_checkpointing": False, "our_overrides": ours.overrides,
              "trl_args": {"per_device_train_batch_size": args.generations,
                           "gradient_accumulation_steps": args.problems, "optimizer_updates_per_step": 1,
                           "num_generations": args.generations, "max_completion_length": args.max_tokens,
                           "loss_type": "dapo (TRL default)", "reward": "trl.rewards.accuracy_reward"},
              "prompt_lengths": prompt_lengths, "trl_version": _trl_version()}
    path = write_result(NAME, argv, quick=args.quick, directory=out_dir(args.out_dir, args.quick), config=config,
                        samples={"warm_up": warm_up, "timed": samples}, medians=medians,
                        measured=medians["ratio_of_medians"], target=TARGET, op="<=",
                        metric="our median step time / TRL median step time", load_before=load_before,
                        threads=args.threads, notes=notes)
    return {"path": str(path), "medians": medians}


def _trl_version() -> str:
    out = subprocess.run([str(TRL_PYTHON), "-c", "import trl; print(trl.__version__)"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
