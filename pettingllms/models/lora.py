"""One LoRA adapter per agent (L2), on one shared base model, with peft.

``attach_adapters`` wraps the model in a ``peft.PeftModel`` holding one LoRA adapter per name.
``use_adapter(model, name)`` routes forwards through one adapter, or through the base weights when the
name is None (e.g. for a reference policy). The rollout engine (generation) and the learner (training
each agent's rows through that agent's adapter, ``training_adapter``) both use it; a generation batch that mixes
adapters routes each row through its own in one forward (``lora_rows.per_row_adapters``). ``adapter_parameters``
finds an adapter's weights; ``adapter_tensors`` turns a stream of trained tensors into each adapter's peft files for an
engine with its own copy (vLLM). This module is the project's one home for LoRA.

Gradient flags (``requires_grad``), measured on peft 0.21.2:
- ``get_peft_model`` makes its adapter trainable, but ``add_adapter`` leaves each added adapter frozen;
- peft's ``set_adapter(name)`` marks *only* that adapter trainable and freezes every other adapter;
  ``disable_adapter_layers()`` freezes all adapters; re-enabling unfreezes only the active one.
- ``use_adapter`` undoes those side effects: on entry and on exit it restores every parameter's
  ``requires_grad`` flag to what it was before. After ``attach_adapters`` every adapter's LoRA weights
  are trainable and every base weight is frozen, and switching adapters never changes that.
- So one optimizer over all adapters' parameters works: an adapter that took no part in a forward gets
  ``grad=None`` and torch optimizers skip parameters whose grad is None. Zero gradients with
  ``set_to_none=True`` (the torch default), or Adam would move an idle adapter with stale momentum.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch.nn as nn

from pettingllms.core.choices import DEFAULT_LORA_TARGET_MODULES
from pettingllms.core.errors import ConfigError

_ADAPTER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_STATE_ATTR = "_pettingllms_adapter"  # which adapter use_adapter last routed to (None = base weights)
_UNSET = object()


@dataclass(frozen=True)
class LoraSpec:
    """LoRA hyper-parameters shared by every adapter of a model.

    dropout defaults to 0: with dropout the learner's training-mode log-probabilities would not match
    the engine's eval-mode sampling log-probabilities even before any update.
    """

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_LORA_TARGET_MODULES

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ConfigError(f"lora rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ConfigError(f"lora alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ConfigError("lora target_modules is empty")
        object.__setattr__(self, "target_modules", tuple(self.target_modules))

    def to_peft_config(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )


def attach_adapters(model: nn.Module, names: Sequence[str], spec: LoraSpec) -> nn.Module:
    """Add one fresh LoRA adapter per name and return the ``peft.PeftModel`` holding them.

    A fresh adapter has B = 0, so it starts equal to the base model. LoRA A is drawn from torch's global
    RNG: seed it beforehand for reproducible adapters. Afterwards all adapters are trainable, base
    weights frozen, and ``names[0]`` is active. A model that is already a PeftModel gets the new names added.
    """
    from peft import PeftModel, get_peft_model

    names = _checked_names(names)
    existing = set(model.peft_config) if isinstance(model, PeftModel) else set()
    clashes = sorted(existing.intersection(names))
    if clashes:
        raise ConfigError(f"LoRA adapters {clashes} already exist on this model")
    config = spec.to_peft_config()
    if isinstance(model, PeftModel):
        peft_model = model
        pending = list(names)
    else:
        peft_model = get_peft_model(model, config, adapter_name=names[0])
        pending = list(names[1:])
    for name in pending:
        peft_model.add_adapter(name, config)
    peft_model.set_adapter(names[0])
    peft_model.set_requires_grad(list(peft_model.peft_config), requires_grad=True)
    setattr(peft_model, _STATE_ATTR, names[0])
    return peft_model


def adapter_names(model: nn.Module) -> tuple[str, ...]:
    """Names of the LoRA adapters on ``model`` (empty for a plain model)."""
    from peft import PeftModel

    return tuple(model.peft_config) if isinstance(model, PeftModel) else ()


@contextmanager
def use_adapter(model: nn.Module, name: str | None) -> Iterator[nn.Module]:
    """Route forwards through adapter ``name``, or through the base weights when ``name`` is None.

    Restores the previous routing and every ``requires_grad`` flag on exit; nests. On a plain model
    (no adapters) ``name=None`` is a no-op and any name is an error.
    """
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        if name is not None:
            raise ConfigError(f"adapter '{name}' requested, but the model has no LoRA adapters")
        yield model
        return
    if name is not None and name not in model.peft_config:
        raise ConfigError(f"unknown LoRA adapter '{name}'; this model has {sorted(model.peft_config)}")
    flags = [(param, param.requires_grad) for param in model.parameters()]
    previous = getattr(model, _STATE_ATTR, _UNSET)
    if previous is _UNSET:
        previous = model.active_adapter
    try:
        _route(model, name)
        _restore_flags(flags)
        yield model
    finally:
        _route(model, previous)
        _restore_flags(flags)


def _route(model, name: str | None) -> None:
    """Point the LoRA layers at ``name`` (enabled) or disable them all (None); flags are fixed by the caller.

    Always applied, never skipped as "already there": code outside use_adapter may have switched peft.
    """
    if name is None:
        model.base_model.disable_adapter_layers()
    else:
        model.base_model.enable_adapter_layers()
        model.set_adapter(name)
    setattr(model, _STATE_ATTR, name)


def _restore_flags(flags: list) -> None:
    for param, requires_grad in flags:
        if param.requires_grad != requires_grad:
            param.requires_grad_(requires_grad)


def _checked_names(names: Sequence[str]) -> list[str]:
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names:
        raise ConfigError("attach_adapters needs at least one adapter name")
    if len(set(names)) != len(names):
        raise ConfigError(f"duplicate LoRA adapter names: {names}")
    for name in names:
        if not isinstance(name, str) or not _ADAPTER_NAME.match(name) or "lora_" in name:
            raise ConfigError(
                f"bad LoRA adapter name {name!r}: use letters, digits, '_' or '-', start with a letter or '_', "
                "and do not include 'lora_' (peft's parameter prefix)"
            )
    return names


def adapter_parameters(model: nn.Module, name: str) -> list[tuple[str, nn.Parameter]]:
    """(qualified name, parameter) of every tensor that belongs to peft adapter ``name``, in model order.

    Found through peft's own per-layer registries (``adapter_layer_names``), plus ``modules_to_save`` copies,
    so other adapters and the base weights are never included. Raises if the adapter owns no parameter.
    """
    import torch

    owned: set[int] = set()
    for module in model.modules():
        for attribute in getattr(module, "adapter_layer_names", ()):
            container = getattr(module, attribute, None)
            if container is not None and name in container:
                entry = container[name]
                if isinstance(entry, torch.Tensor):
                    owned.add(id(entry))
                else:
                    owned.update(id(p) for p in entry.parameters())
    found = []
    for qualified, param in model.named_parameters():
        parts = qualified.split(".")
        in_saved_copy = any(parts[i] == "modules_to_save" and parts[i + 1] == name for i in range(len(parts) - 1))
        if id(param) in owned or in_saved_copy:
            found.append((qualified, param))
    if not found:
        raise ConfigError(f"adapter {name!r} has no parameters in the model; attach it before building the learner")
    return found


def copy_adapter(model: nn.Module, source: str, target: str) -> None:
    """Overwrite adapter ``target``'s weights with ``source``'s, in place (both attached with the model's one
    ``LoraSpec``, so shapes and, under FSDP, shardings match). ``target``'s ``requires_grad`` flags are untouched."""
    import torch

    def by_place(adapter: str) -> dict[tuple[str, ...], nn.Parameter]:  # the name with the adapter's part blanked
        return {tuple("" if part == adapter else part for part in name.split(".")): param
                for name, param in adapter_parameters(model, adapter)}

    sources, targets = by_place(source), by_place(target)
    if sources.keys() != targets.keys():
        raise ConfigError(f"adapters {source!r} and {target!r} hold different tensors; they cannot be copied")
    with torch.no_grad():
        for key, param in targets.items():
            param.copy_(sources[key])


