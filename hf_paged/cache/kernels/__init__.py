"""Paged-attention kernels: one public function per operation, dispatched to Triton or to the torch reference.

    store_kv                 new K/V rows -> their cache slots
    paged_decode_attention   one query token per sequence -> its pages (split-K, flash-decoding)
    paged_prefill_attention  a packed chunk of query tokens per sequence -> its pages, causally

Both attention kernels also read quantized caches (`QuantizedKV`: int8, fp8, int4 blocks with their scales),
dequantized where the K/V tiles are loaded, with the blocks not yet full in a `FullPrecisionTail` (see
`quantized.py`; the torch reference of that path is `reference_quantized.py`).

`backend="auto"` runs Triton when the tensors are on CUDA (and triton is installed) and the torch reference
(`reference.py`) otherwise; `"triton"` on CPU tensors runs the Triton interpreter, so it needs `TRITON_INTERPRET=1`.
Every argument is checked here, before any launch (shapes, dtypes, strides, devices; no value is read, so nothing
synchronises the GPU). Values are the caller's contract: slots and block ids inside the cache, `1 <= context_len <=
max_blocks_per_seq * block_size`, and for prefill `q_len <= context_len`.

Example:
    >>> import torch
    >>> from hf_paged.cache.kernels import store_kv, paged_decode_attention
    >>> k_cache = torch.zeros(4, 16, 2, 8); v_cache = torch.zeros(4, 16, 2, 8)
    >>> key = torch.randn(3, 2, 8); value = torch.randn(3, 2, 8)
    >>> store_kv(key, value, k_cache, v_cache, torch.tensor([32, 33, 34]), backend="torch")
    >>> out = paged_decode_attention(torch.randn(1, 4, 8), k_cache, v_cache, torch.tensor([[2]], dtype=torch.int32),
    ...                              torch.tensor([3], dtype=torch.int32), scale=8 ** -0.5, backend="torch")
    >>> out.shape
    torch.Size([1, 4, 8])
"""

from __future__ import annotations

import importlib.util

import torch

from hf_paged.cache.kernels import _checks as chk
from hf_paged.cache.kernels._arguments import check_attention, check_caches
from hf_paged.cache.kernels._checks import KernelArgumentError
from hf_paged.cache.kernels.quantized import FullPrecisionTail, QuantizedKV

__all__ = [
    "FullPrecisionTail",
    "KernelArgumentError",
    "QuantizedKV",
    "check_backend",
    "paged_decode_attention",
    "paged_prefill_attention",
    "store_kv",
    "store_kv_backend",
]

def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: str = "auto",
) -> None:
    """Write each token's K/V rows into its slot (`block_id * block_size + offset`); a slot < 0 is skipped.

    Args:
        key, value: `[num_tokens, num_kv_heads, head_dim]`, the cache's dtype.
        key_cache, value_cache: `[num_blocks, block_size, num_kv_heads, head_dim]`, written in place.
        slot_mapping: `[num_tokens]` int64.
        backend: "auto" (Triton on CUDA, torch elsewhere), "triton" or "torch".
    """
    chk.check_backend(backend)
    check_caches(key_cache, value_cache)
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    for name, t in (("key", key), ("value", value)):
        chk.check_ndim(name, t, 3, "[num_tokens, num_kv_heads, head_dim]")
        chk.check_dim(name, t, 1, num_kv_heads, "the caches' num_kv_heads")
        chk.check_dim(name, t, 2, head_dim, "the caches' head_dim")
        if t.dtype != key_cache.dtype:
            raise KernelArgumentError(
                f"{name} has dtype {t.dtype} but the cache holds {key_cache.dtype}; pass {name}.to({key_cache.dtype})"
            )
    chk.check_dim("value", value, 0, key.shape[0], "key's num_tokens")
    chk.check_ndim("slot_mapping", slot_mapping, 1, "[num_tokens]")
    chk.check_dtype("slot_mapping", slot_mapping, (torch.int64,))
    chk.check_dim("slot_mapping", slot_mapping, 0, key.shape[0], "key's num_tokens")
    tensors = {
        "key": key,
        "value": value,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "slot_mapping": slot_mapping,
    }
    device = chk.check_same_device(tensors)
    chk.check_last_dim_contiguous(tensors)
    if _use_triton(backend, device):
        from hf_paged.cache.kernels.triton_store import store_kv_triton

        store_kv_triton(key, value, key_cache, value_cache, slot_mapping)
    else:
        from hf_paged.cache.kernels.reference import ref_store_kv

        ref_store_kv(key, value, key_cache, value_cache, slot_mapping)


