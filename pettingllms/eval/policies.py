"""The evaluated models, loaded once and shared by every env: one client (engine + chat codec) per policy.

Each policy is described by the same ``WorkerSpec`` training builds (``assembly.plan.plan`` of every env, merged
over envs), its model resolved once, and served through ``runtime/serving.py`` exactly as a training worker serves
it: the same codec, the same engine construction, the same weight pushes. What is eval's own is which weights:
- the model of ``base_models.<policy>.path`` (alias, hub id, local HF directory, or a trainer HF export
  ``<run>/hf/<policy>``); an export has no tokenizer, so it is read from ``model.tokenizer`` or the run's
  ``config.yaml``;
- ``model.checkpoint``: the base model of the run's config plus the trained weights (``eval.checkpoints``);
- ``model.adapters``: LoRA adapters exported by the trainer (``<run>/hf/<policy>/<adapter>``) on the base model
  ``base_models.policy_0.path``; each agent uses the adapter named after it, or the only one;
- ``model.server_url``: an OpenAI-compatible server (``rollout.openai_engine``); prompts are still encoded
  locally with the served model's tokenizer (``model.tokenizer``, else ``base_models.policy_0.path``).
Local models run in this process (no Ray: an evaluation has no learner to host), on the policy's engine:
``HFEngine`` (CPU) over the loaded module, or ``VLLMEngine`` (``engine=vllm``, or ``auto`` with GPUs), which
starts from the base model's folder and receives the evaluated weights from memory: a checkpoint's full
weights through ``sync_weights``, LoRA adapters (a checkpoint's, or the trainer's export folders) through
``add_adapter``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from pettingllms.config.schema import EvalModelConfig
from pettingllms.core import ConfigError
from pettingllms.eval.checkpoints import RUN_CONFIG, load_policy_weights, read_run_config
from pettingllms.models import LoraSpec, load_model
from pettingllms.models.load import refused_as_one_line
from pettingllms.rollout.policy_client import LocalPolicyClient, PolicyClient
from pettingllms.runtime.serving import (
    EngineSync,
    add_adapter_folders,
    close_engine,
    initial_push_needed,
    make_engine,
    peft_adapter_configs,
    policy_codec,
    push_weights,
    served_engine,
)
from pettingllms.runtime.spec import WorkerSpec

log = logging.getLogger("pettingllms.eval")
ADAPTER_CONFIG = "adapter_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass
class LoadedPolicies:
    clients: dict[str, PolicyClient]
    agent_adapters: dict[str, str | None] = field(default_factory=dict)  # role -> adapter, where the source decides
    described: dict[str, Any] = field(default_factory=dict)  # policy -> where its weights came from
    engines: dict[str, Any] = field(default_factory=dict)  # policy -> engine (those with close() are closed at the end)

    def close(self) -> None:
        for engine in self.engines.values():
            close_engine(engine)


def merge_specs(specs: Sequence[WorkerSpec]) -> dict[str, WorkerSpec]:
    """One worker spec per policy name; envs must agree on its model, and their adapters are united."""
    merged: dict[str, WorkerSpec] = {}
    for s in specs:
        old = merged.get(s.policy)
        if old is None:
            merged[s.policy] = s
            continue
        if (old.model_path, old.dtype, old.lora) != (s.model_path, s.dtype, s.lora):
            raise ConfigError(f"policy {s.policy!r} is set up differently by two envs: "
                              f"{(old.model_path, old.dtype, old.lora)} vs {(s.model_path, s.dtype, s.lora)}")
        merged[s.policy] = dataclasses.replace(old, adapters=tuple(dict.fromkeys(old.adapters + s.adapters)),
                                               num_threads=max(old.num_threads, s.num_threads))
    return merged


def load_policies(m: EvalModelConfig, specs: dict[str, WorkerSpec], roles: Sequence[str], seed: int,
                  checkpoint: Path | None = None) -> LoadedPolicies:
    """Load every policy (or connect to the server) and return its client. Engines sample with ``seed``."""
    specs = {name: dataclasses.replace(spec, seed=seed) for name, spec in specs.items()}
    if m.server_url:
        return _server_policy(m, specs)
    threads = max((s.num_threads for s in specs.values()), default=0)
    if threads > 0:
        torch.set_num_threads(threads)
    if m.adapters:
        return _adapter_policy(m, specs, roles)
    loaded = LoadedPolicies({})
    vllm_engines = sum(spec.engine == "vllm" for spec in specs.values())  # all on this process's GPU
    try:
        for spec in specs.values():
            _refuse_adapter_export(spec.model_path)
            spec = spec.resolved()  # the policy's model, once
            codec = policy_codec(spec, tokenizer_source(spec, m))
            model = load_model(spec.directory, spec.dtype, spec.lora, spec.lora_names)
            trained = checkpoint is not None
            if trained:
                source = load_policy_weights(model, checkpoint, spec.policy, spec.lora_names)
                trained = not source.startswith("base weights")
            else:
                source = str(spec.directory)
            engine = local_engine(spec, model, codec, trained, vllm_engines)
            loaded.engines[spec.policy] = engine
            loaded.clients[spec.policy] = LocalPolicyClient(engine, codec)
            loaded.described[spec.policy] = {"model": spec.model_path, "weights": source, "engine": spec.engine,
                                             "dtype": spec.dtype}
    except BaseException:
        loaded.close()
        raise
    return loaded


def local_engine(spec: WorkerSpec, model: torch.nn.Module, codec, trained: bool, vllm_engines: int = 1):
    """The policy's engine in this process, built as training builds it (without a learner), holding ``model``'s
    weights: the transformers engine over ``model`` itself, or vLLM started from the model directory and given
    ``model``'s LoRA adapters and, when ``trained``, its full weights from memory. ``vllm_engines``: how many
    policies' vLLM engines this process starts on its GPU (they split vLLM's share of it)."""
    engine = make_engine(spec, model, codec, colocated=False, engines_on_gpu=vllm_engines)
    try:
        if initial_push_needed(spec, trained):
            push_weights(EngineSync(engine, peft_adapter_configs(model, spec.lora_names)), model, spec,
                         trained_only=False)
    except BaseException:
        close_engine(engine)
        raise
    return engine


def tokenizer_source(spec: WorkerSpec, m: EvalModelConfig) -> str | None:
    """Where the codec's tokenizer comes from: ``model.tokenizer``; else the model directory (None) if it has a
    tokenizer; else, for a trainer HF export (``<run>/hf/<policy>``), the run's base model."""
    if m.tokenizer:
        return m.tokenizer
    directory = spec.directory
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        return None
    run_config = directory.parent.parent / RUN_CONFIG
    if run_config.is_file():
        base = read_run_config(run_config.parent).base_models.get(directory.name)
        if base is not None:
            log.info("%s has no tokenizer; using the run's base model %s", directory, base.path)
            return base.path
    raise ConfigError(f"model directory {directory} has no tokenizer (no {' / '.join(TOKENIZER_FILES)}): "
                      "set model.tokenizer to the base model it was trained from")


