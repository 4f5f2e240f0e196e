"""The run directory: ``logs/<experiment>/<date>/<time>/`` with train.log, summary.log (JSON lines),
config.yaml, checkpoints/, validate/ and (``training.save_samples_freq``) samples/."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from pettingllms.assembly.run_dirs import LOGGER_NAME
from pettingllms.core import EpisodeRecord, Sample

# One line per training step. Not propagated: the console shows the step line through the progress bar instead.
STEP_LOGGER = "pettingllms.steps"
logging.getLogger(STEP_LOGGER).propagate = False


def find_resumable_run(log_dir: str | Path, experiment: str) -> Path | None:
    """The most recent run of ``experiment`` that has a checkpoint."""
    runs = sorted(Path(log_dir, experiment).absolute().glob("*/*/checkpoints/latest"), key=lambda p: p.stat().st_mtime)
    return runs[-1].parents[1] if runs else None


class _OursOrWarnings(logging.Filter):
    """train.log keeps pettingllms' own records at INFO and above, and every library's warnings and errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name == LOGGER_NAME or record.name.startswith(
            LOGGER_NAME + ".")


@dataclass
class FileLog:
    """What ``attach_file_logger`` changed, so that ``detach_file_logger`` can undo exactly that."""

    handler: logging.FileHandler
    previous_level: int
    captured_warnings: bool


def attach_file_logger(run_dir: Path) -> FileLog:
    """Write ``<run_dir>/train.log``: pettingllms' INFO lines, the per-step lines (``STEP_LOGGER``, which the
    console does not repeat: it shows the progress bar and its own step line), Python warnings, and every
    library's warnings and errors."""
    handler = logging.FileHandler(run_dir / "train.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_OursOrWarnings())
    ours = logging.getLogger(LOGGER_NAME)
    previous_level = ours.level
    if ours.getEffectiveLevel() > logging.INFO:
        ours.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    steps = logging.getLogger(STEP_LOGGER)
    steps.addHandler(handler)
    captured = logging._warnings_showwarning is not None  # type: ignore[attr-defined]
    logging.captureWarnings(True)  # warnings.warn(...) -> the "py.warnings" logger -> train.log
    return FileLog(handler, previous_level, captured)


def detach_file_logger(log: FileLog) -> None:
    logging.getLogger().removeHandler(log.handler)
    logging.getLogger(STEP_LOGGER).removeHandler(log.handler)
    logging.getLogger(LOGGER_NAME).setLevel(log.previous_level)
    if not log.captured_warnings:
        logging.captureWarnings(False)
    log.handler.close()


def truncate_summary(run_dir: Path, last_step: int) -> None:
    """On resume, drop summary lines written after the checkpoint's step (they will be written again)."""
    path = run_dir / "summary.log"
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


def write_training_samples(run_dir: Path, step: int,
                           scored: Mapping[str, tuple[Sequence[Sample], Sequence[float], Sequence[bool]]],
                           decoders: Mapping[str, Callable[[Sequence[int]], str]]) -> Path:
    """``<run_dir>/samples/step_<N>.jsonl``: one line per GRPO group (problem slot, turn, agent) of the samples a
    step trained on, each candidate with its response, reward parts, advantage and whether it was in the loss.

    ``scored``: policy -> (samples, advantages, in_loss), one entry per sample; ``decoders``: policy -> token ids
    to text (the prompt is kept as token ids in a sample)."""
    groups: dict[tuple, list[tuple[Sample, float, bool]]] = {}
    for policy, (samples, advantages, in_loss) in scored.items():
        for sample, advantage, used in zip(samples, advantages, in_loss):
            groups.setdefault((policy, *sample.group), []).append((sample, advantage, used))
    folder = run_dir / "samples"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:06d}.jsonl"
    with path.open("w") as fh:
        for (policy, slot, turn, agent), members in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
            members.sort(key=lambda m: (m[0].episode, m[0].branch))
            decode = decoders[policy]
            prompts = {m[0].prompt_ids for m in members}
            shared = decode(prompts.pop()) if len(prompts) == 1 else None  # tree mode: one prompt for the K
            row = {"step": step, "policy": policy, "agent": agent, "turn": turn, "slot": slot,
                   "problem_id": members[0][0].problem_id, "adapter": members[0][0].adapter, "prompt": shared,
                   "candidates": [_candidate(sample, advantage, used, None if shared is not None else decode)
                                  for sample, advantage, used in members]}
            fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return path


def _candidate(sample: Sample, advantage: float, in_loss: bool, decode_prompt) -> dict:
    out = {"episode": sample.episode, "branch": sample.branch, "response": sample.response_text,
           "reward": sample.reward, "team_reward": sample.team_reward, "local_reward": sample.local_reward,
           "advantage": advantage, "in_loss": in_loss, "chosen": sample.chosen, "failed": sample.failed,
           "nonfinite_reward": sample.nonfinite_reward, "truncated": sample.truncated,
           "response_tokens": len(sample.response_ids), "info": sample.info}
    if decode_prompt is not None:  # independent mode: the K episodes of a group may have different prompts
        out["prompt"] = decode_prompt(sample.prompt_ids)
    return out


def write_validation_records(run_dir: Path, step: int, benchmark: str, episodes: Sequence[EpisodeRecord]) -> Path:
    folder = run_dir / "validate" / f"step_{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{benchmark}.jsonl"
    with path.open("w") as fh:
        for episode in episodes:
            fh.write(json.dumps(dataclasses.asdict(episode), ensure_ascii=False, default=str) + "\n")
    return path
