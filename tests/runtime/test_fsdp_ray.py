"""L3 on Ray with FSDP2 worker groups: two policies, each 2 gloo ranks in its own placement group.

The real trainer runs 2 steps, saving a sharded (DCP) checkpoint after each; a second run starts new worker
groups from the step-1 checkpoint, redoes step 2, and logs exactly the same metrics. (Stopping with
``stop_after_steps`` and resuming with ``resume=auto`` reach the same loading code; tests/trainer covers them.)
One Ray instance (2 CPUs, four half-CPU ranks) serves both runs, so the runs leave it running and remove only
their own actors and placement groups.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pettingllms.entry.train import run_training

BASE = [
    "base_models.policy_0.path=tiny-random-smollm2",
    "base_models.policy_0.num_ranks=2",
    "specialization=L3",
    "env.name=toy_targets",
    "env.max_turns=1",
    "training.total_training_steps=2",
    "training.train_batch_size=2",
    "training.max_response_length=5",
    "training.val_freq=0",  # both engines of each policy generate the rollouts; validation would only add time
    "training.plot=false",
    "rollout.branching=3",
    "rollout.select=sample",
    "optim.lr=1e-3",
    "resources.use_ray=true",
    "resources.num_cpus=2",
    "+agents.alice.train_sampling.max_tokens=5",
    "+agents.bob.train_sampling.max_tokens=5",
]
VOLATILE = ("timing/", "update_s", "old_log_prob_s", "ref_log_prob_s")
POLICIES = (("policy_alice", "alice"), ("policy_bob", "bob"))


@pytest.fixture(scope="module")
def shared_ray():
    import ray

    from pettingllms.runtime.local_ray import start_local_ray

    assert not ray.is_initialized()
    local = start_local_ray(num_cpus=2, namespace="pettingllms-test-fsdp", include_dashboard=False, log_to_driver=False)
    yield ray
    local.stop()


def comparable(run_dir: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "summary.log").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not any(t in k for t in VOLATILE)} for r in rows}


# Four gloo ranks and their engines share two cores: a few minutes on a quiet machine, and more than the default
# 600 s when other jobs load it (measured 385 s at load ~9, and a timeout at load ~10 in a fresh clone).
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("async_checkpoint", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["sync_save", "async_save"])  # async: DCP async_save on a gloo group of its own
def test_two_fsdp_policies_train_and_resume_identically(shared_ray, tmp_path, async_checkpoint):
    straight, _ = run_training("train", BASE + [f"training.log_dir={tmp_path}", "training.resume=none",
                                                "training.save_freq=1",
                                                f"training.async_checkpoint={str(async_checkpoint).lower()}"])
    rows = comparable(straight.run_dir)
    assert sorted(rows) == [1, 2]
    summary = [json.loads(line) for line in (straight.run_dir / "summary.log").read_text().splitlines()]
    for policy, agent in POLICIES:
        assert rows[1][f"{policy}/actor/num_sequences"] > 0
        assert f"{policy}/{agent}/reward_mean" in rows[1]
        assert summary[0][f"{policy}/actor/timing/sync_s"] > 0  # the engines' own copies received the weights
        assert (straight.run_dir / "hf" / policy / "config.json").is_file()  # exported from the full copy
    checkpoint = straight.run_dir / "checkpoints" / "step_000001"
    shards = checkpoint / "policies" / "policy_alice"
    assert (shards / "learner" / ".metadata").is_file() and (shards / "rank_1.pt").is_file()
    assert json.loads((shards / "learner.json").read_text())["world_size"] == 2
    # The 2-rank DCP checkpoint reads into plain models: `pettingllms export` of the last step equals the trainer's
    # own export, which the ranks gathered at the end of the run.
    from safetensors.torch import load_file

    from pettingllms.eval.export import export_checkpoint

    export_checkpoint(straight.run_dir, tmp_path / "exported")
    for policy, _ in POLICIES:
        mine = load_file(tmp_path / "exported" / policy / "model.safetensors")
        theirs = load_file(straight.run_dir / "hf" / policy / "model.safetensors")
        assert mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine)
    # The run leaves the Ray it did not start running, but removes its own placement groups.
    assert shared_ray.is_initialized()
    assert all(pg["state"] == "REMOVED" for pg in shared_ray.util.placement_group_table().values())

    # New worker groups load the step-1 sharded checkpoint and redo step 2 in the same run directory.
    resumed, _ = run_training("train", BASE + [f"training.log_dir={tmp_path}", f"training.resume={checkpoint}",
                                               "training.export_hf=false"])
    assert resumed.run_dir == straight.run_dir and resumed.step_done == 2
    got = comparable(resumed.run_dir)
    assert sorted(got) == [1, 2]
    assert got[2] == rows[2], "step 2 differs after resuming from the sharded checkpoint"


def test_ray_start_up_refuses_an_impossible_layout_before_starting_any_actor(shared_ray):
    from settings_support import learner_config
    from pettingllms.learner.sharding import FSDPOptions
    from pettingllms.runtime.group import PolicyGroup
    from pettingllms.runtime.layout import resolve_layout
    from pettingllms.runtime.placement import PlacementError
    from pettingllms.runtime.spec import WorkerSpec

    spec = dict(model_path="tiny-random-smollm2", learner=learner_config(total_steps=1), fsdp=FSDPOptions())
    specs = [WorkerSpec(policy="policy_0", layout=resolve_layout("policy_0", num_gpus=2), **spec),
             WorkerSpec(policy="policy_1", layout=resolve_layout("policy_1", num_gpus=0, num_ranks=2), **spec)]
    with pytest.raises(PlacementError) as info:
        PolicyGroup(specs, use_ray=True)
    message = str(info.value)
    assert "policy_0 needs 2 GPUs > 0 GPUs in the cluster: no GPUs are visible" in message
    assert "policy_1 needs 2 ranks x 1 CPU = 2 CPUs" in message and "the cluster has 2 CPUs: 4 > 2" in message
    assert "one rank of policy_0 needs 1 GPU on one node, and the largest node has 0 GPUs" in message
    # Refused before anything was reserved or started.
    assert all(pg["state"] == "REMOVED" for pg in shared_ray.util.placement_group_table().values())
