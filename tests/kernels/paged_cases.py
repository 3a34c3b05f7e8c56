"""Builders of small paged-attention cases for the kernel tests, and the dense SDPA oracle.

A case scatters each sequence's dense K/V into randomly permuted blocks of a cache whose other slots hold NaN
(or large garbage), so a kernel that reads one slot it should not read produces a wrong or non-finite answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(slots=True)
class PagedCase:
    """One batch of sequences laid out in a paged cache, with the dense K/V each sequence owns."""

    query: torch.Tensor  # [total_q_tokens, num_heads, head_dim] (decode: one row per sequence)
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, unused entries = pad_block
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    context_lens: torch.Tensor  # [num_seqs] int32
    dense_keys: list[torch.Tensor]  # per sequence [context_len, num_kv_heads, head_dim]
    dense_values: list[torch.Tensor]
    scale: float


def make_case(
    context_lens: list[int],
    q_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
    fill: float = float("nan"),
    pad_block: int = -1,
    spare_blocks: int = 3,
    device: torch.device = DEVICE,
) -> PagedCase:
    """Random case: sequence i has context_lens[i] cached keys, the last q_lens[i] of which are its queries; on
    `device` (CUDA where there is one: the Triton kernels' tests; the CPU kernels' tests ask for the CPU)."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(c / block_size) for c in context_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).tolist()  # scattered, never contiguous by accident
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, fill, dtype=torch.float32)
    value_cache = torch.full(shape, fill, dtype=torch.float32)
    max_blocks = max(blocks_per_seq) + 1  # one spare column: the table is wider than any sequence needs
    tables = torch.full((len(context_lens), max_blocks), pad_block, dtype=torch.int32)
    dense_k, dense_v = [], []
    for i, ctx in enumerate(context_lens):
        ids = [order.pop() for _ in range(blocks_per_seq[i])]
        tables[i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        k = torch.randn(ctx, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(ctx, num_kv_heads, head_dim, generator=gen)
        pos = torch.arange(ctx)
        blocks = torch.tensor(ids, dtype=torch.long)[pos // block_size]
        key_cache[blocks, pos % block_size] = k
        value_cache[blocks, pos % block_size] = v
        dense_k.append(k.to(dtype))
        dense_v.append(v.to(dtype))
    query = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return PagedCase(
        query=query.to(dtype).to(device),
        key_cache=key_cache.to(dtype).to(device),
        value_cache=value_cache.to(dtype).to(device),
        block_tables=tables.to(device),
        query_start_loc=qsl.to(device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        dense_keys=[k.to(device) for k in dense_k],
        dense_values=[v.to(device) for v in dense_v],
        scale=head_dim**-0.5,
    )


def dense_attention(case: PagedCase, sliding_window: int | None = None) -> torch.Tensor:
    """SDPA in fp32 on each sequence's dense K/V with an explicit causal (+ window) mask: the oracle."""
    outs = []
    qsl = case.query_start_loc.tolist()
    for i, (k, v) in enumerate(zip(case.dense_keys, case.dense_values)):
        q = case.query[qsl[i] : qsl[i + 1]].float()
        ctx, q_len = k.shape[0], q.shape[0]
        q_pos = torch.arange(ctx - q_len, ctx, device=q.device)[:, None]
        k_pos = torch.arange(ctx, device=q.device)[None, :]
        mask = k_pos <= q_pos
        if sliding_window is not None:
            mask &= k_pos > q_pos - sliding_window
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k.float().transpose(0, 1)[None],
            v.float().transpose(0, 1)[None],
            attn_mask=mask,
            scale=case.scale,
            enable_gqa=True,
        )
        outs.append(out[0].transpose(0, 1))
    return torch.cat(outs).to(case.query.dtype)


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """fp32: summation order only; 16-bit: the probabilities are rounded to 16 bits before P @ V."""
    return {
        torch.float32: {"atol": 2e-5, "rtol": 2e-5},
        torch.float16: {"atol": 4e-3, "rtol": 4e-3},
        torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
    }[dtype]


def zero_filled(case: PagedCase) -> PagedCase:
    """The same case with unused slots set to 0 and table padding to block 0 (what the torch reference needs)."""
    owned = torch.zeros(case.key_cache.shape[:2], dtype=torch.bool, device=case.key_cache.device)
    tables = case.block_tables.clone()
    for i, ctx in enumerate(case.context_lens.tolist()):
        pos = torch.arange(ctx, device=owned.device)
        owned[case.block_tables[i, pos // owned.shape[1]].long(), pos % owned.shape[1]] = True
        tables[i, -(-ctx // owned.shape[1]) :] = 0
    keep = owned[:, :, None, None]
    return PagedCase(
        query=case.query,
        key_cache=torch.where(keep, case.key_cache, 0),
        value_cache=torch.where(keep, case.value_cache, 0),
        block_tables=tables,
        query_start_loc=case.query_start_loc,
        context_lens=case.context_lens,
        dense_keys=case.dense_keys,
        dense_values=case.dense_values,
        scale=case.scale,
    )
