"""The request batcher flushes only when every participant waits: episode tasks, and the parts an episode runs
concurrently through ``RequestBatcher.gather`` (tree mode's playouts). Before ``gather``, playouts ran under
``asyncio.gather``: a few of them waiting could outnumber the live episodes and flush a partial batch, so the
batches' make-up, and the results' last bits, depended on thread timing (two identical game runs differed in
their log-probs at 1e-7)."""

from __future__ import annotations

import asyncio
import time

from pettingllms.core import SamplingParams
from pettingllms.core.types import Completion, GenerationRequest, GenerationResult
from pettingllms.rollout.batcher import RequestBatcher


class RecordingClient:
    def __init__(self):
        self.calls: list[list[str]] = []

    async def generate(self, requests):
        self.calls.append([r.request_id for r in requests])
        return [GenerationResult(r.request_id, tuple(Completion((1,), (0.0,), "x", "stop") for _ in range(r.n)))
                for r in requests]


def request(name: str) -> tuple[str, GenerationRequest]:
    return "policy_0", GenerationRequest(name, (1, 2, 3), 1, SamplingParams())


def test_a_flush_waits_for_every_concurrent_part_of_an_episode_and_for_the_other_episodes():
    client = RecordingClient()

    async def main():
        batcher = RequestBatcher({"policy_0": client})

        async def part(name: str, delay: float):
            await asyncio.to_thread(time.sleep, delay)  # an env step in a thread, as the executor runs them
            return await batcher.generate_many([request(name)])

        async def episode_with_parts():  # three playouts: two ask at once, one after a slow env step
            return await batcher.gather([part("a0", 0), part("a1", 0), part("a2", 0.2)])

        async def plain_episode():
            return await part("b", 0.1)

        return await batcher.run([episode_with_parts(), plain_episode()])

    asyncio.run(main())
    assert client.calls == [["a0", "a1", "a2", "b"]]  # one batch: nobody was left out by timing


def test_gather_of_nothing_returns_at_once_and_leaves_the_count_alone():
    client = RecordingClient()

    async def main():
        batcher = RequestBatcher({"policy_0": client})

        async def episode():
            assert await batcher.gather([]) == []
            return await batcher.generate_many([request("x")])

        return await batcher.run([episode(), episode()])

    asyncio.run(main())
    assert client.calls == [["x", "x"]]


def test_an_episode_whose_playouts_ended_is_waited_for_before_the_next_flush():
    """After its last part ends, the episode is live again and about to ask: the next flush includes it (it used to go
    out one request short, almost doubling the engine calls of a tree step with playouts)."""
    client = RecordingClient()

    async def main():
        batcher = RequestBatcher({"policy_0": client})

        async def playout(name: str):
            return await batcher.generate_many([request(name)])

        async def with_playouts():
            await batcher.generate_many([request("e/t1")])
            await batcher.gather([playout("e/p0"), playout("e/p1")])
            await asyncio.to_thread(time.sleep, 0.05)  # scoring the playouts' results in a thread
            return await batcher.generate_many([request("e/t2")])

        async def plain():
            await batcher.generate_many([request("b/t1")])
            await batcher.generate_many([request("b/t2")])
            return await batcher.generate_many([request("b/t3")])

        return await batcher.run([with_playouts(), plain()])

    asyncio.run(main())
    assert client.calls == [["b/t1", "e/t1"], ["b/t2", "e/p0", "e/p1"], ["b/t3", "e/t2"]]


def test_a_failing_part_lets_the_others_end_then_raises():
    client = RecordingClient()
    ended = []

    async def main():
        batcher = RequestBatcher({"policy_0": client})

        async def fails():
            raise ValueError("a playout failed")

        async def slow():
            await asyncio.to_thread(time.sleep, 0.05)
            ended.append("slow")
            return await batcher.generate_many([request("s")])

        async def episode():
            return await batcher.gather([fails(), slow()])

        return await batcher.run([episode()])

    import pytest

    with pytest.raises(ValueError, match="a playout failed"):
        asyncio.run(main())
    assert ended == ["slow"]
