"""Resource layouts: the pure arithmetic and the config checks (the Ray start-up check is in test_fsdp_ray.py)."""

from __future__ import annotations

import pytest

from pettingllms.core import ConfigError
from pettingllms.runtime.placement import PlacementError, PolicyDemand, check_layout


def test_the_message_spells_out_the_gpu_arithmetic():
    demands = [PolicyDemand("policy_0", num_ranks=2, gpus_per_rank=2, tensor_parallel=2),
               PolicyDemand("policy_1", num_ranks=1, gpus_per_rank=2)]
    with pytest.raises(PlacementError) as info:
        check_layout(demands, {"CPU": 64, "GPU": 4})
    assert ("policy_0 needs 2 ranks x 2 GPUs (TP=2) = 4 GPUs, policy_1 needs 1 rank x 2 GPUs = 2 GPUs; "
            "the cluster has 4 GPUs: 6 > 4") in str(info.value)
    assert "CPUs:" not in str(info.value)  # the CPUs fit


def test_a_layout_that_fits_passes_and_cpus_are_counted_too():
    fits = [PolicyDemand("a", num_ranks=2, gpus_per_rank=1, cpus_per_rank=4), PolicyDemand("b", 2, 1, 4)]
    check_layout(fits, {"CPU": 16, "GPU": 4}, largest_node={"CPU": 8, "GPU": 2})
    with pytest.raises(PlacementError, match=r"a needs 2 ranks x 4 CPUs = 8 CPUs, b needs 2 ranks x 4 CPUs = 8 CPUs; "
                                             r"the cluster has 12 CPUs: 16 > 12"):
        check_layout(fits, {"CPU": 12, "GPU": 4})
    fractional = [PolicyDemand("a", num_ranks=2, cpus_per_rank=0.5), PolicyDemand("b", 2, 0, 0.5)]
    check_layout(fractional, {"CPU": 2})  # four half-CPU ranks share a 2-core machine


def test_a_rank_must_fit_on_one_node():
    demands = [PolicyDemand("policy_0", num_ranks=1, gpus_per_rank=4)]
    with pytest.raises(PlacementError, match="one rank of policy_0 needs 4 GPUs on one node, and the largest node "
                                             "has 2 GPUs"):
        check_layout(demands, {"CPU": 32, "GPU": 8}, largest_node={"CPU": 16, "GPU": 2})


def test_bad_numbers_are_named():
    with pytest.raises(PlacementError, match=r"base_models.p.num_ranks must be >= 1, got 0"):
        PolicyDemand("p", num_ranks=0)
    with pytest.raises(PlacementError, match=r"gpus_per_rank=0.5 \(a share of one GPU\) fits only one rank"):
        check_layout([PolicyDemand("p", 2, gpus_per_rank=0.5)], {"CPU": 8, "GPU": 8})
    with pytest.raises(PlacementError, match="TP=2"):
        check_layout([PolicyDemand("p", 1, gpus_per_rank=0.5, tensor_parallel=2)], {"CPU": 8, "GPU": 8})
    with pytest.raises(PlacementError, match="gpus_per_rank=1.5 must be a whole number"):
        check_layout([PolicyDemand("p", 1, gpus_per_rank=1.5)], {"CPU": 8, "GPU": 8})
    # Two one-rank TP=1 policies on one GPU (L3 on a single GPU) fit.
    check_layout([PolicyDemand("a", 1, gpus_per_rank=0.5), PolicyDemand("b", 1, gpus_per_rank=0.5)],
                 {"CPU": 8, "GPU": 1})
    assert PolicyDemand("p", 3, 2, 1.5).bundles() == [{"CPU": 1.5, "GPU": 2.0}] * 3


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["base_models.policy_0.num_ranks=2", "resources.use_ray=false"], "FSDP worker groups run as Ray actors"),
        (["base_models.policy_0.fsdp.mixed_precision=true"], "need an FSDP worker group"),
        (["base_models.policy_0.fsdp.enabled=true", "base_models.policy_0.fsdp.cpu_offload=true"],
         "cpu_offload needs GPU ranks"),
        (["base_models.policy_0.num_ranks=2", "base_models.policy_0.num_gpus=3"], "not a multiple of num_ranks=2"),
    ],
)
def test_config_errors_name_the_key(overrides, message):
    from pettingllms.config.load import compose, to_schema
    from pettingllms.trainer.setup import plan

    cfg = to_schema(compose("train", ["base_models.policy_0.path=tiny-random-smollm2", *overrides]))
    with pytest.raises(ConfigError, match=message):
        plan(cfg)


def test_default_layout_is_one_process_per_policy_with_the_cores_split():
    from pettingllms.config.load import compose, to_schema
    from pettingllms.trainer.setup import plan

    cfg = to_schema(compose("train", ["base_models.policy_0.path=tiny-random-smollm2", "specialization=L3",
                                      "resources.num_cpus=2"]))
    specs = plan(cfg).worker_specs
    assert [(s.num_ranks, s.fsdp, s.cpus_per_rank, s.num_threads) for s in specs] == [(1, None, 1.0, 1)] * 2
    cfg.base_models["policy_0"].num_ranks = 2
    specs = plan(cfg).worker_specs  # L3 copies policy_0 for both agents: 4 ranks on 2 CPUs
    assert [(s.num_ranks, s.cpus_per_rank, s.num_threads) for s in specs] == [(2, 0.5, 1)] * 2
    assert all(s.fsdp is not None for s in specs)
