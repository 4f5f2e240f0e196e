"""HFEngine vs bare ``model.generate`` on the packaged SmolLM2-135M-Instruct, fp32 and bf16.

Workload (the TRL comparison in docs/DESIGN): 4 chat prompts x n=8 samples x up to 64 new tokens, plain
temperature-1 sampling (top_k=0, top_p=1.0, passed explicitly to both). Each side produces the same 32
completions' worth of work; runs are paired (engine, generate, engine, generate, ...) and the median of
``--repeats`` is reported. Tokens counted = response tokens up to and including the first eos.

    .venv/bin/python benchmarks/engine_throughput.py [--repeats 3] [--threads 2]
    .venv/bin/python benchmarks/engine_throughput.py --quick    # tiny random model, 8 tokens, 1 repeat (smoke test)

Writes benchmarks/results/engine_throughput.json (or ``--out-dir``; ``--quick``: a temp folder).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from pettingllms.core.types import GenerationRequest, SamplingParams  # noqa: E402
from pettingllms.models import HFChatCodec, load_model, resolve_model  # noqa: E402
from pettingllms.rollout.hf_engine import HFEngine, left_pad  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import out_dir  # noqa: E402

QUESTIONS = [
    "What is 17 + 25? Think step by step, then give the answer.",
    "A box holds 6 rows of 7 apples. How many apples are in the box?",
    "Tom had 40 marbles and gave away 13. How many does he have left?",
    "What is 9 times 8 minus 5?",
]
SAMPLES_PER_PROMPT = 8
MAX_NEW_TOKENS = 64
MODEL = "smollm2-135m-instruct"
QUICK_MODEL, QUICK_MAX_NEW_TOKENS = "tiny-random-smollm2", 8


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model_name, max_new_tokens = (QUICK_MODEL, QUICK_MAX_NEW_TOKENS) if args.quick else (MODEL, MAX_NEW_TOKENS)
    model_dir = resolve_model(model_name)
    codec = HFChatCodec.from_pretrained(model_dir)
    prompts = [codec.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    report = {"quick": args.quick, "machine": machine_info(args.threads),
              "workload": workload(prompts, model_name, max_new_tokens), "results": {}}
    for dtype in ("float32", "bfloat16"):
        model = load_model(model_dir, dtype=dtype)
        report["results"][dtype] = compare(model, codec, prompts, args.repeats, max_new_tokens)
        print(json.dumps({dtype: report["results"][dtype]["summary"]}, indent=2))
        del model
    path = out_dir(args.out_dir, args.quick) / "engine_throughput.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return report


def compare(model, codec, prompts, repeats: int, max_new_tokens: int = MAX_NEW_TOKENS) -> dict:
    engine = HFEngine(model, codec, seed=0)
    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_new_tokens)
    requests = [GenerationRequest(f"p{i}", tuple(p), SAMPLES_PER_PROMPT, sampling) for i, p in enumerate(prompts)]
    warm_up(engine, model, codec, prompts)
    runs = {"engine": [], "generate": []}
    for repeat in range(repeats):
        runs["engine"].append(time_engine(engine, requests))
        runs["generate"].append(time_generate(model, codec, prompts, seed=repeat, max_new_tokens=max_new_tokens))
    summary = {}
    for name, measured in runs.items():
        seconds = statistics.median(r["seconds"] for r in measured)
        tokens_per_s = statistics.median(r["tokens"] / r["seconds"] for r in measured)
        summary[name] = {
            "median_seconds": round(seconds, 3),
            "median_tokens_per_s": round(tokens_per_s, 1),
            "mean_completion_tokens": round(statistics.mean(r["tokens"] for r in measured) / 32, 1),
        }
    summary["speedup_wall"] = round(summary["generate"]["median_seconds"] / summary["engine"]["median_seconds"], 2)
    summary["speedup_tokens_per_s"] = round(
        summary["engine"]["median_tokens_per_s"] / summary["generate"]["median_tokens_per_s"], 2
    )
    return {"summary": summary, "runs": runs}


def warm_up(engine, model, codec, prompts) -> None:
    short = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=4)
    engine.generate([GenerationRequest("warm", tuple(prompts[0]), 2, short)])
    time_generate(model, codec, prompts[:1], seed=0, max_new_tokens=4)


def time_engine(engine, requests) -> dict:
    start = time.perf_counter()
    results = engine.generate(requests)
    seconds = time.perf_counter() - start
    lengths = [len(c.token_ids) for r in results for c in r.completions]
    return {"seconds": seconds, "tokens": sum(lengths), "completions": len(lengths)}


def time_generate(model, codec, prompts, *, seed: int, max_new_tokens: int = MAX_NEW_TOKENS) -> dict:
    rows = [p for p in prompts for _ in range(SAMPLES_PER_PROMPT)]
    input_ids, attention_mask, _ = left_pad(rows, codec.pad_token_id)
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(codec.eos_token_ids),
            pad_token_id=codec.pad_token_id,
        )
    seconds = time.perf_counter() - start
    responses = output[:, input_ids.shape[1] :].tolist()
    tokens = sum(response_length(r, codec.eos_token_ids) for r in responses)
    return {"seconds": seconds, "tokens": tokens, "completions": len(rows)}


def response_length(ids: list[int], eos_ids) -> int:
    for position, token in enumerate(ids):
        if token in eos_ids:
            return position + 1
    return len(ids)


def workload(prompts, model_name: str = MODEL, max_new_tokens: int = MAX_NEW_TOKENS) -> dict:
    return {
        "model": f"{MODEL} (packaged GGUF Q4_1, dequantized)" if model_name == MODEL else model_name,
        "prompts": len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "samples_per_prompt": SAMPLES_PER_PROMPT,
        "max_new_tokens": max_new_tokens,
        "sampling": {"temperature": 1.0, "top_k": 0, "top_p": 1.0},
    }


def machine_info(threads: int) -> dict:
    cpu, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == platform.processor():
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        # bf16 matmuls are only fast with native support (avx512_bf16 / amx_bf16); AVX2-only CPUs emulate them.
        "cpu_simd": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni"}),
        "load_average_at_start": os.getloadavg()[0],
        "torch_threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny random model, 8 new tokens, 1 repeat (smoke test)")
    parser.add_argument("--out-dir", help="where to write the JSON (default benchmarks/results)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    return args


if __name__ == "__main__":
    main()
