"""A learner's state, built in one place: what a resumed run needs, saved with DCP; and Hugging Face exports.

``learner_meta`` is the part every rank shares (step, LR schedule, KL coefficients, adapter layout, which parameters
have optimiser state); the tensors (trained weights, AdamW state) go through torch.distributed.checkpoint (DCP),
which writes each rank's shards from where they live and reshards on load: a state written by N FSDP ranks loads
into M ranks or into a plain single-process learner. ``snapshot``/``restore`` keep the same state in memory.

Every function here works on a ``StateView``, the learner's parts named explicitly (``PolicyLearner.state_view``), so
this module knows nothing else of the learner. Loading restores the tensors, optimiser, scheduler and KL controllers
in place and returns the saved step counter, which the learner adopts.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import nn

from pettingllms.core.errors import ConfigError
from pettingllms.learner.weights import trained_parameter_names

FORMAT = 2


@dataclass(frozen=True)
class StateView:
    """The parts of a learner that its state is made of, as they are when the view is taken.

    kl_controllers: one per stream, each with a ``value`` (empty when the KL loss is off); adapter_names and frozen:
    the LoRA layout a saved state must match; step: the number of ``update`` calls so far; nonfinite_guard: the
    learner's ``NonfiniteGradientGuard``, whose streak of NaN/inf steps a resume continues.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    kl_controllers: Sequence[Any]
    adapter_names: Sequence[str]
    frozen: frozenset[str]
    step: int
    nonfinite_guard: Any = None


def learner_meta(view: StateView, optimizer_state_params: Sequence[str]) -> dict[str, Any]:
    """The state every rank shares, as plain JSON-able values."""
    return {
        "format": FORMAT,
        "step": view.step,
        "scheduler": view.scheduler.state_dict(),
        "kl_coefs": [float(c.value) for c in view.kl_controllers],
        "adapter_names": list(view.adapter_names),
        "frozen": sorted(view.frozen),
        "optimizer_state_params": list(optimizer_state_params),
        # else a resumed run stops at another step than the uninterrupted one (optim.max_nonfinite_grad_steps)
        "nonfinite_streak": int(view.nonfinite_guard.streak) if view.nonfinite_guard is not None else 0,
    }


def check_meta(view: StateView, meta: Mapping[str, Any], what: str) -> None:
    """Raise unless a saved state fits this learner: format, adapters, frozen adapters, KL on or off."""
    if meta.get("format") != FORMAT:
        raise ValueError(f"{what} format {meta.get('format')!r} is not {FORMAT}")
    fix = ("; resume with the agents, adapters and KL setting the checkpoint was trained with, or start afresh "
           "(training.resume=none or another training.experiment_name)")
    if list(meta["adapter_names"]) != list(view.adapter_names) or sorted(meta["frozen"]) != sorted(view.frozen):
        raise ConfigError(
            f"{what} was saved with adapters {meta['adapter_names']} (frozen {meta['frozen']}); "
            f"this learner has {list(view.adapter_names)} (frozen {sorted(view.frozen)}){fix}"
        )
    if len(meta["kl_coefs"]) != len(view.kl_controllers):
        raise ConfigError(f"{what} and this learner disagree on whether the KL loss is on "
                          f"(algorithm.kl.init_kl_coeff > 0){fix}")


def configured_hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each param group's settings (lr, betas, weight decay, ...) as this learner was built from the config."""
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


def restore_meta(view: StateView, meta: Mapping[str, Any], configured: list[dict[str, Any]]) -> int:
    """Restore the LR schedule's position and the KL coefficients in place; returns the saved step.

    The schedule's shape and the optimiser's settings stay the config's (``configured``, taken before the optimiser's
    state was loaded, which would bring back the saved ones): a resume that changes ``optim.lr``, the weight decay,
    betas, warmup or minimum ratio trains with the new values from the resumed step on, at the saved position of the
    schedule (the LR is the new peak times the schedule's factor there)."""
    view.scheduler.load_state_dict(meta["scheduler"])
    for group, mine in zip(view.optimizer.param_groups, configured):
        group.update(mine)
    view.scheduler.base_lrs = [mine["initial_lr"] if "initial_lr" in mine else mine["lr"] for mine in configured]
    at = view.scheduler.last_epoch
    lrs = [base * factor(at) for base, factor in zip(view.scheduler.base_lrs, view.scheduler.lr_lambdas)]
    for group, lr in zip(view.optimizer.param_groups, lrs):
        group["lr"] = lr
    view.scheduler._last_lr = lrs  # what get_last_lr() reports (torch keeps it in this attribute)
    for controller, value in zip(view.kl_controllers, meta["kl_coefs"]):
        controller.value = value
    if view.nonfinite_guard is not None:
        view.nonfinite_guard.streak = int(meta.get("nonfinite_streak", 0))  # checkpoints before it: 0
    return int(meta["step"])


