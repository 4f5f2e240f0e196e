"""What a run needs to start, checked before any worker starts and without loading weights: every policy's engine is
installed, its model is found (here, or downloadable), and its chat template renders the env's first prompts within
``training.max_prompt_length``. ``--dry-run`` runs ``locate_models`` and the prompt check on the tokenizers already
here; the trainer runs the same checks, then ``resolve_models`` (downloads, the packaged model's conversion) and the
prompt check on every policy, before its workers start.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Callable, Mapping, Sequence, TypeVar

from pettingllms.assembly.plan import PREFLIGHT_PROBLEMS, RunPlan, check_prompts
from pettingllms.config.frozen import thaw
from pettingllms.config.schema import Config
from pettingllms.config.specialization import PolicyPlan
from pettingllms.core import ConfigError, PettingLLMsError, Problem
from pettingllms.models import HFChatCodec, resolve_model
from pettingllms.models.resolve import ModelSource, locate_model

T = TypeVar("T")


def check_engines(run_plan: RunPlan) -> None:
    """Every policy's rollout engine can be imported where its workers run. A GPU policy generates with vLLM
    (``engine: auto``), so a machine without vLLM is refused now, not once Ray has started and the workers have
    loaded their models. With ``RAY_ADDRESS`` set the workers run on the cluster's nodes, whose Python environment
    decides (a worker without vLLM stops at its start with the same message)."""
    vllm_policies = [spec for spec in run_plan.worker_specs if spec.engine == "vllm"]
    if not vllm_policies or os.environ.get("RAY_ADDRESS") or importlib.util.find_spec("vllm") is not None:
        return
    from pettingllms.rollout.vllm import INSTALL_HINT

    keys = ", ".join(f"base_models.{spec.policy}.engine" for spec in vllm_policies)
    why = " (auto: the policy has GPUs)" if any(spec.layout.uses_gpus for spec in vllm_policies) else ""
    raise ConfigError(f"{keys} = vllm{why}: {INSTALL_HINT}")


def describe_engines(run_plan: RunPlan) -> list[str]:
    """The dry run's word on vLLM where ``check_engines`` leaves it to the cluster: a missing vLLM here is said, not
    refused, when ``RAY_ADDRESS`` sends the workers elsewhere."""
    vllm_policies = [spec.policy for spec in run_plan.worker_specs if spec.engine == "vllm"]
    if not vllm_policies or not os.environ.get("RAY_ADDRESS") or importlib.util.find_spec("vllm") is not None:
        return []
    return [f"engines:  {', '.join(vllm_policies)} generate with vLLM, which is not installed here; RAY_ADDRESS is "
            "set, so the workers run on the cluster's nodes, which must have it (pip install -e '.[gpu]' there)"]


def model_key(policy: PolicyPlan) -> str:
    """The config key a policy's model comes from (an L3 copy ``policy_<agent>`` names the entry it copies)."""
    return f"base_models.{policy.config_key or policy.name}.path"


def locate_models(cfg: Config, run_plan: RunPlan) -> dict[str, ModelSource]:
    """Every policy's model, found without downloading or converting; ConfigError naming the key otherwise."""
    return _per_policy(cfg, run_plan, locate_model)


def unplanned_model_problems(cfg: Config) -> list[ConfigError]:
    """Each ``base_models`` entry whose model is not found, checked without a plan: when the config cannot be
    planned (an unknown agent, say), a bad model path is still named beside that problem instead of after its fix."""
    problems = []
    for key, model in cfg.base_models.items():
        try:
            locate_model(model.path)
        except ConfigError as exc:
            problems.append(ConfigError(f"base_models.{key}.path={model.path}: {exc}"))
    return problems


def resolve_models(cfg: Config, run_plan: RunPlan) -> dict[str, Path]:
    """Every policy's local model directory: downloads and the packaged model's one-time conversion happen here."""
    return _per_policy(cfg, run_plan, resolve_model)


def _per_policy(cfg: Config, run_plan: RunPlan, find: Callable[[str], T]) -> dict[str, T]:
    """``find(path)`` of every policy's model path; its ConfigError is raised again naming the policy's key."""
    found = {}
    for name, policy in run_plan.policies.items():
        path = policy.model.path
        try:
            found[name] = find(path)
        except ConfigError as exc:
            raise ConfigError(f"{model_key(policy)}={path}: {exc}") from exc
    return found


def chat_codecs(cfg: Config, run_plan: RunPlan, directories: Mapping[str, Path | None]) -> dict[str, HFChatCodec]:
    """A chat codec (tokenizer only, never the weights) per policy whose model directory is here, once the folder
    is checked (``check_model_folder``: no code of its own, valid safetensors headers); a refusal names the key."""
    from pettingllms.models.load import check_model_folder

    codecs = {}
    for name, directory in directories.items():
        if directory is None:
            continue
        policy = run_plan.policies[name]
        try:
            check_model_folder(directory)
            codecs[name] = HFChatCodec.from_pretrained(directory, thaw(policy.model.chat_template_kwargs))
        except PettingLLMsError as exc:
            raise type(exc)(f"{model_key(policy)}={policy.model.path}: {exc}") from exc
    return codecs


def check_first_prompts(cfg: Config, run_plan: RunPlan, codecs: Mapping[str, HFChatCodec],
                        training: Sequence[Problem], benchmarks: Mapping[str, Sequence[Problem]]) -> None:
    """The first turn of the first training problems and of every benchmark problem renders and fits."""
    limit = cfg.training.max_prompt_length
    check_prompts(run_plan, codecs, training[:PREFLIGHT_PROBLEMS], limit, "training")
    for name, problems in benchmarks.items():
        check_prompts(run_plan, codecs, problems, limit, f"benchmark {name!r}")


def describe_models(sources: Mapping[str, ModelSource], codecs: Mapping[str, HFChatCodec]) -> list[str]:
    lines = []
    for name, source in sources.items():
        template = ("chat template renders the first prompts" if name in codecs
                    else "chat template checked at start-up, once the model is here")
        lines.append(f"model:    {name}: {source.describe()}; {template}")
    return lines
