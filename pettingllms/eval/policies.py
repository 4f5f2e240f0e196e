"""The evaluated models, loaded once and shared by every env: one client (engine + chat codec) per policy.

Sources, per policy (``base_models.<policy>``, after ``assembly.plan.plan`` of every env):
- a model spec (``path``: alias, hub id, local HF directory, or a trainer HF export ``<run>/hf/<policy>``);
  an export has no tokenizer, so it is read from ``model.tokenizer`` or the run's ``config.yaml``;
- ``model.checkpoint``: the base model of the run's config plus the trained weights (``eval.checkpoints``);
- ``model.adapters``: LoRA adapters exported by the trainer (``<run>/hf/<policy>/<adapter>``) on the base model
  ``base_models.policy_0.path``; each agent uses the adapter named after it, or the only one;
- ``model.server_url``: an OpenAI-compatible server (``rollout.openai_engine``); prompts are still encoded
  locally with the served model's tokenizer (``model.tokenizer``, else ``base_models.policy_0.path``).
Local models run in this process (no Ray: an evaluation has no learner to host), on the policy's engine:
``HFEngine`` (CPU) over the loaded module, or ``VLLMEngine`` (``engine=vllm``, or ``auto`` with GPUs), which
starts from the base model's folder and receives the evaluated weights from memory: a checkpoint's full
weights through ``sync_weights``, LoRA adapters (a checkpoint's, or the trainer's export folders) through
``add_adapter``, exactly as in training.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from pettingllms.config.schema import EvalModelConfig
from pettingllms.core import ConfigError
from pettingllms.eval.checkpoints import RUN_CONFIG, load_policy_weights, read_run_config
from pettingllms.models import ALIASES, HFChatCodec, LoraSpec, load_model, resolve_model
from pettingllms.rollout.hf_engine import HFEngine
from pettingllms.rollout.policy_client import LocalPolicyClient, PolicyClient
from pettingllms.runtime.spec import WorkerSpec

log = logging.getLogger("pettingllms.eval")
ADAPTER_CONFIG = "adapter_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True)
class PolicyNeed:
    """What the evaluated envs need from one policy (merged over envs)."""

    name: str
    model_path: str
    dtype: str
    lora: LoraSpec | None
    adapters: tuple[str, ...]
    num_threads: int
    engine: str
    engine_options: dict = field(default_factory=dict)
    tensor_parallel: int = 1
    chat_template_kwargs: dict = field(default_factory=dict)


@dataclass
class LoadedPolicies:
    clients: dict[str, PolicyClient]
    agent_adapters: dict[str, str | None] = field(default_factory=dict)  # role -> adapter, where the source decides
    described: dict[str, Any] = field(default_factory=dict)  # policy -> where its weights came from
    engines: dict[str, Any] = field(default_factory=dict)  # policy -> engine (those with close() are closed at the end)

    def close(self) -> None:
        for engine in self.engines.values():
            close = getattr(engine, "close", None)
            if close is not None:
                close()


def merge_needs(specs: Sequence[WorkerSpec]) -> dict[str, PolicyNeed]:
    """One need per policy name; envs must agree on its model, and their adapters are united."""
    needs: dict[str, PolicyNeed] = {}
    for s in specs:
        old = needs.get(s.policy)
        if old is not None and (old.model_path, old.dtype, old.lora) != (s.model_path, s.dtype, s.lora):
            raise ConfigError(f"policy {s.policy!r} is set up differently by two envs: "
                              f"{(old.model_path, old.dtype, old.lora)} vs {(s.model_path, s.dtype, s.lora)}")
        adapters = tuple(dict.fromkeys((old.adapters if old else ()) + tuple(s.adapters)))
        needs[s.policy] = PolicyNeed(s.policy, s.model_path, s.dtype, s.lora, adapters,
                                     max(s.num_threads, old.num_threads if old else 0), s.engine,
                                     dict(s.engine_options), s.layout.tensor_parallel, dict(s.chat_template_kwargs))
    return needs


def load_policies(m: EvalModelConfig, needs: dict[str, PolicyNeed], roles: Sequence[str], seed: int,
                  checkpoint: Path | None = None) -> LoadedPolicies:
    """Load every needed policy (or connect to the server) and return its client."""
    if m.server_url:
        return _server_policy(m, needs)
    threads = max((n.num_threads for n in needs.values()), default=0)
    if threads > 0:
        torch.set_num_threads(threads)
    if m.adapters:
        return _adapter_policy(m, needs, roles, seed)
    loaded = LoadedPolicies({})
    try:
        for need in needs.values():
            _refuse_adapter_export(need.model_path)
            codec = _codec(tokenizer_source(need, m), need.chat_template_kwargs)
            model = load_model(need.model_path, need.dtype, need.lora, need.adapters)
            trained = checkpoint is not None
            if trained:
                source = load_policy_weights(model, checkpoint, need.name, need.adapters)
                trained = not source.startswith("base weights")
            else:
                source = str(resolve_model(need.model_path))
            engine = local_engine(need, model, codec, seed, push_weights=trained)
            loaded.engines[need.name] = engine
            loaded.clients[need.name] = LocalPolicyClient(engine, codec)
            loaded.described[need.name] = {"model": need.model_path, "weights": source, "engine": need.engine,
                                           "dtype": need.dtype}
    except BaseException:
        loaded.close()
        raise
    return loaded


def local_engine(need: PolicyNeed, model: torch.nn.Module, codec: HFChatCodec, seed: int, push_weights: bool):
    """The policy's engine in this process: the transformers engine over ``model``, or vLLM started from the base
    model's folder and given ``model``'s weights (``push_weights``: a checkpoint's full weights) and its LoRA
    adapters from memory."""
    if need.engine == "hf":
        return HFEngine(model, codec, seed=seed, **need.engine_options)
    if need.engine != "vllm":
        raise ConfigError(f"base_models.{need.name}.engine={need.engine!r}: eval runs hf or vllm locally")
    from pettingllms.learner.weights import full_weights, trained_parameter_names
    from pettingllms.rollout.vllm import VLLMEngine
    from pettingllms.runtime.engine_sync import EngineSync, peft_adapter_configs

    options = {"dtype": need.dtype, **need.engine_options}
    if need.lora is not None:
        options.setdefault("enable_lora", True)
        options.setdefault("max_loras", max(1, len(need.adapters)))
        options.setdefault("max_lora_rank", need.lora.rank)
    engine = VLLMEngine(resolve_model(need.model_path), tensor_parallel_size=need.tensor_parallel, seed=seed,
                        codec=codec, **options)
    try:
        if need.adapters or push_weights:  # adapters always go in (requests name them); full weights if trained
            sync = EngineSync(engine, peft_adapter_configs(model, need.adapters))
            sync.push(full_weights(model, trained_parameter_names(model, need.adapters)))
    except BaseException:
        engine.close()
        raise
    return engine


def tokenizer_source(need: PolicyNeed, m: EvalModelConfig) -> str:
    """``model.tokenizer``; else the model directory if it has a tokenizer; else, for a trainer HF export
    (``<run>/hf/<policy>``), the run's base model."""
    if m.tokenizer:
        return m.tokenizer
    directory = resolve_model(need.model_path)
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        return str(directory)
    run_config = directory.parent.parent / RUN_CONFIG
    if run_config.is_file():
        base = read_run_config(run_config.parent).base_models.get(directory.name)
        if base is not None:
            log.info("%s has no tokenizer; using the run's base model %s", directory, base.path)
            return base.path
    raise ConfigError(f"model directory {directory} has no tokenizer (no {' / '.join(TOKENIZER_FILES)}): "
                      "set model.tokenizer to the base model it was trained from")


def _codec(source: str, chat_template_kwargs: dict | None = None) -> HFChatCodec:
    """The chat codec of a model spec, or of a tokenizer-only directory or hub id (no weights needed)."""
    path = Path(source).expanduser()
    has_weights = path.is_dir() and any(any(path.glob(pattern)) for pattern in ("*.safetensors", "*.bin"))
    if source in ALIASES or has_weights:
        return HFChatCodec.from_pretrained(source, chat_template_kwargs)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path if path.is_dir() else source)
    except Exception as exc:  # missing files, hub errors, offline cache misses: all mean "no tokenizer here"
        raise ConfigError(f"cannot load a tokenizer from {source!r}: {type(exc).__name__}: {exc}. Set "
                          "model.tokenizer to a local model or tokenizer directory") from exc
    tokenizer.padding_side = "left"
    return HFChatCodec(tokenizer, chat_template_kwargs=chat_template_kwargs)


