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

Each (grad mode, autocast, adapter, which adapter trains) combination is a variant compiled on first use; the limit
on variants is raised to what a run can meet (``recompile_limit`` below), and hitting it anyway raises instead of
silently falling back to eager layers.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from pettingllms.models.layers import decoder_layers

# Variants of the one layer graph a learner can need: 2 grad modes x (adapters x trainable or not). An L2 policy
# with 8 agents needs 32; past this dynamo would fall back to eager layers, which ``fail_on_recompile_limit_hit``
# turns into an error.
RECOMPILE_LIMIT = 64


class CompiledLayers:
    """The model's decoder layers, each with a compiled ``forward`` that ``active()`` puts in place."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = decoder_layers(model)
        if not self.layers:
            raise ValueError(f"{type(model).__name__} has no decoder layers that transformers names in "
                             "_no_split_modules: nothing to compile (optim.compile=false)")
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        # dynamic=True: packed rows change length every micro-batch; one graph with a symbolic length serves them.
        self._compiled = [torch.compile(layer.forward, dynamic=True) for layer in self.layers]
        self._depth = 0

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within the block the layers run their compiled ``forward``; afterwards their own again. Re-entrant: a
        pass inside a block that already holds them (the backward's recompute under gradient checkpointing must
        run the same compiled forward as the pass it recomputes) keeps them in place."""
        self._depth += 1
        if self._depth == 1:
            for layer, compiled in zip(self.layers, self._compiled):
                layer.forward = compiled
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                for layer in self.layers:
                    del layer.forward  # the instance attribute set above: the class's forward shows through again
