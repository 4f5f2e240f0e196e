"""The executor against a naive per-episode sequential loop doing the same work (issue #7, benchmark 2).

The naive loop is what a straightforward port of the public reference's per-episode rollout does without a
batching inference server: one episode at a time, and inside it one generation request at a time, one
sequence per request (the reference sends one request per branch). It is the same tree algorithm: per turn
and stage, K candidates per agent, each stepped on its own copy of the state and scored ``alpha * team +
local``, greedy selection with lowest-index ties, then the stage's chosen actions applied in agent order. It
uses the same engine, model, env, agents, sampling settings, problems, K and turns as the executor (the
workload of benchmarks/rollout_efficiency.py: ``arith_duo`` by default; its docstring says why not ``math``).

The executor batches every waiting episode's requests into one call per flush and shares each node's prompt
prefill across its K samples. Runs alternate (executor, naive, executor, naive, ...) so machine noise hits
both. Sampling differs between the two, so episodes may end at different turns: the primary figure is the
ratio of generated tokens per second (executor / naive); the ratio of wall time per rollout is recorded too.
Target: at least 5x.

    python benchmarks/naive_loop.py [--env arith_duo|math] [--problems 8] [--branching 4] [--repeats 3]
    python benchmarks/naive_loop.py --quick

Writes benchmarks/results/naive_loop.json (or ``--out-dir``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import median, out_dir, write_result  # noqa: E402
from rollout_efficiency import RecordingClient, Workload, generated_tokens, prepare  # noqa: E402

from pettingllms.core import GenerationRequest, Problem, SamplingParams  # noqa: E402

NAME = "naive_loop"
TARGET = 5.0


def naive_rollout(work: Workload, problems: Sequence[Problem], seeds: Sequence[int]) -> dict[str, float]:
    """Tree episodes one after another; every candidate is its own single-sequence engine call."""
    env, config = work.plan.env, work.plan.executor_config
    tokens = calls = 0
    turns_total = 0
    for slot, (problem, seed) in enumerate(zip(problems, seeds)):
        state = env.reset(problem, seed)
        done = False
        turn = 0
        for turn in range(env.max_turns):
            for stage in env.graph.stages(turn):
                chosen: list[tuple[str, Any, Any]] = []  # (agent, action, transition) per agent of the stage
                for name in stage:
                    spec = work.plan.agent_specs[name]
                    prompt = tuple(work.codec.encode_chat(spec.agent.observe(state, turn)))
                    sampling = _capped(spec.train_sampling, config.max_response_length)
                    best = None  # (reward, action, transition)
                    for branch in range(config.branching):
                        request = GenerationRequest(f"p{slot}/t{turn}/{name}/b{branch}", prompt, 1, sampling)
                        completion = work.engine.generate([request])[0].completions[0]
                        calls += 1
                        tokens += len(completion.token_ids)
                        if completion.failed:
                            continue
                        action = spec.agent.parse(completion.text)
                        transition = env.step(state, name, action)
                        reward = config.alpha * env.team_reward(transition.state) + \
                            spec.agent.local_reward(transition.state)
                        if best is None or reward > best[0]:
                            best = (reward, action, transition)
                    if best is None:
                        done = True  # every candidate failed: the episode cannot go on
                        break
                    chosen.append((name, best[1], best[2]))
                if done:
                    break
                state, done = _apply(env, state, chosen)
                if done:
                    break
            if done:
                break
        turns_total += turn + 1
    return {"tokens": tokens, "calls": calls, "turns_mean": turns_total / len(problems)}


def _apply(env, state, chosen) -> tuple[Any, bool]:
    """The state after a stage: the first agent's chosen transition, then the others' actions in order."""
    _, _, first = chosen[0]
    state, done = first.state, first.terminated or first.truncated
    for name, action, _ in chosen[1:]:
        if done:
            break
        step = env.step(state, name, action)
        state, done = step.state, step.terminated or step.truncated
    return state, done


def _capped(sampling: SamplingParams, max_response_length: int) -> SamplingParams:
    if sampling.max_tokens <= max_response_length:
        return sampling
    return SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, max_response_length)


def executor_run(work: Workload, rng_seed: int) -> dict[str, float]:
    work.engine.generator.manual_seed(rng_seed)
    client = RecordingClient(work.engine, work.codec)
    start = time.perf_counter()
    rollout = work.executor(client).run(work.problems, list(range(len(work.problems))))
    seconds = time.perf_counter() - start
    tokens = sum(generated_tokens(results) for _, results in client.calls)
    turns = sum(e.turns for e in rollout.episodes) / len(rollout.episodes)
    return {"seconds": seconds, "tokens": tokens, "calls": len(client.calls), "turns_mean": turns,
            "tokens_per_s": tokens / seconds}


def naive_run(work: Workload, rng_seed: int) -> dict[str, float]:
    work.engine.generator.manual_seed(rng_seed)
    start = time.perf_counter()
    counts = naive_rollout(work, work.problems, list(range(len(work.problems))))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, **counts, "tokens_per_s": counts["tokens"] / seconds}


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, work, load_before = prepare(argv, __doc__.splitlines()[0])
    samples = []
    for repeat in range(args.repeats):
        executor = executor_run(work, rng_seed=1000 + repeat)
        naive = naive_run(work, rng_seed=1000 + repeat)
        sample = {"executor": executor, "naive": naive,
                  "tokens_per_s_ratio": executor["tokens_per_s"] / naive["tokens_per_s"],
                  "wall_ratio": naive["seconds"] / executor["seconds"]}
        print({k: v if not isinstance(v, float) else round(v, 3) for k, v in sample.items()})
        samples.append(sample)
    medians = {
        "executor_seconds": median([s["executor"]["seconds"] for s in samples]),
        "naive_seconds": median([s["naive"]["seconds"] for s in samples]),
        "executor_tokens_per_s": median([s["executor"]["tokens_per_s"] for s in samples]),
        "naive_tokens_per_s": median([s["naive"]["tokens_per_s"] for s in samples]),
        "tokens_per_s_ratio": median([s["tokens_per_s_ratio"] for s in samples]),
        "wall_ratio": median([s["wall_ratio"] for s in samples]),
    }
    config = {"env": args.env, "model": args.model, "dtype": args.dtype, "problems": args.problems,
              "branching": args.branching, "max_turns": args.turns, "max_tokens": args.max_tokens,
              "mode": "tree", "repeats": args.repeats, "threads": args.threads,
              "naive_loop": "one episode at a time; one engine call per candidate (n=1)", **work.settings}
    path = write_result(NAME, argv, quick=args.quick, directory=out_dir(args.out_dir, args.quick), config=config,
                        samples=samples, medians=medians, measured=medians["tokens_per_s_ratio"], target=TARGET,
                        op=">=", metric="executor tokens/s / naive loop tokens/s (median of paired repeats)",
                        load_before=load_before, threads=args.threads,
                        notes=[f"wall-time ratio per rollout (naive / executor), median: {medians['wall_ratio']:.2f}"])
    return {"path": str(path), "medians": medians}


if __name__ == "__main__":
    main()
