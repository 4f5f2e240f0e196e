"""Worker-group layouts: the pure arithmetic (``runtime/layout.py``, ``runtime/placement.py``) and the config
checks that run before anything loads. Actors placed on simulated clusters: test_simulated_cluster.py."""

from __future__ import annotations

import pytest

from pettingllms.core import ConfigError
from pettingllms.runtime.layout import WorkerLayout, resolve_layout
from pettingllms.runtime.placement import PlacementError, check_layout


def test_a_policy_with_g_gpus_runs_g_ranks_and_g_over_t_engines():
    layout = resolve_layout("policy_0", num_gpus=8, tensor_parallel=2)
    assert (layout.num_ranks, layout.gpus_per_rank, layout.sharded, layout.backend) == (8, 1.0, True, "nccl")
    assert (layout.engine, layout.num_engines, layout.engine_ranks) == ("vllm", 4, (0, 2, 4, 6))
    assert [layout.tp_group(r) for r in (0, 1, 6, 7)] == [(0, 1), (0, 1), (6, 7), (6, 7)]
    assert [layout.bundle_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert layout.bundles() == [{"CPU": 2.0, "GPU": 2.0}] * 4  # one bundle per TP group: an engine stays on a node
    assert layout.describe() == "8 GPUs: 8 FSDP ranks (nccl), 4 vllm engines x TP=2, 1 CPU/rank"


def test_cpu_default_is_one_process_and_gloo_ranks_each_host_an_engine():
    one = resolve_layout("p", num_gpus=0)
    assert (one.num_ranks, one.sharded, one.engine, one.num_engines, one.bundles()) == (1, False, "hf", 1,
                                                                                          [{"CPU": 1.0}])
    two = resolve_layout("p", num_gpus=0, num_ranks=2, engine="vllm", cpus_per_rank=0.5)
    assert (two.backend, two.engine_ranks, two.bundles()) == ("gloo", (0, 1), [{"CPU": 0.5}, {"CPU": 0.5}])
    assert resolve_layout("p", num_gpus=0, fsdp_enabled=True).sharded


def test_a_share_of_one_gpu_is_one_rank_with_tp_1():
    layout = resolve_layout("p", num_gpus=0.5)
    assert (layout.num_ranks, layout.gpus, layout.engine, layout.sharded, layout.bundles()) == (
        1, 0.5, "vllm", False, [{"CPU": 1.0, "GPU": 0.5}])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_gpus": 8, "tensor_parallel": 3}, r"tensor_parallel=3 must divide the policy's 8 GPUs \(GPU_num\).*"
                                                r"\[1, 2, 4, 8\]"),
        ({"num_gpus": 4, "num_ranks": 2}, r"num_ranks=2 with 4 GPUs; a policy runs one FSDP rank per GPU"),
        ({"num_gpus": 0, "tensor_parallel": 2}, "tensor_parallel=2 needs GPUs"),
        ({"num_gpus": 1.5}, "a whole number of GPUs or a share below 1, got 1.5"),
        ({"num_gpus": 0.5, "num_ranks": 2}, "share of one GPU, which fits one rank"),
        ({"num_gpus": -1}, "must be >= 0"),
        ({"num_gpus": 2, "engine": "hf"}, r"engine=hf: the transformers engine is the CPU engine.*engine=vllm"),
        ({"num_gpus": 0, "engine": "vlm"}, r"engine must be one of \('auto', 'hf', 'vllm'\), got 'vlm'"),
    ],
)
def test_bad_layouts_name_the_key_and_the_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        resolve_layout("policy_0", **kwargs)


