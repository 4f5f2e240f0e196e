"""The KL penalty's coefficient per stream: fixed, or adapted once per training step towards a target KL.

One controller per stream (each LoRA adapter, or the one full-model stream), so an agent's coefficient follows its
own KL to the reference; none at all when the penalty is off (``KLPenalty.coef == 0``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pettingllms.algo.verl_adapter import adaptive_kl_controller, fixed_kl_controller
from pettingllms.learner.config import KLPenalty


class KLControllers:
    """verl's controllers (the adaptive one: Ziegler et al.), one per stream of ``streams``."""

    def __init__(self, kl: KLPenalty, streams: Sequence[str | None]) -> None:
        self.streams = tuple(streams)
        self.controllers: list[Any] = [_controller(kl) for _ in self.streams] if kl.enabled else []

    def __bool__(self) -> bool:
        return bool(self.controllers)

    @property
    def coefs(self) -> dict[str | None, float]:
        """Current coefficient per stream; empty when the penalty is off."""
        return {stream: float(c.value) for stream, c in zip(self.streams, self.controllers)}

    def update(self, sequences: Mapping[str | None, int], kl: Mapping[str | None, float]) -> None:
        """Once per training step: each stream that trained (``sequences`` of it) moves towards its measured ``kl``."""
        for stream, controller in zip(self.streams, self.controllers):
            if stream in sequences:
                controller.update(current_kl=kl[stream], n_steps=sequences[stream])


def _controller(kl: KLPenalty) -> Any:
    if kl.adaptive:
        return adaptive_kl_controller(kl.coef, kl.target, kl.horizon)
    return fixed_kl_controller(kl.coef)
