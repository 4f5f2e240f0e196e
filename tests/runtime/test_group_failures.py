"""A rank that fails stops the step at once, while the other ranks of its policy are still blocked in a collective
(they wait for the failed rank's part of an all-gather that never comes): the driver must not wait for them."""

from __future__ import annotations

import time

import pytest


def test_the_first_failing_rank_raises_without_waiting_for_the_blocked_ones():
    import ray

    from pettingllms.runtime.group import PolicyGroup
    from pettingllms.runtime.local_ray import start_local_ray

    assert not ray.is_initialized()
    local = start_local_ray(num_cpus=2, include_dashboard=False, namespace="pettingllms-test-fail-fast",
                            log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        def blocked_rank():
            time.sleep(120)  # a rank stuck in the all-gather its failed peer never joins
            return {}

        @ray.remote(num_cpus=0)
        def failing_rank():
            time.sleep(1)
            raise RuntimeError("CUDA out of memory while gathering model.embed_tokens.weight")

        started = time.perf_counter()
        with pytest.raises(ray.exceptions.RayTaskError, match="out of memory"):
            PolicyGroup._rank0_results({"policy_0": [blocked_rank.remote(), failing_rank.remote()]})
        assert time.perf_counter() - started < 60
    finally:
        local.stop()


def test_a_wait_with_a_timeout_gives_up_on_a_rank_that_never_answers():
    """A stopping run's wait for its checkpoint (``PolicyGroup.save_wait(timeout=...)``) must not wait for a rank stuck
    behind a failed peer."""
    import ray

    from pettingllms.runtime.group import PolicyGroup
    from pettingllms.runtime.local_ray import start_local_ray

    assert not ray.is_initialized()
    local = start_local_ray(num_cpus=2, include_dashboard=False, namespace="pettingllms-test-wait-timeout",
                            log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        def rank(seconds):
            time.sleep(seconds)
            return {"slept": seconds}

        assert PolicyGroup._rank0_results({"p": [rank.remote(0.1), rank.remote(0.2)]}, timeout=60) == {
            "p": {"slept": 0.1}}
        started = time.perf_counter()
        with pytest.raises(TimeoutError, match="1 of 2 rank call"):
            PolicyGroup._rank0_results({"p": [rank.remote(0.1), rank.remote(120)]}, timeout=2)
        assert time.perf_counter() - started < 30
    finally:
        local.stop()
