"""Reading a quantized cache's rows and blocks in numba kernels: the format and scale-layout codes, fp16 and log8
scales, and a row or a block dequantized to float32 (`cpu_quantized`'s loops and `cpu_quantized_decode`'s vectors).
The formats are `cpu_quantized`'s table.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from hf_paged.background_compile import sources_digest
from hf_paged.cache.kernels.cpu_attention import _FASTMATH
from hf_paged.cache.kernels.cpu_prefetch import CPU_KERNEL_SOURCES
from hf_paged.compat import seal_numba_cache

# format codes of `_dequant_row` (the Triton kernels' codes, `quantized.FORMAT_CODES`; fp8 as bytes)
PLAIN, INT8, FP8, INT4 = 0, 1, 4, 3
# scale layouts: one per token (all heads), one per (token, KV head), one per (KV head, dim) over a block
PER_TOKEN, PER_HEAD, PER_CHANNEL = 0, 1, 2


def _fp8_table() -> np.ndarray:
    """float8_e4m3fn byte -> its value (0x7f and 0xff are NaN)."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()


FP8_VALUES = _fp8_table()
LOG_SCALES = (2.0 ** ((np.arange(256) - 160) / 10.0)).astype(np.float32)  # log8 code -> scale (`compression`)


@njit(cache=True, nogil=True, inline="always")
def _half(bits) -> np.float32:
    """An fp16 stored as int16 bits -> float32 (scales are finite)."""
    h = np.int32(bits) & 0xFFFF
    exp, man = (h >> 10) & 0x1F, h & 0x3FF
    if exp == 0:
        value = math.ldexp(np.float64(man), -24)
    else:
        value = math.ldexp(np.float64(man | 0x400), exp - 25)
    return np.float32(-value if h & 0x8000 else value)


@njit(cache=True, nogil=True, inline="always")
def _scale(scale, log_scale, b, o, h, d, layout):
    if layout == PER_TOKEN:
        raw = scale[b, o, 0]
    elif layout == PER_HEAD:
        raw = scale[b, o, h]
    else:
        raw = scale[b, h, d]
    if log_scale:
        return LOG_SCALES[np.int32(raw) & 0xFF]
    return _half(raw)


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _dequant_row(data, scale, zero, fmt, layout, log_scale, b, o, h, out):
    """Row (block b, slot o, KV head h) of a quantized cache -> `out` [D] float32."""
    dim = out.shape[0]
    row = data[b, o, h]
    if layout == PER_CHANNEL:  # int4 keys: a scale and zero per dim
        for d in range(dim):
            byte = np.int32(row[d >> 1]) & 0xFF
            q = (byte >> 4) if d & 1 else (byte & 0xF)
            out[d] = (q - np.int32(zero[b, h, d])) * _scale(scale, log_scale, b, o, h, d, layout)
        return
    s = _scale(scale, log_scale, b, o, h, 0, layout)
    if fmt == INT8:
        for d in range(dim):
            out[d] = np.float32(row[d]) * s
    elif fmt == FP8:
        for d in range(dim):
            out[d] = FP8_VALUES[np.int32(row[d]) & 0xFF] * s
    else:  # INT4, per token or per head
        z = np.int32(zero[b, o, 0] if layout == PER_TOKEN else zero[b, o, h])
        for d in range(dim):
            byte = np.int32(row[d >> 1]) & 0xFF
            q = (byte >> 4) if d & 1 else (byte & 0xF)
            out[d] = (q - z) * s


@njit(cache=True, nogil=True, fastmath=True)
def _dequant_block(data, scale, zero, fmt, layout, log_scale, b, h, rows, channel, out):
    """Rows 0 .. rows - 1 of block b, KV head h -> `out` [bs, D] float32 (`channel`: [2, D] scratch)."""
    dim = out.shape[1]
    if layout == PER_CHANNEL:  # int4 keys: a scale and zero per dim, decoded once for the block
        for d in range(dim):
            channel[0, d] = _scale(scale, log_scale, b, 0, h, d, layout)
            channel[1, d] = np.float32(zero[b, h, d])
        for o in range(rows):
            packed = data[b, o, h]
            for e in range(dim // 2):
                byte = np.int32(packed[e]) & 0xFF
                out[o, 2 * e] = ((byte & 0xF) - channel[1, 2 * e]) * channel[0, 2 * e]
                out[o, 2 * e + 1] = ((byte >> 4) - channel[1, 2 * e + 1]) * channel[0, 2 * e + 1]
        return
    for o in range(rows):
        s = _scale(scale, log_scale, b, o, h, 0, layout)
        packed = data[b, o, h]
        if fmt == INT8:
            for d in range(dim):
                out[o, d] = np.float32(packed[d]) * s
        elif fmt == FP8:
            for d in range(dim):
                out[o, d] = FP8_VALUES[np.int32(packed[d]) & 0xFF] * s
        else:
            z = np.float32(zero[b, o, 0] if layout == PER_TOKEN else zero[b, o, h])
            for e in range(dim // 2):
                byte = np.int32(packed[e]) & 0xFF
                out[o, 2 * e] = ((byte & 0xF) - z) * s
                out[o, 2 * e + 1] = ((byte >> 4) - z) * s


@njit(cache=True, nogil=True)
def _copy_block(data, b, h, rows, out):
    for o in range(rows):
        for d in range(out.shape[1]):
            out[o, d] = np.float32(data[b, o, h, d])


seal_numba_cache(list(globals().values()), sources_digest(*CPU_KERNEL_SOURCES))
