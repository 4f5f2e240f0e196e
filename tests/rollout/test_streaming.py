"""Streaming rollout (``rollout.streaming``): each engine is fed without waiting for every episode. A free engine that
does not batch continuously gets what is pending (after at most ``wait_s``, or at once when every episode waits); one
that does (``client.continuous``) gets each episode's requests at once. The samples are those of the barrier."""

from __future__ import annotations

import asyncio
import time

import pytest

from pettingllms.core import SamplingParams
from pettingllms.core.errors import ConfigError
from pettingllms.core.types import Completion, GenerationRequest, GenerationResult
from pettingllms.rollout.batcher import RequestBatcher


class TimedClient:
    """Answers after ``seconds`` per call; records each call's request ids and how many calls overlapped."""

    def __init__(self, seconds: float = 0.0, continuous: bool = False, fail_on: str | None = None):
        self.seconds, self.continuous, self.fail_on = seconds, continuous, fail_on
        self.calls: list[list[str]] = []
        self.in_flight = self.most_in_flight = 0

    async def generate(self, requests):
        self.calls.append([r.request_id for r in requests])
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.seconds)
            if self.fail_on in self.calls[-1]:
                raise RuntimeError(f"engine failed on {self.fail_on}")
        finally:
            self.in_flight -= 1
        return [GenerationResult(r.request_id, tuple(Completion((1,), (0.0,), "x", "stop") for _ in range(r.n)))
                for r in requests]


def request(name: str) -> tuple[str, GenerationRequest]:
    return "policy_0", GenerationRequest(name, (1, 2, 3), 1, SamplingParams())


def episode(batcher: RequestBatcher, name: str, env_seconds: float, turns: int = 2):
    async def run():
        for turn in range(turns):
            await batcher.generate_many([request(f"{name}{turn}")])
            await asyncio.to_thread(time.sleep, env_seconds)  # the env step, in a thread as the executor runs it
        return name
    return run()


def rollout(client, streaming: bool, wait_s: float = 0.0, env_seconds=(0.0, 0.3)):
    async def main():
        batcher = RequestBatcher({"policy_0": client}, streaming=streaming, wait_s=wait_s)
        started = time.monotonic()
        names = await batcher.run([episode(batcher, n, s) for n, s in zip("ab", env_seconds)])
        return names, time.monotonic() - started, batcher

    return asyncio.run(main())


def test_the_barrier_makes_the_fast_episode_wait_for_the_slow_env_step():
    client = TimedClient(0.05)
    names, _, _ = rollout(client, streaming=False)
    assert names == ["a", "b"] and client.calls == [["a0", "b0"], ["a1", "b1"]]


def test_streaming_sends_the_fast_episodes_turn_while_the_slow_one_steps_its_env():
    client = TimedClient(0.05)
    names, _, batcher = rollout(client, streaming=True)
    assert names == ["a", "b"] and client.calls == [["a0", "b0"], ["a1"], ["b1"]]
    assert batcher.stats.calls == 3 and batcher.stats.sequences == 4


def test_a_free_engine_waits_up_to_wait_s_for_more_and_no_longer_once_every_episode_waits():
    client = TimedClient(0.01)
    _, elapsed, _ = rollout(client, streaming=True, wait_s=10.0)  # b's env step ends: everyone waits, send at once
    assert client.calls == [["a0", "b0"], ["a1", "b1"]] and elapsed < 5
    client = TimedClient(0.01)
    rollout(client, streaming=True, wait_s=0.0, env_seconds=(0.0, 0.1))
    assert client.calls == [["a0", "b0"], ["a1"], ["b1"]]


def test_a_continuous_engine_gets_each_episodes_requests_at_once_and_concurrently():
    client = TimedClient(0.3, continuous=True)
    rollout(client, streaming=True, env_seconds=(0.0, 0.1))
    assert client.calls == [["a0", "b0"], ["a1"], ["b1"]]  # asked together at the start, then each on its own
    assert client.most_in_flight == 2  # b1 went while a1 ran: the engine batches them itself


def test_a_failing_call_fails_the_rollout_without_hanging():
    client = TimedClient(0.01, fail_on="b1")
    with pytest.raises(RuntimeError, match="engine failed on b1"):
        rollout(client, streaming=True, env_seconds=(0.0, 0.05))


def test_a_negative_wait_is_refused():
    with pytest.raises(ConfigError, match="streaming_wait_s"):
        RequestBatcher({}, streaming=True, wait_s=-1)


def sample_keys(result):
    return sorted((s.group, s.agent, s.turn, tuple(s.prompt_ids), tuple(s.response_ids), s.reward)
                  for s in result.samples)


@pytest.mark.parametrize("mode", ["tree", "trajectory"])
def test_a_streamed_rollout_has_the_barriers_samples_groups_and_episodes(make_executor, mode):
    from pettingllms.core import Problem
    from pettingllms.envs.toy.env import TargetsEnv

    def script(prompt: str, k: int, request) -> str:  # depends on the prompt: the history must be the same
        return "ab"[(len(prompt) + k) % 2] * (1 + (len(prompt) + k) % 3)

    problems = [Problem(f"q{i}", {"prompt": f"task {i}"}) for i in range(3)]
    results = {}
    for streaming in (False, True):
        executor, _ = make_executor(TargetsEnv(max_turns=3, threshold=2.0), script, branching=3, mode=mode,
                                    streaming=streaming, streaming_wait_s=0.0)
        results[streaming] = executor.run(problems, seeds=[0, 1, 2])
    assert sample_keys(results[True]) == sample_keys(results[False]) and results[False].samples
    assert [e.agent_rewards for e in results[True].episodes] == [e.agent_rewards for e in results[False].episodes]
    timings = results[True].timings
    assert timings["generate_s"] + timings["env_s"] <= timings["rollout_s"]
    assert 0.0 <= timings["engine_idle_fraction"] <= 1.0


def test_an_answered_episode_stops_counting_as_waiting_when_its_answer_arrives():
    """After a call returns, its episodes are no longer waiting although their tasks have not run yet: a batch held
    back for ``wait_s`` must not be sent early on their account (review: b1 went alone, and a2 50 ms later alone too)."""

    class Client(TimedClient):
        async def generate(self, requests):
            self.seconds = 0.6 if [r.request_id for r in requests] == ["a1"] else 0.1
            return await super().generate(requests)

    client = Client()

    async def main():
        batcher = RequestBatcher({"policy_0": client}, streaming=True, wait_s=0.5)

        async def first():
            await batcher.generate_many([request("a0")])
            await batcher.generate_many([request("a1")])
            await asyncio.to_thread(time.sleep, 0.05)
            await batcher.generate_many([request("a2")])

        async def second():
            await batcher.generate_many([request("b0")])
            await asyncio.to_thread(time.sleep, 1.0)
            await batcher.generate_many([request("b1")])

        await batcher.run([first(), second()])

    asyncio.run(main())
    assert client.calls == [["a0", "b0"], ["a1"], ["a2", "b1"]]
