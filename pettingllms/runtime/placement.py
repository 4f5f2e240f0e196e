"""Where each policy's worker group runs: one Ray placement group per policy, checked before anything starts.

A policy's layout (``runtime/layout.py``) asks for one bundle per TP group: T ranks' GPUs and CPUs, so every
engine's GPUs are on one node. ``check_layout`` is the pure arithmetic: the sum over policies must fit the
cluster, and one bundle must fit on one node. Its errors spell the arithmetic out and name the fix, e.g.

    2 policies x 8 GPUs = 16 GPUs > 8 GPUs in the cluster: set GPU_num=4 (resources.gpus_per_policy=4)

``reserve`` creates the placement groups (strategy PACK: a group's bundles share a node when they fit, and
spread over nodes when they do not) and waits for them with a deadline, so an unsatisfiable request fails
with a message instead of hanging.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pettingllms.core.errors import ConfigError
from pettingllms.runtime.layout import WorkerLayout

if TYPE_CHECKING:
    from pettingllms.runtime.spec import WorkerSpec

RESERVE_TIMEOUT_S = 120.0


class PlacementError(ConfigError):
    """The policies' worker groups cannot be placed on this cluster."""


def local_cpus() -> int:
    """CPUs this process may run on: its affinity mask (what Slurm, cgroups' cpusets or ``taskset`` allow), not
    ``os.cpu_count()``, which counts every core of the node."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity API on this platform
        return os.cpu_count() or 1


def share_cpus(specs: Sequence["WorkerSpec"], budget: float,
               nodes: Sequence[Mapping[str, float]] = ()) -> list["WorkerSpec"]:
    """The specs with ``budget`` CPUs split over every rank of every policy, where the config left it to us.

    budget: ``resources.num_cpus``, else the Ray cluster's CPUs when the run joins one (Slurm: what ``ray start
    --num-cpus`` gave each node, summed), else ``local_cpus()``. nodes: the cluster's nodes' resources (``CPU``,
    ``GPU``) when it is known. A rank's Ray CPUs are, unless ``base_models.<p>.cpus_per_rank`` (or
    ``num_threads``) says otherwise:
    - a GPU rank: its GPUs' share of the CPUs of the GPU nodes (the fewest CPUs per GPU among them), so every
      node can host as many ranks as it has GPUs, whatever the number of nodes and of CPU-only nodes;
    - a CPU rank: ``budget / ranks``, and never more than one node has (a TP group's ranks share a node).
    Its torch threads are the whole CPUs of that share (at least 1) unless ``num_threads`` says otherwise.
    """
    total_ranks = sum(spec.layout.num_ranks for spec in specs) or 1
    gpu_nodes = [n for n in nodes if float(n.get("GPU", 0.0)) > 0]
    cpus_per_gpu = min((float(n.get("CPU", 0.0)) / float(n["GPU"]) for n in gpu_nodes), default=0.0)
    largest = max((float(n.get("CPU", 0.0)) for n in nodes), default=0.0)
    shared = []
    for spec in specs:
        if spec.layout.uses_gpus and cpus_per_gpu > 0:
            share = cpus_per_gpu * spec.layout.gpus_per_rank
        else:
            share = budget / total_ranks
            if largest > 0:
                share = min(share, largest / spec.layout.tensor_parallel)
        threads = spec.requested_threads or max(1, int(share))
        cpus = spec.requested_cpus or float(spec.requested_threads or share)
        shared.append(dataclasses.replace(spec, num_threads=threads,
                                          layout=dataclasses.replace(spec.layout, cpus_per_rank=cpus)))
    return shared


def check_layout(
    layouts: Sequence[WorkerLayout],
    cluster: Mapping[str, float],
    largest_node: Mapping[str, float] | None = None,
    where: str = "the cluster",
) -> None:
    """Raise ``PlacementError`` unless every policy fits: in total, and each TP group's bundle on a single node.

    cluster: total resources (Ray's ``cluster_resources()``: ``{"CPU": 16, "GPU": 8, ...}``).
    largest_node: the most of each resource any one node has; None skips the per-node check.
    where: how the message names the resources ("the cluster", "this machine").
    """
    problems = [_gpu_total(layouts, float(cluster.get("GPU", 0.0)), where)]
    problems.append(_cpu_total(layouts, float(cluster.get("CPU", 0.0)), where))
    if largest_node is not None:
        problems += [_node_fit(layout, largest_node) for layout in layouts]
    problems = [p for p in problems if p]
    if problems:
        raise PlacementError("impossible resource layout: " + "; ".join(problems))


def _gpu_total(layouts: Sequence[WorkerLayout], have: float, where: str) -> str | None:
    needed = sum(layout.gpus for layout in layouts)
    if needed <= have + 1e-9:
        return None
    users = [layout for layout in layouts if layout.gpus > 0]
    amounts = {layout.gpus for layout in users}
    if len(amounts) == 1 and len(users) > 1:
        need = f"{len(users)} policies x {_amount(users[0].gpus, 'GPU')} = {_amount(needed, 'GPU')}"
    else:
        need = ", ".join(f"{layout.policy} needs {_amount(layout.gpus, 'GPU')}" for layout in users)
        need += f" = {_amount(needed, 'GPU')}" if len(users) > 1 else ""
    return f"{need} > {_amount(have, 'GPU')} in {where}: {_gpu_fix(users, have)}"


def _gpu_fix(users: Sequence[WorkerLayout], have: float) -> str:
    """The GPU_num that makes these policies fit, or what else to do."""
    if have <= 0:
        return "no GPUs are visible; run on CPU with GPU_num=0, or start on (or join, RAY_ADDRESS) a GPU node"
    count = len(users)
    step = math.lcm(*(layout.tensor_parallel for layout in users))
    per_policy = int(have // count) // step * step
    if per_policy >= 1:
        return f"set GPU_num={per_policy} (resources.gpus_per_policy={per_policy}) or add GPUs"
    share = 1.0 / count if have >= 1 and step == 1 else 0.0
    if share > 0:
        return (f"set GPU_num={share:g} (resources.gpus_per_policy={share:g}: the policies share one GPU, each with "
                f"one rank and a vLLM gpu_memory_utilization below {share:g}) or add GPUs")
    return f"add GPUs, or lower base_models.<policy>.tensor_parallel (the policies' TP sizes need multiples of {step})"


def _cpu_total(layouts: Sequence[WorkerLayout], have: float, where: str) -> str | None:
    needed = sum(layout.cpus for layout in layouts)
    if needed <= have + 1e-9:
        return None
    parts = ", ".join(
        f"{layout.policy} needs {layout.num_ranks} rank{'s' if layout.num_ranks != 1 else ''} x "
        f"{_amount(layout.cpus_per_rank, 'CPU')} = {_amount(layout.cpus, 'CPU')}"
        for layout in layouts
    )
    return (f"{parts}; {where} has {_amount(have, 'CPU')}: {_number(needed)} > {_number(have)}. Lower "
            f"base_models.<policy>.cpus_per_rank or num_ranks (resources.num_cpus sets the CPUs of a local Ray "
            f"instance)")


def _node_fit(layout: WorkerLayout, largest_node: Mapping[str, float]) -> str | None:
    bundle = layout.bundles()[0]
    for resource, amount in bundle.items():
        node_max = float(largest_node.get(resource, 0.0))
        if amount > node_max + 1e-9:
            what = (f"one engine of {layout.policy} needs {_amount(amount, resource)} on one node "
                    f"(tensor_parallel={layout.tensor_parallel})" if layout.tensor_parallel > 1
                    else f"one rank of {layout.policy} needs {_amount(amount, resource)} on one node")
            return f"{what}, and the largest node has {_amount(node_max, resource)}"
    return None


def visible_gpus() -> int:
    """GPUs this machine exposes to the run: CUDA_VISIBLE_DEVICES when set, else what torch sees."""
    import os

    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    if devices is not None:
        return len([d for d in devices.split(",") if d.strip()])
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA here means no GPUs
        return 0


def check_here(layouts: Sequence[WorkerLayout], num_cpus: float) -> str:
    """Check layouts against this machine (``--dry-run``); returns what was checked. With ``RAY_ADDRESS`` set the
    run joins a cluster, which is checked at start-up instead."""
    import os

    if os.environ.get("RAY_ADDRESS"):
        return f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}: the layout is checked against that cluster at start-up"
    gpus = visible_gpus()
    check_layout(layouts, {"CPU": num_cpus, "GPU": float(gpus)}, where="this machine")
    return f"fits this machine ({gpus} GPU{'s' if gpus != 1 else ''} visible, {num_cpus:g} CPUs)"


def reserve(layouts: Sequence[WorkerLayout], timeout_s: float = RESERVE_TIMEOUT_S) -> dict[str, Any]:
    """Check the layouts against the running Ray cluster, then create and wait for one placement group per
    policy. Returns ``{policy: PlacementGroup}``; on failure removes what it created and raises."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    check_layout(layouts, ray.cluster_resources(), largest_node_resources())
    groups: dict[str, Any] = {}
    try:
        for layout in layouts:
            groups[layout.policy] = placement_group(layout.bundles(), strategy="PACK", name="")
        for layout in layouts:
            ready, _ = ray.wait([groups[layout.policy].ready()], timeout=timeout_s)
            if not ready:
                raise PlacementError(
                    f"could not reserve {layout.describe()} for {layout.policy} within {timeout_s:.0f} s; free now: "
                    f"{ray.available_resources()}. Other jobs may hold the resources"
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
