"""The set of policy workers of a run, in this process or as Ray actors, behind one interface.

- ``clients()``: what the executor calls to generate (one batched call per policy per flush);
- ``update(batches)``: every policy's update, run in parallel across policies;
- ``save``/``load``/``export_hf``: per-policy state under one checkpoint directory.
With Ray, the driver starts its own namespace and stops only the actors it started.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Sequence

from pettingllms.core import GenerationRequest, GenerationResult, Sample
from pettingllms.models import HFChatCodec, resolve_model
from pettingllms.rollout.policy_client import PolicyClient
from pettingllms.runtime.worker import PolicyWorker, WorkerSpec

log = logging.getLogger("pettingllms.runtime")


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


class PolicyGroup:
    def __init__(self, specs: Sequence[WorkerSpec], use_ray: bool, num_cpus: int = 0, namespace: str = "pettingllms"):
        self.specs = {s.policy: s for s in specs}
        self.use_ray = use_ray
        self._started_ray = False
        if use_ray:
            self._start_ray(specs, num_cpus, namespace)
        else:
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
            ray.init(address=address, **kwargs)
            self._started_ray = True
        actor_cls = ray.remote(PolicyWorker)
        self.actors = {}
        for spec in specs:
            cpus = max(1, spec.num_threads)
            self.actors[spec.policy] = actor_cls.options(num_cpus=cpus, name=None).remote(spec)
        ray.get([a.ready.remote() for a in self.actors.values()])  # surface start-up errors now
        self._clients = {
            p: _RayClient(a, HFChatCodec.from_pretrained(resolve_model(self.specs[p].model_path)))
            for p, a in self.actors.items()
        }

    # ----------------------------------------------------------------------------------------- API
    def clients(self) -> dict[str, PolicyClient]:
        return dict(self._clients)

    def update(self, batches: Mapping[str, tuple[Sequence[Sample], Sequence[float]]]) -> dict[str, dict[str, float]]:
        """Update every policy that has samples, all at once."""
        if self.use_ray:
            import ray

            refs = {p: self.actors[p].update.remote(list(s), list(a)) for p, (s, a) in batches.items()}
            return dict(zip(refs, ray.get(list(refs.values()))))
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
            return
        import ray

        for actor in self.actors.values():
            ray.kill(actor)
        self.actors = {}
        if self._started_ray:
            ray.shutdown()

    def _call_all(self, method: str, arg_for) -> dict:
        if self.use_ray:
            import ray

            refs = {p: getattr(a, method).remote(arg_for(p)) for p, a in self.actors.items()}
            return dict(zip(refs, ray.get(list(refs.values()))))
        return {p: getattr(w, method)(arg_for(p)) for p, w in self.workers.items()}
