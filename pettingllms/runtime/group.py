"""The set of policy workers of a run, in this process or as Ray actors, behind one interface.

- ``clients()``: what the executor calls to generate (one batched call per policy per flush);
- ``update(batches)``: every policy's update, run in parallel across policies;
- ``save``/``load``/``export_hf``: per-policy state under one checkpoint directory.

With Ray, each policy is a worker group in its own placement group (``runtime/placement.py``): one
``PolicyWorker`` actor, or ``num_ranks`` ``FSDPRankWorker`` actors that train one sharded learner together.
The layout is checked against the cluster before any actor starts. The driver starts its own Ray instance in
its own namespace, or joins the cluster named by ``RAY_ADDRESS``, and stops only the actors and placement
groups it created.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

from pettingllms.core import ConfigError, GenerationRequest, GenerationResult, Sample
from pettingllms.models import HFChatCodec, resolve_model
from pettingllms.rollout.policy_client import PolicyClient
from pettingllms.runtime.placement import PolicyDemand, release, reserve
from pettingllms.runtime.worker import PolicyWorker, WorkerSpec

log = logging.getLogger("pettingllms.runtime")
CLOSE_TIMEOUT_S = 60.0  # seconds the workers get to stop their engines before they are killed


class _LocalClient:
    def __init__(self, worker: PolicyWorker) -> None:
        self.worker = worker
        self.codec = worker.codec

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return await asyncio.to_thread(self.worker.generate, list(requests))


class _RayClient:
    def __init__(self, actor, codec: HFChatCodec) -> None:
        self.actor = actor
        self.codec = codec

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return await self.actor.generate.remote(list(requests))


def demand_of(spec: WorkerSpec) -> PolicyDemand:
    """The resources one policy's worker group reserves."""
    return PolicyDemand(spec.policy, spec.num_ranks, spec.gpus_per_rank, spec.ray_cpus_per_rank, spec.tensor_parallel)


