#!/usr/bin/env bash
# The prepared script for a lent GPU machine (one GPU, no network, a 15-minute lease): what the fast learner step
# rests on, measured in one call, cheapest and newest first. Each part has its own time limit and writes its JSON as
# it ends, so a part that overruns costs only itself.
#
#   bash benchmarks/gpu_lent.sh OUT_DIR [WHEEL_DIR]
#   GPU_PARTS="streaming" bash benchmarks/gpu_lent.sh OUT_DIR [WHEEL_DIR]     # some parts only (one call <= 10 min)
#
# WHEEL_DIR: wheels for what the machine lacks (the project's pins of transformers, tokenizers, peft, verl, hydra,
# omegaconf, ...; Ray without its server binaries, imported and never started) and ``smollm2-tokenizer/`` (the BPE
# files the full-size replica takes; the packaged GGUF needs the gguf package to convert). docs/distributed.md says
# how to make it. Where gpu_carry.py's site is unpacked it holds all of those: pass its folder (.carry) for the
# tokenizer files alone. The streaming and smoke parts need vLLM (skipped, and said so, where it is not importable): on a
# lent machine it comes in parts (benchmarks/gpu_carry.py) unpacked into /tmp/site, which goes on PYTHONPATH here
# when present. All parts together take longer than one 10-minute call: run them as two or three calls (GPU_PARTS).
set -u
out=${1:?usage: gpu_lent.sh OUT_DIR [WHEEL_DIR]}
wheels=${2:-}
mkdir -p "$out"
log="$out/gpu_lent.log"
exec > >(tee -a "$log") 2>&1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
if [ -f /tmp/site/.gpu-carry-complete ]; then  # vLLM and the project's pins, carried in parts (gpu_carry.py)
  export PYTHONPATH=/tmp/site:$PWD
fi
if [ -n "$wheels" ] && compgen -G "$wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl \
    || { echo "gpu_lent: installing the carried wheels failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
fi
# The built-in envs are found through the package's entry points: a source tree that was never installed has none.
if ! python3 -c 'import importlib.metadata as m; m.version("pettingllms")' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . \
    || { echo "gpu_lent: installing the project failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
status=0
parts=" ${GPU_PARTS:-attention ipc learner checkpoint streaming smoke} "
part() {  # part SECONDS NAME COMMAND...
  local limit=$1 name=$2; shift 2
  [[ "$parts" == *" $name "* ]] || return 0
  local start=$SECONDS
  timeout -k 10 "$limit" "$@" || { echo "gpu_lent: $name exited $? after $((SECONDS - start)) s"; status=1; }
  echo "gpu_lent: $name took $((SECONDS - start)) s"
}
part 110 attention python3 benchmarks/gpu_probe.py --parts attention --out-dir "$out"
part 80 ipc python3 benchmarks/gpu_probe.py --parts ipc --out-dir "$out"
tokenizer=()
[ -n "$wheels" ] && [ -d "$wheels/smollm2-tokenizer" ] && tokenizer=(--tokenizer-dir "$wheels/smollm2-tokenizer")
part 300 learner python3 benchmarks/gpu_learner.py --cases chunked compiled chunked_sdpa lora --repeats 2 --profile "${tokenizer[@]}" \
  --replica-cache /tmp/replicas --out-dir "$out"
part 140 checkpoint python3 benchmarks/gpu_probe.py --parts checkpoint --scratch /tmp/probe-ckpt --out-dir "$out"
# vLLM 0.26's V2 model runner imports FlashInfer for its sampler unless told not to; the carried vLLM leaves
# FlashInfer behind (gpu_carry.py), so its PyTorch sampler serves. A registry install of vLLM brings FlashInfer.
python3 -c 'import flashinfer' 2>/dev/null || export VLLM_USE_FLASHINFER_SAMPLER=0
# The streaming rollout against the barrier (vLLM's engine loop against its offline generate), a full-size random
# Qwen3-0.6B replica in bf16, greedy, long-tailed lengths (15% of requests to 1,024 tokens) and env steps.
if python3 -c 'import vllm' 2>/dev/null; then
  part 300 streaming python3 benchmarks/rollout_streaming.py --engine vllm --replica Qwen/Qwen3-0.6B --dtype bfloat16 \
    "${tokenizer[@]}" --replica-cache /tmp/replicas --episodes 64 --turns 4 --short-tokens 64 --long-tokens 1024 \
    --repeats 2 --out-dir "$out"
  # The shipped scripts as users run them (vLLM engines, sleep mode, the weight sync's four phases, checkpoints):
  # L1 twice (the second start loads vLLM's compile cache; its rollout streams), then LoRA served by vLLM.
  part 540 smoke python3 benchmarks/gpu_smoke.py --parts ${GPU_SMOKE_PARTS:-L1 L1_streaming L2} --steps 2 \
    "${tokenizer[@]}" --replica-cache /tmp/replicas --out-dir "$out"
else
  for name in streaming smoke; do
    [[ "$parts" == *" $name "* ]] && echo "gpu_lent: $name skipped: vLLM is not installed here"
  done
fi
exit $status
