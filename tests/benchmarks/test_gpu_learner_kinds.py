"""``gpu_learner.py --profile`` groups CUDA kernels by kind from their names (real names from an H100 profile)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.parametrize("name, kind", [
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, "
     "float, float, at::native::binary_internal::MulFunctor<float> > >", "element-wise and other"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<float> "
     ">(at::TensorIteratorBase&)", "element-wise and other"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)",
     "copy and cast"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)",
     "copy and cast"),
    ("Memcpy DtoD (Device -> Device)", "copy and cast"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "matmul"),
    ("triton_tem_fused_flex_attention_backward_1", "attention"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "compiled fusion"),
    ("triton_poi_fused_mul_silu_1", "compiled fusion"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...FusedAdamMathFunctor...>", "optimizer"),
])
def test_kernel_kinds(name, kind):
    from gpu_learner import kernel_kind

    assert kernel_kind(name) == kind
