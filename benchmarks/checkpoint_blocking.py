"""How long a checkpoint stops training on CPU: ``training.async_checkpoint`` against the synchronous save.

    python benchmarks/checkpoint_blocking.py            # the packaged SmolLM2-135M, full fine-tune, fp32 + AdamW
    python benchmarks/checkpoint_blocking.py --quick    # the tiny random model: checks the script

One policy worker as a run builds it (``runtime/worker.PolicyWorker``, the transformers engine, one rank) takes one
real update (its own samples, so AdamW's state exists), then saves its state again and again, alternating:

- synchronous (``PolicyWorker.save``, what a run does without ``training.async_checkpoint``): the whole write blocks;
- asynchronous (``save_start`` then ``save_wait``): training is blocked only while the state is copied into host
  buffers kept across saves; a thread writes them. The first asynchronous save also allocates the buffers, so it is
  reported apart and not counted in the medians.

The figure is the ratio of the medians: seconds training is blocked by an asynchronous save over seconds of a
synchronous one (target <= 0.5). Each save goes to a fresh folder that is removed afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from _report import learner_config, load_average, median, out_dir, write_result  # noqa: E402

TARGET_RATIO = 0.5


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def trained_worker(model: str, threads: int):
    """A one-rank policy worker on CPU after one update on its own samples (AdamW's moments exist)."""
    import torch

    from pettingllms.core.types import GenerationRequest, Sample, SamplingParams
    from pettingllms.runtime.layout import resolve_layout
    from pettingllms.runtime.spec import WorkerSpec
    from pettingllms.runtime.worker import PolicyWorker

    torch.set_num_threads(threads)
    spec = WorkerSpec(policy="policy_0", model_path=model, learner=learner_config(total_steps=10, lr=1e-5),
                      layout=resolve_layout("policy_0", num_gpus=0, engine="hf"), num_threads=threads)
    worker = PolicyWorker(spec)
    worker.setup()
    prompt = worker.codec.encode_chat([{"role": "user", "content": "Count from one to five."}])
    sampling = SamplingParams(temperature=1.0, max_tokens=16)
    (result,) = worker.generate([GenerationRequest("q0", tuple(prompt), 4, sampling, None)])
    samples, advantages = [], []
    for branch, completion in enumerate(result.completions):
        samples.append(Sample(policy="policy_0", agent="agent", turn=0, group=(0, 0, "agent"), episode=f"e{branch}",
                              problem_id="q0", branch=branch, prompt_ids=tuple(prompt),
                              response_ids=completion.token_ids, response_logprobs=completion.logprobs,
                              reward=float(branch % 2), adapter=None))
        advantages.append(1.0 if branch % 2 else -1.0)
    worker.update(samples, advantages)
    return worker


def measure(worker, scratch: Path, repeats: int) -> dict[str, Any]:
    def fresh(tag: str) -> Path:
        path = scratch / tag
        shutil.rmtree(path, ignore_errors=True)
        return path

    path = fresh("first_async")
    start = time.perf_counter()
    worker.save_start(str(path))
    first_blocking = time.perf_counter() - start
    worker.save_wait()
    first_complete = time.perf_counter() - start
    size = folder_bytes(path)
    shutil.rmtree(path, ignore_errors=True)
    pairs = []
    for r in range(repeats):
        path = fresh(f"sync{r}")
        start = time.perf_counter()
        worker.save(str(path))
        sync_s = time.perf_counter() - start
        shutil.rmtree(path, ignore_errors=True)
        path = fresh(f"async{r}")
        start = time.perf_counter()
        worker.save_start(str(path))
        blocking = time.perf_counter() - start
        worker.save_wait()
        complete = time.perf_counter() - start
        shutil.rmtree(path, ignore_errors=True)
        pairs.append({"sync_s": sync_s, "async_blocking_s": blocking, "async_complete_s": complete})
        print(f"[checkpoint] repeat {r}: sync {sync_s:.2f} s; async blocked {blocking:.2f} s, complete "
              f"{complete:.2f} s", flush=True)
    return {"checkpoint_bytes": size, "first_async": {"blocking_s": first_blocking, "complete_s": first_complete},
            "pairs": pairs}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: smollm2-135m-instruct (--quick: tiny-random-smollm2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="the tiny model, one repeat: checks the script")
    parser.add_argument("--scratch", default=None, help="where the saves are written (default: a temp folder)")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--note", default="", help="the conditions, recorded in the JSON (e.g. a quiet machine)")
    args = parser.parse_args(argv)
    model = args.model or ("tiny-random-smollm2" if args.quick else "smollm2-135m-instruct")
    repeats = 1 if args.quick else args.repeats
    load_before = load_average()
    worker = trained_worker(model, args.threads)
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="checkpoint-blocking-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        samples = measure(worker, scratch, repeats)
    finally:
        worker.close()
        shutil.rmtree(scratch, ignore_errors=True)
    pairs = samples["pairs"]
    medians = {key: median([p[key] for p in pairs]) for key in ("sync_s", "async_blocking_s", "async_complete_s")}
    medians["ratio"] = round(medians["async_blocking_s"] / medians["sync_s"], 3)
    write_result(
        "checkpoint_blocking", sys.argv[1:] if argv is None else list(argv), quick=args.quick,
        directory=out_dir(args.out_dir, args.quick),
        config={"model": model, "repeats": repeats, "threads": args.threads, "dtype": "float32",
                "state": "fp32 weights + AdamW moments (full fine-tune), one rank, transformers engine",
                "note": args.note},
        samples=samples, medians=medians, measured=medians["ratio"], target=TARGET_RATIO, op="<=",
        metric="seconds training is blocked by an asynchronous save (training.async_checkpoint) over seconds of a "
               "synchronous one, medians",
        load_before=load_before, threads=args.threads,
        notes=["the first asynchronous save allocates the host buffers: reported apart (samples.first_async), "
               "not in the medians"],
    )
    return {"medians": medians, "samples": samples}


if __name__ == "__main__":
    main()
