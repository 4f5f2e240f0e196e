"""A learner's state, built in one place: what a resumed run needs, saved with DCP; and Hugging Face exports.

``learner_meta`` is the part every rank shares (step, LR schedule, KL coefficients, adapter layout, which parameters
have optimiser state); the tensors (trained weights, AdamW state) go through torch.distributed.checkpoint (DCP),
which writes each rank's shards from where they live and reshards on load: a state written by N FSDP ranks loads
into M ranks or into a plain single-process learner. ``snapshot``/``restore`` keep the same state in memory.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import torch
from torch import nn

from pettingllms.learner.weights import trained_parameter_names

if TYPE_CHECKING:
    from pettingllms.learner.learner import PolicyLearner

FORMAT = 2


def learner_meta(learner: "PolicyLearner", optimizer_state_params: Sequence[str]) -> dict[str, Any]:
    """The state every rank shares, as plain JSON-able values."""
    return {
        "format": FORMAT,
        "step": learner.step,
        "scheduler": learner.scheduler.state_dict(),
        "kl_coefs": [float(c.value) for c in learner.kl_controllers],
        "adapter_names": list(learner.adapter_names),
        "frozen": sorted(learner.frozen),
        "optimizer_state_params": list(optimizer_state_params),
    }


def check_meta(learner: "PolicyLearner", meta: Mapping[str, Any], what: str) -> None:
    """Raise unless a saved state fits this learner: format, adapters, frozen adapters, KL on or off."""
    if meta.get("format") != FORMAT:
        raise ValueError(f"{what} format {meta.get('format')!r} is not {FORMAT}")
    if list(meta["adapter_names"]) != list(learner.adapter_names) or sorted(meta["frozen"]) != sorted(learner.frozen):
        raise ValueError(
            f"{what} was saved with adapters {meta['adapter_names']} (frozen {meta['frozen']}); "
            f"this learner has {list(learner.adapter_names)} (frozen {sorted(learner.frozen)})"
        )
    if len(meta["kl_coefs"]) != len(learner.kl_controllers):
        raise ValueError(f"{what} and this learner disagree on whether the KL loss is on")


def restore_meta(learner: "PolicyLearner", meta: Mapping[str, Any]) -> None:
    learner.scheduler.load_state_dict(meta["scheduler"])
    for controller, value in zip(learner.kl_controllers, meta["kl_coefs"]):
        controller.value = value
    learner.step = int(meta["step"])


def snapshot(learner: "PolicyLearner") -> dict[str, Any]:
    """An in-memory copy (host tensors) of everything a resumed run needs; ``restore`` loads it back."""
    names = set(trained_parameter_names(learner.model, learner.adapter_names))
    params = dict(learner.model.named_parameters())
    with_state = [name for name in params if name in names and params[name] in learner.optimizer.state]
    return {
        "meta": learner_meta(learner, with_state),
        "model": {n: p.detach().to("cpu", copy=True) for n, p in params.items() if n in names},
        "optimizer": _to_host(learner.optimizer.state_dict()),
    }


def restore(learner: "PolicyLearner", state: Mapping[str, Any]) -> None:
    check_meta(learner, state["meta"], "learner state")
    params = {n: p for n, p in learner.model.named_parameters()
              if n in set(trained_parameter_names(learner.model, learner.adapter_names))}
    missing, unexpected = sorted(set(params) - set(state["model"])), sorted(set(state["model"]) - set(params))
    if missing or unexpected:
        raise ValueError(f"saved weights do not match: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state["model"][name])
    learner.optimizer.load_state_dict(state["optimizer"])
    restore_meta(learner, state["meta"])


def _to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    return value


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
    return learner_meta(learner, with_state)


def load_sharded(learner: "PolicyLearner", directory: str | Path, meta: Mapping[str, Any]) -> None:
    """Restore what ``save_sharded`` wrote (a collective), whatever the number of ranks that wrote it.

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

    check_meta(learner, meta, "sharded learner state")
    path = Path(directory)
    if not (path / METADATA_FILE).is_file():
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
        load_dcp(state, path)
        set_model_state_dict(learner.model, state["model"], options=StateDictOptions(strict=False))
        if with_state:
            set_optimizer_state_dict(learner.model, learner.optimizer, state["optimizer"])
    _drop_state_except(learner, with_state)
    restore_meta(learner, meta)


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
