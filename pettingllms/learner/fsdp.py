"""FSDP2 for one policy's learner across the ranks of its worker group.

A policy with ``num_ranks > 1`` trains data-parallel: every rank holds a shard of the weights, gradients and
optimiser state (``torch.distributed.fsdp.fully_shard``, one FSDP unit per decoder layer plus the root), runs
the forward and backward passes of its share of each mini-batch, and FSDP reduce-scatters the gradients.
This module holds the pieces the ``PolicyLearner`` and the runtime's rank worker need:

- ``FSDPOptions`` and ``shard_model``: mixed precision (``MixedPrecisionPolicy``: bf16 compute, fp32 master
  weights and gradient reduction), CPU offload (``CPUOffloadPolicy``; GPU only) and resharding after forward.
  Activation checkpointing is the learner's ``gradient_checkpointing`` (transformers' per-layer checkpointing,
  which composes with ``fully_shard``).
- ``DataParallel``: which samples a rank trains on. Every rank receives the whole batch and derives its share
  itself, so shares need no communication and the loss can be normalised by the GLOBAL token count
  (``GlobalBatchInfo``) exactly as in a single process.
- ``full_weights``: the full (unsharded) tensors, streamed one at a time, for the rollout engine.
- ``save_sharded`` / ``load_sharded``: torch.distributed.checkpoint (DCP). DCP stores each tensor's shards
  with their offsets and reshards on load, so a checkpoint written by N ranks loads into M ranks, or into a
  plain single-process learner (tested for 2 -> 1).

Every function that touches FSDP parameters is a collective: all ranks of the group call it, in the same order.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import torch
from torch import nn

from pettingllms.core.types import Sample
from pettingllms.learner.adapters import adapter_parameters
from pettingllms.learner.batching import split_mini_batches

if TYPE_CHECKING:
    from pettingllms.learner.learner import PolicyLearner

META_FORMAT = 1


@dataclass(frozen=True)
class FSDPOptions:
    """How a policy's learner is sharded. The defaults are plain FSDP2 in the model's own dtype.

    mixed_precision: compute in bfloat16 (parameters are all-gathered in bf16) while the sharded master
        weights, the optimiser state and the gradient reduction stay float32. Needs a float32 model.
    cpu_offload: keep the sharded parameters, gradients and optimiser state in host memory and copy each
        layer to the GPU for its compute. GPU only: on a CPU machine everything already is in host memory.
    reshard_after_forward: free each layer's gathered weights after its forward (and gather them again for
        the backward). False trades memory for one all-gather less per layer and step.
    """

    mixed_precision: bool = False
    cpu_offload: bool = False
    reshard_after_forward: bool = True


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the data-parallel ranks of one policy (rank 0 of 1: a single process)."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"data-parallel rank {self.rank} of world size {self.world_size} is not a valid rank")

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def shares(self, samples: Sequence[Sample], indices: Sequence[int], mini_batch_size: int) -> list[list[int]]:
        """Every rank's share of ``indices``; see ``rank_shares``."""
        return rank_shares(samples, indices, mini_batch_size, self.world_size)

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum of ``values`` over the ranks (a collective). float64, so sums are exact enough."""
        if not self.is_distributed:
            return [float(v) for v in values]
        import torch.distributed as dist

        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return tensor.cpu().tolist()


SINGLE_PROCESS = DataParallel()


def rank_shares(
    samples: Sequence[Sample], indices: Sequence[int], mini_batch_size: int, world_size: int
) -> list[list[int]]:
    """Split ``indices`` (into ``samples``) between ``world_size`` ranks; returns one list per rank.

    Each mini-batch (``split_mini_batches(indices, mini_batch_size)``) is dealt out on its own, so a rank's share
    of a mini-batch is the same whether it is computed from that mini-batch or from the whole stream: the pass
    that computes old log-probs over the stream and the training passes over its mini-batches agree on who owns
    which sample. Within a mini-batch, samples that share a prompt are put next to each other (first-seen prompt
    order) and the list is cut into ``world_size`` contiguous pieces of near-equal length, so the K branches of
    a tree node mostly land on one rank, where the learner can pack them into one row.
    A rank may get nothing from a small mini-batch (fewer samples than ranks).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for chunk in split_mini_batches(indices, mini_batch_size):
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for index in chunk:
            by_prompt.setdefault(tuple(samples[index].prompt_ids), []).append(index)
        ordered = [index for group in by_prompt.values() for index in group]
        for rank in range(world_size):
            start, stop = rank * len(ordered) // world_size, (rank + 1) * len(ordered) // world_size
            shares[rank].extend(ordered[start:stop])
    return shares


