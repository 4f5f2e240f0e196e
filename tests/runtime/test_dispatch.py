"""Spreading a policy's requests over its engines (``runtime/dispatch.py``)."""

from __future__ import annotations

import asyncio
import random

import pytest

from pettingllms.core import Completion, GenerationRequest, GenerationResult, SamplingParams
from pettingllms.runtime.dispatch import STICKY_SLACK, EngineSetClient, assign_requests, request_cost


def requests_of(seed: int, episodes: int = 12, agents: int = 2, k: int = 4) -> list[GenerationRequest]:
    rng = random.Random(seed)
    out = []
    for e in range(episodes):
        for a in range(agents):
            prompt = tuple(rng.randint(1, 100) for _ in range(rng.randint(5, 60)))
            sampling = SamplingParams(max_tokens=rng.randint(4, 40))
            out.append(GenerationRequest(f"p{e}/t000/a{a}", prompt, k, sampling, prefix_group=f"p{e}"))
    return out


@pytest.mark.parametrize("engines", [1, 2, 3, 8])
def test_every_request_goes_to_exactly_one_engine_and_loads_stay_balanced(engines):
    requests = requests_of(0)
    parts = assign_requests(requests, engines)
    assert sorted(i for part in parts for i in part) == list(range(len(requests)))
    loads = [sum(request_cost(requests[i]) for i in part) for part in parts]
    groups = {}
    for engine, part in enumerate(parts):
        for i in part:
            groups.setdefault(requests[i].prefix_group, set()).add(engine)
    assert all(len(engines_of_group) == 1 for engines_of_group in groups.values())  # an episode stays together
    unit = max(sum(request_cost(r) for r in requests if r.prefix_group == g) for g in groups)
    assert max(loads) <= STICKY_SLACK * sum(loads) / engines + unit


def test_the_assignment_is_a_pure_function_of_the_call():
    requests = requests_of(1)
    first = assign_requests(requests, 4)
    assert assign_requests(requests, 4) == first
    # Later turns of the same episodes (new prompts, same groups) prefer the same engines.
    later = [GenerationRequest(r.request_id.replace("t000", "t001"), r.prompt_ids + (7,) * 5, r.n, r.sampling,
                               prefix_group=r.prefix_group) for r in requests]
    engine_of = lambda parts, reqs: {reqs[i].prefix_group: e for e, part in enumerate(parts) for i in part}  # noqa: E731
    before, after = engine_of(first, requests), engine_of(assign_requests(later, 4), later)
    assert sum(before[g] == after[g] for g in before) >= len(before) - 2


def test_requests_without_a_group_are_units_of_their_own():
    sampling = SamplingParams(max_tokens=10)
    requests = [GenerationRequest(f"r{i}", (1, 2, 3), 2, sampling) for i in range(6)]
    parts = assign_requests(requests, 3)
    assert [len(p) for p in parts] == [2, 2, 2]
    with pytest.raises(ValueError, match="num_engines must be >= 1"):
        assign_requests(requests, 0)


def test_the_client_calls_engines_concurrently_and_answers_in_request_order():
    requests = requests_of(2, episodes=6)
    seen: dict[int, list[str]] = {}
    running = {"now": 0, "max": 0}

    async def call(engine, batch):
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        await asyncio.sleep(0.01)
        running["now"] -= 1
        seen[engine] = [r.request_id for r in batch]
        return [GenerationResult(r.request_id, tuple(Completion((engine,), (0.0,), str(engine)) for _ in range(r.n)))
                for r in batch]

    client = EngineSetClient(3, call, codec=None)
    results = asyncio.run(client.generate(requests))
    assert [r.request_id for r in results] == [r.request_id for r in requests]
    assert running["max"] == 3 and sorted(seen) == [0, 1, 2]
    for result in results:  # each result came back from the engine it was sent to
        engine = result.completions[0].token_ids[0]
        assert result.request_id in seen[engine]
    assert sum(client.requests_per_engine) == len(requests)


def test_each_engine_is_timed_by_itself_and_the_batcher_reads_this_rollouts_share():
    """Two engines, one of which answers 10x slower: the policy has a call in flight the whole time, but the fast
    engine idles most of it, and the batcher reads each engine's own busy time (the rollout's idle fraction averages
    them; it was 0 here when a policy counted as one engine, busy while any of its engines was)."""
    from pettingllms.rollout.batcher import RequestBatcher

    delays = {0: 0.2, 1: 0.02}

    async def call(engine, batch):
        await asyncio.sleep(delays[engine])
        return [GenerationResult(r.request_id, tuple(Completion((1,), (0.0,), "x") for _ in range(r.n)))
                for r in batch]

    requests = [GenerationRequest(f"p{e}/t000/a0", (1, 2, 3), 1, SamplingParams(max_tokens=4), prefix_group=f"p{e}")
                for e in range(8)]
    client = EngineSetClient(2, call, codec=None)
    asyncio.run(client.generate(requests))  # an earlier rollout's time, which the next batcher must not count
    batcher = RequestBatcher({"policy_0": client})
    asyncio.run(client.generate(requests))
    slow, fast = batcher.busy_seconds()["policy_0"]
    assert slow == pytest.approx(0.2, abs=0.05) and fast == pytest.approx(0.02, abs=0.015)
    assert client.engine_busy_seconds()[0] == pytest.approx(0.4, abs=0.1)  # the client's own totals since start
