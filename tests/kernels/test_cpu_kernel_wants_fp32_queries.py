"""`cpu_kernel_applies`: the numba kernels take fp32 queries only, whatever the caches hold (numba has no
half-precision arithmetic on the CPU: a 16-bit query over fp32 caches goes to the torch path)."""

from __future__ import annotations

import torch

from hf_paged.cache.kernels.cpu_launch import cpu_kernel_applies


def test_a_16_bit_query_over_fp32_caches_takes_the_torch_path():
    cache = torch.zeros(1, 1, 1, 4)
    assert cpu_kernel_applies(torch.zeros(1, 2, 4), cache, cache)
    for dtype in (torch.float16, torch.bfloat16):
        assert not cpu_kernel_applies(torch.zeros(1, 2, 4, dtype=dtype), cache, cache)
