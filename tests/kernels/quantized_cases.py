"""Quantized paged-attention cases: a `PagedCase` with its full blocks quantized and its open blocks in a tail.

Everything no sequence reads is poisoned: unused data bytes are 0xFF (int8 -1, int4 nibbles 15, fp8 NaN), unused
scales are NaN (zero points 127), unused tail slots are NaN, and the tail's own table columns that no query reads
point past the tail buffer. A kernel that reads one of them returns a non-finite or wrong answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hf_paged.cache.compression import BlockFormat
from hf_paged.cache.kernels import FullPrecisionTail, QuantizedKV
from tests.kernels.paged_cases import PagedCase


@dataclass(slots=True)
class QuantizedCase:
    case: PagedCase  # query, tables, lengths, and the full-precision K/V it was built from
    key: torch.Tensor | QuantizedKV
    value: torch.Tensor | QuantizedKV
    tail: FullPrecisionTail
    dequantized_key: torch.Tensor  # [num_blocks, bs, H, D]: what the cache holds, dequantized (query dtype)
    dequantized_value: torch.Tensor


def quantize_blocks(cache: torch.Tensor, full: torch.Tensor,
                    fmt: BlockFormat) -> tuple[torch.Tensor | QuantizedKV, torch.Tensor]:
    """Quantize the blocks `full` (bool [num_blocks]) of `cache` in `fmt`; others poisoned (data 0xFF, scales NaN
    or log8 code 255 = 2^9.5, zero points 127). Returns (cache, dequantized: NaN outside `full`)."""
    if not fmt.is_quantized:
        poisoned = cache.clone()
        poisoned[~full] = float("nan")
        return poisoned, poisoned
    num_blocks, bs, heads, dim = cache.shape
    parts = fmt.allocate(num_blocks, bs, heads, dim, cache.dtype, cache.device)
    parts["data"].view(torch.uint8).fill_(0xFF)
    parts["scale"].fill_(255 if parts["scale"].dtype == torch.uint8 else float("nan"))
    if "zero" in parts:
        parts["zero"].fill_(127)
    ids = full.nonzero().squeeze(1)
    for name, t in fmt.quantize(cache[ids]).items():
        parts[name][ids] = t.to(parts[name].dtype)
    q = QuantizedKV(parts["data"], parts["scale"], fmt.name, parts.get("zero"), fmt.per_channel, fmt.per_head)
    deq = torch.full_like(cache, float("nan"))
    deq[ids] = fmt.dequantize({n: t[ids] for n, t in parts.items()}, cache.dtype)
    return q, deq


def quantize_case(case: PagedCase, key_format: str, value_format: str, *, seed: int = 0) -> QuantizedCase:
    """Quantize the blocks full at the end of each sequence; the blocks of its queries go to a shuffled tail."""
    bs = case.key_cache.shape[1]
    lens, qsl = case.context_lens.tolist(), case.query_start_loc.tolist()
    full = torch.zeros(case.key_cache.shape[0], dtype=torch.bool, device=case.key_cache.device)
    tail_blocks = []  # (seq, logical block)
    for i, ctx in enumerate(lens):
        full[case.block_tables[i, : ctx // bs].long()] = True
        q_len = qsl[i + 1] - qsl[i]
        tail_blocks += [(i, b) for b in range((ctx - q_len) // bs, math.ceil(ctx / bs))]
    key, deq_k = quantize_blocks(case.key_cache, full, BlockFormat(key_format, per_channel=key_format == "int4"))
    value, deq_v = quantize_blocks(case.value_cache, full, BlockFormat(value_format))
    n_tail = len(tail_blocks) + 1  # one spare block, left NaN
    order = torch.randperm(n_tail, generator=torch.Generator().manual_seed(seed)).tolist()
    shape = (n_tail, *case.key_cache.shape[1:])
    tail_k = torch.full(shape, float("nan"), dtype=case.query.dtype, device=case.query.device)
    tail_v = torch.full_like(tail_k, float("nan"))
    tables = torch.full_like(case.block_tables, n_tail + 1000)  # entries no query reads point outside
    for (i, b), t in zip(tail_blocks, order):
        tables[i, b] = t
        pos = torch.arange(b * bs, min((b + 1) * bs, lens[i]))
        tail_k[t, pos - b * bs] = case.dense_keys[i][pos]
        tail_v[t, pos - b * bs] = case.dense_values[i][pos]
    return QuantizedCase(case, key, value, FullPrecisionTail(tail_k, tail_v, tables), deq_k, deq_v)


def dense_quantized_attention(qc: QuantizedCase, sliding_window: int | None = None) -> torch.Tensor:
    """The oracle: for every query p on its own, dense K/V where the keys of blocks full at p are dequantized and
    the others exact, then fp32 SDPA."""
    case, bs = qc.case, qc.case.key_cache.shape[1]
    outs = []
    qsl = case.query_start_loc.tolist()
    for i, ctx in enumerate(case.context_lens.tolist()):
        q_len = qsl[i + 1] - qsl[i]
        positions = torch.arange(ctx, device=case.query.device)
        slots = case.block_tables[i, positions // bs].long(), positions % bs
        deq_k, deq_v = qc.dequantized_key[slots], qc.dequantized_value[slots]
        for j in range(q_len):
            p = ctx - q_len + j
            quantized = (positions // bs < p // bs) | ((p + 1) % bs == 0)
            k = torch.where(quantized[:, None, None], deq_k, case.dense_keys[i])[: p + 1].float()
            v = torch.where(quantized[:, None, None], deq_v, case.dense_values[i])[: p + 1].float()
            if sliding_window is not None:
                k, v = k[max(0, p + 1 - sliding_window) :], v[max(0, p + 1 - sliding_window) :]
            q = case.query[qsl[i] + j].float()[:, None, :]  # [H, 1, D]
            o = F.scaled_dot_product_attention(q[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                               scale=case.scale, enable_gqa=True)  # fmt: skip
            outs.append(o[0, :, 0])
    return torch.stack(outs).to(case.query.dtype)


def requantize(qc: QuantizedCase, key: BlockFormat | None = None, value: BlockFormat | None = None) -> QuantizedCase:
    """`qc` with its keys and/or values quantized again in other formats (same full blocks, same tail)."""
    full = torch.isfinite(qc.dequantized_key.flatten(1)).all(1)
    k, deq_k = (qc.key, qc.dequantized_key) if key is None else quantize_blocks(qc.case.key_cache, full, key)
    v, deq_v = (qc.value, qc.dequantized_value) if value is None else quantize_blocks(qc.case.value_cache, full, value)
    return QuantizedCase(qc.case, k, v, qc.tail, deq_k, deq_v)


def assert_kernels_match_oracle(qc: QuantizedCase) -> None:
    """Triton (the interpreter on CPU) and the torch reference, decode (one query per sequence) or prefill, against
    `dense_quantized_attention`."""
    from hf_paged.cache.kernels import paged_decode_attention, paged_prefill_attention
    from tests.kernels.paged_cases import tolerance

    case = qc.case
    expected = dense_quantized_attention(qc)
    decode = bool((case.query_start_loc.diff() == 1).all())
    for backend in ("triton", "torch"):
        if decode:
            out = paged_decode_attention(case.query, qc.key, qc.value, case.block_tables, case.context_lens,
                                         scale=case.scale, tail=qc.tail, backend=backend)
        else:
            out = paged_prefill_attention(case.query, qc.key, qc.value, case.block_tables, case.query_start_loc,
                                          case.context_lens, scale=case.scale, tail=qc.tail, backend=backend)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, expected, **tolerance(torch.float32))
