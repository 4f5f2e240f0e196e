"""Rollout efficiency: the executor's tokens/s against the bare engine's on the very same requests.

Workload (issue #7, benchmark 1): a multi-agent math task in tree mode, SmolLM2-135M in fp32. The default is
``arith_duo`` (a solver and a checker, one sequential stage each per turn; the quickstart task). ``--env math``
runs the paper's math env (a reasoner and a tool agent whose programs run in the sandbox), but on this 2-core
machine it is env-bound: every tool candidate is a sandboxed process (about 0.1 s each on a quiet machine) and
every answer check goes through math-verify in a process pool whose 10 s timeout also covers restarting a
worker, so under load one check that overruns restarts the pool and the next checks time out too (a B=2, K=4
math rollout, niced at machine load 8-13, spent over 15 minutes mostly waiting on such timeouts). Its ratio would measure the sandbox and
the verifier, not the executor; ``arith_duo``'s env steps are pure Python and cost microseconds.

One repeat is a pair, run back to back so that machine noise hits both sides:
  A. ``Executor.run`` on B problems with K branches. A recording client sits between the batcher and the
     engine and keeps every batched call (one per flush) with its requests and results.
  B. The bare engine: ``HFEngine.generate`` called directly with the very same ``GenerationRequest`` lists,
     one call per recorded flush, starting from the same engine RNG state. It therefore regenerates the same
     tokens (``identical_completions`` checks it), so both sides do exactly the same generation work and the
     ratio isolates what the executor adds: episode tasks, batching, chat encoding, parsing and env steps.
tokens/s = generated response tokens (eos included) / wall seconds. Ratio = executor / bare; target >= 0.9.

    python benchmarks/rollout_efficiency.py [--env arith_duo|math] [--problems 8] [--branching 4] [--repeats 3]
    python benchmarks/rollout_efficiency.py --quick      # tiny random model, tiny sizes (smoke test)

Writes benchmarks/results/rollout_efficiency.json (or ``--out-dir``). ``benchmarks/naive_loop.py`` reuses the
workload built here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the built-in envs package

import torch  # noqa: E402

from _report import load_average, median, out_dir, write_result  # noqa: E402
from pettingllms.core import GenerationRequest, GenerationResult, Problem  # noqa: E402
from pettingllms.rollout.executor import Executor  # noqa: E402
from pettingllms.rollout.hf_engine import HFEngine  # noqa: E402
from pettingllms.rollout.policy_client import LocalPolicyClient  # noqa: E402

NAME = "rollout_efficiency"
TARGET = 0.9
POLICY = "policy_0"
CONFIG_OF_ENV = {"math": "math", "arith_duo": "train"}  # the shipped config each workload starts from
PLAIN_SAMPLING = "{{temperature: 1.0, top_p: 1.0, top_k: 0, max_tokens: {}}}"
WHY_ENV = {"arith_duo": "math is env-bound here (sandboxed tool programs, math-verify process pool); see the "
                        "docstring of benchmarks/rollout_efficiency.py",
           "math": "the paper's math env: env steps include sandboxed programs and math-verify"}


@dataclass
class Workload:
    """Everything a rollout needs, built from a shipped config: env, agents, executor settings, problems."""

    env_name: str
    model: str
    plan: object  # pettingllms.assembly.plan.RunPlan
    problems: list[Problem]
    engine: HFEngine
    codec: object
    settings: dict = field(default_factory=dict)

    def executor(self, client) -> Executor:
        return Executor(self.plan.env, self.plan.agent_specs, {POLICY: client}, self.plan.executor_config)


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", choices=sorted(CONFIG_OF_ENV), default="arith_duo")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--problems", type=int, default=8, help="B: problems (tree episodes) per rollout")
    parser.add_argument("--branching", type=int, default=4, help="K: candidates per (turn, agent) node")
    parser.add_argument("--turns", type=int, default=2, help="env.max_turns")
    parser.add_argument("--max-tokens", type=int, default=64, help="max new tokens per response")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny random model and tiny sizes (smoke test)")
    parser.add_argument("--out-dir", help="where to write the JSON (default benchmarks/results)")


def apply_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.model, args.problems, args.branching, args.max_tokens, args.repeats = "tiny-random-smollm2", 2, 2, 6, 1


def build_workload(args: argparse.Namespace, engine_factory=None) -> Workload:
    """The workload of ``args``; ``engine_factory(model_dir, codec)`` builds another engine (default: HFEngine)."""
    from pettingllms.config.load import compose, to_schema
    from pettingllms.models import HFChatCodec, load_model, resolve_model
    from pettingllms.assembly.plan import plan

    torch.set_num_threads(args.threads)
    roles = ("reasoner", "tool") if args.env == "math" else ("solver", "checker")
    overrides = [
        f"env.name={args.env}",
        f"base_models.{POLICY}.path={args.model}",
        f"base_models.{POLICY}.dtype={args.dtype}",
        f"base_models.{POLICY}.lora.rank=0",  # one full model: the engine here loads no adapters
        f"env.max_turns={args.turns}",
        f"rollout.branching={args.branching}",
        "rollout.mode=tree",
        f"training.max_response_length={args.max_tokens}",
    ]
    if args.env == "math":  # the math config's own sampling (top_p 0.9, top_k 20), with our token budget
        overrides += [f"agents.{role}.train_sampling.max_tokens={args.max_tokens}" for role in roles]
    else:  # plain temperature-1 sampling, written out
        overrides += [f"agents.{role}.train_sampling={PLAIN_SAMPLING.format(args.max_tokens)}" for role in roles]
    run_plan = plan(to_schema(compose(CONFIG_OF_ENV[args.env], overrides)))
    model_dir = resolve_model(args.model)
    codec = HFChatCodec.from_pretrained(model_dir)
    if engine_factory is None:
        engine = HFEngine(load_model(model_dir, dtype=args.dtype), codec, seed=0)
    else:
        engine = engine_factory(model_dir, codec)
    settings = {"config": CONFIG_OF_ENV[args.env], "why_this_env": WHY_ENV[args.env], "overrides": overrides,
                "sampling": {r: vars(run_plan.agent_specs[r].train_sampling) for r in roles}}
    return Workload(args.env, args.model, run_plan, workload_problems(args, run_plan.env), engine, codec, settings)


def workload_problems(args: argparse.Namespace, env) -> list[Problem]:
    if args.env == "arith_duo":
        return list(env.procedural_problems("train", args.problems))
    from pettingllms.data.math_sources import PROCEDURAL_SOURCES

    rows = PROCEDURAL_SOURCES["gsm_symbolic"].generate("train", args.problems, 0)  # offline GSM-style problems
    return [Problem(row["id"], row) for row in rows]


class RecordingClient:
    """A policy client that keeps each batched call (requests and results) on its way to the engine."""

    def __init__(self, engine: HFEngine, codec) -> None:
        self.inner = LocalPolicyClient(engine, codec)
        self.codec = codec
        self.calls: list[tuple[list[GenerationRequest], list[GenerationResult]]] = []

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = await self.inner.generate(requests)
        self.calls.append((list(requests), list(results)))
        return results


def generated_tokens(results: Sequence[GenerationResult]) -> int:
    return sum(len(c.token_ids) for r in results for c in r.completions)


def warm_up(work: Workload) -> None:
    """Load kernels and start the env's lazy pools (verifier, sandbox) so no timed run pays for them; warm both
    calling threads (the client's engine thread and this one), since each has its own allocator arena and
    torch thread team: a first call from a thread is slower, on either side."""
    client = RecordingClient(work.engine, work.codec)
    work.executor(client).run(work.problems[:1], [0], n=2)
    for requests, _ in client.calls:
        work.engine.generate(requests)


def executor_then_bare(work: Workload, rng_seed: int | None = None) -> dict:
    """One measured pair: the executor's rollout, then the bare engine on its recorded calls.

    Both sides start from the same engine RNG state. ``rng_seed`` reseeds an ``HFEngine`` first; other engines
    (vLLM) go on from their current state.
    """
    if rng_seed is not None:
        work.engine.generator.manual_seed(rng_seed)
    start_state = work.engine.get_rng_state()
    client = RecordingClient(work.engine, work.codec)
    executor = work.executor(client)
    start = time.perf_counter()
    rollout = executor.run(work.problems, list(range(len(work.problems))))
    executor_s = time.perf_counter() - start

    work.engine.set_rng_state(start_state)
    bare_s, identical = 0.0, True
    for requests, recorded in client.calls:
        start = time.perf_counter()
        replayed = work.engine.generate(requests)
        bare_s += time.perf_counter() - start
        identical &= [c.token_ids for r in replayed for c in r.completions] == \
                     [c.token_ids for r in recorded for c in r.completions]
    tokens = sum(generated_tokens(results) for _, results in client.calls)
    return {
        "tokens": tokens,
        "sequences": sum(r.n for requests, _ in client.calls for r in requests),
        "calls": len(client.calls),
        "episodes": len(rollout.episodes),
        "turns_mean": sum(e.turns for e in rollout.episodes) / len(rollout.episodes),
        "executor_s": executor_s,
        "bare_s": bare_s,
        "executor_generate_s": rollout.timings["generate_s"],
        "executor_env_s": rollout.timings["env_s"],
        "executor_tokens_per_s": tokens / executor_s,
        "bare_tokens_per_s": tokens / bare_s,
        "ratio": bare_s / executor_s,
        "identical_completions": bool(identical),
    }


def prepare(argv: Sequence[str], description: str) -> tuple[argparse.Namespace, Workload, list[float]]:
    """Parse the workload arguments, note the load average, build the workload and warm it up."""
    parser = argparse.ArgumentParser(description=description)
    add_workload_arguments(parser)
    args = parser.parse_args(argv)
    apply_quick(args)
    load_before = load_average()
    work = build_workload(args)
    warm_up(work)
    return args, work, load_before


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, work, load_before = prepare(argv, __doc__.splitlines()[0])
    samples = [executor_then_bare(work, rng_seed=1000 + r) for r in range(args.repeats)]
    for s in samples:
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()})
    medians = {key: median([s[key] for s in samples]) for key in
               ("tokens", "executor_s", "bare_s", "executor_env_s", "executor_tokens_per_s", "bare_tokens_per_s",
                "ratio")}
    env_share = medians["executor_env_s"] / medians["executor_s"]
    notes = [f"env steps took {env_share:.1%} of the executor's wall time (median)"]
    if not all(s["identical_completions"] for s in samples):
        notes.append("the bare replay did not regenerate identical tokens in every repeat; tokens/s still "
                     "compares the two sides on the same requests")
    config = {"env": args.env, "model": args.model, "dtype": args.dtype, "problems": args.problems,
              "branching": args.branching, "max_turns": args.turns, "max_tokens": args.max_tokens,
              "mode": "tree", "repeats": args.repeats, "threads": args.threads, **work.settings}
    path = write_result(NAME, argv, quick=args.quick, directory=out_dir(args.out_dir, args.quick), config=config,
                        samples=samples, medians=medians, measured=medians["ratio"], target=TARGET, op=">=",
                        metric="executor tokens/s / bare engine tokens/s (median of paired repeats)",
                        load_before=load_before, threads=args.threads, notes=notes)
    return {"path": str(path), "medians": medians}


if __name__ == "__main__":
    main()
