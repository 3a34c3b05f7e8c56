"""The Triton decode kernel (the interpreter on the CPU) over caches whose K and V formats differ: int8 keys with
int4 values (K8V4), and one side in full precision. The quantized kernel tests decode one format on both sides
(int4 keys per channel) and run the mixed formats through prefill only, so the decode host's variant choice for
these pairs (`FOLD_SCALES` only when both sides have per-token scales) was never run."""

from __future__ import annotations

import pytest
import torch

from hf_paged.cache.kernels import paged_decode_attention
from tests.kernels.paged_cases import make_case, tolerance
from tests.kernels.quantized_cases import dense_quantized_attention, quantize_case


@pytest.mark.parametrize(("key_format", "value_format"), [("int8", "int4"), ("auto", "int8"), ("int8", "fp8")])
def test_decode_of_mixed_formats_matches_the_oracle(key_format, value_format):
    case = make_case([1, 16, 23, 40], [1, 1, 1, 1], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
                     dtype=torch.float32, seed=4)
    qc = quantize_case(case, key_format, value_format)
    out = paged_decode_attention(case.query, qc.key, qc.value, case.block_tables, case.context_lens,
                                 scale=case.scale, tail=qc.tail, backend="triton")
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_quantized_attention(qc), **tolerance(torch.float32))