def test_too_many_gpus_fails_with_the_arithmetic_and_the_gpu_num_that_fits():
    two_policies = [resolve_layout(p, num_gpus=8) for p in ("policy_a", "policy_b")]
    with pytest.raises(PlacementError) as info:
        check_layout(two_policies, {"CPU": 64, "GPU": 8})
    assert "2 policies x 8 GPUs = 16 GPUs > 8 GPUs in the cluster: set GPU_num=4 (resources.gpus_per_policy=4)" in \
        str(info.value)
    check_layout([resolve_layout(p, num_gpus=4) for p in ("a", "b")], {"CPU": 64, "GPU": 8})

    tp4 = [resolve_layout(p, num_gpus=8, tensor_parallel=4) for p in ("a", "b", "c")]
    with pytest.raises(PlacementError, match=r"3 policies x 8 GPUs = 24 GPUs > 16 GPUs in the cluster: set GPU_num=4"):
        check_layout(tp4, {"CPU": 64, "GPU": 16})  # 16 // 3 = 5, rounded down to a multiple of TP=4

    on_one_gpu = [resolve_layout(p, num_gpus=1) for p in ("a", "b")]
    with pytest.raises(PlacementError, match=r"2 policies x 1 GPU = 2 GPUs > 1 GPU in the cluster: set GPU_num=0.5"):
        check_layout(on_one_gpu, {"CPU": 8, "GPU": 1})
    check_layout([resolve_layout(p, num_gpus=0.5) for p in ("a", "b")], {"CPU": 8, "GPU": 1})

    with pytest.raises(PlacementError, match=r"a needs 2 GPUs, b needs 4 GPUs = 6 GPUs > 4 GPUs in this machine"):
        check_layout([resolve_layout("a", num_gpus=2), resolve_layout("b", num_gpus=4)], {"CPU": 8, "GPU": 4},
                     where="this machine")
    with pytest.raises(PlacementError, match="no GPUs are visible; run on CPU with GPU_num=0"):
        check_layout([resolve_layout("a", num_gpus=1)], {"CPU": 8})


def test_an_engine_must_fit_on_one_node_and_cpus_add_up():
    layout = resolve_layout("policy_0", num_gpus=8, tensor_parallel=8)
    with pytest.raises(PlacementError, match=r"one engine of policy_0 needs 8 GPUs on one node \(tensor_parallel=8\), "
                                             r"and the largest node has 4 GPUs"):
        check_layout([layout], {"CPU": 64, "GPU": 8}, largest_node={"CPU": 32, "GPU": 4})
    check_layout([resolve_layout("policy_0", num_gpus=8, tensor_parallel=4)], {"CPU": 64, "GPU": 8},
                 largest_node={"CPU": 32, "GPU": 4})
    fits = [WorkerLayout("a", 2, 1.0, 4.0, sharded=True, engine="vllm"),
            WorkerLayout("b", 2, 1.0, 4.0, sharded=True, engine="vllm")]
    with pytest.raises(PlacementError, match=r"a needs 2 ranks x 4 CPUs = 8 CPUs, b needs 2 ranks x 4 CPUs = 8 CPUs; "
                                             r"the cluster has 12 CPUs: 16 > 12"):
        check_layout(fits, {"CPU": 12, "GPU": 4})
    halves = [WorkerLayout("a", 2, 0.0, 0.5, sharded=True), WorkerLayout("b", 2, 0.0, 0.5, sharded=True)]
    check_layout(halves, {"CPU": 2})  # four half-CPU ranks share a 2-core machine


def plan_of(*overrides):
    from pettingllms.config.load import compose, to_schema
    from pettingllms.assembly.plan import plan

    return plan(to_schema(compose("train", ["base_models.policy_0.path=tiny-random-smollm2", *overrides])))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["base_models.policy_0.num_ranks=2", "resources.use_ray=false"], "FSDP worker groups run as Ray actors"),
        (["base_models.policy_0.fsdp.reshard_after_forward=false"], "need an FSDP worker group"),
        (["base_models.policy_0.master_weights=bfloat16"], "needs base_models.policy_0.dtype=bfloat16"),
        (["base_models.policy_0.fsdp.enabled=true", "base_models.policy_0.fsdp.cpu_offload=true"],
         "cpu_offload needs GPU ranks"),
        (["resources.gpus_per_policy=4", "base_models.policy_0.tensor_parallel=3"], "must divide the policy's 4 GPUs"),
        (["resources.gpus_per_policy=2", "base_models.policy_0.engine=hf"], "the transformers engine is the CPU"),
    ],
)
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        plan_of(*overrides)