def snapshot(view: StateView) -> dict[str, Any]:
    """An in-memory copy (host tensors) of everything a resumed run needs; ``restore`` loads it back."""
    names = set(trained_parameter_names(view.model, view.adapter_names))
    params = dict(view.model.named_parameters())
    with_state = [name for name in params if name in names and params[name] in view.optimizer.state]
    return {
        "meta": learner_meta(view, with_state),
        "model": {n: p.detach().to("cpu", copy=True) for n, p in params.items() if n in names},
        "optimizer": _to_host(view.optimizer.state_dict()),
    }


def restore(view: StateView, state: Mapping[str, Any]) -> int:
    """Load what ``snapshot`` took back into the view's parts; returns the saved step."""
    check_meta(view, state["meta"], "learner state")
    configured = configured_hyperparameters(view.optimizer)
    params = {n: p for n, p in view.model.named_parameters()
              if n in set(trained_parameter_names(view.model, view.adapter_names))}
    missing, unexpected = sorted(set(params) - set(state["model"])), sorted(set(state["model"]) - set(params))
    if missing or unexpected:
        raise ValueError(f"saved weights do not match: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state["model"][name])
    view.optimizer.load_state_dict(state["optimizer"])
    return restore_meta(view, state["meta"], configured)


def _to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    return value


def save_sharded(view: StateView, directory: str | Path) -> dict[str, Any]:
    """Write the learner's weights and optimiser state with DCP into ``directory`` (a collective).

    Returns the rest of the learner's state, which is the same on every rank (step, LR schedule, KL controllers,
    adapter layout, and which parameters have optimiser state): store it once, beside the shards, and give it
    back to ``load_sharded``. Each rank writes its own shards; with several nodes ``directory`` must be on a
    shared file system. Only trained weights are saved (LoRA: the adapters; the base model is reloaded).
    """
    import torch.distributed.checkpoint as dcp

    from pettingllms.learner.safe_dcp import CheckedWriter  # several writer threads, none of whose failures is lost

    state, meta = _saved_state(view)
    dcp.save(state, storage_writer=CheckedWriter(directory), checkpoint_id=str(directory))
    return meta


def save_sharded_async(view: StateView, directory: str | Path, process_group: Any) -> tuple[Any, dict[str, Any]]:
    """``save_sharded`` that returns once the state is copied to host memory: DCP's ``async_save`` writes the copy in a
    thread, and its planning collectives run on ``process_group``, a gloo group of the policy's ranks kept for
    checkpoints (training's own collectives must not share a group with a thread). Returns (a future that holds the
    result once every file is written, the meta). The same files as ``save_sharded``."""
    import torch.distributed.checkpoint as dcp

    from pettingllms.learner.safe_dcp import CheckedWriter

    state, meta = _saved_state(view)
    future = dcp.async_save(state, storage_writer=CheckedWriter(directory), checkpoint_id=str(directory),
                            process_group=process_group)
    return future, meta


def _saved_state(view: StateView) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a checkpoint holds of the learner: its trained weights and optimiser state (DCP's), and the meta."""
    with_state = [name for name, param in view.model.named_parameters() if param in view.optimizer.state]
    state: dict[str, Any] = {"model": _trained_weights(view)}
    if with_state:  # an optimiser that never stepped has nothing to save (and must not be initialised here)
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        with _requiring_grad(_optimizer_params(view)):
            state["optimizer"] = get_optimizer_state_dict(view.model, view.optimizer)
    return state, learner_meta(view, with_state)


def stage_sharded(view: StateView, buffers: dict[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``save_sharded`` writes, copied into host buffers, and its meta: the learner may train on while
    ``write_staged`` writes the copy (an asynchronous checkpoint). ``buffers`` (name -> host tensor) are kept by the
    caller and reused by the next save, pinned where the state lives on a GPU, so a save after the first costs one
    device-to-host copy and no allocation. Unsharded learners only: an FSDP group's save is a collective
    (``save_sharded_async``)."""
    state, meta = _saved_state(view)
    return host_copy(state, buffers), meta


def host_copy(state: Any, buffers: dict[str, torch.Tensor]) -> Any:
    """``state`` (nested dicts, lists and tensors) with every tensor copied into its host buffer in ``buffers`` (by
    its path; made on first use, pinned for a GPU tensor, and reused while its shape and dtype stay). Returns once
    every copy has landed."""
    on_gpu: list[bool] = []
    copied = _copied(state, buffers, "", on_gpu)
    if any(on_gpu):
        torch.cuda.synchronize()  # the non-blocking copies have landed before anything trains on
    return copied


def _copied(value: Any, buffers: dict[str, torch.Tensor], path: str, on_gpu: list[bool]) -> Any:
    if isinstance(value, Mapping):
        return {key: _copied(item, buffers, f"{path}/{key}", on_gpu) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(item, buffers, f"{path}/{i}", on_gpu) for i, item in enumerate(value))
    if not isinstance(value, torch.Tensor):
        return value
    buffer = buffers.get(path)
    if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
        buffer = buffers[path] = torch.empty(value.shape, dtype=value.dtype, device="cpu",
                                             pin_memory=value.is_cuda)
    buffer.copy_(value.detach(), non_blocking=value.is_cuda)
    on_gpu.append(value.is_cuda)
    return buffer


def write_staged(staged: Mapping[str, Any], directory: str | Path) -> None:
    """Write ``stage_sharded``'s copy with DCP into ``directory``, as ``save_sharded`` would (the same files)."""
    import torch.distributed.checkpoint as dcp

    from pettingllms.learner.safe_dcp import CheckedWriter

    dcp.save(dict(staged), storage_writer=CheckedWriter(directory), checkpoint_id=str(directory))


def load_sharded(view: StateView, directory: str | Path, meta: Mapping[str, Any]) -> int:
    """Restore what ``save_sharded`` wrote (a collective), whatever the number of ranks that wrote it; returns the
    saved step.

    Works for an FSDP learner of any world size and for a plain single-process learner: DCP reads the byte
    ranges each destination shard needs, and nothing in the checkpoint can run code (``safe_dcp.py``). The
    optimiser ends with state for exactly the parameters that had it when saved, so an adapter that had not
    trained yet still takes a first Adam step later.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from pettingllms.learner.safe_dcp import METADATA_FILE, load_dcp

    check_meta(view, meta, "sharded learner state")
    configured = configured_hyperparameters(view.optimizer)
    path = Path(directory)
    if not (path / METADATA_FILE).is_file():
        raise FileNotFoundError(f"no sharded (DCP) checkpoint in {path}")
    with_state = set(meta["optimizer_state_params"])
    state: dict[str, Any] = {"model": _trained_weights(view)}
    # torch's state-dict helpers skip parameters that do not require grad (peft freezes inactive adapters), so
    # every optimiser parameter requires grad while they run.
    with _requiring_grad(_optimizer_params(view)):
        if with_state:
            # A fresh optimiser has no state to load into: torch creates it with one zero-LR step. Keep exactly
            # the entries that were saved, so the template matches the checkpoint key for key.
            view.optimizer.state.clear()
            get_optimizer_state_dict(view.model, view.optimizer)
            _drop_state_except(view, with_state)
            state["optimizer"] = get_optimizer_state_dict(view.model, view.optimizer)
        load_dcp(state, path)
        set_model_state_dict(view.model, state["model"], options=StateDictOptions(strict=False))
        if with_state:
            set_optimizer_state_dict(view.model, view.optimizer, state["optimizer"])
    _drop_state_except(view, with_state)
    return restore_meta(view, meta, configured)


def _trained_weights(view: StateView) -> dict[str, Any]:
    """The model state DCP saves and loads in place: trained weights only, never frozen base weights."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    names = set(trained_parameter_names(view.model, view.adapter_names))
    return {k: v for k, v in get_model_state_dict(view.model).items() if k in names}


def _optimizer_params(view: StateView) -> list[torch.Tensor]:
    return [param for group in view.optimizer.param_groups for param in group["params"]]


def _drop_state_except(view: StateView, names: set[str]) -> None:
    for name, param in view.model.named_parameters():
        if name not in names:
            view.optimizer.state.pop(param, None)


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


def export_hf_model(model: nn.Module, adapter_names: Sequence[str], dest_dir: str | Path) -> list[Path]:
    """Write loadable Hugging Face weights of an unsharded module; returns the folders written.

    Full model: ``save_pretrained`` (safetensors) into ``dest_dir``. LoRA: one peft folder per adapter,
    ``dest_dir/<adapter name>``, whose ``adapter_config.json`` also records ``"pettingllms_agent"``.
    """
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    if not adapter_names:
        model.save_pretrained(dest)
        return [dest]
    written = []
    for name in adapter_names:
        # peft writes a non-"default" adapter into <dir>/<name> and "default" into <dir> itself.
        target_parent = dest / name if name == "default" else dest
        model.save_pretrained(target_parent, selected_adapters=[name])
        folder = dest / name
        _tag_adapter_config(folder / "adapter_config.json", name)
        written.append(folder)
    return written


def _tag_adapter_config(path: Path, agent: str) -> None:
    config = json.loads(path.read_text())
    config["pettingllms_agent"] = agent
    path.write_text(json.dumps(config, indent=2, sort_keys=True))
