"""Support for the FSDP learner tests: a tiny model, GRPO-like samples, and the program each spawned rank runs.

Kept out of the test module so that ``torch.multiprocessing.spawn`` can import it in the child processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from pettingllms.core.types import Sample
from pettingllms.learner import PolicyLearner
from settings_support import learner_config
from pettingllms.learner.data_parallel import SINGLE_PROCESS, DataParallel
from pettingllms.learner.sharding import FSDPOptions, shard_model
from pettingllms.learner.weights import full_weights

VOCAB = 256
ADAPTERS = ("alice", "bob")


@dataclass(frozen=True)
class Case:
    """One learner set-up, trained the same way by one process and by two FSDP ranks."""

    name: str
    lora: bool
    mini_batch_size: int
    micro_batch_max_tokens: int
    gradient_checkpointing: bool = False
    logprob_chunk_tokens: int = 0
    compile: bool = False


# full: 3 mini-batches (4, 4, 2 samples) so old log-probs come from a separate pass, and a token budget small
# enough that ranks get different numbers of micro-batches (padding passes). lora: two adapter streams, one
# mini-batch each, with activation checkpointing. chunked: the full case through the chunked LM head (its weight,
# tied to the embedding, is gathered by the root module's forward, where the head runs). compiled: the full case
# with each decoder layer's forward compiled (optim.compile) inside FSDP2's per-layer gather and free hooks;
# compiled_lora: the lora case compiled, gradient checkpointing recomputing the compiled forward.
CASES = (
    Case("full", lora=False, mini_batch_size=4, micro_batch_max_tokens=40),
    Case("lora", lora=True, mini_batch_size=0, micro_batch_max_tokens=4096, gradient_checkpointing=True),
    Case("chunked", lora=False, mini_batch_size=4, micro_batch_max_tokens=40, logprob_chunk_tokens=3),
)
# The slow lane's (each rank compiles cold: about a minute on this CPU).
COMPILED_CASES = (
    Case("compiled", lora=False, mini_batch_size=4, micro_batch_max_tokens=40, compile=True),
    Case("compiled_lora", lora=True, mini_batch_size=0, micro_batch_max_tokens=4096, gradient_checkpointing=True,
         compile=True),
)


def tiny_model(lora: bool, seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    if not lora:
        return model
    from peft import LoraConfig, get_peft_model

    spec = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    torch.manual_seed(seed + 1)
    model = get_peft_model(model, spec, adapter_name=ADAPTERS[0])
    for name in ADAPTERS[1:]:
        model.add_adapter(name, spec)
    return model


def make_samples(seed: int, lora: bool, groups: int = 3, k: int = 3) -> tuple[list[Sample], list[float]]:
    """``groups`` prompts with ``k`` responses each (shared prompts, as a tree node makes) and their advantages.

    With ``lora`` groups alternate between the two agents' adapters.
    """
    generator = torch.Generator().manual_seed(seed)

    def ids(low: int, high: int) -> tuple[int, ...]:
        length = int(torch.randint(low, high, (1,), generator=generator))
        return tuple(torch.randint(1, VOCAB, (length,), generator=generator).tolist())

    samples, advantages = [], []
    for g in range(groups):
        agent = ADAPTERS[g % 2] if lora else "alice"
        prompt = ids(3, 9)
        for branch in range(k):
            response = ids(2, 9)
            samples.append(Sample(
                policy="policy_0", agent=agent, turn=0, group=(g, 0, agent), episode=f"ep{g}", problem_id=f"p{g}",
                branch=branch, prompt_ids=prompt, response_ids=response,
                response_logprobs=(), reward=float(branch),
                adapter=agent if lora else None,
            ))
            advantages.append(float(torch.randn(1, generator=generator)))
    return samples, advantages


def vocabulary_samples(groups: int = 4, k: int = 4) -> tuple[list[Sample], list[float]]:
    """GRPO-like samples whose prompts hold every token id, so every embedding row gets a gradient."""
    generator = torch.Generator().manual_seed(7)
    samples, advantages = [], []
    for g in range(groups):
        prompt = tuple(int(i) for i in torch.randperm(VOCAB - 1, generator=generator)[:96] + 1)
        for b in range(k):
            response = tuple(int(i) for i in torch.randint(1, VOCAB, (6,), generator=generator))
            samples.append(Sample(policy="p", agent="alice", turn=0, group=(g, 0, "alice"), episode=f"e{g}",
                                  problem_id=f"p{g}", branch=b, prompt_ids=prompt, response_ids=response,
                                  response_logprobs=(), reward=float(b % 2)))
            advantages.append(1.0 if b % 2 else -1.0)
    return samples, advantages


def changed_fraction(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """The fraction of all weight entries that an update changed."""
    changed = sum(int((before[n] != after[n]).sum()) for n in before)
    return changed / sum(t.numel() for t in before.values())


def build_learner(case: Case, model: torch.nn.Module, data_parallel: DataParallel = SINGLE_PROCESS) -> PolicyLearner:
    config = learner_config(
        total_steps=4,
        lr=1e-3,
        ppo_mini_batch_size=case.mini_batch_size,
        micro_batch_max_tokens=case.micro_batch_max_tokens,
        gradient_checkpointing=case.gradient_checkpointing,
        logprob_chunk_tokens=case.logprob_chunk_tokens,
        compile=case.compile,
    )
    return PolicyLearner(model, config, adapter_names=ADAPTERS if case.lora else (), data_parallel=data_parallel)


def rank_main(rank: int, world_size: int, port: int, workdir: str, compiled: bool = False) -> None:
    """One FSDP rank: train every case one step, write rank 0's full weights and metrics, save a DCP checkpoint;
    ``compiled``: the COMPILED_CASES alone."""
    import torch.distributed as dist

    from torch._dynamo.utils import counters

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        data_parallel = DataParallel(rank, world_size)
        checkpoint_group = dist.new_group(backend="gloo")  # as a worker keeps one for its asynchronous saves
        for case in COMPILED_CASES if compiled else CASES:
            folder = Path(workdir) / case.name
            torch._dynamo.reset()
            counters.clear()
            model = shard_model(tiny_model(case.lora), FSDPOptions(), torch.device("cpu"))
            learner = build_learner(case, model, data_parallel)
            samples, advantages = make_samples(1, case.lora)
            metrics = learner.update(samples, advantages)
            weights = {name: tensor.clone() for name, tensor in full_weights(learner.model)}
            meta = learner.save_sharded(folder / "dcp")
            # The same state saved asynchronously, then a second step taken while it is written: the files must
            # hold the state of the moment the save began.
            saving, async_meta = learner.save_sharded_async(folder / "dcp_async", checkpoint_group)
            learner.update(*make_samples(2, case.lora))
            saving.result()
            if rank == 0:
                torch.save({"metrics": metrics, "weights": weights, "meta": meta, "async_meta": async_meta,
                            "compiled_graphs": counters["stats"]["unique_graphs"]}, folder / "after_step_1.pt")
        if compiled:
            return
        # dtype=bfloat16: bf16 compute (MixedPrecisionPolicy) over fp32 sharded master weights; one step at lr 1e-6.
        mixed = shard_model(tiny_model(False), FSDPOptions(), torch.device("cpu"), compute_dtype=torch.bfloat16)
        before = {name: tensor.clone() for name, tensor in full_weights(mixed)}
        learner = PolicyLearner(mixed, learner_config(total_steps=1, lr=1e-6, dtype="bfloat16"),
                                data_parallel=data_parallel)
        metrics = learner.update(*vocabulary_samples())
        after = {name: tensor.clone() for name, tensor in full_weights(mixed)}
        if rank == 0:
            dtypes = sorted({str(p.dtype) for p in mixed.parameters()})
            state_dtypes = sorted({str(v.dtype) for s in learner.optimizer.state.values() for v in s.values()
                                   if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0})
            torch.save({"metrics": metrics, "dtypes": dtypes, "state_dtypes": state_dtypes,
                        "changed": changed_fraction(before, after)}, Path(workdir) / "mixed_precision.pt")
        bf16_weights_in_place(rank, data_parallel, Path(workdir))
        rollout_check_on_every_rank(rank, data_parallel, Path(workdir))
    finally:
        dist.destroy_process_group()


def bf16_weights_in_place(rank: int, data_parallel: DataParallel, workdir: Path) -> None:
    """master_weights=bfloat16 under FSDP: bf16 parameters are sharded as they are (no MixedPrecisionPolicy) and
    updated in place; at lr 1e-6 most of the step rounds away (what the option trades for memory)."""
    model = shard_model(tiny_model(False).to(torch.bfloat16), FSDPOptions(), torch.device("cpu"),
                        compute_dtype=torch.bfloat16)
    before = {name: tensor.clone() for name, tensor in full_weights(model)}
    learner = PolicyLearner(model, learner_config(total_steps=1, lr=1e-6, dtype="bfloat16"),
                            data_parallel=data_parallel)
    metrics = learner.update(*vocabulary_samples())
    after = {name: tensor.clone() for name, tensor in full_weights(model)}
    if rank == 0:
        torch.save({"metrics": metrics, "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
                    "changed": changed_fraction(before, after)}, workdir / "bf16_in_place.pt")


def with_engine_logprobs(samples: list[Sample], shifted: set[int], shift: float) -> list[Sample]:
    """``samples`` with the logprobs an engine holding the initial weights reports (a plain one-process learner
    computes them), minus ``shift`` for the samples in ``shifted`` (a stale or misrouted engine)."""
    import dataclasses

    raw = PolicyLearner(tiny_model(False), learner_config(total_steps=1)).compute_logprobs(samples)
    return [dataclasses.replace(s, response_logprobs=tuple(v - (shift if i in shifted else 0.0) for v in values))
            for i, (s, values) in enumerate(zip(samples, raw))]


def rollout_check_on_every_rank(rank: int, data_parallel: DataParallel, workdir: Path) -> None:
    """The rollout check's sums are all-reduced: a mismatch confined to rank 1's share stops rank 0 too, before
    either steps (a rank that went on alone would hang in the next collective); a clean batch reports global
    figures on every rank."""
    from pettingllms.core.errors import RolloutMismatchError
    from pettingllms.learner.data_parallel import rank_shares

    samples, advantages = make_samples(5, lora=False)
    everything = list(range(len(samples)))
    outcome = {}
    for name, shifted in (("clean", set()), ("rank1_stale", set(rank_shares(samples, everything, 0, 2)[1]))):
        model = shard_model(tiny_model(False), FSDPOptions(), torch.device("cpu"))
        learner = PolicyLearner(model, learner_config(total_steps=1, lr=1e-2), data_parallel=data_parallel)
        before = {n: t.clone() for n, t in full_weights(model)}
        try:
            metrics, error = learner.update(with_engine_logprobs(samples, shifted, 1.0), advantages), None
        except RolloutMismatchError as exc:
            metrics, error = None, str(exc)
        after = {n: t.clone() for n, t in full_weights(model)}
        outcome[name] = {"metrics": metrics, "error": error, "changed": changed_fraction(before, after),
                         "own_share": [i for i in rank_shares(samples, everything, 0, 2)[rank] if i in shifted]}
    outcome["total_tokens"] = sum(len(s.response_ids) for s in samples)
    torch.save(outcome, workdir / f"rollout_check_rank{rank}.pt")