def padded_plan(plans: Sequence[Sequence[Any]], rank: int, padding: Any) -> list[Any]:
    """``plans[rank]`` followed by ``padding`` items up to the longest plan's length.

    FSDP ranks all-gather weights in every forward, so every rank must run as many forwards (and backwards) as
    the others; a rank with less work runs padding passes that contribute nothing.
    """
    longest = max((len(plan) for plan in plans), default=0)
    mine = list(plans[rank])
    return mine + [padding] * (longest - len(mine))


# ---------------------------------------------------------------------------------------------- sharding


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a transformers model (or a peft model around one), in model order.

    Found by the class names transformers lists in ``_no_split_modules`` (e.g. ``LlamaDecoderLayer``); these
    are the natural FSDP units: one all-gather per block.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    return [module for module in model.modules() if type(module).__name__ in names]


def shard_model(model: nn.Module, options: FSDPOptions, device: torch.device) -> nn.Module:
    """Apply ``fully_shard`` to every decoder layer and then to the root, in place; returns ``model``.

    Call it inside an initialised process group, after LoRA adapters are attached and before the optimiser is
    built (the optimiser must hold the sharded parameters). Parameter names do not change.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if options.cpu_offload and device.type == "cpu":
        raise ValueError("fsdp.cpu_offload needs GPUs: on a CPU-only worker the weights already live in host memory")
    if options.mixed_precision:
        dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
        if dtypes != {torch.float32}:
            raise ValueError(
                f"fsdp.mixed_precision keeps float32 master weights and computes in bfloat16; the model is loaded as "
                f"{sorted(str(d) for d in dtypes)}. Set base_models.<policy>.dtype=float32"
            )
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": options.reshard_after_forward}
    if options.mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if options.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


# ---------------------------------------------------------------------------------------------- weights


def trained_parameter_names(model: nn.Module, adapter_names: Sequence[str], frozen: Sequence[str] = ()) -> list[str]:
    """Names of the parameters an update can change, in model order: every parameter of a full model, or the
    LoRA weights of the adapters that are not frozen."""
    if not adapter_names:
        return [name for name, _ in model.named_parameters()]
    trained = [adapter for adapter in adapter_names if adapter not in frozen]
    owned = {name for adapter in trained for name, _ in adapter_parameters(model, adapter)}
    return [name for name, _ in model.named_parameters() if name in owned]


@torch.no_grad()
def full_weights(model: nn.Module, names: Sequence[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` for each parameter (or each one in ``names``), in model order.

    A collective under FSDP: every rank must iterate to the end, together. Each tensor is all-gathered on its
    own, so at most one full tensor exists at a time (an engine can load a large model layer by layer).
    Every rank receives the full tensor; consumers on other ranks simply drop it. A parameter that is not a
    DTensor (a plain module) is yielded as it is.
    """
    from torch.distributed.tensor import DTensor

    wanted = None if names is None else set(names)
    for name, param in model.named_parameters():
        if wanted is not None and name not in wanted:
            continue
        tensor = param.detach()
        if isinstance(tensor, DTensor):
            if tensor.device.type == "cpu" and _backend() == "nccl":
                tensor = tensor.to(torch.device("cuda", torch.cuda.current_device()))  # CPU offload: gather on GPU
            tensor = tensor.full_tensor()
        yield name, tensor


def load_weights_into(module: nn.Module, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> int:
    """Copy each ``(name, tensor)`` into ``module``'s parameter of that name (cast to its dtype and device).

    Returns the number of tensors copied. An unknown name or a shape mismatch raises: the engine copy and the
    learner must be the same architecture with the same adapters.
    """
    params = dict(module.named_parameters())
    count = 0
    with torch.no_grad():
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"weight {name!r} has no parameter in the engine's model")
            target = params[name]
            if target.shape != tensor.shape:
                raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)} != engine's {tuple(target.shape)}")
            target.copy_(tensor)
            count += 1
    return count


