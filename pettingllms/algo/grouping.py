"""Group ids for GRPO: samples with the same (problem slot, turn, agent) key form one group."""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np


def group_index(keys: Sequence[Hashable]) -> np.ndarray:
    """Map each key to a dense integer id, in order of first appearance.

    Shapes: keys (N,) -> ids (N,) int64. Equal keys get equal ids; different keys never share one.
    """
    ids: dict[Hashable, int] = {}
    return np.fromiter((ids.setdefault(k, len(ids)) for k in keys), dtype=np.int64, count=len(keys))