def _adapter_policy(m: EvalModelConfig, needs: dict[str, PolicyNeed], roles: Sequence[str],
                    seed: int) -> LoadedPolicies:
    from peft import PeftModel

    need = _single(needs, "model.adapters")
    folders = adapter_folders(Path(m.adapters).expanduser())
    mapping = adapters_of_agents(roles, folders)
    used = sorted(set(mapping.values()))
    _check_base(folders[used[0]], need.model_path)
    codec = _codec(m.tokenizer or need.model_path, need.chat_template_kwargs)
    described = {"model": need.model_path, "weights": {name: str(folders[name]) for name in used},
                 "engine": need.engine, "dtype": need.dtype}
    if need.engine == "vllm":  # vLLM loads the exported adapter folders as they are
        engine = _vllm_with_adapter_folders(need, codec, seed, {name: folders[name] for name in used})
        return LoadedPolicies({need.name: LocalPolicyClient(engine, codec)}, mapping, {need.name: described},
                              {need.name: engine})
    model = load_model(need.model_path, need.dtype)
    with warnings.catch_warnings():  # peft does not know the trainer's own "pettingllms_agent" tag
        warnings.filterwarnings("ignore", message=".*pettingllms_agent.*")
        model = PeftModel.from_pretrained(model, folders[used[0]], adapter_name=used[0])
        for name in used[1:]:
            model.load_adapter(folders[name], adapter_name=name)
    engine = HFEngine(model, codec, seed=seed)
    return LoadedPolicies({need.name: LocalPolicyClient(engine, codec)}, mapping, {need.name: described})