def test_engine_auto_resolves_to_vllm_on_gpus_and_transformers_on_cpu():
    (cpu,) = plan_of().worker_specs
    assert (cpu.engine, cpu.layout.num_ranks, cpu.layout.sharded) == ("hf", 1, False)
    (gpu,) = plan_of("resources.gpus_per_policy=4").worker_specs
    assert (gpu.engine, gpu.layout.num_ranks, gpu.layout.num_engines, gpu.fsdp is not None) == ("vllm", 4, 4, True)
    (own,) = plan_of("resources.gpus_per_policy=4", "base_models.policy_0.num_gpus=2").worker_specs
    assert own.layout.num_ranks == 2  # a policy's own num_gpus wins over GPU_num


def test_gpu_num_reaches_every_policy_of_l3():
    specs = plan_of("specialization=L3", "resources.gpus_per_policy=4").worker_specs
    assert [(s.policy, s.layout.gpus, s.engine) for s in specs] == [("policy_alice", 4.0, "vllm"),
                                                                      ("policy_bob", 4.0, "vllm")]


def test_default_layout_splits_the_cores_over_every_rank():
    specs = plan_of("specialization=L3", "resources.num_cpus=2").worker_specs
    assert [(s.layout.num_ranks, s.fsdp, s.layout.cpus_per_rank, s.num_threads) for s in specs] == [(1, None, 1.0, 1)] * 2
    specs = plan_of("specialization=L3", "resources.num_cpus=2", "base_models.policy_0.num_ranks=2").worker_specs
    assert [(s.layout.num_ranks, s.layout.cpus_per_rank, s.num_threads) for s in specs] == [(2, 0.5, 1)] * 2
    assert all(s.fsdp is not None and s.layout.num_engines == 2 for s in specs)


def _spec(policy: str, ranks: int, threads: int = 0, cpus: float = 0.0, tp: int = 1):
    from settings_support import learner_config
    from pettingllms.runtime.layout import resolve_layout
    from pettingllms.runtime.spec import WorkerSpec

    layout = resolve_layout(policy, num_gpus=ranks, tensor_parallel=tp) if ranks > 1 else \
        resolve_layout(policy, num_gpus=0)
    return WorkerSpec(policy, "tiny-random-smollm2", learner_config(total_steps=1), layout,
                      requested_threads=threads, requested_cpus=cpus)


def test_share_cpus_splits_the_budget_over_every_rank_and_keeps_what_the_config_set():
    from pettingllms.runtime.placement import share_cpus

    # Slurm: 2 nodes x (32 CPUs, 8 GPUs) given to Ray, 2 policies x 8 ranks; the driver's os.cpu_count() plays no
    # part.
    node = {"CPU": 32.0, "GPU": 8.0}
    a, b = share_cpus([_spec("a", 8), _spec("b", 8)], budget=64.0, nodes=[node, node])
    assert a.layout.cpus_per_rank == b.layout.cpus_per_rank == 4.0 and a.num_threads == b.num_threads == 4
    assert sum(s.layout.cpus for s in (a, b)) == 64.0
    # 3 nodes for 16 ranks, and a CPU-only head: a node still fits as many ranks as it has GPUs.
    (big,) = share_cpus([_spec("a", 16)], budget=32.0 * 3 + 64, nodes=[node, node, node, {"CPU": 64.0}])
    assert big.layout.cpus_per_rank == 4.0
    (alone,) = share_cpus([_spec("a", 1)], budget=4.0, nodes=[{"CPU": 2.0}, {"CPU": 2.0}])  # one node per rank
    assert alone.layout.cpus_per_rank == 2.0 and alone.num_threads == 2
    fixed, free = share_cpus([_spec("a", 1, threads=3), _spec("b", 1, cpus=1.5)], budget=8.0)
    assert (fixed.num_threads, fixed.layout.cpus_per_rank) == (3, 3.0)
    assert (free.num_threads, free.layout.cpus_per_rank) == (4, 1.5)
    (tiny,) = share_cpus([_spec("a", 1)], budget=0.5)
    assert tiny.num_threads == 1 and tiny.layout.cpus_per_rank == 0.5


