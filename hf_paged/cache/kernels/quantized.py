"""Quantized caches for the paged-attention kernels: what a quantized K or V is, and its full-precision tail.

A compressed cache (`hf_paged.cache.compression.BlockFormat`) stores each of K and V as parts with the block id
as leading dim; the kernels take them as one `QuantizedKV` each and dequantize where a K/V tile is loaded:

    format  data [num_blocks, bs, H, ...]        scale / zero                               value
    int8    int8 [.., D]                         scale fp16 [num_blocks, bs] (per token)    q * scale
    fp8     float8_e4m3fn [.., D]                scale fp16 [num_blocks, bs] (per token)    q * scale
    int4    uint8 [.., D/2], even dims low       scale fp16, zero int8 [num_blocks, bs]     (q - zero) * scale
            nibble                               or [num_blocks, H, D] (per_channel, keys)
    any     (per_head)                           per-token scale / zero [num_blocks, bs, H]  (one per KV head)
    any     (log8 scales)                        scale uint8 codes c, any of the shapes       scale = 2^((c - 160) / 10)

A block is quantized once it is full; the blocks still being written live in full precision elsewhere (staging
rows, the step's touched blocks). `FullPrecisionTail` points at them: a query at position p reads the keys of
block b from the quantized cache when b is full at p (its last slot <= p), else from the tail, the rule
`hf_paged.cache.compression.blocks` defines (one-token decoding sees exactly this, so chunking changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hf_paged.cache.kernels import _checks as chk
from hf_paged.cache.kernels._checks import KernelArgumentError

__all__ = [
    "FORMAT_CODES", "FullPrecisionTail", "KVOperand", "QuantizedKV", "check_kv_operands", "kv_operand", "tail_args",
]

# Format codes the kernels branch on (constexpr): 0 is a plain full-precision cache; "fp8_bytes" is fp8 e4m3 decoded
# from its bytes with integer ops, for GPUs without fp8 conversions (before sm_89: A100) and fp8 data given as uint8.
# A cache whose scales are log8 codes (uint8, `compression.encode_log_scale`) adds LOG_SCALE_CODE to its format's code.
FORMAT_CODES = {"plain": 0, "int8": 1, "fp8": 2, "int4": 3, "fp8_bytes": 4}
LOG_SCALE_CODE = 8
_DATA_DTYPES = {"int8": (torch.int8,), "fp8": (torch.float8_e4m3fn, torch.uint8), "int4": (torch.uint8,)}


@dataclass(slots=True)
class QuantizedKV:
    """One of K or V of a layer, stored quantized (the parts of `BlockFormat(format, per_channel)`)."""

    data: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim] (int4: head_dim // 2 bytes; fp8: float8_e4m3fn
    # or its bytes as uint8)
    scale: torch.Tensor  # fp16 (or uint8 log8 codes), [num_blocks, block_size] per token, [num_blocks, num_kv_heads,
    # head_dim] per channel
    format: str  # "int8" | "fp8" | "int4"
    zero: torch.Tensor | None = None  # int8, scale's shape and strides (int4 only)
    per_channel: bool = False  # int4 keys (KIVI): scale and zero per (head, dim) over a block's tokens
    per_head: bool = False  # per-token scale and zero split by KV head: [num_blocks, block_size, num_kv_heads]

    def head_dim(self) -> int:
        return self.data.shape[3] * (2 if self.format == "int4" else 1)


@dataclass(slots=True)
class FullPrecisionTail:
    """The blocks not yet quantized, in the query's dtype, and where each sequence's are.

    `block_tables[i, b]` is the tail block holding logical block b of sequence i; it is read only for the blocks
    that are not full at the query (for decode: the last block when context_len is not a multiple of block_size;
    for a prefill chunk: the chunk's own blocks). Other entries are never read (any value)."""

    key: torch.Tensor  # [num_tail_blocks, block_size, num_kv_heads, head_dim]
    value: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32


@dataclass(slots=True)
class KVOperand:
    """One of K or V as the kernels take it: pointers, strides and the format code."""

    data: torch.Tensor
    scale: torch.Tensor  # the data tensor itself for a plain cache (never read)
    zero: torch.Tensor  # the scale (int8/fp8) or the data tensor (plain): never read
    fmt: int  # FORMAT_CODES value (+ LOG_SCALE_CODE when the scales are log8 codes)
    per_channel: bool
    stride_block: int
    stride_slot: int
    stride_head: int
    stride_scale_block: int
    stride_scale_slot: int  # 0 per channel
    stride_scale_head: int  # 0 per token (all heads share it)

    def args(self) -> tuple:
        """Kernel arguments in the kernels' order: pointers, then strides."""
        return (self.data, self.scale, self.zero, self.stride_block, self.stride_slot, self.stride_head,
                self.stride_scale_block, self.stride_scale_slot, self.stride_scale_head)  # fmt: skip


def kv_operand(cache: torch.Tensor | QuantizedKV) -> KVOperand:
    """The kernel operand of a plain cache tensor or a `QuantizedKV` (checked by `check_kv_operands`)."""
    if isinstance(cache, torch.Tensor):
        s = cache.stride()
        return KVOperand(cache, cache, cache, 0, False, s[0], s[1], s[2], 0, 0, 0)
    s = cache.data.stride()
    sc = cache.scale.stride()
    zero = cache.zero if cache.zero is not None else cache.scale
    if cache.per_channel:
        scale_strides = (sc[0], 0, sc[1])
    elif cache.per_head:  # the kernels offset scale/zero by kv_head * stride_scale_head, as per channel
        scale_strides = (sc[0], sc[1], sc[2])
    else:
        scale_strides = (sc[0], sc[1], 0)
    data, fmt = cache.data, FORMAT_CODES[cache.format]
    if cache.format == "fp8" and (data.dtype == torch.uint8 or not _has_fp8_conversion(data.device)):
        data, fmt = data.view(torch.uint8), FORMAT_CODES["fp8_bytes"]
    if cache.scale.dtype == torch.uint8:
        fmt += LOG_SCALE_CODE
    return KVOperand(data, cache.scale, zero, fmt, cache.per_channel, s[0], s[1], s[2], *scale_strides)


def _has_fp8_conversion(device: torch.device) -> bool:
    """Triton converts float8e4nv natively on sm_89+ (and in the interpreter), not on sm_80/sm_86."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 9)


def _check_quantized(name: str, q: QuantizedKV) -> None:
    if q.format not in _DATA_DTYPES:
        raise KernelArgumentError(f"{name}.format must be one of {list(_DATA_DTYPES)}, got {q.format!r}")
    layout = "[num_blocks, block_size, num_kv_heads, head_dim" + (" // 2]" if q.format == "int4" else "]")
    chk.check_ndim(f"{name}.data", q.data, 4, layout)
    chk.check_dtype(f"{name}.data", q.data, _DATA_DTYPES[q.format])
    chk.check_dtype(f"{name}.scale", q.scale, (torch.float16, torch.uint8))  # uint8: log8 codes
    num_blocks, block_size, num_heads, _ = q.data.shape
    if q.per_channel:
        if q.format != "int4":
            raise KernelArgumentError(f"{name}: per_channel scales exist for int4 only (KIVI keys); got {q.format}")
        if q.per_head:
            raise KernelArgumentError(f"{name}: per_channel and per_head exclude each other; set one of them")
        expected = (num_blocks, num_heads, q.head_dim())
        layout = "[num_blocks, num_kv_heads, head_dim]"
    elif q.per_head:
        expected, layout = (num_blocks, block_size, num_heads), "[num_blocks, block_size, num_kv_heads]"
    else:
        expected, layout = (num_blocks, block_size), "[num_blocks, block_size]"
    if tuple(q.scale.shape) != expected:
        raise KernelArgumentError(
            f"{name}.scale has shape {tuple(q.scale.shape)}, expected {expected} {layout} for data "
            f"{tuple(q.data.shape)}; pass the parts of one BlockFormat"
        )
    if q.format == "int4":
        if q.zero is None:
            raise KernelArgumentError(f"{name}: int4 needs zero points (int8, scale's shape); pass zero=")
        chk.check_dtype(f"{name}.zero", q.zero, (torch.int8,))
        if q.zero.shape != q.scale.shape or q.zero.stride() != q.scale.stride():
            raise KernelArgumentError(
                f"{name}.zero has shape {tuple(q.zero.shape)} / strides {q.zero.stride()} but scale has "
                f"{tuple(q.scale.shape)} / {q.scale.stride()}; pass both .contiguous()"
            )
    tensors = {f"{name}.data": q.data, f"{name}.scale": q.scale}
    if q.zero is not None:
        tensors[f"{name}.zero"] = q.zero
    chk.check_last_dim_contiguous(tensors)


def check_kv_operands(
    key_cache: torch.Tensor | QuantizedKV,
    value_cache: torch.Tensor | QuantizedKV,
    tail: FullPrecisionTail | None,
    query: torch.Tensor,
    num_seqs: int,
) -> tuple[int, int, int, list[torch.Tensor]]:
    """Check a (possibly quantized) K/V pair and its tail against the query; returns
    (block_size, num_kv_heads, head_dim, every tensor involved) for the device/stride checks."""
    tensors: list[torch.Tensor] = []
    geometry = []
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if isinstance(cache, QuantizedKV):
            _check_quantized(name, cache)
            tensors += [t for t in (cache.data, cache.scale, cache.zero) if t is not None]
            geometry.append((*cache.data.shape[:3], cache.head_dim()))
        else:
            chk.check_ndim(name, cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
            chk.check_dtype(name, cache, chk.FLOAT_DTYPES)
            if cache.dtype != query.dtype:
                raise KernelArgumentError(f"{name} is {cache.dtype} but query is {query.dtype}; store both in one dtype")
            tensors.append(cache)
            geometry.append(tuple(cache.shape))
    if geometry[0] != geometry[1]:
        raise KernelArgumentError(
            f"key_cache and value_cache describe different caches: [num_blocks, block_size, num_kv_heads, head_dim] "
            f"= {geometry[0]} vs {geometry[1]}; pass the K and V of one layer"
        )
    _, block_size, num_kv_heads, head_dim = geometry[0]
    quantized = isinstance(key_cache, QuantizedKV) or isinstance(value_cache, QuantizedKV)
    if tail is None:
        if quantized:
            raise KernelArgumentError(
                "a quantized cache needs tail=FullPrecisionTail(...): the blocks not yet full are not quantized; "
                "pass the full-precision blocks and their tables"
            )
        return block_size, num_kv_heads, head_dim, tensors
    for name, t in (("tail.key", tail.key), ("tail.value", tail.value)):
        chk.check_ndim(name, t, 4, "[num_tail_blocks, block_size, num_kv_heads, head_dim]")
        if tuple(t.shape[1:]) != (block_size, num_kv_heads, head_dim) or t.dtype != query.dtype:
            raise KernelArgumentError(
                f"{name} is {t.dtype} {tuple(t.shape)}; expected {query.dtype} [n, {block_size}, {num_kv_heads}, "
                f"{head_dim}] (query's dtype, the cache's block geometry)"
            )
    chk.check_ndim("tail.block_tables", tail.block_tables, 2, "[num_seqs, max_blocks_per_seq]")
    chk.check_dtype("tail.block_tables", tail.block_tables, (torch.int32,))
    chk.check_dim("tail.block_tables", tail.block_tables, 0, num_seqs, "num_seqs")
    return block_size, num_kv_heads, head_dim, [*tensors, tail.key, tail.value, tail.block_tables]


def tail_args(tail: FullPrecisionTail | None, placeholder: torch.Tensor) -> tuple:
    """Kernel arguments of the tail (tail_k, tail_v, tables, 7 strides); placeholders when there is none."""
    if tail is None:
        return (placeholder, placeholder, placeholder, 0, 0, 0, 0, 0, 0, 0)
    k, v = tail.key.stride(), tail.value.stride()
    return (tail.key, tail.value, tail.block_tables, k[0], k[1], k[2], v[0], v[1], v[2], tail.block_tables.stride(0))
