"""Regional compilation: ``torch.compile`` of each decoder layer's ``forward``, for the learner's passes only.

Why regional: the decoder layers are one class repeated, so one compiled graph serves all of them (dynamo guards on
the parameters' shapes and dtypes, not on which layer they belong to), and compiling takes seconds per variant
instead of the minutes a whole-model graph with its LM head and loss would. What it fuses is the element-wise work
between the matrix products (RMSNorm's upcast, rotary embeddings, SiLU and the gate, residual adds, the casts
autocast inserts): on an H100 these kernels were a third to a half of the Qwen3-1.7B update's device time
(docs/results.md, the learner profile).

Why ``forward`` and not the module: hooks stay outside the compiled region. FSDP2 gathers and frees each layer's
weights in forward hooks, and transformers' gradient checkpointing wraps the module call; both keep working
unchanged around a compiled ``forward``.

Why only inside ``active()``: the transformers rollout engine generates with the learner's own module (a KV cache,
one token at a time), which would compile graphs of its own for nothing. Outside ``active()`` the layers run their
plain ``forward``.

Each (grad mode, one row or several, adapter, which adapter trains, the backward's recompute) combination is a
variant compiled on first use: about 6 per LoRA adapter and 4 more (measured: 2 adapters 16, 4 adapters 28, 8
adapters 52). ``recompile_limit`` sizes dynamo's limit on them from the adapter count, set only while the compiled
layers run, and hitting it anyway raises instead of silently running the layers eager. ``fullgraph=True``: a layer
that dynamo cannot trace whole (a graph break, which would leave parts of it eager) fails its first pass instead.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn

from pettingllms.models.layers import decoder_layers

VARIANTS_PER_ADAPTER = 8  # measured about 6 (see above), with room
SHARED_VARIANTS = 16  # a full model's, the KL reference's (its weights do not require grad) and the adapters-off pass


def recompile_limit(adapters: int) -> int:
    """Dynamo's limit on compiled variants of the layer's code for a model with ``adapters`` LoRA adapters."""
    return SHARED_VARIANTS + VARIANTS_PER_ADAPTER * adapters


class CompiledLayers:
    """The model's decoder layers, each with a compiled ``forward`` that ``active()`` puts in place.

    The class's ``forward`` is compiled once and bound to each layer (a deep copy of a layer taken inside
    ``active()`` binds it to the copy, not to this layer's weights). A layer whose ``forward`` something else has
    replaced (an accelerate hook) is refused: compiling the replacement would run its Python side effects only
    while tracing."""

    def __init__(self, model: nn.Module, adapters: int = 0) -> None:
        self.layers = decoder_layers(model)
        if not self.layers:
            raise ValueError(f"{type(model).__name__} has no decoder layers that transformers names in "
                             "_no_split_modules: nothing to compile (optim.compile=false)")
        replaced = [i for i, layer in enumerate(self.layers) if "forward" in vars(layer)]
        if replaced:
            raise ValueError(f"decoder layer {replaced[0]} of {type(model).__name__} has its forward replaced (a hook "
                             "wraps it): optim.compile cannot compile it; set optim.compile=false")
        self.limit = recompile_limit(adapters)
        # dynamic=True: packed rows change length every micro-batch; one graph with a symbolic length serves them.
        compiled = {cls: torch.compile(cls.forward, dynamic=True, fullgraph=True)
                    for cls in {type(layer) for layer in self.layers}}
        self._bound = [types.MethodType(compiled[type(layer)], layer) for layer in self.layers]
        self._depth = 0
        self._settings: Any = None

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within the block the layers run their compiled ``forward`` and dynamo has this model's limit; afterwards
        the layers have their own forward again and dynamo the settings it had. Re-entrant: a pass inside a block
        that already holds them (the backward's recompute under gradient checkpointing must run the same compiled
        forward as the pass it recomputes) keeps them in place."""
        self._depth += 1
        if self._depth == 1:
            limit = max(torch._dynamo.config.recompile_limit, self.limit)
            self._settings = torch._dynamo.config.patch(recompile_limit=limit, fail_on_recompile_limit_hit=True)
            self._settings.__enter__()
            for layer, bound in zip(self.layers, self._bound):
                layer.forward = bound
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                for layer in self.layers:
                    del layer.forward  # the instance attribute set above: the class's forward shows through again
                self._settings.__exit__(None, None, None)
                self._settings = None