def store_kv_backend(backend: str, device: torch.device):
    """What `store_kv` runs for `backend` on `device`, without its argument checks: for a caller that checked its
    arguments once (through `store_kv`) and whose slots are all >= 0, e.g. the paged cache's per-step stores."""
    if _use_triton(backend, device):
        from hf_paged.cache.kernels.triton_store import store_kv_triton

        return store_kv_triton
    from hf_paged.cache.kernels.reference import ref_store_kv_nonnegative

    return ref_store_kv_nonnegative


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor | QuantizedKV,
    value_cache: torch.Tensor | QuantizedKV,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    tail: FullPrecisionTail | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Attention of one query token per sequence to its cached keys 0 .. context_len - 1.

    Args:
        query: `[num_seqs, num_heads, head_dim]`; the query sits at position context_len - 1.
        key_cache, value_cache: `[num_blocks, block_size, num_kv_heads, head_dim]`, query's dtype;
            `num_heads` must be a multiple of `num_kv_heads` (GQA). Either may be a `QuantizedKV` (int8, fp8,
            int4 blocks with their scales), dequantized where its tiles are loaded.
        block_tables: `[num_seqs, max_blocks_per_seq]` int32; context_lens: `[num_seqs]` int32.
        scale: softmax scale, usually `head_dim ** -0.5`.
        sliding_window: if set, the query at position p sees keys at positions > p - sliding_window.
        tail: the blocks not yet quantized in full precision (required with a `QuantizedKV`): the last block of a
            sequence whose context_len is not a multiple of block_size is read from it (see `quantized.py`).
        backend: "auto" (Triton on CUDA, torch elsewhere), "triton" or "torch".

    Returns:
        `[num_seqs, num_heads, head_dim]` in query's dtype (accumulated in fp32).
    """
    chk.check_ndim("query", query, 3, "[num_seqs, num_heads, head_dim]")
    num_seqs = query.shape[0]
    check_attention(
        query, key_cache, value_cache, block_tables, context_lens, num_seqs, scale, sliding_window, backend, extra={},
        tail=tail,
    )
    if _use_triton(backend, query.device):
        from hf_paged.cache.kernels.triton_decode import paged_decode_attention_triton

        return paged_decode_attention_triton(query, key_cache, value_cache, block_tables, context_lens, scale=scale,
                                             sliding_window=sliding_window, tail=tail)  # fmt: skip
    if tail is not None:
        from hf_paged.cache.kernels.reference_quantized import ref_paged_decode_attention_quantized

        return ref_paged_decode_attention_quantized(query, key_cache, value_cache, block_tables, context_lens,
                                                    scale=scale, sliding_window=sliding_window, tail=tail)  # fmt: skip
    from hf_paged.cache.kernels.reference import ref_paged_decode_attention

    return ref_paged_decode_attention(
        query, key_cache, value_cache, block_tables, context_lens, scale=scale, sliding_window=sliding_window
    )


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor | QuantizedKV,
    value_cache: torch.Tensor | QuantizedKV,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    tail: FullPrecisionTail | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Causal attention of a packed chunk of query tokens per sequence to its cached keys (K/V already stored).

    Args:
        query: `[total_q_tokens, num_heads, head_dim]`, sequences packed back to back.
        key_cache, value_cache: `[num_blocks, block_size, num_kv_heads, head_dim]`, query's dtype, or
            `QuantizedKV` (dequantized where loaded).
        block_tables: `[num_seqs, max_blocks_per_seq]` int32.
        query_start_loc: `[num_seqs + 1]` int32, cu_seqlens of the queries (0, q_len_0, q_len_0 + q_len_1, ...).
        context_lens: `[num_seqs]` int32, cached tokens of each sequence INCLUDING this chunk; query j of
            sequence i sits at position context_lens[i] - q_len_i + j and sees keys at positions <= its own.
        scale: softmax scale; sliding_window: if set, keys at positions > p - sliding_window only.
        tail: full-precision blocks (required with a `QuantizedKV`): query p reads block b from the tail when b is
            not full at p (p's own block, unless p is its last slot), from the quantized cache otherwise.
        backend: "auto" (Triton on CUDA, torch elsewhere), "triton" or "torch".

    Returns:
        `[total_q_tokens, num_heads, head_dim]` in query's dtype (accumulated in fp32).
    """
    chk.check_ndim("query", query, 3, "[total_q_tokens, num_heads, head_dim]")
    chk.check_ndim("context_lens", context_lens, 1, "[num_seqs]")
    num_seqs = context_lens.shape[0]
    chk.check_ndim("query_start_loc", query_start_loc, 1, "[num_seqs + 1]")
    chk.check_dtype("query_start_loc", query_start_loc, (torch.int32,))
    chk.check_dim("query_start_loc", query_start_loc, 0, num_seqs + 1, "num_seqs + 1 (context_lens has num_seqs)")
    check_attention(
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        num_seqs,
        scale,
        sliding_window,
        backend,
        extra={"query_start_loc": query_start_loc},
        tail=tail,
    )
    if _use_triton(backend, query.device):
        from hf_paged.cache.kernels.triton_prefill import paged_prefill_attention_triton

        return paged_prefill_attention_triton(
            query,
            key_cache,
            value_cache,
            block_tables,
            query_start_loc,
            context_lens,
            scale=scale,
            sliding_window=sliding_window,
            tail=tail,
        )
    if tail is not None:
        from hf_paged.cache.kernels.reference_quantized import ref_paged_prefill_attention_quantized

        return ref_paged_prefill_attention_quantized(query, key_cache, value_cache, block_tables, query_start_loc,
                                                     context_lens, scale=scale, sliding_window=sliding_window,
                                                     tail=tail)  # fmt: skip
    from hf_paged.cache.kernels.reference import ref_paged_prefill_attention

    return ref_paged_prefill_attention(
        query,
        key_cache,
        value_cache,
        block_tables,
        query_start_loc,
        context_lens,
        scale=scale,
        sliding_window=sliding_window,
    )


def check_backend(backend: str, device: torch.device, *, setting: str = "backend") -> None:
    """Raise `KernelArgumentError` now when `backend` cannot run on `device` (an engine checks this once, instead
    of failing every request at its first step); `setting`: what the message calls it (the engine's
    "PagedConfig.attention_backend")."""
    _use_triton(backend, device, setting)


def _use_triton(backend: str, device: torch.device, setting: str = "backend") -> bool:
    if backend == "torch" or (backend == "auto" and device.type != "cuda"):
        return False
    if backend == "auto" and importlib.util.find_spec("triton") is None:
        return False  # a CUDA build of torch without triton: the reference still works
    if device.type != "cuda":
        from hf_paged.cache.kernels.triton_common import interpreter_enabled

        if not interpreter_enabled():
            fix = (f"or set {setting}='auto' (the numba kernels on the CPU) or 'torch'" if setting != "backend"
                   else "or pass backend='torch'")
            raise KernelArgumentError(
                f"{setting}='triton' got tensors on {device}: move them to CUDA, set TRITON_INTERPRET=1 (before "
                f"importing triton) to run the CPU interpreter, {fix}"
            )
    return True
