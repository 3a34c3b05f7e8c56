"""Argument checks of the attention and store entry points, run before any launch (no value is read, so nothing
synchronises the GPU)."""

from __future__ import annotations

import torch

from hf_paged.cache.kernels import _checks as chk
from hf_paged.cache.kernels._checks import KernelArgumentError
from hf_paged.cache.kernels.quantized import FullPrecisionTail, check_kv_operands

CACHE_LAYOUT = "[num_blocks, block_size, num_kv_heads, head_dim]"


def check_caches(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    chk.check_ndim("key_cache", key_cache, 4, CACHE_LAYOUT)
    chk.check_ndim("value_cache", value_cache, 4, CACHE_LAYOUT)
    if key_cache.shape != value_cache.shape:
        raise KernelArgumentError(
            f"key_cache {tuple(key_cache.shape)} and value_cache {tuple(value_cache.shape)} must have one shape "
            f"{CACHE_LAYOUT}"
        )
    chk.check_dtype("key_cache", key_cache, chk.FLOAT_DTYPES)
    if value_cache.dtype != key_cache.dtype:
        raise KernelArgumentError(
            f"key_cache is {key_cache.dtype} but value_cache is {value_cache.dtype}; store both in one dtype"
        )


def check_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    num_seqs: int,
    scale: float,
    sliding_window: int | None,
    backend: str,
    extra: dict[str, torch.Tensor],
    tail: FullPrecisionTail | None = None,
) -> None:
    chk.check_backend(backend)
    if tail is None and isinstance(key_cache, torch.Tensor) and isinstance(value_cache, torch.Tensor):
        check_caches(key_cache, value_cache)
        _, _, num_kv_heads, head_dim = key_cache.shape
        cache_tensors = {"key_cache": key_cache, "value_cache": value_cache}
    else:
        chk.check_dtype("query", query, chk.FLOAT_DTYPES)
        _, num_kv_heads, head_dim, more = check_kv_operands(key_cache, value_cache, tail, query, num_seqs)
        cache_tensors = {f"cache part {i}": t for i, t in enumerate(more)}
        if tail is not None and tail.block_tables.shape[1] != block_tables.shape[1]:
            raise KernelArgumentError(
                f"tail.block_tables has {tail.block_tables.shape[1]} columns but block_tables has "
                f"{block_tables.shape[1]}; give both one width (max_blocks_per_seq)"
            )
    num_heads = query.shape[1]
    chk.check_dim("query", query, 2, head_dim, "the caches' head_dim")
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise KernelArgumentError(
            f"query has {num_heads} heads, not a multiple of the caches' {num_kv_heads} KV heads; "
            "check the cache was built with the model's num_key_value_heads"
        )
    if isinstance(key_cache, torch.Tensor) and query.dtype != key_cache.dtype:
        raise KernelArgumentError(
            f"query is {query.dtype} but the caches hold {key_cache.dtype}; pass query.to({key_cache.dtype})"
        )
    chk.check_ndim("block_tables", block_tables, 2, "[num_seqs, max_blocks_per_seq]")
    chk.check_dtype("block_tables", block_tables, (torch.int32,))
    chk.check_dim("block_tables", block_tables, 0, num_seqs, "num_seqs")
    chk.check_ndim("context_lens", context_lens, 1, "[num_seqs]")
    chk.check_dtype("context_lens", context_lens, (torch.int32,))
    chk.check_dim("context_lens", context_lens, 0, num_seqs, "num_seqs")
    chk.check_scale(scale)
    chk.check_sliding_window(sliding_window)
    tensors = {
        "query": query,
        **cache_tensors,
        "block_tables": block_tables,
        "context_lens": context_lens,
        **extra,
    }
    chk.check_same_device(tensors)
    chk.check_last_dim_contiguous(tensors)  # for the 1-D tensors this is full contiguity
