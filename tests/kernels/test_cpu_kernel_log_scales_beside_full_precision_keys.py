"""Full-precision keys beside log8-scaled values (`key_cache_dtype="auto"`, `value_cache_dtype` quantized,
`kv_scale_format="log8"`: `formats_for` gives the keys no log scale): the CPU kernel reads the value scales as log8
codes, not fp16 bits (`cpu_launch.kernel_launch` takes the flag from either side)."""

from __future__ import annotations

import functools

import torch

from hf_paged.cache.compression import BlockFormat
from hf_paged.cache.compression.formats import formats_for
from hf_paged.cache.kernels.cpu_launch import plan_cpu_attention, run_cpu_attention
from tests.kernels.paged_cases import make_case as _make_case
from tests.kernels.paged_cases import tolerance
from tests.kernels.quantized_cases import dense_quantized_attention, quantize_case, requantize

make_case = functools.partial(_make_case, device=torch.device("cpu"))


def test_log8_value_scales_beside_full_precision_keys(one_thread):  # serial: one numba compile, not two
    key, value = formats_for("auto", "int8", scale_format="log8")
    assert not key.is_quantized and not key.log_scale and value.log_scale  # the product's pairing
    case = make_case([1, 16, 17, 40, 33], [1, 1, 1, 7, 16], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
                     dtype=torch.float32, seed=6)
    qc = requantize(quantize_case(case, "int8", "int8", seed=2), BlockFormat("auto"), value)
    plan = plan_cpu_attention(case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(), 8, None,
                              quantized=True)
    out = run_cpu_attention(plan, case.query, qc.key, qc.value, scale=case.scale, softcap=None, tail=qc.tail)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_quantized_attention(qc), **tolerance(torch.float32))
