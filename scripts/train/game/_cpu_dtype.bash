# Sourced by the game scripts before common.sh. With no GPU the run uses float32: on CPUs without native
# bf16 (AVX2 only, like the CPU dev machine) bf16 matmuls are emulated, about 15x slower than fp32.
# A dtype given on the command line still wins (it comes after DEFAULTS).
if [[ "${GPU_num:-}" == "0" ]] || { [[ -z "${GPU_num:-}${CUDA_VISIBLE_DEVICES:-}" ]] && ! command -v nvidia-smi >/dev/null 2>&1; }; then
  DEFAULTS+=("base_models.policy_0.dtype=float32")
fi
