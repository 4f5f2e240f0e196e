"""The envs' one sandbox runner: the cache (on for code and math, off for the games), own or per-process pools,
pickling, and the games' tool runner built on it."""

from __future__ import annotations

import pickle

import pytest

from pettingllms.core.errors import InfrastructureError
from pettingllms.envs.common.sandbox_runner import SandboxRunner
from pettingllms.envs.games_common.runner import tool_runner
from pettingllms.envs.sokoban.env import SokobanEnv
from pettingllms.sandbox import Limits

LIMITS = Limits(wall_timeout_s=5.0, cpu_time_s=5.0)
RANDOM = "import os\nprint(os.urandom(8).hex(), input())"


def test_results_are_cached_per_program_and_stdin_unless_the_cache_is_off():
    cached = SandboxRunner(1, LIMITS, name="test-cached")
    uncached = SandboxRunner(1, LIMITS, cache_size=0, name="test-uncached")
    try:
        first = cached.run(RANDOM, "a")
        assert first.verdict == "ok" and first.stdout.endswith(" a\n")
        assert cached.run(RANDOM, "a") is first
        assert cached.run_many(RANDOM, ["a", "b", "a"])[0] is first
        assert cached.run(RANDOM, "b").stdout != first.stdout
        runs = [uncached.run(RANDOM, "a").stdout for _ in range(2)]
        runs += [r.stdout for r in uncached.run_many(RANDOM, ["a"])]
        assert len(set(runs)) == 3, "with cache_size=0 every call runs the program"
    finally:
        cached.close()
        uncached.close()


def test_a_runner_owns_its_pool_unless_it_shares_the_process_pool():
    own_a, own_b = SandboxRunner(2, LIMITS, name="test-own"), SandboxRunner(2, LIMITS, name="test-own")
    shared_a = SandboxRunner(2, LIMITS, shared_pool=True, name="test-shared")
    shared_b = SandboxRunner(2, LIMITS, cache_size=0, shared_pool=True, name="test-shared")
    try:
        assert own_a._get_pool() is not own_b._get_pool()
        assert shared_a._get_pool() is shared_b._get_pool()
        assert SandboxRunner(3, LIMITS, shared_pool=True, name="test-shared")._get_pool() is not shared_a._get_pool()
        shared_a.close()  # a shared pool outlives any one runner
        assert shared_b("print(input())", "still open").stdout == "still open\n"
    finally:
        own_a.close()
        own_b.close()


def test_a_pickled_runner_keeps_its_settings_and_finds_the_shared_pool_again():
    runner = SandboxRunner(2, LIMITS, cache_size=0, shared_pool=True, name="test-pickled")
    runner.run("print(1)")
    copy = pickle.loads(pickle.dumps(runner))
    assert (copy.workers, copy.limits, copy.cache_size, copy.shared_pool, copy.name) == (
        2, LIMITS, 0, True, "test-pickled")
    assert copy._get_pool() is runner._get_pool()


def test_the_game_tool_runner_has_the_games_limits_no_cache_and_one_pool_per_process():
    runner = tool_runner(timeout_s=3, workers=2)
    assert (runner.limits.wall_timeout_s, runner.limits.cpu_time_s) == (3.0, 3.0)
    assert runner.limits.address_space_bytes == 512 << 20 and runner.limits.max_processes == 8
    assert runner.limits.max_output_bytes == 64 << 10
    assert runner.cache_size == 0 and runner.shared_pool and runner.name == "games-tool-2"
    env = SokobanEnv(tool_timeout_s=3, sandbox_workers=2)
    assert env.runner._get_pool() is runner._get_pool()
    output = env.runner("print(input())", "board\n")
    assert (output.stdout, output.verdict) == ("board\n", "ok")


def test_a_runner_on_the_fallback_layer_warns_once_per_process(monkeypatch, caplog):
    import logging

    from pettingllms.envs.common import sandbox_runner
    from pettingllms.sandbox import Sandbox

    monkeypatch.setattr(sandbox_runner, "_fallback_warned", sandbox_runner.threading.Event())
    fallback, strong = Sandbox("fallback", LIMITS), Sandbox("strong", LIMITS)
    with caplog.at_level(logging.WARNING, logger="pettingllms.envs"):
        for sandbox in (strong, fallback, fallback):
            try:
                sandbox_runner.warn_once_if_fallback(sandbox)
            except InfrastructureError:
                pytest.skip(f"the {sandbox.requested_layer} layer does not work here")
    warnings = [r.getMessage() for r in caplog.records if r.name == "pettingllms.envs"]
    assert len(warnings) == 1 and "fallback layer" in warnings[0] and "docs/sandbox.md" in warnings[0]


def test_reference_runners_use_the_reference_sandbox_and_pickle_as_such():
    from pettingllms.sandbox import default_sandbox, reference_sandbox
    from pettingllms.sandbox.uids import REFERENCE_UID_BASE

    runner = SandboxRunner(1, LIMITS, name="test-reference", reference=True)
    try:
        assert runner._get_pool().sandbox is reference_sandbox() is not default_sandbox()
        assert reference_sandbox()._run_kwargs["uid_base"] == REFERENCE_UID_BASE
        assert pickle.loads(pickle.dumps(runner)).reference is True
    finally:
        runner.close()
