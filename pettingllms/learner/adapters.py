"""LoRA adapter switching and discovery, behind a one-function interface.

The learner only needs ``adapter_context(model, name)``: a context manager under which ``model``'s forward uses
adapter ``name`` alone, or no adapter at all when ``name`` is None. The default below uses peft directly;
``pettingllms.models.lora.use_adapter`` has the same shape and can be passed instead.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, ContextManager, Iterator

import torch
from torch import nn

AdapterContext = Callable[[nn.Module, "str | None"], ContextManager[None]]

# peft keeps each adapter's tensors in ModuleDicts/ParameterDicts keyed by the adapter name under these attributes.
_MODULES_TO_SAVE = "modules_to_save"


@contextmanager
def peft_adapter_context(model: nn.Module, name: str | None) -> Iterator[None]:
    """Run the body with only adapter ``name`` active, or with every adapter disabled when ``name`` is None.

    The previously active adapter is restored afterwards. Callers must not rely on peft's side effects on
    ``requires_grad``: ``set_adapter`` and ``disable_adapter`` toggle it, so the learner sets it itself.
    """
    if name is None:
        with model.disable_adapter():
            yield
        return
    previous = model.active_adapter
    if previous != name:
        model.set_adapter(name)
    try:
        yield
    finally:
        if previous != name:
            model.set_adapter(previous)


def adapter_parameters(model: nn.Module, name: str) -> list[tuple[str, nn.Parameter]]:
    """(qualified name, parameter) of every tensor that belongs to peft adapter ``name``, in model order.

    Found through peft's own per-layer registries (``adapter_layer_names``), plus ``modules_to_save`` copies,
    so other adapters and the base weights are never included. Raises if the adapter owns no parameter.
    """
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
        in_saved_copy = any(parts[i] == _MODULES_TO_SAVE and parts[i + 1] == name for i in range(len(parts) - 1))
        if id(param) in owned or in_saved_copy:
            found.append((qualified, param))
    if not found:
        raise ValueError(f"adapter {name!r} has no parameters in the model; attach it before building the learner")
    return found
