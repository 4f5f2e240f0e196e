"""The chunked LM head (``optim.logprob_chunk_tokens``) against the dense one: peak memory and time of one learner
update at Qwen3's 151,936-token vocabulary, on CPU.

    .venv/bin/python benchmarks/logprob_head.py [--tokens 4096] [--chunk 1024] [--repeats 3] [--threads 2]
    .venv/bin/python benchmarks/logprob_head.py --quick     # small vocabulary and lengths (checks the script)

The model: Qwen3's vocabulary and tied head (what the logits term depends on) on a small trunk (hidden 512, two
layers), random weights, float32. The update: ``PolicyLearner.accumulate_gradients`` (forward, loss, backward; no
optimiser step) of 2 samples whose responses fill ``--tokens`` logit positions in one micro-batch. Each head runs
in a fresh child process; its peak is the growth of the process's peak RSS (``ru_maxrss``) over the update, beside
the memory plan's logits term for the same tokens (``assembly/memory.py::logits_bytes``). The figure: the dense
update's peak growth over the chunked one's (target >= 2: the logits term dominates at this vocabulary).

Writes benchmarks/results/logprob_head.json (``--quick``: a temp folder).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import learner_config, load_average, out_dir, write_result  # noqa: E402

NAME = "logprob_head"
VOCAB, QUICK_VOCAB = 151_936, 4096
MiB = 2**20


def build(vocab: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=vocab, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True)
    return Qwen3ForCausalLM(config)


def samples(vocab: int, tokens: int):
    from pettingllms.core.types import Sample

    prompt = 24
    response = tokens // 2 - prompt
    out = []
    for i in range(2):
        ids = [(7 * j + 13 * i) % (vocab - 1) + 1 for j in range(prompt + response)]
        out.append(Sample(policy="policy_0", agent="solver", turn=0, group=(0, 0, "solver"), episode=f"e{i}",
                          problem_id="p0", branch=i, prompt_ids=tuple(ids[:prompt]), response_ids=tuple(ids[prompt:]),
                          response_logprobs=(), reward=float(i)))
    return out


def child(mode_chunk: int, vocab: int, tokens: int, repeats: int, threads: int) -> dict:
    """One head in this process: the update's peak RSS growth and its seconds."""
    import torch

    from pettingllms.learner import PolicyLearner

    torch.set_num_threads(threads)
    model = build(vocab)
    batch = samples(vocab, tokens)
    config = learner_config(total_steps=1, micro_batch_max_tokens=tokens, logprob_chunk_tokens=mode_chunk)
    learner = PolicyLearner(model, config)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seconds = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=False)
        start = time.perf_counter()
        learner.accumulate_gradients(batch, [1.0, -1.0])
        seconds.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_growth_mib": (peak - before) / MiB, "seconds": seconds}


def planned_logits_mib(vocab: int, logit_tokens: int, chunk: int) -> float:
    from pettingllms.learner.footprint import LearnerSetup, logits_bytes
    from pettingllms.models.shape import ModelShape

    shape = ModelShape(model_type="qwen3", vocab=vocab, hidden=512, layers=2, heads=8, kv_heads=4, head_dim=64,
                       intermediate=1024, tied=True, qk_norm=True)
    setup = LearnerSetup(compute_bytes=4, tokens=logit_tokens, logit_tokens=logit_tokens,
                         logprob_chunk_tokens=chunk)
    return logits_bytes(shape, setup) / MiB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out-dir")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    vocab = QUICK_VOCAB if args.quick else VOCAB
    if args.quick:
        args.tokens, args.chunk, args.repeats = 256, 64, 1
    if args.child is not None:
        print(json.dumps(child(args.child, vocab, args.tokens, args.repeats, args.threads)))
        return 0
    load_before = load_average()
    results = {}
    for name, chunk in (("dense", 0), ("chunked", args.chunk)):
        command = [sys.executable, __file__, "--child", str(chunk), "--tokens", str(args.tokens), "--repeats",
                   str(args.repeats), "--threads", str(args.threads), *(["--quick"] if args.quick else [])]
        run = subprocess.run(command, capture_output=True, text=True, check=True)
        results[name] = json.loads(run.stdout.strip().splitlines()[-1])
        logit_tokens = args.tokens - 2 * 24 + 2  # every response position plus each row's last prompt column
        results[name]["planned_logits_mib"] = planned_logits_mib(vocab, logit_tokens, chunk)
        print(f"{name}: peak growth {results[name]['peak_growth_mib']:.0f} MiB (plan's logits term "
              f"{results[name]['planned_logits_mib']:.0f} MiB), update {statistics.median(results[name]['seconds']):.2f} s")
    ratio = results["dense"]["peak_growth_mib"] / max(1.0, results["chunked"]["peak_growth_mib"])
    medians = {name: {"peak_growth_mib": r["peak_growth_mib"], "update_s": statistics.median(r["seconds"])}
               for name, r in results.items()}
    medians["update_time_ratio_chunked_over_dense"] = medians["chunked"]["update_s"] / medians["dense"]["update_s"]
    write_result(NAME, argv if argv is not None else sys.argv[1:], quick=args.quick,
                 directory=out_dir(args.out_dir, args.quick),
                 config={"vocab": vocab, "tokens": args.tokens, "chunk": args.chunk, "repeats": args.repeats,
                         "model": "Qwen3 vocabulary, tied head, hidden 512, 2 layers, float32"},
                 samples=results, medians=medians, measured=ratio, target=2.0, op=">=",
                 metric="dense update's peak RSS growth / chunked update's", load_before=load_before,
                 threads=args.threads,
                 notes=["peak growth: ru_maxrss after the updates minus before them, in a fresh process per head",
                        "planned_logits_mib: assembly/memory.py's logits term for the same logit positions"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
