"""Where each policy's worker group runs: one Ray placement group per policy, checked before anything starts.

A policy declares ``num_ranks`` ranks, each needing ``gpus_per_rank`` GPUs and ``cpus_per_rank`` CPUs; its
placement group has one bundle per rank. ``check_layout`` is the pure arithmetic: the sum over policies must fit
the cluster, and one rank's bundle must fit on one node. Its errors spell the arithmetic out, e.g.

    policy_0 needs 2 ranks x 2 GPUs (TP=2) = 4 GPUs, policy_1 needs 1 rank x 2 GPUs = 2 GPUs; the cluster has
    4 GPUs: 6 > 4

``reserve`` creates the placement groups (strategy PACK: a group's bundles share a node when they fit, and
spread over nodes when they do not) and waits for them with a deadline, so an unsatisfiable request fails
with a message instead of hanging.

Several small policies may share one GPU (``gpus_per_rank`` below 1, e.g. 0.5 each for L3 with two policies
on one GPU): then each has one rank and TP=1, and its vLLM ``gpu_memory_utilization`` must leave room for the
others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pettingllms.core.errors import ConfigError

RESERVE_TIMEOUT_S = 120.0


class PlacementError(ConfigError):
    """The declared per-policy resources cannot be placed on this cluster."""


@dataclass(frozen=True)
class PolicyDemand:
    """What one policy's worker group asks for."""

    policy: str
    num_ranks: int = 1
    gpus_per_rank: float = 0.0
    cpus_per_rank: float = 1.0
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        where = f"base_models.{self.policy}"
        if self.num_ranks < 1:
            raise PlacementError(f"{where}.num_ranks must be >= 1, got {self.num_ranks}")
        if self.gpus_per_rank < 0:
            raise PlacementError(f"{where}.gpus_per_rank must be >= 0, got {self.gpus_per_rank}")
        if self.cpus_per_rank <= 0:
            raise PlacementError(f"{where}.cpus_per_rank must be > 0, got {self.cpus_per_rank}")
        if self.tensor_parallel < 1:
            raise PlacementError(f"{where}.tensor_parallel must be >= 1, got {self.tensor_parallel}")

    @property
    def gpus(self) -> float:
        return self.num_ranks * self.gpus_per_rank

    @property
    def cpus(self) -> float:
        return self.num_ranks * self.cpus_per_rank

    def bundles(self) -> list[dict[str, float]]:
        """One Ray resource bundle per rank."""
        bundle = {"CPU": float(self.cpus_per_rank)}
        if self.gpus_per_rank > 0:
            bundle["GPU"] = float(self.gpus_per_rank)
        return [dict(bundle) for _ in range(self.num_ranks)]

    def explain(self, resource: str) -> str:
        per_rank = self.gpus_per_rank if resource == "GPU" else self.cpus_per_rank
        total = self.gpus if resource == "GPU" else self.cpus
        ranks = f"{self.num_ranks} rank{'s' if self.num_ranks != 1 else ''}"
        tp = f" (TP={self.tensor_parallel})" if resource == "GPU" and self.tensor_parallel > 1 else ""
        return f"{self.policy} needs {ranks} x {_amount(per_rank, resource)}{tp} = {_amount(total, resource)}"


def check_layout(
    demands: Sequence[PolicyDemand],
    cluster: Mapping[str, float],
    largest_node: Mapping[str, float] | None = None,
) -> None:
    """Raise ``PlacementError`` unless every policy's ranks fit: in total, and each rank on a single node.

    cluster: total resources (Ray's ``cluster_resources()``: ``{"CPU": 16, "GPU": 8, ...}``).
    largest_node: the most of each resource any one node has; None skips the per-node check.
    """
    problems = []
    for resource in ("GPU", "CPU"):
        needed = sum(d.gpus if resource == "GPU" else d.cpus for d in demands)
        have = float(cluster.get(resource, 0.0))
        if needed > have + 1e-9:
            parts = ", ".join(d.explain(resource) for d in demands if (d.gpus if resource == "GPU" else d.cpus) > 0)
            problems.append(
                f"{parts}; the cluster has {_amount(have, resource)}: {_number(needed)} > {_number(have)}"
            )
    if largest_node is not None:
        for d in demands:
            for resource, per_rank in (("GPU", d.gpus_per_rank), ("CPU", d.cpus_per_rank)):
                node_max = float(largest_node.get(resource, 0.0))
                if per_rank > node_max + 1e-9:
                    problems.append(
                        f"one rank of {d.policy} needs {_amount(per_rank, resource)} on one node, and the largest "
                        f"node has {_amount(node_max, resource)}"
                    )
    for d in demands:
        shares_a_gpu = 0 < d.gpus_per_rank < 1
        if shares_a_gpu and (d.num_ranks > 1 or d.tensor_parallel > 1):
            problems.append(
                f"{d.policy}: gpus_per_rank={d.gpus_per_rank} (a share of one GPU) fits only one rank with "
                f"tensor_parallel=1; it has {d.num_ranks} ranks and TP={d.tensor_parallel} (NCCL ranks and TP shards "
                f"each need a GPU of their own)"
            )
        elif d.gpus_per_rank > 1 and d.gpus_per_rank % 1:
            problems.append(f"{d.policy}: gpus_per_rank={d.gpus_per_rank} must be a whole number of GPUs (or < 1)")
    if problems:
        raise PlacementError(
            "impossible resource layout: " + "; ".join(problems)
            + ". Lower base_models.<policy>.num_ranks, gpus_per_rank or cpus_per_rank, or add nodes"
            + " (resources.num_cpus sets the CPUs of a local Ray instance)"
        )


def reserve(demands: Sequence[PolicyDemand], timeout_s: float = RESERVE_TIMEOUT_S) -> dict[str, Any]:
    """Check the layout against the running Ray cluster, then create and wait for one placement group per
    policy. Returns ``{policy: PlacementGroup}``; on failure removes what it created and raises."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    check_layout(demands, ray.cluster_resources(), largest_node_resources())
    groups: dict[str, Any] = {}
    try:
        for d in demands:
            groups[d.policy] = placement_group(d.bundles(), strategy="PACK", name="")
        for d in demands:
            ready, _ = ray.wait([groups[d.policy].ready()], timeout=timeout_s)
            if not ready:
                raise PlacementError(
                    f"could not reserve {d.explain('GPU') if d.gpus else d.explain('CPU')} for {d.policy} within "
                    f"{timeout_s:.0f} s; free now: {ray.available_resources()}. Other jobs may hold the resources"
                )
    except BaseException:
        for group in groups.values():
            remove_placement_group(group)
        raise
    return groups


def release(groups: Mapping[str, Any]) -> None:
    from ray.util.placement_group import remove_placement_group

    for group in groups.values():
        remove_placement_group(group)


def largest_node_resources() -> dict[str, float]:
    """The most CPUs and GPUs that any single live Ray node has."""
    import ray

    largest: dict[str, float] = {"CPU": 0.0, "GPU": 0.0}
    for node in ray.nodes():
        if not node.get("Alive", False):
            continue
        resources = node.get("Resources", {})
        for key in largest:
            largest[key] = max(largest[key], float(resources.get(key, 0.0)))
    return largest


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _amount(value: float, resource: str) -> str:
    unit = resource if math.isclose(value, 1.0) else resource + "s"
    return f"{_number(value)} {unit}"
