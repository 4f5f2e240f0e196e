"""The policies' worker groups of a run, in this process or as Ray actors, behind one interface.

- ``clients()``: what the executor calls to generate; a policy with several engines spreads each call over them
  (``runtime/dispatch.py``);
- ``update(batches)``: every policy's update, run in parallel across policies; every rank of a policy gets the
  whole batch;
- ``save``/``load``/``export_hf``: per-policy state under one checkpoint directory (``runtime/checkpoints.py``).

With Ray, each policy is a worker group of ``layout.num_ranks`` ``PolicyWorker`` actors in its own placement
group (``runtime/placement.py``, one bundle per TP group), checked against the cluster before any actor starts.
Start-up has two phases: the actors are placed (cheap: ``placement()`` reports the node and the GPU ids Ray
assigned), then set up (model, process group, learner, engines). ``PolicyGroup(..., setup=False)`` stops after
the first phase, which is how the simulated-cluster tests check every script's layout without a GPU. The driver
starts its own Ray instance in its own namespace, with its session files in a private directory
(``runtime/local_ray.py``), or joins the cluster named by ``RAY_ADDRESS``, and stops only the actors and placement
groups it created.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

from pettingllms.core import ConfigError, Sample
from pettingllms.rollout.policy_client import CONTINUOUS_CALLS, LocalPolicyClient, PolicyClient
from pettingllms.runtime.dispatch import EngineSetClient
from pettingllms.runtime.local_ray import LocalRay, start_local_ray
from pettingllms.runtime.placement import local_cpus, release, reserve, share_cpus
from pettingllms.runtime.serving import engine_visible_devices
from pettingllms.runtime.spec import WorkerSpec
from pettingllms.runtime.worker import PolicyWorker

GENERATE_GROUP = "generate"  # the Ray concurrency group of a continuous engine's generate calls

log = logging.getLogger("pettingllms.runtime")
CLOSE_TIMEOUT_S = 60.0  # seconds the workers get to stop their engines before they are killed


def setup_waves(specs: Sequence[WorkerSpec]) -> list[list[str]]:
    """The order policies are set up in: all at once, unless vLLM engines share a GPU with another policy (a
    fractional GPU_num, L3 on one GPU): then one policy after another. vLLM sizes its KV cache from the device's
    free memory while it starts, so two engines (or an engine and a learner still loading) starting together on one
    GPU mis-size each other (vllm#55827, #56830)."""
    names = [s.policy for s in specs]
    return [[name] for name in names] if engines_share_a_gpu(specs) else [names]


def engines_share_a_gpu(specs: Sequence[WorkerSpec]) -> bool:
    """Whether a policy's vLLM engines share their GPU with another policy (a fractional GPU_num)."""
    return any(0 < s.layout.gpus_per_rank < 1 and s.engine == "vllm" for s in specs)


class PolicyGroup:
    def __init__(self, specs: Sequence[WorkerSpec], use_ray: bool, num_cpus: int = 0, namespace: str = "pettingllms",
                 setup: bool = True):
        self.specs = {s.policy: s for s in specs}
        self.use_ray = use_ray
        self._started_ray = False  # this group called ray.init (started an instance, or joined RAY_ADDRESS)
        self._own_ray: LocalRay | None = None  # the instance this group started, with its private session folder
        self.ranks: dict[str, list[Any]] = {}  # each policy's workers (Ray actors or objects), rank 0 first
        self.placements: dict[str, list[dict[str, Any]]] = {}  # what each rank reported, with its bundle index
        self._placement_groups: dict[str, Any] = {}
        self._clients: dict[str, PolicyClient] = {}
        if use_ray:
            self._start_ray(specs, num_cpus, namespace, setup)
        else:
            self._start_local(specs)

    # ----------------------------------------------------------------------------------------- set-up
    def _start_local(self, specs: Sequence[WorkerSpec]) -> None:
        grouped = sorted(s.policy for s in specs if s.layout.num_ranks > 1 or s.layout.sharded)
        if grouped:
            raise ConfigError(
                f"policies {grouped} train with FSDP worker groups (several ranks, or fsdp.enabled), which run as "
                f"Ray actors: set resources.use_ray=true"
            )
        for spec in self._resolved(specs):
            worker = PolicyWorker(spec, 0)
            worker.setup()
            self.ranks[spec.policy] = [worker]
            self.placements[spec.policy] = [{**worker.placement(), "bundle": None}]
            self._clients[spec.policy] = LocalPolicyClient(worker.engine, worker.codec)

    def _start_ray(self, specs: Sequence[WorkerSpec], num_cpus: int, namespace: str, setup: bool) -> None:
        import ray

        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS")
            kwargs: dict[str, Any] = {"namespace": namespace, "include_dashboard": False, "log_to_driver": True}
            if not address:
                # Always a new instance of our own (address "local"). Without it Ray would join whatever cluster
                # the last `ray start` on this machine recorded in /tmp/ray, even a stopped one.
                kwargs["num_cpus"] = num_cpus or local_cpus()
                # Ray starts workers at nice 15; ours do the compute the driver waits for, so on a shared host
                # any other process would starve them. The raylet reads this from its environment.
                os.environ.setdefault("RAY_worker_niceness", "0")
                self._own_ray = start_local_ray(**kwargs)
            else:
                ray.init(address=address, **kwargs)
            self._started_ray = True
            if address:
                nodes = [n for n in ray.nodes() if n.get("Alive")]
                resources = ray.cluster_resources()
                log.info("joined the Ray cluster at %s: %d node(s), %g CPUs, %g GPUs", address, len(nodes),
                         resources.get("CPU", 0.0), resources.get("GPU", 0.0))
                if not num_cpus:
                    # The plan split this process's CPUs; the ranks run on the cluster's (Slurm: --num-cpus per node).
                    specs = share_cpus(specs, float(resources.get("CPU", 0.0)) or local_cpus(),
                                       [n.get("Resources", {}) for n in nodes])
                    self.specs = {s.policy: s for s in specs}
        try:
            self._placement_groups = reserve([s.layout for s in specs])
            if setup:
                specs = self._resolved(specs)
            self._place_actors(specs)
            if setup:
                self._setup_actors()
                self._clients = {policy: self._ray_client(policy) for policy in self.ranks}
        except BaseException:
            self.shutdown()
            raise

    def _resolved(self, specs: Sequence[WorkerSpec]) -> list[WorkerSpec]:
        """The specs with their model directories (a run's plan resolved them already; specs built by hand are
        resolved here, once, rather than in every rank)."""
        resolved = [spec.resolved() for spec in specs]
        self.specs = {s.policy: s for s in resolved}
        return resolved

    def _place_actors(self, specs: Sequence[WorkerSpec]) -> None:
        """Start every rank's actor in its TP group's bundle and record where it landed."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_cls = ray.remote(PolicyWorker)
        for spec in specs:
            layout = spec.layout
            actors = []
            for rank in range(layout.num_ranks):
                # A continuous engine takes concurrent generate calls: they get a concurrency group of their own,
                # and every other method keeps the actor's one thread (updates, syncs and saves never interleave).
                streaming = {"concurrency_groups": {GENERATE_GROUP: CONTINUOUS_CALLS}} if spec.continuous_engine else {}
                options = actor_cls.options(
                    num_cpus=layout.cpus_per_rank,
                    num_gpus=layout.gpus_per_rank,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self._placement_groups[spec.policy],
                        placement_group_bundle_index=layout.bundle_of(rank),
                    ),
                    **streaming,
                )
                actors.append(options.remote(spec, rank))
            self.ranks[spec.policy] = actors
        reports = {p: [a.placement.remote() for a in actors] for p, actors in self.ranks.items()}
        for policy, refs in reports.items():
            layout = self.specs[policy].layout
            self.placements[policy] = [{**report, "bundle": layout.bundle_of(report["rank"])}
                                       for report in ray.get(refs)]

    def _setup_actors(self) -> None:
        """Set up the policies' ranks, wave by wave (``setup_waves``); sharded groups meet at rank 0's rendezvous."""
        import ray

        for wave in setup_waves(list(self.specs.values())):
            started = []
            for policy in wave:
                actors, layout = self.ranks[policy], self.specs[policy].layout
                address, port = ray.get(actors[0].rendezvous.remote()) if layout.sharded else (None, None)
                for rank, actor in enumerate(actors):
                    started.append(actor.setup.remote(address, port, self.engine_devices(policy, rank)))
            ray.get(started)  # surface start-up errors now

    def engine_devices(self, policy: str, rank: int) -> str | None:
        """For the host of a TP>1 engine: its TP group's GPU ids, its own first (None otherwise)."""
        layout = self.specs[policy].layout
        if layout.tensor_parallel == 1 or not layout.hosts_engine(rank):
            return None
        reports = {r["rank"]: r for r in self.placements[policy]}
        peers = [reports[r]["gpu_ids"] for r in layout.tp_group(rank) if r != rank]
        return engine_visible_devices(reports[rank]["gpu_ids"], peers)

    def _ray_client(self, policy: str) -> EngineSetClient:
        from pettingllms.runtime.serving import policy_codec

        spec = self.specs[policy]
        hosts = [self.ranks[policy][rank] for rank in spec.layout.engine_ranks]
        codec = policy_codec(spec)

        if spec.continuous_engine:
            async def call(engine: int, requests):
                return await hosts[engine].generate.options(concurrency_group=GENERATE_GROUP).remote(requests)
        else:
            async def call(engine: int, requests):
                return await hosts[engine].generate.remote(requests)

        return EngineSetClient(len(hosts), call, codec, continuous=spec.continuous_engine)

    # ----------------------------------------------------------------------------------------- API
    def clients(self) -> dict[str, PolicyClient]:
        return dict(self._clients)

    def update(self, batches: Mapping[str, tuple[Sequence[Sample], Sequence[float]]]) -> dict[str, dict[str, float]]:
        """Update every policy that has samples, all at once. Every rank of a policy gets the whole batch.

        Where engines share a GPU with another policy, every updating policy's engines sleep before any update
        starts: vLLM checks a sleep by the device's free memory ("Memory usage increased after sleeping"), which
        another policy's learner, already updating, may be filling at that moment."""
        if len(batches) > 1 and engines_share_a_gpu(list(self.specs.values())):
            self._release_engines(list(batches))
        if self.use_ray:
            import ray

            refs = {}
            for policy, (samples, advantages) in batches.items():
                shared = (ray.put(list(samples)), ray.put(list(advantages)))  # stored once, read by every rank
                refs[policy] = [actor.update.remote(*shared) for actor in self.ranks[policy]]
            return self._rank0_results(refs)
        if len(batches) == 1:
            (policy, (samples, advantages)), = batches.items()
            return {policy: self.ranks[policy][0].update(samples, advantages)}
        with ThreadPoolExecutor(max_workers=len(batches)) as pool:
            futures = {p: pool.submit(self.ranks[p][0].update, s, a) for p, (s, a) in batches.items()}
            return {p: f.result() for p, f in futures.items()}

    def _release_engines(self, policies: Sequence[str]) -> None:
        if self.use_ray:
            self._rank0_results({p: [actor.release_engine.remote() for actor in self.ranks[p]] for p in policies})
        else:
            for policy in policies:
                self.ranks[policy][0].release_engine()

    def snapshot(self, copies: Mapping[str, Sequence[tuple[str, str]]]) -> None:
        """Copy adapters into others on every rank of each named policy (the opponent pool's snapshots:
        policy -> (source adapter, target adapter) pairs); each policy's engines then serve the copies."""
        if self.use_ray:
            self._rank0_results({p: [actor.snapshot.remote(list(pairs)) for actor in self.ranks[p]]
                                 for p, pairs in copies.items()})
            return
        for policy, pairs in copies.items():
            self.ranks[policy][0].snapshot(list(pairs))

    def snapshot_full(self, pools: Mapping[str, str], k: int) -> None:
        """Full-weight policies' opponent-pool snapshots (``runtime/snapshots.py``): each trained policy's weights
        (every rank takes part, as in a weight sync) become slot ``k`` of its pool worker; ``pools``: trained policy
        -> its pool worker's policy. With Ray, rank 0's actor hands the copy to the pool's through the object store,
        never through the driver."""
        if not pools:
            return
        if not self.use_ray:
            for policy, pool in pools.items():
                self.ranks[pool][0].hold_snapshot(k, self.ranks[policy][0].snapshot_weights())
            return
        self._rank0_results({policy: [actor.send_snapshot.remote(self.ranks[pool][0], k)
                                      for actor in self.ranks[policy]] for policy, pool in pools.items()})

    def held_snapshots(self, pools: Sequence[str]) -> dict[str, list[int]]:
        """Opponent-pool workers -> the slots each holds."""
        if self.use_ray:
            return self._rank0_results({pool: [self.ranks[pool][0].held_snapshots.remote()] for pool in pools})
        return {pool: self.ranks[pool][0].held_snapshots() for pool in pools}

    def serve_snapshot(self, slots: Mapping[str, int]) -> None:
        """Opponent-pool workers (pool policy -> slot): each plays that slot's past version from now on."""
        if self.use_ray:
            self._rank0_results({pool: [self.ranks[pool][0].serve_snapshot.remote(k)] for pool, k in slots.items()})
            return
        for pool, k in slots.items():
            self.ranks[pool][0].serve_snapshot(k)

    def save(self, directory: str) -> None:
        self._call_all("save", lambda p: os.path.join(directory, p))

    def save_start(self, directory: str) -> None:
        """Every policy's ``PolicyWorker.save_start``: their states copied, their writes running; ``save_wait``."""
        self._call_all("save_start", lambda p: os.path.join(directory, p))

    def save_wait(self, timeout: float | None = None) -> None:
        """Wait for every policy's write started by ``save_start``; the first failure is raised. ``timeout`` (Ray):
        a ``TimeoutError`` after that many seconds (a run that stops on a failed rank: a peer may be stuck in a
        collective, and its ``save_wait`` queued behind it would run only at nccl's or gloo's timeout)."""
        if self.use_ray:
            self._rank0_results({p: [actor.save_wait.remote() for actor in actors] for p, actors in self.ranks.items()},
                                timeout=timeout)
            return
        failures = []
        for workers in self.ranks.values():  # every policy's write ends before the first failure is raised
            try:
                workers[0].save_wait()
            except BaseException as exc:  # noqa: BLE001 - raised below, once all have ended
                failures.append(exc)
        if failures:
            raise failures[0]

    def load(self, directory: str) -> None:
        self._call_all("load", lambda p: os.path.join(directory, p))

    def export_hf(self, directory: str) -> dict[str, list[str]]:
        return self._call_all("export_hf", lambda p: os.path.join(directory, p))

    def shutdown(self) -> None:
        if not self.use_ray:
            for workers in self.ranks.values():
                for worker in workers:
                    worker.close()
            self.ranks = {}
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
        release(self._placement_groups)
        self._placement_groups = {}
        if self._own_ray is not None:
            self._own_ray.stop()
            self._own_ray = None
        elif self._started_ray:
            ray.shutdown()  # leaves the joined cluster (its folders are the cluster's own)
        self._started_ray = False

    def _call_all(self, method: str, arg_for) -> dict:
        if self.use_ray:
            refs = {p: [getattr(a, method).remote(arg_for(p)) for a in actors] for p, actors in self.ranks.items()}
            return self._rank0_results(refs)
        return {p: getattr(workers[0], method)(arg_for(p)) for p, workers in self.ranks.items()}

    @staticmethod
    def _rank0_results(refs: Mapping[str, list[Any]], timeout: float | None = None) -> dict[str, Any]:
        """Wait for every rank of every policy (collectives need them all); return each policy's rank-0 result.

        The first rank that fails raises at once: the others may be blocked in a collective that can never complete
        now (an all-gather of the weight stream), and would otherwise hold the run until nccl's timeout. ``timeout``:
        a ``TimeoutError`` when some rank has not answered after that many seconds."""
        import ray

        flat = [ref for policy_refs in refs.values() for ref in policy_refs]
        pending = list(flat)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not done:
                raise TimeoutError(f"{len(pending)} of {len(flat)} rank call(s) did not answer within {timeout:.0f} s")
            ray.get(done)  # raises the failed rank's error now
        values = iter(ray.get(flat))
        results = {}
        for policy, policy_refs in refs.items():
            per_rank = [next(values) for _ in policy_refs]
            results[policy] = per_rank[0]
        return results
