"""The run directory: ``logs/<experiment>/<date>/<time>/`` with train.log, summary.log (JSON lines),
config.yaml (and the configs of earlier starts, config.<n>.yaml), checkpoints/, validate/ and
(``training.save_samples_freq``) samples/."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Callable, Mapping, Sequence

from pettingllms.core import DataError, EpisodeRecord, Sample
from pettingllms.core.atomic import write_text_atomic
from pettingllms.core.disk_full import naming_a_full_disk

log = logging.getLogger("pettingllms.trainer")

def find_resumable_run(log_dir: str | Path, experiment: str) -> Path | None:
    """The most recent run of ``experiment`` that has a checkpoint."""
    runs = sorted(Path(log_dir, experiment).absolute().glob("*/*/checkpoints/latest"), key=lambda p: p.stat().st_mtime)
    return runs[-1].parents[1] if runs else None


def resume_point(log_dir: str | Path, experiment: str, resume: str) -> tuple[Path, Path | None] | None:
    """(run directory, checkpoint) a run continues, or None for a fresh run. ``resume``: ``auto`` (the latest run of
    ``experiment`` with a checkpoint), ``none``/"" or a checkpoint directory (ConfigError if it is not one)."""
    from pettingllms.core import ConfigError
    from pettingllms.runtime import checkpoints as ckpt

    if resume == "auto":
        run = find_resumable_run(log_dir, experiment)
        if run is None:
            return None
        checkpoint = ckpt.latest_checkpoint(run / "checkpoints")
        if checkpoint is None:  # `latest` names a step that is not there: never train from step 0 over this run
            from pettingllms.core import DamagedCheckpointError
            from pettingllms.core.atomic import leftovers

            pointer = run / "checkpoints" / ckpt.LATEST
            aside = [p.name for p in leftovers(run / "checkpoints")]
            raise DamagedCheckpointError(
                f"{pointer} names {pointer.read_text().strip()!r}, which is missing or incomplete"
                + (f"; beside it: {aside} (a replaced step's only copy may be in a .old- folder)" if aside else "")
                + ". Restore that step folder, point `latest` at a complete step_N, or start afresh with "
                  "training.resume=none")
        return run, checkpoint
    if resume in ("none", ""):
        return None
    checkpoint = Path(resume).absolute()  # handed to Ray actors, whose working directory is not ours
    if not (checkpoint / ckpt.STATE_FILE).is_file():
        raise ConfigError(f"training.resume={resume!r} is not a checkpoint directory")
    return checkpoint.parents[1], checkpoint


def write_run_config(run_dir: Path, text: str) -> Path | None:
    """Write ``config.yaml``. When a resumed run's config differs from the one there, that one is first copied to
    ``config.<n>.yaml`` (n = 1, 2, ...: the run's earlier starts, oldest first; none is ever overwritten). Returns
    the copy, or None."""
    path = run_dir / "config.yaml"
    kept = None
    if path.is_file():
        if path.read_text() == text:
            return None
        n = 1
        while (run_dir / f"config.{n}.yaml").exists():
            n += 1
        kept = run_dir / f"config.{n}.yaml"
        with naming_a_full_disk(kept):
            shutil.copyfile(path, kept)  # a copy, so that config.yaml is never missing
    write_text_atomic(path, text)
    return kept


def read_json_lines(path: Path) -> list[tuple[dict, int, int]]:
    """(row, byte offset where its line starts, where it ends) of a JSON-lines metric log such as summary.log. A
    torn last line (a run stopped while writing it) is dropped with a warning naming the file and line; a bad line
    before the last one is a DataError."""
    lines, start = [], 0  # (line number in the file, its bytes, its offset) of every non-blank line
    for number, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
        if line.strip():
            lines.append((number, line, start))
        start += len(line)
    rows = []
    for number, line, offset in lines:
        try:
            rows.append((json.loads(line), offset, offset + len(line)))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if number < lines[-1][0]:
                raise DataError(f"{path} line {number} is not JSON ({exc}); the file is damaged: delete that line "
                                "and the ones after it") from exc
            log.warning("%s: dropping its torn last line %d (the run stopped while writing it)", path, number)
    return rows


def truncate_summary(run_dir: Path, last_step: int) -> None:
    """On resume, cut summary.log after the checkpoint's step: the lines of later steps (they will be written
    again) and a torn last line go. In place: a truncation needs no free space."""
    path = run_dir / "summary.log"
    if not path.exists():
        return
    rows = read_json_lines(path)
    kept = [end for row, _, end in rows if row.get("step", 0) <= last_step]  # steps only grow down the file
    end = kept[-1] if kept else 0
    if end < path.stat().st_size:
        os.truncate(path, end)
    if end and not path.read_bytes().endswith(b"\n"):  # a last row cut just before its newline
        with path.open("a") as fh:
            fh.write("\n")


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
    with naming_a_full_disk(path), path.open("w") as fh:
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
    with naming_a_full_disk(path), path.open("w") as fh:
        for episode in episodes:
            fh.write(json.dumps(dataclasses.asdict(episode), ensure_ascii=False, default=str) + "\n")
    return path
