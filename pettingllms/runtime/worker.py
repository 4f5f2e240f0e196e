"""``PolicyWorker``: one rank of a policy's worker group (a Ray actor, or an object in the driver for debugging).

A policy's worker group is ``layout.num_ranks`` ranks (``runtime/layout.py``). Every rank holds the learner: the
whole model in a one-rank group, or a shard of it in an FSDP2 group (``layout.sharded``: gloo on CPU, nccl on GPU,
one process group per policy with its own rendezvous port). Every rank that starts a TP group hosts an engine
(``layout.hosts_engine``), so every GPU generates:

- one-rank group with the transformers engine: the engine generates with the learner's own module, so an update
  is visible to it at once (no copy, no sync);
- otherwise the engine keeps its own copy of the weights (vLLM; or a full transformers copy beside an FSDP
  shard). After every update all ranks stream the trained tensors (``full_weights``: one all-gather per tensor,
  a collective) and every engine host hands them to its engine from memory; vLLM sleeps while the learner trains.
The engine, the codec and the weight pushes are built and decided in ``runtime/serving.py``, which evaluation
shares.

Life cycle: the constructor only records the spec, so Ray can place the actor and ``placement()`` can report
where it landed without touching a GPU; ``setup`` loads the model, joins the process group and builds the
learner and the engine. Heavy modules (torch, transformers) are imported there. The spec's model directory is
resolved once by the run's plan (``RunPlan.resolved``); a spec built by hand is resolved when first needed.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import socket
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from pettingllms.core import ConfigError, GenerationRequest, GenerationResult, Sample
from pettingllms.core.part_clock import PartClock
from pettingllms.runtime.spec import WorkerSpec

log = logging.getLogger("pettingllms.runtime")


class PolicyWorker:
    """Rank ``rank`` of ``spec.layout.num_ranks``. With several ranks: ``rendezvous`` on rank 0, then ``setup`` on
    every rank at once (they meet in the process group)."""

    def __init__(self, spec: WorkerSpec, rank: int = 0) -> None:
        self.spec = spec
        self.layout = spec.layout
        self.rank = rank
        self.learner = None
        self.engine = None
        self.sync = None
        self._model = None
        self._engine_model = None  # a transformers engine's own full copy (FSDP groups)
        self._codec = None
        self._engine_barrier = None  # the TP group's barrier (engine_group_barrier), from setup on
        self._saving = None  # a checkpoint write running in the background (save_start), until save_wait
        self._checkpoint_group = None  # FSDP: the gloo group of the asynchronous saves' collectives
        self.snapshots = None  # an opponent-pool worker's past versions (spec.snapshot_of): runtime/snapshots.py
        self._serving_slot: int | None = None  # the slot whose weights its module and engine hold now

    # ------------------------------------------------------------------------------------------ placement
    def placement(self) -> dict[str, Any]:
        """Where this rank runs and what it was given; no GPU is touched (simulated-cluster tests, diagnostics)."""
        info: dict[str, Any] = {
            "policy": self.spec.policy,
            "rank": self.rank,
            "world_size": self.layout.num_ranks,
            "hosts_engine": self.layout.hosts_engine(self.rank),
            "engine": self.spec.engine,
            "tensor_parallel": self.layout.tensor_parallel,
            "tp_group": list(self.layout.tp_group(self.rank)),
            "backend": self.layout.backend if self.layout.sharded else None,
            "pid": os.getpid(),
            "node_id": None,
            "placement_group": None,
            "gpu_ids": [],
        }
        import ray

        if ray.is_initialized():
            context = ray.get_runtime_context()
            info["node_id"] = context.get_node_id()
            info["placement_group"] = context.get_placement_group_id()
            info["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
        return info

    def rendezvous(self) -> tuple[str, int]:
        """(address, free port) on this node for the policy's process group; called on rank 0."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        address = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        return address, port

    # ------------------------------------------------------------------------------------------ set-up
    def setup(self, address: str | None = None, port: int | None = None, engine_devices: str | None = None,
              engine: Any = None) -> str:
        """Build this rank: process group (sharded groups), model or shard, learner, and engine (engine hosts).

        engine_devices: on the host of a TP>1 engine, the GPUs of its TP group (``serving.engine_visible_devices``).
        engine: an engine object to host instead of building the spec's (``benchmarks/gpu_learner.py`` measures the
        learner's side of a GPU step with one that only receives the weights, where vLLM is not installed).
        """
        from pettingllms.runtime.serving import expose_tp_group_gpus

        self.spec = self.spec.resolved()
        if engine_devices and self.layout.tensor_parallel > 1 and self.layout.hosts_engine(self.rank):
            expose_tp_group_gpus(engine_devices)  # before anything starts CUDA in this process
        import torch

        spec = self.spec
        if spec.num_threads > 0:
            torch.set_num_threads(spec.num_threads)
        torch.manual_seed(spec.seed)  # every rank builds the same initial weights (LoRA A is random)
        device = torch.device("cuda", 0) if self.layout.uses_gpus else torch.device("cpu")
        if self.layout.uses_gpus:
            torch.cuda.set_device(device)  # Ray exposes this rank's GPU first
        if self.layout.sharded:
            self._join_process_group(address, port)
        self._engine_barrier = barrier = engine_group_barrier(self.layout)
        self._build_learner(device)
        if barrier is not None:  # vLLM sizes its KV cache from the free memory of every GPU its TP group spans:
            barrier()  # the peers' learners are built before it measures,
        self._build_engine(device, engine)
        if barrier is not None:
            barrier()  # and change nothing until it has
        if spec.snapshot_of:
            from pettingllms.runtime.snapshots import SnapshotStore

            self.snapshots = SnapshotStore()
        from pettingllms.runtime.serving import initial_push_needed

        if initial_push_needed(spec, trained=False):
            self._push_weights(trained_only=False)
        return spec.policy

    def _join_process_group(self, address: str | None, port: int | None) -> None:
        import torch.distributed as dist

        if address is None or port is None:
            raise ConfigError(f"policy {self.spec.policy!r}: a sharded worker group needs rank 0's rendezvous")
        dist.init_process_group(self.layout.backend, init_method=f"tcp://{address}:{port}", rank=self.rank,
                                world_size=self.layout.num_ranks)

    def _build_learner(self, device) -> None:
        from pettingllms.learner import PolicyLearner
        from pettingllms.learner.data_parallel import SINGLE_PROCESS, DataParallel
        from pettingllms.learner.sharding import shard_model
        from pettingllms.models import load_model
        from pettingllms.models.load import parse_dtype

        spec = self.spec
        path = spec.directory
        # Master weights only where something trains: a policy that never updates keeps its compute dtype.
        weights = spec.learner_weights_dtype if spec.trainable else spec.dtype
        if weights == "bfloat16" and spec.trainable:
            log.warning("policy %s keeps its weights and AdamW state in bfloat16 (master_weights=bfloat16): updates "
                        "smaller than bf16's spacing are lost (about 1%% of weights move per step at lr 5e-6)",
                        spec.policy)
        model = load_model(path, weights, spec.lora, spec.lora_names)
        reference = None
        if self.layout.sharded:
            compute = parse_dtype(spec.dtype) if weights == "float32" else parse_dtype(weights)
            if spec.trainable and spec.learner.kl.enabled and not spec.lora_names:
                # The learner's default reference is a deep copy; under FSDP it is sharded like the policy.
                reference = shard_model(load_model(path, weights), spec.fsdp, device, compute)
            shard_model(model, spec.fsdp, device, compute)
        elif not spec.module_on_host:
            model = model.to(device)
        self._model = model
        if spec.trainable:
            self.learner = PolicyLearner(
                model,
                spec.learner,
                adapter_names=spec.lora_names,
                ref_model=reference,
                frozen=spec.frozen,
                policy=spec.policy,
                pad_token_id=self.codec.pad_token_id,
                data_parallel=DataParallel(self.rank, self.layout.num_ranks) if self.layout.sharded
                else SINGLE_PROCESS,
            )

    def _build_engine(self, device, given: Any = None) -> None:
        import torch

        from pettingllms.models import load_model
        from pettingllms.runtime.serving import EngineSync, make_engine, peft_adapter_configs

        spec = self.spec
        if given is not None:
            self.engine = given
        elif self.layout.hosts_engine(self.rank):
            if spec.engine == "hf" and self.layout.sharded:  # a full copy beside the shard, refreshed every update
                self._engine_model = load_model(spec.directory, spec.dtype, spec.lora, spec.lora_names).to(device)
            # Without a copy of its own the engine generates with the learner's module: updates are visible at once.
            engine_model = self._engine_model if self._engine_model is not None else self._model
            index = self.layout.engine_ranks.index(self.rank)
            # The learner's own fp32 module computing in bf16: the engine autocasts exactly as the learner does.
            autocast = (engine_model is self._model and spec.dtype == "bfloat16"
                        and next(self._model.parameters()).dtype == torch.float32)
            self.engine = make_engine(spec, engine_model, self.codec, index, autocast=autocast)
        self.sync = EngineSync(self.engine, peft_adapter_configs(self._model, spec.lora_names), self._engine_model,
                               group_barrier=self._engine_barrier)

    @property
    def model(self):
        """The learner's module (a shard of it in an FSDP group); None before ``setup``."""
        return self._model

    @property
    def codec(self):
        if self._codec is None:
            from pettingllms.runtime.serving import policy_codec

            self.spec = self.spec.resolved()
            self._codec = policy_codec(self.spec)
        return self._codec

    def ready(self) -> str:
        return self.spec.policy

    # ------------------------------------------------------------------------------------------ work
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        if self.engine is None:
            raise RuntimeError(f"policy {self.spec.policy!r}: rank {self.rank} hosts no engine (engine ranks: "
                               f"{list(self.layout.engine_ranks)})")
        return self.engine.generate(list(requests))

    def release_engine(self) -> None:
        """Put this rank's engine to sleep for the coming update (``update`` does it too; ``PolicyGroup.update``
        calls this first on every policy that shares a GPU, so no engine sleeps while another policy updates)."""
        if self.learner is not None:
            self.sync.release_for_update()

    def update(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict[str, float]:
        """One training iteration (every rank gets the whole batch), then the weight sync to every engine."""
        from pettingllms.runtime.serving import device_memory

        if self.learner is None:
            return {}
        self.sync.release_for_update()
        clock = PartClock()
        with clock.part("update"):
            metrics = dict(self.learner.update(samples, advantages))
        metrics.update(device_memory("after_update"))
        with clock.part("sync"):
            self._push_weights(trained_only=True)
        metrics.update({f"timing/{part}_s": seconds for part, seconds in clock.totals().items()})
        metrics.update(self.sync.memory)  # after the cache release, the weights' sync and the KV cache's wake
        metrics.update(self.sync.timings)  # the sync's parts: cache release, weights, KV cache wake
        return metrics

    def snapshot(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Copy each source adapter's weights into its target adapter (a frozen slot of the opponent pool), then give
        this rank's engine every adapter if it holds its own copy (a collective under FSDP: every rank copies its
        shard, then all stream the weights together)."""
        from pettingllms.models.lora import copy_adapter

        for source, target in pairs:
            copy_adapter(self._model, source, target)
        self._push_weights(trained_only=False)

    def snapshot_weights(self) -> dict[str, Any] | None:
        """A full-weight policy's opponent-pool snapshot: every weight in the engines' dtype, copied to host memory
        (rank 0's return; the other ranks of an FSDP group take part in the all-gathers and return None)."""
        from pettingllms.learner.weights import full_weights
        from pettingllms.models.load import parse_dtype
        from pettingllms.runtime.snapshots import SnapshotStore

        stream = full_weights(self._model, self._weight_names(False), dtype=parse_dtype(self.spec.dtype))
        if self.rank != 0:
            for _ in stream:
                pass
            return None
        return SnapshotStore.host_copy(stream)

    def send_snapshot(self, pool_worker: Any, k: int) -> None:
        """Ray: ``snapshot_weights`` handed to the opponent-pool worker's actor as its slot ``k`` (every rank calls
        this together; rank 0 sends)."""
        weights = self.snapshot_weights()
        if weights is not None:
            import ray

            ray.get(pool_worker.hold_snapshot.remote(k, weights))

    def hold_snapshot(self, k: int, weights: dict[str, Any]) -> None:
        """An opponent-pool worker: keep ``weights`` (``snapshot_weights`` of its policy) as slot ``k``."""
        self._pool_store().hold(k, weights)
        if self._serving_slot == k:
            self._serving_slot = None  # the slot holds another version now: load it again before playing it

    def serve_snapshot(self, k: int) -> None:
        """An opponent-pool worker: its module and engine play slot ``k``'s past version (nothing to do when they
        already do)."""
        if self._serving_slot == k:
            return
        self._pool_store().load_into(k, self._model)
        self._push_weights(trained_only=False)
        self._serving_slot = k

    def _pool_store(self):
        if self.snapshots is None:
            raise RuntimeError(f"policy {self.spec.policy!r} is not an opponent-pool worker (spec.snapshot_of)")
        return self.snapshots

    def full_weights(self, trained_only: bool = False) -> Iterator[tuple[str, Any]]:
        """The policy's full (unsharded) weights, one ``(name, tensor)`` at a time. Under FSDP a collective: every
        rank iterates it to the end together. ``trained_only``: the tensors an update changes (all of a full
        model; the unfrozen adapters under LoRA)."""
        from pettingllms.learner.weights import full_weights

        return full_weights(self._model, self._weight_names(trained_only))

    def _weight_names(self, trained_only: bool) -> list[str]:
        from pettingllms.runtime.serving import weight_names

        return weight_names(self._model, self.spec, trained_only)

    def _push_weights(self, trained_only: bool) -> None:
        """Hand the learner's weights to this rank's engine (``serving.push_weights`` decides what moves)."""
        from pettingllms.runtime.serving import push_weights

        push_weights(self.sync, self._model, self.spec, trained_only)

    # ------------------------------------------------------------------------------------------ state
    def save(self, directory: str) -> None:
        from pettingllms.runtime.checkpoints import save_worker_state

        engine_rng = self.engine.get_rng_state() if self.engine is not None else None
        save_worker_state(Path(directory), self.learner, self.rank, self.layout.num_ranks, engine_rng)
        self._save_snapshots(directory)

    def save_start(self, directory: str) -> None:
        """``save`` with the learner's shards written in a thread of this worker (its state copied into host buffers
        first, so the next update may run at once); ``save_wait`` waits for it. An FSDP group's save is a collective:
        it runs on a gloo group of its own (made at the first asynchronous save, by every rank, since they all call
        this together), never on the group training's collectives use."""
        from pettingllms.runtime.checkpoints import start_worker_save

        self.save_wait()  # the host buffers are reused: never while the previous write still reads them
        group = None
        if self.layout.sharded and self.learner is not None:
            if self._checkpoint_group is None:
                import torch.distributed as dist

                self._checkpoint_group = dist.new_group(backend="gloo")
            group = self._checkpoint_group
        engine_rng = self.engine.get_rng_state() if self.engine is not None else None
        self._saving = start_worker_save(Path(directory), self.learner, self.rank, self.layout.num_ranks, engine_rng,
                                         process_group=group)
        if self.snapshots is not None and self.rank == 0:  # a pool worker (no learner): its past versions, in a thread
            from pettingllms.runtime.checkpoints import SNAPSHOTS_DIR, WorkerSave

            slots, folder = self.snapshots.frozen(), Path(directory) / SNAPSHOTS_DIR
            self._saving = WorkerSave(lambda: slots.save(folder), f"checkpoint-{Path(directory).name}-snapshots")

    def _save_snapshots(self, directory: str) -> None:
        from pettingllms.runtime.checkpoints import SNAPSHOTS_DIR

        if self.snapshots is not None and self.rank == 0:
            self.snapshots.save(Path(directory) / SNAPSHOTS_DIR)

    def held_snapshots(self) -> list[int] | None:
        """An opponent-pool worker's filled slots (None for any other worker): a resume checks them against the
        trainer's record of the pool."""
        return sorted(self.snapshots.slots) if self.snapshots is not None else None

    def save_wait(self) -> None:
        saving, self._saving = self._saving, None
        if saving is not None:
            saving.wait()

    def load(self, directory: str) -> None:
        from pettingllms.runtime.checkpoints import SNAPSHOTS_DIR, load_worker_state

        engine_rng = load_worker_state(Path(directory), self.learner, self.rank, self.spec.policy)
        if self.engine is not None and engine_rng is not None:
            self.engine.set_rng_state(engine_rng)
        if self.snapshots is not None:  # the past versions the run had; the next step loads the one it plays
            self.snapshots.load(Path(directory) / SNAPSHOTS_DIR)
            self._serving_slot = None
        # An engine with its own copy still holds the initial weights: give it the restored ones.
        self._push_weights(trained_only=False)

    def export_hf(self, directory: str) -> list[str]:
        """Hugging Face weights (full model: safetensors + tokenizer; LoRA: one peft folder per adapter), written
        by rank 0. A collective for sharded groups (the full tensors are gathered on every rank)."""
        if self.learner is None:
            return []
        from pettingllms.learner.state import export_hf_model
        from pettingllms.models import load_model

        model = self._model
        if self.layout.sharded:
            stream = self.full_weights()
            if self.rank != 0:
                for _ in stream:  # take part in the all-gathers
                    pass
                return []
            spec = self.spec
            model = load_model(spec.directory, spec.dtype, spec.lora, spec.lora_names)
            from pettingllms.learner.weights import load_weights_into

            load_weights_into(model, stream)
        return save_tokenizer_beside(export_hf_model(model, self.spec.lora_names, directory), self.codec)

    def close(self) -> None:
        """Stop the engine's own processes (vLLM) and leave the policy's process group."""
        from pettingllms.runtime.serving import close_engine

        close_engine(self.engine)
        if self.layout.sharded:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


ENGINE_BARRIER_TIMEOUT = datetime.timedelta(hours=1)  # the peers wait at it through the host's whole vLLM start


def engine_group_barrier(layout) -> Callable[[], None] | None:
    """A barrier of the worker group (joined, every rank calls this once) whose engines span several ranks' GPUs
    (TP > 1), else None: there each rank's engine is on its own GPU and nothing needs to wait
    (``serving.EngineSync`` says where it waits). It runs on a gloo group: on the CPU, holding no GPU memory, and
    with a timeout longer than NCCL's default, since peers wait at it while the host starts vLLM (weights,
    compilation, CUDA graphs). A rank that fails leaves the others waiting there until the group is killed."""
    if not (layout.tensor_parallel > 1 and layout.sharded):
        return None
    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=ENGINE_BARRIER_TIMEOUT)
    return functools.partial(dist.barrier, group=group)


def save_tokenizer_beside(paths: Sequence[Path | str], codec) -> list[str]:
    """Write the tokenizer (chat template included) into every exported full-model folder, so it loads and
    serves on its own (vLLM, transformers); adapter folders load on top of the base model and need none."""
    for path in paths:
        if (Path(path) / "config.json").is_file():
            codec.tokenizer.save_pretrained(path)
    return [str(p) for p in paths]
