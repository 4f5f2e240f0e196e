"""The FSDP2 learner on 2 gloo ranks takes the same step as one process, and its DCP checkpoint reshards.

Two spawned processes shard a tiny model with ``fully_shard`` and train one step with each rank on its own share
of the samples (a full model with 3 mini-batches and padding passes; LoRA with two adapter streams and activation
checkpointing; in the slow lane both again with the decoder layers compiled, held to the eager single-process
step). This process trains the same step unsharded and compares weights and metrics, then loads the
2-rank DCP checkpoint into a plain single-process learner (world size 2 -> 1) and checks that the next step
matches an uninterrupted run too.
"""

from __future__ import annotations

import dataclasses
import math
import socket

import pytest
import torch

from fsdp_rank_checks import CASES, COMPILED_CASES, build_learner, make_samples, rank_main, tiny_model
from pettingllms.learner.data_parallel import padded_plan, rank_shares
from pettingllms.learner.weights import trained_parameter_names

METRICS = ("pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "grad_norm", "num_sequences", "num_tokens", "lr")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    import torch.multiprocessing as mp

    workdir = tmp_path_factory.mktemp("fsdp")
    mp.spawn(rank_main, args=(2, _free_port(), str(workdir)), nprocs=2, join=True)
    return workdir


@pytest.fixture(scope="module")
def two_rank_compiled_run(tmp_path_factory):
    import torch.multiprocessing as mp

    workdir = tmp_path_factory.mktemp("fsdp_compiled")
    mp.spawn(rank_main, args=(2, _free_port(), str(workdir), True), nprocs=2, join=True)
    return workdir


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_two_ranks_take_the_single_process_step_and_reshard_to_one(two_rank_run, case):
    _takes_the_single_process_step_and_reshards_to_one(two_rank_run / case.name, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", COMPILED_CASES, ids=lambda c: c.name)
def test_two_compiled_ranks_take_the_eager_single_process_step(two_rank_compiled_run, case):
    _takes_the_single_process_step_and_reshards_to_one(two_rank_compiled_run / case.name, case)


def _takes_the_single_process_step_and_reshards_to_one(folder, case) -> None:
    sharded = torch.load(folder / "after_step_1.pt", weights_only=False)

    # The single-process step runs eager layers: a compiled case's 2 ranks are held to the eager learner's step.
    reference = build_learner(dataclasses.replace(case, compile=False), tiny_model(case.lora))
    initial = {n: p.detach().clone() for n, p in reference.model.named_parameters()}
    expected_metrics = reference.update(*make_samples(1, case.lora))
    expected = {n: p.detach().clone() for n, p in reference.model.named_parameters()}

    assert _max_difference(sharded["weights"], expected) < 1e-5
    assert (sharded["compiled_graphs"] > 0) is case.compile  # the ranks' layers ran compiled exactly where asked
    trained = trained_parameter_names(reference.model, reference.adapter_names)
    assert _max_difference({n: expected[n] for n in trained}, {n: initial[n] for n in trained}) > 1e-4  # it moved
    for key in METRICS:
        assert math.isclose(sharded["metrics"][key], expected_metrics[key], rel_tol=1e-4, abs_tol=1e-6), key
    if case.lora:
        for adapter in ("alice", "bob"):
            key = f"adapter/{adapter}/num_tokens"
            assert sharded["metrics"][key] == expected_metrics[key] > 0

    # World size 2 -> 1: a plain learner resumes from the sharded checkpoint and takes the same next step.
    resumed = build_learner(case, tiny_model(case.lora))
    resumed.load_sharded(folder / "dcp", sharded["meta"])
    # The asynchronous save (taken beside training's collectives, on a gloo group of its own, while the ranks stepped
    # on) holds exactly the state of the synchronous one.
    assert sharded["async_meta"] == sharded["meta"]
    from_async = build_learner(case, tiny_model(case.lora))
    from_async.load_sharded(folder / "dcp_async", sharded["async_meta"])
    assert _max_difference({n: p.detach() for n, p in from_async.model.named_parameters()},
                           {n: p.detach() for n, p in resumed.model.named_parameters()}) == 0.0
    for (name, a), (_, b) in zip(sorted(from_async.optimizer.state_dict()["state"].items()),
                                 sorted(resumed.optimizer.state_dict()["state"].items())):
        assert all(torch.equal(a[k], b[k]) for k in a if torch.is_tensor(a[k])), name
    assert resumed.step == 1 and resumed.lr == reference.lr
    next_batch = make_samples(2, case.lora)
    reference.update(*next_batch)
    resumed.update(*next_batch)
    after_reference = {n: p.detach() for n, p in reference.model.named_parameters()}
    after_resumed = {n: p.detach() for n, p in resumed.model.named_parameters()}
    assert _max_difference(after_resumed, after_reference) < 1e-5


def test_bf16_compute_keeps_fp32_master_weights_that_small_updates_move(two_rank_run):
    """dtype=bfloat16 under FSDP2: bf16 compute, fp32 sharded weights and AdamW state; one update at lr 1e-6 moves
    at least 90% of the weights (bf16 weights updated in place move about 1% at lr 5e-6)."""
    result = torch.load(two_rank_run / "mixed_precision.pt", weights_only=False)
    assert result["dtypes"] == ["torch.float32"]
    assert result["state_dtypes"] == ["torch.float32"]
    assert math.isfinite(result["metrics"]["pg_loss"]) and result["metrics"]["grad_norm"] > 0
    assert result["changed"] >= 0.9, result["changed"]


def test_bf16_weights_in_place_shard_without_a_mixed_precision_policy(two_rank_run):
    """master_weights=bfloat16 on an FSDP group: the bf16 model shards and trains (it used to be refused because
    bf16 compute assumed fp32 parameters), and small steps round away as documented."""
    result = torch.load(two_rank_run / "bf16_in_place.pt", weights_only=False)
    assert result["dtypes"] == ["torch.bfloat16"]
    assert math.isfinite(result["metrics"]["pg_loss"]) and result["metrics"]["grad_norm"] > 0
    assert result["changed"] < 0.5, result["changed"]


def test_the_rollout_check_takes_one_decision_on_every_rank(two_rank_run):
    ranks = [torch.load(two_rank_run / f"rollout_check_rank{r}.pt", weights_only=False) for r in range(2)]
    for rank, outcome in enumerate(ranks):
        clean = outcome["clean"]
        assert clean["error"] is None and clean["changed"] > 0.5
        # The figures are global: every rank reports every token, and they agree to rounding.
        assert clean["metrics"]["rollout/tokens"] == outcome["total_tokens"]
        assert clean["metrics"]["rollout/kl_k3"] < 1e-10
        stale = outcome["rank1_stale"]
        assert stale["error"] is not None and "the rollout engine's logprobs disagree" in stale["error"], rank
        assert stale["changed"] == 0.0  # stopped before the optimiser step, on both ranks
    assert ranks[0]["rank1_stale"]["own_share"] == [] and ranks[1]["rank1_stale"]["own_share"]  # only rank 1's


def test_rank_shares_are_consistent_per_mini_batch_and_keep_prompts_together():
    samples, _ = make_samples(3, lora=False, groups=4, k=3)  # 12 samples, 4 prompts
    indices = list(range(len(samples)))
    whole = rank_shares(samples, indices, mini_batch_size=6, world_size=2)
    per_chunk = [rank_shares(samples, chunk, 6, 2) for chunk in (indices[:6], indices[6:])]
    assert whole == [per_chunk[0][r] + per_chunk[1][r] for r in range(2)]
    assert sorted(whole[0] + whole[1]) == indices
    # Each mini-batch in trie order (sorted prompt ids), cut in two: each rank holds whole prompt groups here.
    expected = [[], []]
    for chunk in (indices[:6], indices[6:]):
        ordered = sorted(chunk, key=lambda i: samples[i].prompt_ids)
        expected[0] += ordered[:3]
        expected[1] += ordered[3:]
    assert whole == expected
    for share in whole:
        assert len({samples[i].prompt_ids for i in share}) == 2  # two whole groups of 3 branches
    assert rank_shares(samples, [4], 0, 3) == [[], [], [4]]  # fewer samples than ranks: some ranks get none


def test_padded_plan_gives_every_rank_the_same_number_of_passes():
    plans = [["a", "b", "c"], ["d"], []]
    assert [padded_plan(plans, r, None) for r in range(3)] == [["a", "b", "c"], ["d", None, None], [None] * 3]
