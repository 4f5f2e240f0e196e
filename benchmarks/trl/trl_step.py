"""The TRL side of benchmarks/trl_compare.py: TRL's GRPOTrainer, one optimizer update per step, on command.

Runs in .venv-trl (benchmarks/trl/setup.sh); it imports nothing from pettingllms. The driver writes a JSON
settings file and starts ``.venv-trl/bin/python benchmarks/trl/trl_step.py SETTINGS.json``; then, for every
step, it writes ``go`` on stdin and reads one ``TRL_STEP {...}`` line from stdout. A step is timed from
``on_step_begin`` (before TRL generates) to ``on_step_end`` (after the optimizer step and the LR scheduler):
generation, reward, advantages, forward, backward and the update.

Settings keys: model_dir, prompts (chat message lists), solutions, num_generations, max_completion_length,
per_device_train_batch_size, gradient_accumulation_steps, steps, learning_rate, weight_decay, max_grad_norm, temperature, top_p, top_k, threads, output_dir.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.rewards import accuracy_reward  # noqa: E402

MARKER = "TRL_STEP "


class StepClock(TrainerCallback):
    """Waits for ``go`` before each step, times it, and reports it once TRL has logged the step's metrics."""

    def __init__(self) -> None:
        self.start = self.seconds = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("trl_step: expected 'go' on stdin")
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds = time.perf_counter() - self.start

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "completions/mean_length" not in logs:
            return  # the end-of-training summary, not a step
        report = {"step": state.global_step, "seconds": self.seconds,
                  "mean_completion_length": logs["completions/mean_length"], "reward": logs.get("reward"),
                  "clipped_ratio": logs.get("completions/clipped_ratio")}
        print(MARKER + json.dumps(report), flush=True)


def main() -> None:
    with open(sys.argv[1]) as f:
        settings = json.load(f)
    torch.set_num_threads(settings["threads"])
    k = settings["num_generations"]
    if settings["per_device_train_batch_size"] * settings["gradient_accumulation_steps"] != len(settings["prompts"]) * k:
        raise SystemExit("trl_step: per_device_train_batch_size x gradient_accumulation_steps must equal B x K")
    dataset = Dataset.from_list([{"prompt": p, "solution": s}
                                 for p, s in zip(settings["prompts"], settings["solutions"])])
    args = GRPOConfig(
        output_dir=settings["output_dir"],
        # One generation round of B prompts x K completions and one optimizer update per step, the update
        # accumulated over micro-batches (per_device_train_batch_size x gradient_accumulation_steps = B x K;
        # steps_per_generation defaults to gradient_accumulation_steps, so TRL generates once per update).
        per_device_train_batch_size=settings["per_device_train_batch_size"],
        gradient_accumulation_steps=settings["gradient_accumulation_steps"],
        num_generations=k,
        max_completion_length=settings["max_completion_length"],
        max_steps=settings["steps"],
        learning_rate=settings["learning_rate"],
        lr_scheduler_type="constant",
        weight_decay=settings["weight_decay"],
        max_grad_norm=settings["max_grad_norm"],
        temperature=settings["temperature"],
        top_p=settings["top_p"],
        top_k=settings["top_k"],
        beta=0.0,  # no reference model, like the other side (KL off)
        bf16=False,  # fp32 on both sides
        use_cpu=True,
        gradient_checkpointing=False,  # off on both sides
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    model = AutoModelForCausalLM.from_pretrained(settings["model_dir"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"])
    trainer = GRPOTrainer(model=model, reward_funcs=accuracy_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepClock()])
    prompt_lengths = [len(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True)["input_ids"])
                      for p in settings["prompts"]]
    print("TRL_READY " + json.dumps({"prompt_lengths": prompt_lengths}), flush=True)
    trainer.train()


if __name__ == "__main__":
    main()
