"""Child process of test_weight_chunks: one weight sync of SmolLM2-135M, chunked or whole, measured from outside.

Run as ``python sync_memory_child.py chunked|whole CHUNK_MB``. It loads the model, prints ``ready`` and waits for a
line on stdin (the parent reads its baseline memory then), runs the sync as ``VLLMEngine.sync_weights`` does (every
chunk written to shared memory, where vLLM's worker processes would map it), then prints ``done <tensors>``.
"""

from __future__ import annotations

import sys

import torch


def chunked(model, chunk_bytes: int) -> int:
    from safetensors import safe_open

    from pettingllms.learner.weights import full_weights
    from pettingllms.rollout.vllm.weights import weight_chunks, write_shared_weights

    count = 0
    for chunk in weight_chunks(full_weights(model, dtype=torch.bfloat16), chunk_bytes, torch.bfloat16):
        path = write_shared_weights(chunk)
        chunk.clear()
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:  # vLLM's workers map it elsewhere
                count += len(list(handle.keys()))
        finally:
            path.unlink()
    return count


def whole(model) -> int:
    """The sync before the change: every tensor at once, one host copy and one file."""
    from pettingllms.learner.weights import full_weights
    from pettingllms.rollout.vllm.weights import write_shared_weights

    weights = dict(full_weights(model))
    path = write_shared_weights(weights, torch.bfloat16)
    path.unlink()
    return len(weights)


def main() -> None:
    from pettingllms.models import load_model

    torch.set_num_threads(1)
    mode, chunk_mb = sys.argv[1], float(sys.argv[2])
    model = load_model("smollm2-135m-instruct", "float32")
    for param in model.parameters():  # weights mapped from the model file become resident before the baseline
        float(param.detach().sum())
    print("ready", flush=True)
    sys.stdin.readline()
    count = chunked(model, int(chunk_mb * 2**20)) if mode == "chunked" else whole(model)
    print(f"done {count}", flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