def test_local_cpus_is_the_affinity_mask_not_the_core_count(monkeypatch):
    import os

    from pettingllms.runtime.placement import local_cpus

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert local_cpus() == 2


def test_policies_sharing_a_gpu_with_vllm_start_one_after_another():
    from settings_support import learner_config
    from pettingllms.runtime.group import setup_waves
    from pettingllms.runtime.layout import resolve_layout
    from pettingllms.runtime.spec import WorkerSpec

    def spec(policy, gpus, engine="auto"):
        return WorkerSpec(policy, "m", learner_config(total_steps=1), resolve_layout(policy, num_gpus=gpus,
                                                                                     engine=engine))

    assert setup_waves([spec("a", 0.5), spec("b", 0.5)]) == [["a"], ["b"]]  # L3 on one GPU
    assert setup_waves([spec("a", 4), spec("b", 4)]) == [["a", "b"]]  # L3 on 8 GPUs: separate devices
    assert setup_waves([spec("a", 0), spec("b", 0)]) == [["a", "b"]]  # CPU


class _GpuSharingWorker:
    """A policy's rank on a GPU it shares: its engine's sleep is checked as vLLM checks it, by the device's free
    memory before and after (``Memory usage increased after sleeping``), and its update allocates the learner's
    peak on the same device. ``update`` sleeps first unless ``release_engine`` already did, as PolicyWorker's."""

    def __init__(self, policy, device, events, engine_gb, learner_gb):
        self.policy, self.device, self.events = policy, device, events
        self.engine_gb, self.learner_gb, self.asleep = engine_gb, learner_gb, False
        device["used"] += engine_gb

    def release_engine(self):
        if not self.asleep:
            before = self.device["total"] - self.device["used"]
            self.device["used"] -= self.engine_gb
            self.device["during_sleep"]()  # what the other processes on the device do meanwhile
            after = self.device["total"] - self.device["used"]
            assert after - before >= 0, "Memory usage increased after sleeping."
            self.asleep = True
            self.events.append(("sleep", self.policy))

    def update(self, samples, advantages):
        self.release_engine()
        self.events.append(("update", self.policy))
        self.device["updating"].append(self)
        return {}


def test_policies_sharing_a_gpu_put_every_engine_to_sleep_before_any_update():
    """Two policies on one GPU: if one's engine slept while the other's learner was already filling the GPU, vLLM's
    sleep check (device-wide free memory) would fail. Every engine sleeps first, then the updates run."""
    from settings_support import learner_config
    from pettingllms.runtime.group import PolicyGroup
    from pettingllms.runtime.layout import resolve_layout
    from pettingllms.runtime.spec import WorkerSpec

    events = []
    device = {"total": 80.0, "used": 0.0, "updating": []}

    def others_allocate():  # a learner already updating allocates its peak (AdamW state at the first step)
        for worker in device["updating"]:
            device["used"] += worker.learner_gb
        device["updating"].clear()

    device["during_sleep"] = others_allocate
    group = object.__new__(PolicyGroup)
    group.use_ray = False
    group.specs = {p: WorkerSpec(p, "m", learner_config(total_steps=1), resolve_layout(p, num_gpus=0.5,
                                                                                       engine="vllm"))
                   for p in ("a", "b")}
    group.ranks = {p: [_GpuSharingWorker(p, device, events, engine_gb=20.0, learner_gb=30.0)] for p in ("a", "b")}
    group.update({"a": ([], []), "b": ([], [])})
    assert sorted(events[:2]) == [("sleep", "a"), ("sleep", "b")]
    assert sorted(events[2:]) == [("update", "a"), ("update", "b")]
