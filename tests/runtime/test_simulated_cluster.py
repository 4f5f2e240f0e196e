"""Every train script's GPU layout, placed by Ray on simulated GPU clusters, without a GPU.

Ray is started with logical GPU resources: one node with 8 GPUs (``ray.init(num_gpus=8)``), and two nodes with 4
GPUs each (``ray.cluster_utils.Cluster``). Each script under ``scripts/train`` is run as a user runs it (its
``bash`` wrapper decides GPU_num from the visible GPUs; a stub interpreter records the command line instead of
training), its config is composed and planned, and the run's real ``PolicyWorker`` actors are placed through the
real ``PolicyGroup`` start-up (placement groups, bundles, scheduling). The actors are not set up: each reports
what Ray gave it (node, GPU ids, rank, world size, engine, TP) instead of touching CUDA.

On two nodes the sbatch launcher exports ``CLUSTER_GPUS`` (the whole allocation), so the scripts' defaults use
all 8 GPUs there too. Layouts that many scripts share are placed once per cluster.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from script_support import SCRIPTS_DIR, script_specs

# script -> its policies (L3 scripts run one model per agent; every other script one shared policy).
EXPECTED_POLICIES = {
    "code/code_L0_single_agent.sh": ["policy_0"],
    "code/code_L1_prompt.sh": ["policy_0"],
    "code/code_L2_lora.sh": ["policy_0"],
    "code/code_L3_model.sh": ["policy_coder", "policy_tester"],
    "game/game_L2_lora.sh": ["policy_0"],
    "game/plan_path_L1_prompt.sh": ["policy_0"],
    "game/sokoban_L1_prompt.sh": ["policy_0"],
    "game/sokoban_two_policy.sh": ["policy_plan_agent", "policy_tool_agent"],
    "game/sudoku_L1_prompt.sh": ["policy_0"],
    "game/sudoku_single.sh": ["policy_0"],
    "math/math_L0_single_agent.sh": ["policy_0"],
    "math/math_L1_prompt.sh": ["policy_0"],
    "math/math_L2_lora.sh": ["policy_0"],
    "math/math_L3_model.sh": ["policy_reasoner", "policy_tool"],
}
CLUSTERS = {
    # name: (GPUs per node, nodes, the environment a user's shell has when launching the script there)
    "1x8": (8, 1, {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}),
    "2x4": (4, 2, {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "CLUSTER_GPUS": "8"}),
}


def specs_of(script: str, env: dict[str, str], *overrides: str):
    return script_specs(script, env, *overrides)


# The two-node cluster (the harder case: bundles across nodes, TP groups kept on one) runs in the default lane: it is
# the default lane's only placement of every script at its GPUs. The one-node cluster is in the slow lane (make
# test-slow); CI's vLLM lane also places the three math scripts on one 8-GPU node in their whole rehearsals.
@pytest.fixture(scope="module", params=[pytest.param("1x8", marks=pytest.mark.slow), "2x4"])
def cluster(request):
    """A Ray instance with logical GPUs: one 8-GPU node, or two 4-GPU nodes."""
    import ray

    per_node, nodes, env = CLUSTERS[request.param]
    assert not ray.is_initialized()
    simulated = None
    if nodes == 1:
        ray.init(address="local", num_cpus=4, num_gpus=per_node, namespace="pettingllms-test-layout", include_dashboard=False,
                 log_to_driver=False)
    else:
        from ray.cluster_utils import Cluster

        simulated = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": per_node})
        for _ in range(nodes - 1):
            simulated.add_node(num_cpus=2, num_gpus=per_node)
        ray.init(address=simulated.address, namespace="pettingllms-test-layout", log_to_driver=False)
        simulated.wait_for_nodes()
    cache: dict = {}
    yield request.param, env, cache
    ray.shutdown()
    if simulated is not None:
        simulated.shutdown()


def place(specs, cache: dict) -> tuple[dict[str, list[dict]], dict]:
    """Each policy's rank reports, placing the real actors once per distinct list of layouts (then removing them).
    Placement depends on the layouts, not on the policies' names: scripts whose policies have the same layouts in
    the same order (the L3 scripts: two policies of 4 GPUs) share one placement, reported under their own names."""
    from pettingllms.runtime.group import PolicyGroup

    key = tuple(dataclasses.replace(s.layout, policy="") for s in specs)
    if key not in cache:
        group = PolicyGroup(specs, use_ray=True, setup=False)
        try:
            cache[key] = ([group.placements[s.policy] for s in specs],
                          [[group.engine_devices(s.policy, r) for r in range(s.layout.num_ranks)] for s in specs])
        finally:
            group.shutdown()
    placements, devices = cache[key]
    return ({s.policy: reports for s, reports in zip(specs, placements)},
            {(s.policy, r): device for s, per_rank in zip(specs, devices) for r, device in enumerate(per_rank)})


def test_every_script_is_in_the_table():
    found = sorted(str(p.relative_to(SCRIPTS_DIR)) for p in SCRIPTS_DIR.glob("*/*.sh"))
    assert found == sorted(EXPECTED_POLICIES)


def check_policy(reports: list[dict], gpus: int, tensor_parallel: int = 1) -> None:
    """One rank per GPU, every GPU its own, each TP group on one node, one engine per TP group on its first rank."""
    assert sorted(r["rank"] for r in reports) == list(range(gpus))
    assert all(r["world_size"] == gpus and r["backend"] == "nccl" and r["engine"] == "vllm" for r in reports)
    assert all(r["tensor_parallel"] == tensor_parallel and len(r["gpu_ids"]) == 1 for r in reports)
    hosts = [r["rank"] for r in reports if r["hosts_engine"]]
    assert hosts == list(range(0, gpus, tensor_parallel))  # gpus / TP engines
    by_rank = {r["rank"]: r for r in reports}
    for host in hosts:
        group = [by_rank[m] for m in by_rank[host]["tp_group"]]
        assert len({m["node_id"] for m in group}) == 1, "a TP group spans nodes"
        assert len({m["placement_group"] for m in group}) == 1 and group[0]["placement_group"] is not None


@pytest.mark.parametrize("script", sorted(EXPECTED_POLICIES))
def test_script_defaults_place_one_rank_and_one_engine_per_gpu(cluster, script):
    name, env, cache = cluster
    specs = specs_of(script, env)
    expected = EXPECTED_POLICIES[script]
    gpus = 8 // len(expected)  # 8 GPUs in both clusters, split over the script's policies
    assert [s.policy for s in specs] == expected
    for spec in specs:
        assert (spec.layout.gpus, spec.layout.num_ranks, spec.layout.num_engines, spec.layout.tensor_parallel) == (
            gpus, gpus, gpus, 1)
        assert spec.engine == "vllm" and spec.fsdp is not None and spec.dtype == "bfloat16"
    placements, _ = place(specs, cache)
    every_gpu = Counter()
    for policy in expected:
        check_policy(placements[policy], gpus)
        every_gpu.update((r["node_id"], r["gpu_ids"][0]) for r in placements[policy])
    assert sum(every_gpu.values()) == 8 and max(every_gpu.values()) == 1  # all 8 GPUs, none given twice
    nodes = Counter(node for node, _ in every_gpu)
    assert sorted(nodes.values()) == ([8] if name == "1x8" else [4, 4])


def test_tensor_parallel_groups_stay_on_one_node_and_expose_their_gpus(cluster):
    _, env, cache = cluster
    specs = specs_of("math/math_L1_prompt.sh", env, "base_models.policy_0.tensor_parallel=2")
    (spec,) = specs
    assert (spec.layout.num_ranks, spec.layout.num_engines, spec.layout.engine_ranks) == (8, 4, (0, 2, 4, 6))
    placements, devices = place(specs, cache)
    check_policy(placements["policy_0"], 8, tensor_parallel=2)
    by_rank = {r["rank"]: r for r in placements["policy_0"]}
    for host in (0, 2, 4, 6):
        own, peer = by_rank[host]["gpu_ids"][0], by_rank[host + 1]["gpu_ids"][0]
        assert devices[("policy_0", host)] == f"{own},{peer}"  # the engine host sees its TP group's two GPUs
        assert devices[("policy_0", host + 1)] is None


def test_an_l3_script_that_asks_for_too_many_gpus_fails_with_the_fix(cluster):
    from pettingllms.runtime.group import PolicyGroup
    from pettingllms.runtime.placement import PlacementError

    _, env, _ = cluster
    specs = specs_of("math/math_L3_model.sh", {**env, "GPU_num": "8"})
    with pytest.raises(PlacementError, match=r"2 policies x 8 GPUs = 16 GPUs > 8 GPUs in the cluster: set GPU_num=4 "
                                             r"\(resources.gpus_per_policy=4\)"):
        PolicyGroup(specs, use_ray=True, setup=False)
    import ray

    assert all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())