def _adapter_policy(m: EvalModelConfig, specs: dict[str, WorkerSpec], roles: Sequence[str]) -> LoadedPolicies:
    from peft import PeftModel

    spec = _single(specs, "model.adapters")
    folders = adapter_folders(Path(m.adapters).expanduser())
    mapping = adapters_of_agents(roles, folders)
    used = sorted(set(mapping.values()))
    spec = spec.resolved()  # the base model, once
    _check_base(folders[used[0]], spec)
    codec = policy_codec(spec, m.tokenizer or None)
    described = {"model": spec.model_path, "weights": {name: str(folders[name]) for name in used},
                 "engine": spec.engine, "dtype": spec.dtype}
    if spec.engine == "vllm":  # vLLM loads the exported adapter folders as they are
        ranks = [int(json.loads((folders[name] / ADAPTER_CONFIG).read_text()).get("r", 1)) for name in used]
        served = dataclasses.replace(spec, lora=LoraSpec(rank=max(ranks)), adapters=tuple(used))
        engine = make_engine(served, None, codec, colocated=False)
        try:
            add_adapter_folders(engine, {name: folders[name] for name in used})
        except BaseException:
            close_engine(engine)
            raise
        return LoadedPolicies({spec.policy: LocalPolicyClient(engine, codec)}, mapping, {spec.policy: described},
                              {spec.policy: engine})
    model = load_model(spec.directory, spec.dtype)
    with warnings.catch_warnings():  # peft does not know the trainer's own "pettingllms_agent" tag
        warnings.filterwarnings("ignore", message=".*pettingllms_agent.*")
        with refused_as_one_line(folders[used[0]]):
            model = PeftModel.from_pretrained(model, folders[used[0]], adapter_name=used[0])
        for name in used[1:]:
            model.load_adapter(folders[name], adapter_name=name)
    engine = make_engine(spec, model, codec, colocated=False)
    return LoadedPolicies({spec.policy: LocalPolicyClient(engine, codec)}, mapping, {spec.policy: described})


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


def _check_base(folder: Path, spec: WorkerSpec) -> None:
    recorded = json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if recorded and Path(recorded).is_dir() and Path(recorded).resolve() != spec.directory.resolve():
        log.warning("adapters in %s were trained on %s, but base_models.policy_0.path is %s", folder, recorded,
                    spec.model_path)


def _server_policy(m: EvalModelConfig, specs: dict[str, WorkerSpec]) -> LoadedPolicies:
    spec = _single(specs, "model.server_url")
    if spec.adapters or m.adapters or m.checkpoint:
        raise ConfigError("model.server_url evaluates the served model as it is: drop LoRA adapters, model.adapters "
                          "and model.checkpoint (serve the trained weights instead)")
    codec = policy_codec(spec, m.tokenizer or spec.model_path)  # the served model may not exist here
    engine = served_engine(m.server_url, m.served_name or spec.model_path, codec, api_key_env=m.api_key_env,
                           prompt_format=m.prompt_format, vllm_extras=m.vllm_extras, timeout_s=m.request_timeout_s,
                           max_retries=m.max_retries, max_concurrency=m.max_concurrency)
    engine.check_server()
    described = {"model": engine.model, "server_url": m.server_url, "engine": "openai",
                 "prompt_format": m.prompt_format}
    return LoadedPolicies({spec.policy: LocalPolicyClient(engine, codec)}, {}, {spec.policy: described},
                          {spec.policy: engine})


def _single(specs: dict[str, WorkerSpec], what: str) -> WorkerSpec:
    if len(specs) != 1:
        raise ConfigError(f"{what} provides one model, but the agents use policies {sorted(specs)}; "
                          "use specialization L0 or L1")
    return next(iter(specs.values()))