def _vllm_with_adapter_folders(need: PolicyNeed, codec: HFChatCodec, seed: int, folders: dict[str, Path]):
    from pettingllms.rollout.vllm import VLLMEngine

    ranks = [int(json.loads((folder / ADAPTER_CONFIG).read_text()).get("r", 1)) for folder in folders.values()]
    options = {"dtype": need.dtype, "enable_lora": True, "max_loras": len(folders), "max_lora_rank": max(ranks),
               **need.engine_options}
    engine = VLLMEngine(resolve_model(need.model_path), tensor_parallel_size=need.tensor_parallel, seed=seed,
                        codec=codec, **options)
    try:
        for name, folder in folders.items():
            engine.add_adapter(name, folder)
    except BaseException:
        engine.close()
        raise
    return engine


def adapter_folders(root: Path) -> dict[str, Path]:
    """Adapter name -> folder for a trainer LoRA export (one peft folder per adapter, or the folder itself)."""
    if (root / ADAPTER_CONFIG).is_file():
        return {_adapter_name(root): root}
    folders = {_adapter_name(p): p for p in sorted(root.iterdir()) if (p / ADAPTER_CONFIG).is_file()} \
        if root.is_dir() else {}
    if not folders:
        raise ConfigError(f"model.adapters={root} holds no LoRA adapter folders (sub-folders with {ADAPTER_CONFIG})")
    return folders


def adapters_of_agents(roles: Sequence[str], folders: dict[str, Path]) -> dict[str, str]:
    """Each agent's adapter: the one named after it, else the export's only adapter (a shared one)."""
    mapping, orphans = {}, []
    for role in roles:
        if role in folders:
            mapping[role] = role
        elif len(folders) == 1:
            mapping[role] = next(iter(folders))
        else:
            orphans.append(role)
    if orphans:
        raise ConfigError(f"the LoRA export has adapters {sorted(folders)} but none for agents {orphans}")
    return mapping


def _refuse_adapter_export(model_path: str) -> None:
    path = Path(model_path).expanduser()
    if path.is_dir() and not (path / "config.json").is_file() and any(path.glob(f"*/{ADAPTER_CONFIG}")):
        raise ConfigError(f"{path} holds LoRA adapters, not a model: pass model.adapters={path} and set "
                          "base_models.policy_0.path to the base model they were trained on")


def _adapter_name(folder: Path) -> str:
    """The agent the trainer tagged the adapter with, else the folder name."""
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    return str(config.get("pettingllms_agent") or folder.name)


def _check_base(folder: Path, base: str) -> None:
    recorded = json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if recorded and Path(recorded).is_dir() and Path(recorded).resolve() != resolve_model(base):
        log.warning("adapters in %s were trained on %s, but base_models.policy_0.path is %s", folder, recorded, base)


def _server_policy(m: EvalModelConfig, needs: dict[str, PolicyNeed]) -> LoadedPolicies:
    from pettingllms.rollout.openai_engine import OpenAICompletionsEngine

    need = _single(needs, "model.server_url")
    if need.adapters or m.adapters or m.checkpoint:
        raise ConfigError("model.server_url evaluates the served model as it is: drop LoRA adapters, model.adapters "
                          "and model.checkpoint (serve the trained weights instead)")
    codec = _codec(m.tokenizer or need.model_path, need.chat_template_kwargs)
    eos = codec.tokenizer.eos_token_id
    eos = int(eos) if eos is not None else min(codec.eos_token_ids)
    engine = OpenAICompletionsEngine(
        m.server_url, m.served_name or need.model_path, codec.tokenizer, eos,
        api_key=os.environ.get(m.api_key_env) if m.api_key_env else None, prompt_format=m.prompt_format,
        vllm_extras=m.vllm_extras, timeout_s=m.request_timeout_s, max_concurrency=m.max_concurrency,
        max_retries=m.max_retries,
    )
    engine.check_server()
    described = {"model": engine.model, "server_url": m.server_url, "engine": "openai",
                 "prompt_format": m.prompt_format}
    return LoadedPolicies({need.name: LocalPolicyClient(engine, codec)}, {}, {need.name: described},
                          {need.name: engine})


def _single(needs: dict[str, PolicyNeed], what: str) -> PolicyNeed:
    if len(needs) != 1:
        raise ConfigError(f"{what} provides one model, but the agents use policies {sorted(needs)}; "
                          "use specialization L0 or L1")
    return next(iter(needs.values()))