# ---------------------------------------------------------------------------------------------- checkpoints


def save_sharded(learner: "PolicyLearner", directory: str | Path) -> dict[str, Any]:
    """Write the learner's weights and optimiser state with DCP into ``directory`` (a collective).

    Returns the rest of the learner's state, which is the same on every rank (step, LR schedule, KL controllers,
    adapter layout, and which parameters have optimiser state): store it once, beside the shards, and give it
    back to ``load_sharded``. Each rank writes its own shards; with several nodes ``directory`` must be on a
    shared file system. Only trained weights are saved (LoRA: the adapters; the base model is reloaded).
    """
    import torch.distributed.checkpoint as dcp

    with_state = [name for name, param in learner.model.named_parameters() if param in learner.optimizer.state]
    state: dict[str, Any] = {"model": _trained_weights(learner)}
    if with_state:  # an optimiser that never stepped has nothing to save (and must not be initialised here)
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        with _requiring_grad(_optimizer_params(learner)):
            state["optimizer"] = get_optimizer_state_dict(learner.model, learner.optimizer)
    dcp.save(state, checkpoint_id=str(directory))
    return {
        "format": META_FORMAT,
        "step": learner.step,
        "scheduler": learner.scheduler.state_dict(),
        "kl_coefs": [float(c.value) for c in learner.kl_controllers],
        "adapter_names": list(learner.adapter_names),
        "frozen": sorted(learner.frozen),
        "optimizer_state_params": with_state,
    }


def load_sharded(learner: "PolicyLearner", directory: str | Path, meta: Mapping[str, Any]) -> None:
    """Restore what ``save_sharded`` wrote (a collective), whatever the number of ranks that wrote it.

    Works for an FSDP learner of any world size and for a plain single-process learner: DCP reads the byte
    ranges each destination shard needs. The optimiser ends with state for exactly the parameters that had it
    when saved, so an adapter that had not trained yet still takes a first Adam step later.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    learner.check_saved_state(meta, META_FORMAT, "sharded learner state")
    path = Path(directory)
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"no sharded (DCP) checkpoint in {path}")
    with_state = set(meta["optimizer_state_params"])
    state: dict[str, Any] = {"model": _trained_weights(learner)}
    # torch's state-dict helpers skip parameters that do not require grad (peft freezes inactive adapters), so
    # every optimiser parameter requires grad while they run.
    with _requiring_grad(_optimizer_params(learner)):
        if with_state:
            # A fresh optimiser has no state to load into: torch creates it with one zero-LR step. Keep exactly
            # the entries that were saved, so the template matches the checkpoint key for key.
            learner.optimizer.state.clear()
            get_optimizer_state_dict(learner.model, learner.optimizer)
            _drop_state_except(learner, with_state)
            state["optimizer"] = get_optimizer_state_dict(learner.model, learner.optimizer)
        dcp.load(state, checkpoint_id=str(path))
        set_model_state_dict(learner.model, state["model"], options=StateDictOptions(strict=False))
        if with_state:
            set_optimizer_state_dict(learner.model, learner.optimizer, state["optimizer"])
    _drop_state_except(learner, with_state)
    learner.scheduler.load_state_dict(meta["scheduler"])
    for controller, value in zip(learner.kl_controllers, meta["kl_coefs"]):
        controller.value = value
    learner.step = int(meta["step"])


def _trained_weights(learner: "PolicyLearner") -> dict[str, Any]:
    """The model state DCP saves and loads in place: trained weights only, never frozen base weights."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    names = set(trained_parameter_names(learner.model, learner.adapter_names))
    return {k: v for k, v in get_model_state_dict(learner.model).items() if k in names}


def _optimizer_params(learner: "PolicyLearner") -> list[torch.Tensor]:
    return [param for group in learner.optimizer.param_groups for param in group["params"]]


def _drop_state_except(learner: "PolicyLearner", names: set[str]) -> None:
    for name, param in learner.model.named_parameters():
        if name not in names:
            learner.optimizer.state.pop(param, None)


@contextmanager
def _requiring_grad(params: Sequence[torch.Tensor]) -> Iterator[None]:
    saved = [(p, p.requires_grad) for p in params]
    for p, _ in saved:
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)


def _backend() -> str | None:
    import torch.distributed as dist

    return dist.get_backend() if dist.is_initialized() else None