class PolicyGroup:
    def __init__(self, specs: Sequence[WorkerSpec], use_ray: bool, num_cpus: int = 0, namespace: str = "pettingllms"):
        self.specs = {s.policy: s for s in specs}
        self.use_ray = use_ray
        self._started_ray = False
        self.ranks: dict[str, list[Any]] = {}  # Ray: each policy's actors, rank 0 first
        self._placement: dict[str, Any] = {}
        if use_ray:
            self._start_ray(specs, num_cpus, namespace)
        else:
            sharded = sorted(s.policy for s in specs if s.fsdp is not None)
            if sharded:
                raise ConfigError(
                    f"policies {sharded} train with FSDP worker groups (num_ranks > 1 or fsdp.enabled), which run "
                    f"as Ray actors: set resources.use_ray=true"
                )
            self.workers = {s.policy: PolicyWorker(s) for s in specs}
            self._clients = {p: _LocalClient(w) for p, w in self.workers.items()}

    # ----------------------------------------------------------------------------------------- set-up
    def _start_ray(self, specs: Sequence[WorkerSpec], num_cpus: int, namespace: str) -> None:
        import ray

        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS")
            kwargs = {"namespace": namespace, "include_dashboard": False, "log_to_driver": True}
            if not address:
                kwargs["num_cpus"] = num_cpus or os.cpu_count()
                # Ray starts workers at nice 15; ours do the compute the driver waits for, so on a shared host
                # any other process would starve them. The raylet reads this from its environment.
                os.environ.setdefault("RAY_worker_niceness", "0")
            # "local": a new instance of our own. Without it, ray.init() joins whatever cluster
            # /tmp/ray/ray_current_cluster names (another user's, or a dead one left behind).
            ray.init(address=address or "local", **kwargs)
            self._started_ray = True
        try:
            self._placement = reserve([demand_of(s) for s in specs])
            self._start_actors(specs)
        except BaseException:
            self.shutdown()
            raise
        self._clients = {
            p: _RayClient(actors[0], HFChatCodec.from_pretrained(resolve_model(self.specs[p].model_path)))
            for p, actors in self.ranks.items()
        }

    def _start_actors(self, specs: Sequence[WorkerSpec]) -> None:
        """Start every policy's actors in its placement group; FSDP groups rendezvous and load in parallel."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from pettingllms.runtime.fsdp_worker import FSDPRankWorker

        for spec in specs:
            cls = ray.remote(PolicyWorker if spec.fsdp is None else FSDPRankWorker)
            actors = []
            for rank in range(spec.num_ranks):
                options = cls.options(
                    num_cpus=spec.ray_cpus_per_rank,
                    num_gpus=spec.gpus_per_rank,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self._placement[spec.policy], placement_group_bundle_index=rank
                    ),
                )
                actors.append(options.remote(spec) if spec.fsdp is None else options.remote(spec, rank))
            self.ranks[spec.policy] = actors
        rendezvous = {p: self.ranks[p][0].rendezvous.remote() for p, s in self.specs.items() if s.fsdp is not None}
        started = []
        for policy, actors in self.ranks.items():
            if policy in rendezvous:
                address, port = ray.get(rendezvous[policy])
                started += [actor.setup.remote(address, port) for actor in actors]
            else:
                started.append(actors[0].ready.remote())
        ray.get(started)  # surface start-up errors now

    # ----------------------------------------------------------------------------------------- API
    def clients(self) -> dict[str, PolicyClient]:
        return dict(self._clients)

    def update(self, batches: Mapping[str, tuple[Sequence[Sample], Sequence[float]]]) -> dict[str, dict[str, float]]:
        """Update every policy that has samples, all at once. Every rank of a policy gets the whole batch."""
        if self.use_ray:
            import ray

            refs = {}
            for policy, (samples, advantages) in batches.items():
                shared = (ray.put(list(samples)), ray.put(list(advantages)))  # stored once, read by every rank
                refs[policy] = [actor.update.remote(*shared) for actor in self.ranks[policy]]
            return self._rank0_results(refs)
        if len(batches) == 1:
            (p, (s, a)), = batches.items()
            return {p: self.workers[p].update(s, a)}
        with ThreadPoolExecutor(max_workers=len(batches)) as pool:
            futures = {p: pool.submit(self.workers[p].update, s, a) for p, (s, a) in batches.items()}
            return {p: f.result() for p, f in futures.items()}

    def save(self, directory: str) -> None:
        self._call_all("save", lambda p: os.path.join(directory, p))

    def load(self, directory: str) -> None:
        self._call_all("load", lambda p: os.path.join(directory, p))

    def export_hf(self, directory: str) -> dict[str, list[str]]:
        return self._call_all("export_hf", lambda p: os.path.join(directory, p))

    def shutdown(self) -> None:
        if not self.use_ray:
            for worker in self.workers.values():
                worker.close()
            return
        import ray

        actors = [actor for group in self.ranks.values() for actor in group]
        try:  # let engines stop their own processes (vLLM) and FSDP groups leave their collectives
            ray.get([actor.close.remote() for actor in actors], timeout=CLOSE_TIMEOUT_S)
        except Exception as exc:  # a dead or stuck actor must not keep the others alive
            log.warning("policy workers did not close cleanly (%s); killing them", exc)
        for actor in actors:
            ray.kill(actor)
        self.ranks = {}
        release(self._placement)
        self._placement = {}
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def _call_all(self, method: str, arg_for) -> dict:
        if self.use_ray:
            refs = {p: [getattr(a, method).remote(arg_for(p)) for a in actors] for p, actors in self.ranks.items()}
            return self._rank0_results(refs)
        return {p: getattr(w, method)(arg_for(p)) for p, w in self.workers.items()}

    @staticmethod
    def _rank0_results(refs: Mapping[str, list[Any]]) -> dict[str, Any]:
        """Wait for every rank of every policy (collectives need them all); return each policy's rank-0 result."""
        import ray

        flat = [ref for policy_refs in refs.values() for ref in policy_refs]
        values = iter(ray.get(flat))
        results = {}
        for policy, policy_refs in refs.items():
            per_rank = [next(values) for _ in policy_refs]
            results[policy] = per_rank[0]
        return results
