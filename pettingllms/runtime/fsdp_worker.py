"""One rank of a policy's FSDP2 worker group (a Ray actor); ``num_ranks`` of them train one policy together.

Design, and why:
- One Ray actor per rank, all inside the policy's own placement group, and one ``torch.distributed`` process
  group per policy (gloo on CPU, nccl on GPU) with its own rendezvous port: policies never share a collective,
  so their updates run side by side without waiting for each other.
- Training is data-parallel. Every rank receives the whole batch (one object in Ray's store, read by all) and
  derives its own share (``pettingllms.learner.fsdp.DataParallel``), so the loss is normalised by the global
  token count exactly as in one process, and FSDP reduce-scatters the gradients.
- Generation happens on rank 0 only, from a full (unsharded) copy of the weights that rank 0 keeps for its
  engine. After every update the ranks stream the trained tensors to it (``full_weights``: one all-gather per
  tensor, so one full tensor at a time); the seconds it takes are reported as ``timing/sync_s``.
  The alternative, every rank unsharding the model and generating a slice of the requests, would tie every
  generation call to a collective across ranks; this way the engine sees exactly what a single-process worker
  sees (sampling does not depend on the number of ranks) and the same hand-off serves an engine that keeps
  its own copy of the weights, such as vLLM: the vLLM engine is given the stream through ``EngineSync``
  (runtime/engine_sync.py: full tensors, or each adapter's LoRA tensors) and sleeps while the ranks train; the
  transformers engine's module is filled with ``load_weights_into``. The cost is one extra full copy of the
  model on rank 0 (for LoRA only the adapters are streamed after the first sync).
- Checkpoints are sharded (torch.distributed.checkpoint) and reshard on load, so a run can resume with another
  number of ranks. Rank 0 also writes the learner state every rank shares and the engine's RNG; each rank
  writes its own torch RNG state.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Iterator, Sequence

import torch

from pettingllms.core import ConfigError, GenerationRequest, GenerationResult, Sample
from pettingllms.learner import PolicyLearner
from pettingllms.learner.fsdp import (
    DataParallel,
    full_weights,
    load_sharded,
    load_weights_into,
    save_sharded,
    shard_model,
    trained_parameter_names,
)
from pettingllms.learner.learner import export_hf_model
from pettingllms.models import HFChatCodec, load_model, resolve_model, use_adapter
from pettingllms.runtime.engine_sync import EngineSync, peft_adapter_configs
from pettingllms.runtime.worker import WorkerSpec, make_engine, save_tokenizer_beside

log = logging.getLogger("pettingllms.runtime")

META_FILE = "fsdp_state.pt"
SHARDS_DIR = "shards"
RNG_FILE = "rng_rank{rank}.pt"


class FSDPRankWorker:
    """Rank ``rank`` of ``spec.num_ranks``. Call ``rendezvous`` on rank 0, then ``setup`` on every rank at once."""

    def __init__(self, spec: WorkerSpec, rank: int) -> None:
        if spec.fsdp is None:
            raise ConfigError(f"policy {spec.policy!r}: FSDPRankWorker needs spec.fsdp")
        if spec.num_threads > 0:
            torch.set_num_threads(spec.num_threads)
        self.spec = spec
        self.rank = rank
        self.world_size = spec.num_ranks
        self.learner: PolicyLearner | None = None
        self.engine = None
        self.engine_model: torch.nn.Module | None = None

    # ------------------------------------------------------------------------------------------ start-up
    def rendezvous(self) -> tuple[str, int]:
        """(address, free port) on this node for the policy's process group; called on rank 0."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, address: str, port: int) -> str:
        """Join the policy's process group, load and shard the model, build the learner and (rank 0) the engine."""
        import torch.distributed as dist

        use_gpu = self.spec.gpus_per_rank > 0
        if use_gpu:
            torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this rank's GPUs
        device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")
        dist.init_process_group(
            "nccl" if use_gpu else "gloo",
            init_method=f"tcp://{address}:{port}",
            rank=self.rank,
            world_size=self.world_size,
        )
        spec = self.spec
        path = resolve_model(spec.model_path)
        names = spec.adapters if spec.lora is not None else ()
        torch.manual_seed(spec.seed)  # every rank builds the same initial weights (LoRA A is random)
        model = load_model(path, spec.dtype, spec.lora, names)
        if spec.trainable:
            reference = None
            if spec.learner.kl.enabled and not names:
                # The learner's default reference is a deep copy; under FSDP it must be sharded like the policy.
                reference = shard_model(load_model(path, spec.dtype), spec.fsdp, device)
            shard_model(model, spec.fsdp, device)
            self.learner = PolicyLearner(
                model,
                spec.learner,
                adapter_names=names,
                ref_model=reference,
                adapter_context=use_adapter,
                frozen=spec.frozen,
                policy=spec.policy,
                pad_token_id=HFChatCodec.from_pretrained(path).pad_token_id,
                data_parallel=DataParallel(self.rank, self.world_size),
            )
            self._model = model
        else:
            self._model = shard_model(model, spec.fsdp, device)
        if self.rank == 0:
            if spec.engine == "hf":  # the transformers engine generates from a full copy on rank 0
                self.engine_model = load_model(path, spec.dtype, spec.lora, names).to(device)
            self.engine = make_engine(spec, self.engine_model, HFChatCodec.from_pretrained(path))
        self.sync = EngineSync(self.engine, peft_adapter_configs(model, names))
        self._push_weights(trained_only=False)  # the engine starts from exactly the learner's weights
        return spec.policy

    def ready(self) -> str:
        return self.spec.policy

    # ------------------------------------------------------------------------------------------ work
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        if self.engine is None:
            raise RuntimeError(f"policy {self.spec.policy!r}: only rank 0 generates (this is rank {self.rank})")
        return self.engine.generate(list(requests))

    def update(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict[str, float]:
        """One training iteration on the whole batch (every rank gets all of it), then the engine weight sync."""
        if self.learner is None:
            return {}
        self.sync.release_for_update()
        start = time.perf_counter()
        metrics = dict(self.learner.update(samples, advantages))
        metrics["timing/update_s"] = time.perf_counter() - start
        start = time.perf_counter()
        self._push_weights(trained_only=True)
        metrics["timing/sync_s"] = time.perf_counter() - start
        return metrics

    def full_weights(self, trained_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's full (unsharded) weights, one ``(name, tensor)`` at a time, for a rollout engine.

        A collective: every rank of the group must iterate it to the end at the same time. Every rank receives
        each full tensor; only rank 0's engine keeps them. ``trained_only``: just the tensors an update changes
        (all of them for a full model, the unfrozen adapters under LoRA).
        """
        names = None
        if trained_only and self.learner is not None:
            names = trained_parameter_names(self._model, self.learner.adapter_names, sorted(self.learner.frozen))
        return full_weights(self._model, names)

    def _push_weights(self, trained_only: bool) -> None:
        stream = self.full_weights(trained_only)
        if self.engine_model is not None:
            load_weights_into(self.engine_model, stream)
        else:  # vLLM on rank 0 (tensors or adapters from memory); other ranks take part in the all-gathers only
            self.sync.push(stream)

    # ------------------------------------------------------------------------------------------ state
    def save(self, directory: str) -> None:
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        learner_meta = save_sharded(self.learner, folder / SHARDS_DIR) if self.learner is not None else None
        torch.save({"torch_rng": torch.get_rng_state()}, folder / RNG_FILE.format(rank=self.rank))
        if self.rank == 0:
            meta = {"world_size": self.world_size, "learner": learner_meta, "engine_rng": self.engine.get_rng_state()}
            torch.save(meta, folder / META_FILE)

    def load(self, directory: str) -> None:
        folder = Path(directory)
        meta_path = folder / META_FILE
        if not meta_path.is_file():
            raise ConfigError(
                f"checkpoint for policy {self.spec.policy!r} has no {META_FILE} in {folder}; it was not written by an "
                f"FSDP worker group (num_ranks > 1 or fsdp.enabled), so it cannot be resumed by one"
            )
        meta = torch.load(meta_path, weights_only=False)
        if self.learner is not None and meta["learner"] is not None:
            load_sharded(self.learner, folder / SHARDS_DIR, meta["learner"])
        if meta["world_size"] != self.world_size and self.rank == 0:
            log.info("policy %s: resharded a %d-rank checkpoint onto %d ranks", self.spec.policy,
                     meta["world_size"], self.world_size)
        rng_path = folder / RNG_FILE.format(rank=self.rank)
        if rng_path.is_file():  # a rank the saving run did not have keeps its seeded RNG
            torch.set_rng_state(torch.load(rng_path, weights_only=False)["torch_rng"])
        if self.engine is not None:
            self.engine.set_rng_state(meta["engine_rng"])
        self._push_weights(trained_only=False)

    def export_hf(self, directory: str) -> list[str]:
        """Hugging Face weights from rank 0's full copy (current after every update); other ranks write nothing.

        With vLLM, rank 0 keeps no transformers copy: every rank gathers the weights (a collective) and rank 0
        loads them into a host-memory model to write it.
        """
        if self.learner is None:
            return []
        model = self.engine_model
        if self.spec.engine != "hf":  # decided alike on every rank: the gather below is a collective
            stream = self.full_weights()
            if self.rank != 0:
                for _ in stream:
                    pass
                return []
            spec = self.spec
            model = load_model(resolve_model(spec.model_path), spec.dtype, spec.lora, self.learner.adapter_names)
            load_weights_into(model, stream)
        if self.rank != 0:
            return []
        codec = HFChatCodec.from_pretrained(resolve_model(self.spec.model_path))
        return save_tokenizer_beside(export_hf_model(model, self.learner.adapter_names, directory), codec)

    def close(self) -> None:
        """Stop rank 0's engine processes (vLLM) and leave the policy's process group."""
        import torch.distributed as dist

        close = getattr(self.engine, "close", None)
        if callable(close):
            close()
        if dist.is_initialized():
            dist.destroy_process_group()