@contextmanager
def training_adapter(
    model: nn.Module, name: str | None, adapters: dict[str, list[nn.Parameter]], trainable: bool
) -> Iterator[nn.Module]:
    """Forward (and backward) through adapter ``name`` (None: the base weights), with exactly one adapter's weights
    requiring grad: ``name``'s when ``trainable``, none otherwise. Every flag is restored on exit.

    adapters: every adapter's parameters (``adapter_parameters``), so that the others can be switched off.
    """
    with use_adapter(model, name):
        for adapter, params in adapters.items():
            wanted = trainable and adapter == name
            for param in params:
                if param.requires_grad != wanted:
                    param.requires_grad_(wanted)
        yield model


# A peft parameter name carries its adapter: "...q_proj.lora_A.<adapter>.weight". peft's saved adapter files
# (what engines load) drop it: "...q_proj.lora_A.weight".
_ADAPTER_IN_NAME = re.compile(r"\.(lora_A|lora_B)\.([^.]+)\.")


def adapter_tensors(named_tensors, adapter_names) -> dict[str, dict]:
    """{adapter: its LoRA tensors under peft's saved-file names}, consuming the whole ``(name, tensor)`` stream.

    Consuming every item matters under FSDP: the stream is a collective that all ranks iterate to the end. Other
    tensors (the frozen base weights) are dropped as they pass, and adapter tensors are copied to host memory as
    they arrive, so at most one full tensor is on the GPU at a time.
    """
    wanted = set(adapter_names)
    adapters: dict[str, dict] = {}
    for name, tensor in named_tensors:
        match = _ADAPTER_IN_NAME.search(name)
        if match and match.group(2) in wanted:
            saved_name = name[: match.start()] + f".{match.group(1)}." + name[match.end():]
            adapters.setdefault(match.group(2), {})[saved_name] = tensor.detach().to("cpu", copy=True)
    return adapters
