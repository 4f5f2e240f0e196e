"""The opponent pool (``self_play.*``): frozen past versions as opponents. The pool's seating and slots by hand, the
executor's routing of a past version's moves (its adapter, one sample, frozen samples, playouts), the adapter copy,
and training runs on tests/lenient_nim.py: snapshots taken and served, frozen samples kept out of the loss, refusals,
and a resumed run that seats and plays exactly as the uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pettingllms.assembly.opponent_pool import OpponentPool, check_pool, slot_adapter
from pettingllms.core import ConfigError, Problem, SamplingParams
from pettingllms.entry.train import run_training
from pettingllms.rollout.executor import AgentSpec, Opponent


def specs(adapters=("player_0", "player_1"), policy="policy_0", trainable=(True, True)):
    sampling = SamplingParams()
    return {f"player_{i}": AgentSpec(None, policy, sampling, sampling, adapter, trained)
            for i, (adapter, trained) in enumerate(zip(adapters, trainable))}


# ------------------------------------------------------------------------------------------- the pool by hand

def test_an_empty_pool_seats_every_agent_live_then_one_seat_trains_against_a_past_version():
    pool = OpponentPool(2, snapshot_every=5, live_prob=0.0, agent_specs=specs(), seed=0)
    assert pool.seatings(step=3, problems=4) == [{}, {}, {}, {}]  # nothing in the pool yet
    assert not pool.snapshot_due(4) and pool.snapshot_due(5)
    assert pool.next_slot() == 0
    assert pool.copies(0) == {"policy_0": [("player_0", "player_0-pool0"), ("player_1", "player_1-pool0")]}
    pool.record(0, 5)
    seatings = pool.seatings(step=6, problems=4)
    # step 6: the trained seat is pooled[(6 + slot) % 2]: player_0, player_1, player_0, player_1
    assert seatings == [{"player_1": Opponent("pool0@step5", "policy_0", "player_1-pool0")},
                        {"player_0": Opponent("pool0@step5", "policy_0", "player_0-pool0")}] * 2
    assert pool.seatings(step=6, problems=4) == seatings  # seeded: a resumed run seats the same way


def test_slots_fill_in_order_then_the_oldest_is_replaced_and_draws_cover_every_filled_slot():
    pool = OpponentPool(3, snapshot_every=1, live_prob=0.0, agent_specs=specs(), seed=7)
    for step in (1, 2, 3):
        pool.record(pool.next_slot(), step)
    assert pool.slots == [1, 2, 3] and pool.next_slot() == 0
    pool.record(0, 4)
    assert pool.next_slot() == 1  # now slot 1 (step 2) is the oldest
    drawn = {o.name for step in range(10, 30) for seat in pool.seatings(step, 8) for o in seat.values()}
    assert drawn == {"pool0@step4", "pool1@step2", "pool2@step3"}


@pytest.mark.parametrize("live_prob, expected_live", [(1.0, 1.0), (0.0, 0.0), (0.5, 0.5)])
def test_live_prob_is_the_share_of_plain_self_play_problems(live_prob, expected_live):
    pool = OpponentPool(1, snapshot_every=1, live_prob=live_prob, agent_specs=specs(), seed=0)
    pool.record(0, 1)
    seats = [seat for step in range(2, 202) for seat in pool.seatings(step, 4)]
    live = sum(not seat for seat in seats) / len(seats)
    assert live == pytest.approx(expected_live, abs=0.05)


def test_shared_adapter_one_copy_and_untrained_agents_stay_live():
    pool = OpponentPool(1, 1, 0.0, specs(adapters=("shared", "shared")), seed=0)
    assert pool.copies(0) == {"policy_0": [("shared", "shared-pool0")]}
    frozen_seat = OpponentPool(1, 1, 0.0, specs(trainable=(True, False)), seed=0)
    frozen_seat.record(0, 1)
    # player_1 does not train: it is the same in every version, so it plays live; player_0 is the one pooled agent
    assert frozen_seat.seatings(2, 4) == [{}] * 4


def test_state_round_trip_and_a_resume_with_another_size_is_refused():
    pool = OpponentPool(2, 1, 0.5, specs(), seed=0)
    pool.record(pool.next_slot(), 3)
    again = OpponentPool(2, 1, 0.5, specs(), seed=0)
    again.load_state_dict(json.loads(json.dumps(pool.state_dict())))
    assert again.slots == [3, None]
    with pytest.raises(ConfigError, match="resume with self_play.pool_size=2"):
        OpponentPool(3, 1, 0.5, specs(), seed=0).load_state_dict(pool.state_dict())


def test_pools_the_run_cannot_hold_are_refused_naming_the_fix():
    check_pool(0, {"solo": specs()["player_0"]}, program=False)  # off: nothing checked
    check_pool(2, specs(adapters=(None, None)), program=False)  # full models: kept by a pool worker
    with pytest.raises(ConfigError, match="needs two acting agents"):
        check_pool(2, {"player_0": specs()["player_0"]}, program=False)
    with pytest.raises(ConfigError, match="needs two trained agents or more"):
        check_pool(2, specs(trainable=(True, False)), program=False)
    with pytest.raises(ConfigError, match="not built for programs"):
        check_pool(2, specs(), program=True)


# ------------------------------------------------------------------------------------------- full-model pools

def test_a_full_model_pool_is_played_by_the_pool_worker_one_past_version_per_step():
    pool = OpponentPool(3, snapshot_every=1, live_prob=0.0, agent_specs=specs(adapters=(None, None)), seed=0)
    assert pool.copies(0) == {} and pool.full_copies() == {"policy_0": "policy_0-pool"}
    assert pool.step_slot(1) is None  # nothing to play yet
    for step in (1, 2, 3):
        pool.record(pool.next_slot(), step)
    per_step = {step: pool.step_slot(step) for step in range(10, 40)}
    assert set(per_step.values()) == {0, 1, 2}  # every filled slot is drawn, one per step
    for step, k in per_step.items():
        seatings = pool.seatings(step, 6)
        opponents = {o for seat in seatings for o in seat.values()}
        assert opponents == {Opponent(f"pool{k}@step{k + 1}", "policy_0-pool", None)}, step
    assert "policy_0's full weights, kept in host memory and played by policy_0-pool" in pool.describe()
    assert "per step" in pool.describe()
    # an adapter pool keeps its per-problem draws: step_slot says nothing there
    lora = OpponentPool(3, 1, 0.0, specs(), seed=0)
    lora.record(0, 1)
    assert lora.step_slot(5) is None


def test_snapshot_store_copies_round_trips_and_refuses_a_model_it_does_not_match(tmp_path):
    import torch

    from pettingllms.runtime.snapshots import SnapshotStore

    model = torch.nn.Linear(3, 2)
    store = SnapshotStore()
    store.hold(0, SnapshotStore.host_copy(model.named_parameters()))
    taken = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on; the slot keeps the version it was given
    assert torch.equal(store.slots[0]["weight"], taken["weight"])
    store.save(tmp_path / "snapshots")
    again = SnapshotStore()
    again.load(tmp_path / "snapshots")
    assert set(again.slots) == {0} and all(torch.equal(again.slots[0][n], t) for n, t in taken.items())
    again.load_into(0, model)
    assert torch.equal(model.weight, taken["weight"])
    with pytest.raises(KeyError, match="slot 1 is empty"):
        again.load_into(1, model)
    with pytest.raises(ValueError, match="missing"):
        again.load_into(0, torch.nn.Sequential(torch.nn.Linear(3, 2)))
    with pytest.raises(ValueError, match="shape"):
        again.load_into(0, torch.nn.Linear(3, 4))
    empty = SnapshotStore()
    empty.load(tmp_path / "nothing-saved")  # a checkpoint from before the first snapshot
    assert empty.slots == {}


def test_an_unchanged_slot_is_linked_into_the_next_checkpoint_and_a_changed_one_written_afresh(tmp_path):
    import torch

    from pettingllms.runtime.snapshots import SLOT_FILE, SnapshotStore

    def weights(value):
        return {"w": torch.full((4,), float(value))}

    def slot_file(folder, k):
        return tmp_path / folder / SLOT_FILE.format(k=k)

    store = SnapshotStore()
    store.hold(0, weights(0))
    store.hold(1, weights(1))
    assert store.save(tmp_path / "a") == {"written": [0, 1], "linked": []}
    store.hold(1, weights(11))  # slot 1 takes a newer version; slot 0 keeps its own
    assert store.frozen().save(tmp_path / "b") == {"written": [1], "linked": [0]}  # as the async save does it
    assert slot_file("b", 0).stat().st_ino == slot_file("a", 0).stat().st_ino
    assert slot_file("b", 1).stat().st_ino != slot_file("a", 1).stat().st_ino
    store.hold(0, weights(10))
    assert store.save(tmp_path / "b") == {"written": [0], "linked": [1]}  # the same folder again
    old, new = SnapshotStore(), SnapshotStore()
    old.load(tmp_path / "a")
    new.load(tmp_path / "b")
    # writing slot 0 into b replaced b's link: a's file, which it shared, still holds the old version
    assert torch.equal(old.slots[0]["w"], weights(0)["w"]) and torch.equal(old.slots[1]["w"], weights(1)["w"])
    assert torch.equal(new.slots[0]["w"], weights(10)["w"]) and torch.equal(new.slots[1]["w"], weights(11)["w"])
    assert new.save(tmp_path / "c") == {"written": [], "linked": [0, 1]}  # a resumed run links to what it loaded
    for k in (0, 1):
        slot_file("b", k).unlink()  # the older checkpoint deleted (max_ckpt_to_keep): the links keep the bytes
    again = SnapshotStore()
    again.load(tmp_path / "c")
    assert torch.equal(again.slots[0]["w"], weights(10)["w"]) and torch.equal(again.slots[1]["w"], weights(11)["w"])


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_run_links_an_unchanged_slot_from_the_checkpoint_its_temporary_folder_became(tmp_path, asynchronous):
    """A checkpoint is written into a temporary folder that is then renamed: the slot's last file is found where the
    rename put it (it was rewritten at every checkpoint before)."""
    import torch

    from pettingllms.runtime.checkpoints import begin_checkpoint, save_checkpoint, step_dir_name
    from pettingllms.runtime.snapshots import SLOT_FILE, SnapshotStore

    store, done = SnapshotStore(), {}
    store.hold(0, {"w": torch.ones(4)})
    for step in (1, 2, 3):
        frozen = store.frozen()

        def payload(folder, step=step, frozen=frozen):
            done[step] = frozen.save(folder / "policies" / "pool" / "snapshots")

        if asynchronous:
            begin_checkpoint(tmp_path, step, {"step": step}, payload).finish(lambda: None)
        else:
            save_checkpoint(tmp_path, step, {"step": step}, payload)
    assert done == {1: {"written": [0], "linked": []}, 2: {"written": [], "linked": [0]},
                    3: {"written": [], "linked": [0]}}
    files = [tmp_path / step_dir_name(step) / "policies/pool/snapshots" / SLOT_FILE.format(k=0) for step in (1, 2, 3)]
    assert len({f.stat().st_ino for f in files}) == 1 and files[0].stat().st_nlink == 3


def test_published_path_maps_a_temporary_folder_to_its_final_name():
    from pettingllms.core.atomic import published_path

    assert published_path("/r/.step_000003.tmp-ab_1/p/slot0.safetensors") == Path("/r/step_000003/p/slot0.safetensors")
    assert published_path("/r/step_000003/p/x") == Path("/r/step_000003/p/x")
    assert published_path("/r/.hidden/x") == Path("/r/.hidden/x")


def test_where_the_filesystem_cannot_link_an_unchanged_slot_is_written(tmp_path, monkeypatch):
    import os

    import torch

    from pettingllms.runtime.snapshots import SnapshotStore

    store = SnapshotStore()
    store.hold(0, {"w": torch.ones(3)})
    store.save(tmp_path / "a")

    def no_links(source, target):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    assert store.save(tmp_path / "b") == {"written": [0], "linked": []}
    again = SnapshotStore()
    again.load(tmp_path / "b")
    assert torch.equal(again.slots[0]["w"], torch.ones(3))


def test_the_plan_adds_one_pool_worker_per_full_policy_and_refuses_tensor_parallel():
    import dataclasses

    from pettingllms.assembly.describe import describe_plan
    from pettingllms.assembly.plan import plan, pool_worker_spec
    from pettingllms.entry.train import load_config
    from pettingllms.runtime.layout import resolve_layout

    run_plan = plan(load_config("train", ["env.name=lenient_nim:LenientNim", "specialization=L3",
                                          "base_models.policy_0.path=tiny-random-smollm2",
                                          "self_play.pool_size=2", "resources.use_ray=false"]))
    trained = sorted(run_plan.policies)  # L3: one per agent
    assert len(trained) == 2
    pools = {s.policy: s for s in run_plan.worker_specs if s.snapshot_of}
    assert pools.keys() == {f"{p}-pool" for p in trained}
    assert all(not s.trainable and s.snapshot_of == name[:-len("-pool")] and s.layout.num_ranks == 1
               for name, s in pools.items())
    assert run_plan.pool.full_copies() == {p: f"{p}-pool" for p in trained}
    assert "plays policy_" in describe_plan(run_plan)  # the plan printout names what each pool worker plays
    live = next(s for s in run_plan.worker_specs if s.policy == trained[0])
    tp2 = dataclasses.replace(live, layout=resolve_layout(trained[0], num_gpus=2, tensor_parallel=2, engine="vllm"))
    with pytest.raises(ConfigError, match="tensor_parallel=2"):
        pool_worker_spec(tp2)


# ------------------------------------------------------------------------------------------- the executor

def test_a_past_version_plays_with_its_adapter_one_sample_a_move_and_its_samples_are_frozen(make_executor):
    import lenient_nim

    def script(prompt, k, request):  # the live adapter takes 1 or 2 by branch; the past version always takes 1
        return "1" if request.adapter == "player_1-pool0" else "12"[k % 2]

    opponent = Opponent("pool0@step1", "policy_0", "player_1-pool0")
    executor, engines = make_executor(lenient_nim.LenientNim(), script, branching=2, mode="tree", playouts=1,
                                      adapters={"player_0": "player_0", "player_1": "player_1"})
    result = executor.run([Problem("nim", {"stones": 4})], [0], opponents=[{"player_1": opponent}])
    requests = [r for call in engines["policy_0"].calls for r in call]
    theirs = [r for r in requests if r.adapter == "player_1-pool0"]
    assert theirs and all(r.n == 1 for r in theirs)  # never branched
    assert not [r for r in requests if r.adapter == "player_1"]  # the live player_1 never played, playouts included
    frozen = [s for s in result.samples if s.frozen]
    assert frozen and all(s.agent == "player_1" and s.adapter == "player_1-pool0" for s in frozen)
    assert all(not s.frozen for s in result.samples if s.agent == "player_0")
    (record,) = result.episodes
    assert record.opponents == {"player_1": "pool0@step1"}
    # player_0's first move, valued by a playout against the past version (which always takes 1): from 4, taking 1
    # leaves 3 -> it takes 1 -> 2 left -> player_0's playout takes 2 (k=0 answers "1"... the playout's one sample is
    # branch 0, "1") -> 1 left -> it takes the last: -1; taking 2 leaves 2 -> it takes 1 -> player_0 takes the last: +1
    first = {s.response_text: s.reward for s in result.samples if s.turn == 0 and s.agent == "player_0"}
    assert first == {"1": -1.0, "2": 1.0}


# ------------------------------------------------------------------------------------------- the adapter copy

def test_copy_adapter_copies_the_weights_and_leaves_the_copy_frozen_and_independent():
    import torch

    from pettingllms.models import LoraSpec, load_model
    from pettingllms.models.lora import adapter_parameters, copy_adapter
    from pettingllms.models.resolve import resolve_model

    model = load_model(resolve_model("tiny-random-smollm2"), "float32", LoraSpec(rank=4, alpha=8),
                       ("live", "live-pool0"))
    with torch.no_grad():
        for _, p in adapter_parameters(model, "live"):
            p.normal_()
    flags = [p.requires_grad for _, p in adapter_parameters(model, "live-pool0")]
    copy_adapter(model, "live", "live-pool0")
    live, copy = adapter_parameters(model, "live"), adapter_parameters(model, "live-pool0")
    assert len(live) == len(copy) > 0
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(live, copy))
    assert [p.requires_grad for _, p in copy] == flags
    with torch.no_grad():
        live[0][1].add_(1.0)
    assert not torch.equal(live[0][1], copy[0][1])  # a copy, not a view


# ------------------------------------------------------------------------------------------- training runs

TRAIN = ["base_models.policy_0.path=tiny-random-smollm2", "env.name=lenient_nim:LenientNim", "specialization=L2",
         "training.total_training_steps=3", "training.train_batch_size=4", "rollout.branching=2",
         "training.max_response_length=3", "training.val_freq=0", "training.val_before_train=false",
         "training.export_hf=false", "training.plot=false", "resources.use_ray=false", "optim.lr=1e-2",
         "rollout.select=sample", "training.save_samples_freq=1",
         "self_play.pool_size=2", "self_play.snapshot_every=1", "self_play.live_prob=0.25"]


@pytest.fixture
def nim_path(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))


def rows_of(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "summary.log").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if "timing" not in k and "update_s" not in k} for r in rows}


def test_the_served_slots_hold_bit_identical_copies_taken_after_their_steps_update(tmp_path, nim_path):
    import torch

    from pettingllms.entry.train import load_config
    from pettingllms.models.lora import adapter_parameters
    from pettingllms.trainer.trainer import Trainer

    with Trainer(load_config("train", [*TRAIN, f"training.log_dir={tmp_path}"])) as trainer:
        model = trainer.policies.ranks["policy_0"][0].model
        weights = lambda adapter: [p.detach().clone() for _, p in adapter_parameters(model, adapter)]  # noqa: E731
        taken = {}
        for step in (1, 2, 3):
            trainer.step(step)
            taken[step] = {a: weights(a) for a in ("player_0", "player_1")}
        # slot 0: step 3's copy (it replaced step 1's, the oldest); slot 1: step 2's, untouched by step 3's update
        for adapter in ("player_0", "player_1"):
            for slot, step in ((0, 3), (1, 2)):
                served = weights(slot_adapter(adapter, slot))
                assert all(torch.equal(a, b) for a, b in zip(served, taken[step][adapter]))
        moved = [not torch.equal(a, b) for adapter in ("player_0", "player_1")
                 for a, b in zip(taken[2][adapter], taken[3][adapter])]
        assert any(moved), "step 3 should have updated a live adapter (else the check above shows nothing)"


def test_a_run_snapshots_plays_past_versions_trains_live_seats_and_resumes_exactly(tmp_path, nim_path):
    from pettingllms.runtime import checkpoints as ckpt

    straight, _ = run_training("train", [*TRAIN, f"training.log_dir={tmp_path}/a"])
    rows = rows_of(straight.run_dir)
    assert [rows[s]["self_play/pool_filled"] for s in (1, 2, 3)] == [1.0, 2.0, 2.0]
    assert rows[1]["self_play/vs_pool_share"] == 0.0  # the pool was empty during step 1's rollout
    assert rows[2]["self_play/vs_pool_share"] > 0 and "self_play/vs_pool/win_rate" in rows[2]
    for step in (2, 3):  # the samples each policy was scored on: a past version's never reach them
        lines = (straight.run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        assert {json.loads(line)["adapter"] for line in lines} <= {"player_0", "player_1"}
    # the final checkpoint holds the slots' steps: slot 0 was replaced by step 3's copy, slot 1 holds step 2's
    latest = ckpt.read_trainer_state(ckpt.latest_checkpoint(straight.run_dir / "checkpoints"))
    assert latest["opponent_pool"] == {"slots": [3, 2]}
    # stopped after step 2 and resumed: step 3 plays against the restored slots with their restored weights
    first, _ = run_training("train", [*TRAIN, f"training.log_dir={tmp_path}/b", "training.resume=auto",
                                      "training.stop_after_steps=2"])
    resumed, _ = run_training("train", [*TRAIN, f"training.log_dir={tmp_path}/b", "training.resume=auto"])
    assert resumed.run_dir == first.run_dir
    assert rows_of(resumed.run_dir)[3] == rows[3] and rows[3]["self_play/vs_pool_share"] > 0


FULL = [o for o in TRAIN if o != "specialization=L2"] + ["specialization=L1"]  # no LoRA: full-weight snapshots


def test_a_full_model_pool_serves_bit_identical_copies_taken_after_their_steps_update(tmp_path, nim_path):
    import torch

    from pettingllms.entry.train import load_config
    from pettingllms.trainer.trainer import Trainer

    with Trainer(load_config("train", [*FULL, f"training.log_dir={tmp_path}"])) as trainer:
        live = trainer.policies.ranks["policy_0"][0]
        pool_worker = trainer.policies.ranks["policy_0-pool"][0]
        assert live.spec.lora is None and pool_worker.learner is None
        taken = {}
        for step in (1, 2, 3):
            trainer.step(step)
            taken[step] = {n: p.detach().clone() for n, p in live.model.named_parameters()}
        assert trainer.pool.slots == [3, 2]  # slot 0 replaced by step 3's copy
        for slot, step in ((0, 3), (1, 2)):
            held = pool_worker.snapshots.slots[slot]
            assert all(torch.equal(held[n], t) for n, t in taken[step].items())
            pool_worker.serve_snapshot(slot)  # what the pool's engine plays: the module it generates with
            assert all(torch.equal(p, taken[step][n]) for n, p in pool_worker.model.named_parameters())
        assert any(not torch.equal(taken[2][n], taken[3][n]) for n in taken[2]), "step 3 should have trained"


# Slow lane for synchronous checkpoints (13 s): the asynchronous ones, in the default lane, take the same pool path
# and more; synchronous checkpoint resumes are the default lane's kill -9 and fault tests.
@pytest.mark.parametrize("background", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["sync_checkpoints", "async_checkpoints"])
def test_a_full_model_pool_run_plays_past_versions_and_resumes_exactly(tmp_path, nim_path, background):
    from pettingllms.eval.export import export_checkpoint
    from pettingllms.runtime import checkpoints as ckpt

    run = [*FULL, f"training.async_checkpoint={str(background).lower()}"]
    straight, _ = run_training("train", [*run, f"training.log_dir={tmp_path}/a"])
    rows = rows_of(straight.run_dir)
    assert [rows[s]["self_play/pool_filled"] for s in (1, 2, 3)] == [1.0, 2.0, 2.0]
    assert rows[2]["self_play/vs_pool_share"] > 0 and "self_play/vs_pool/win_rate" in rows[2]
    assert "policy_0-pool/actor/pg_loss" not in rows[2]  # the pool worker never trains
    latest = ckpt.latest_checkpoint(straight.run_dir / "checkpoints")
    assert sorted(p.name for p in (latest / ckpt.POLICIES_DIR / "policy_0-pool" / "snapshots").iterdir()) == \
        ["slot0.safetensors", "slot1.safetensors", "slots.json"]
    # the export writes the run's policies; the pool worker's past versions are not one
    assert [e.policy for e in export_checkpoint(latest, tmp_path / "hf", trust_run_code=True)] == ["policy_0"]
    first, _ = run_training("train", [*run, f"training.log_dir={tmp_path}/b", "training.resume=auto",
                                      "training.stop_after_steps=2"])
    resumed, _ = run_training("train", [*run, f"training.log_dir={tmp_path}/b", "training.resume=auto"])
    assert resumed.run_dir == first.run_dir
    assert rows_of(resumed.run_dir)[3] == rows[3] and rows[3]["self_play/vs_pool_share"] > 0


def test_a_checkpoint_whose_pool_weights_are_missing_is_refused_at_resume_naming_them(tmp_path, nim_path):
    from pettingllms.core import DamagedCheckpointError
    from pettingllms.runtime import checkpoints as ckpt

    first, _ = run_training("train", [*FULL, f"training.log_dir={tmp_path}", "training.stop_after_steps=2"])
    latest = ckpt.latest_checkpoint(first.run_dir / "checkpoints")
    (latest / ckpt.POLICIES_DIR / "policy_0-pool" / "snapshots" / "slots.json").unlink()
    with pytest.raises(DamagedCheckpointError, match=r"slots \[0, 1\].*policy_0-pool/snapshots holds none"):
        run_training("train", [*FULL, f"training.log_dir={tmp_path}", "training.resume=auto"])


def test_the_pages_pool_commands_plan_with_their_opponents_lines():
    """docs/self_play.md's pool commands, as written (with the packaged tiny model in place of the default one): the
    adapter pool (L2) and the full-model pool (L1)."""
    import re
    import shlex

    pytest.importorskip("pyspiel", reason="the games extra: pip install -e '.[games]'")
    from pettingllms.assembly.describe import describe_plan
    from pettingllms.assembly.plan import plan
    from pettingllms.entry.train import load_config

    page = (Path(__file__).resolve().parents[2] / "docs" / "self_play.md").read_text()
    adapters, full = [c for c in re.findall(r"```bash\n(.*?)```", page, flags=re.S) if "self_play.pool_size" in c]
    plans = []
    for command in (adapters, full):
        words = shlex.split(command.replace("\\\n", " "))
        assert words[:2] == ["pettingllms", "train"]
        plans.append(plan(load_config("train", [*words[2:], "base_models.policy_0.path=tiny-random-smollm2"])))
    assert "opponents: self-play with an opponent pool of 4 past versions" in describe_plan(plans[0])
    (spec,) = plans[0].worker_specs
    assert set(spec.frozen) == {slot_adapter(a, k) for a in ("player_0", "player_1") for k in range(4)}
    assert "policy_0's full weights" in describe_plan(plans[1])
    assert [(s.policy, s.trainable) for s in plans[1].worker_specs] == [("policy_0", True), ("policy_0-pool", False)]
