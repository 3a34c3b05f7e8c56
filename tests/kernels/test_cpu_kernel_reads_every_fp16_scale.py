"""The CPU quantized kernel's fp16 decoding (`cpu_quantized._half`: scales are stored as int16 bits) gives torch's
value for every finite fp16, subnormals included (a block of tiny values, |x| < 127 * 6.1e-5 for int8, has a
subnormal scale; the kernel tests' random blocks never do)."""

from __future__ import annotations

import numpy as np
import torch

from hf_paged.cache.kernels.cpu_quantized import _half


def test_every_finite_fp16_bit_pattern_decodes_to_its_value():
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = bits.view(torch.float16).float()
    finite = torch.isfinite(values)
    got = np.array([_half(np.int16(b)) for b in bits[finite].tolist()], dtype=np.float32)
    assert np.array_equal(got, values[finite].numpy())  # exact: every fp16 is a float32
    subnormal = (values != 0) & (values.abs() < 2.0**-14)
    assert int(subnormal.sum()) == 2 * 1023  # the patterns above include them
