"""The TRL side of benchmarks/trl_compare.py: TRL's GRPOTrainer in one configuration, one optimizer update per
step.

Runs in .venv-trl (benchmarks/trl/setup.sh); it imports nothing from pettingllms. The driver writes a JSON
settings file and starts ``.venv-trl/bin/python benchmarks/trl/trl_step.py SETTINGS.json``, one process per
configuration (memory a run leaves behind never counts against the next one's cap). The process builds the
model and trainer and prints ``TRL_READY {...}``; then per step it waits for ``go`` on stdin and prints one
``TRL_STEP {...}`` line; it ends with ``TRL_DONE {...}``, or ``TRL_FAILED {...}`` with the error (e.g. an
allocation over the memory cap). With ``--standalone`` the steps run back to back without waiting for ``go``
(TRL alone on the machine). A step is timed from ``on_step_begin`` (before TRL generates) to ``on_step_end``
(after the optimizer step and the LR scheduler): generation, reward, advantages, forward, backward, update.

Settings keys: model_dir, threads, output_dir, memory_cap_gb (optional: the process's address-space limit, so
a configuration too big for the machine fails here with an allocation error instead of waking the OOM killer),
name, prompts (chat message lists), solutions, steps, and grpo: the ``GRPOConfig`` arguments of the
configuration, passed through as they are (the driver decides them).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

STARTED = time.perf_counter()  # before the heavy imports: the process's start-up is part of what READY reports
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.rewards import accuracy_reward  # noqa: E402

MARKER = "TRL_STEP "


def peak_rss_gb() -> float:
    """This process's peak resident memory (VmHWM, in KiB)."""
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kib / 2**20


class StepClock(TrainerCallback):
    """Waits for ``go`` before each step (unless standalone), times it, and reports it once TRL has logged the
    step's metrics."""

    def __init__(self, standalone: bool) -> None:
        self.standalone = standalone
        self.start = self.seconds = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        if not self.standalone and sys.stdin.readline().strip() != "go":
            raise SystemExit("trl_step: expected 'go' on stdin")
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds = time.perf_counter() - self.start

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "completions/mean_length" not in logs:
            return  # the end-of-training summary, not a step
        report = {"step": state.global_step, "seconds": self.seconds,
                  "mean_completion_length": logs["completions/mean_length"], "reward": logs.get("reward"),
                  "clipped_ratio": logs.get("completions/clipped_ratio"), "peak_rss_gb": peak_rss_gb()}
        print(MARKER + json.dumps(report), flush=True)


def run(settings: dict, standalone: bool) -> None:
    """The configuration: a fresh fp32 model and GRPOTrainer, ``settings["steps"]`` steps."""
    grpo = settings["grpo"]
    rows = grpo["per_device_train_batch_size"] * grpo["gradient_accumulation_steps"]
    if rows != len(settings["prompts"]) * grpo["num_generations"]:
        raise SystemExit(f"trl_step: {settings['name']}: per_device_train_batch_size x gradient_accumulation_steps "
                         f"must equal B x K (one generation round, one optimizer update per step)")
    dataset = Dataset.from_list([{"prompt": p, "solution": s}
                                 for p, s in zip(settings["prompts"], settings["solutions"])])
    args = GRPOConfig(output_dir=settings["output_dir"], max_steps=settings["steps"], use_cpu=True, logging_steps=1,
                      save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0, seed=0,
                      **grpo)
    # fp32 weights in every configuration (the same model as the other side); bf16=True is autocast over them.
    model = AutoModelForCausalLM.from_pretrained(settings["model_dir"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"])
    trainer = GRPOTrainer(model=model, reward_funcs=accuracy_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepClock(standalone)])
    prompt_lengths = [len(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True)["input_ids"])
                      for p in settings["prompts"]]
    ready = {"name": settings["name"], "prompt_lengths": prompt_lengths, "threads": torch.get_num_threads(),
             "since_process_start_s": time.perf_counter() - STARTED,
             "gradient_checkpointing": args.gradient_checkpointing, "bf16": args.bf16,
             "per_device_train_batch_size": args.per_device_train_batch_size,
             "gradient_accumulation_steps": args.gradient_accumulation_steps,
             "steps_per_generation": args.steps_per_generation, "generation_batch_size": args.generation_batch_size}
    print("TRL_READY " + json.dumps(ready), flush=True)
    trainer.train()


def main(argv: list[str]) -> None:
    standalone = "--standalone" in argv
    with open([a for a in argv if not a.startswith("--")][0]) as f:
        settings = json.load(f)
    # On a shared machine out of memory, the kernel kills this benchmark process first, not someone else's work.
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    if settings.get("memory_cap_gb"):
        cap = int(settings["memory_cap_gb"] * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    torch.set_num_threads(settings["threads"])
    try:
        run(settings, standalone)
    except (RuntimeError, MemoryError) as error:  # torch reports a failed allocation as a RuntimeError
        print("TRL_FAILED " + json.dumps({"name": settings["name"], "error": f"{type(error).__name__}: {error}"[:500],
                                           "peak_rss_gb": peak_rss_gb()}), flush=True)
        raise SystemExit(1)
    print("TRL_DONE " + json.dumps({"name": settings["name"], "peak_rss_gb": peak_rss_gb()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
