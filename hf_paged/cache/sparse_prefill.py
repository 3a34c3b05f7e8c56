"""Block-sparse prefill for long prompts: which key blocks each query block reads (`PagedConfig.sparse_prefill`).

A prefill chunk of a long prompt (context >= `sparse_prefill_min_tokens`, at least one 64-token query block) is
attended block-sparsely (`kernels/block_sparse.py`): each query block of each head keeps the first key block (the
attention sink), the blocks its own queries overlap plus the one before (the local window), and the best-scored
others, up to `ceil(sparse_keep_ratio x visible blocks)`. The scores are a cheap estimate, after MInference's two
dynamic patterns:

    "block"           mean-pooled queries of each query block . mean-pooled keys of each key block
                      (MInference's block-sparse pattern: a query block attends where its average query does)
    "vertical_slash"  the exact attention of the chunk's last 64 queries (the sample), summed per key ("vertical":
                      keys every query reads) and per distance query - key ("slash": fixed offsets); a block scores
                      its keys' vertical mass plus the slash mass at its distance from the query block
    "auto"            per head, whichever of the two keeps more of the exact attention of a held-out sample (the
                      chunk's middle query block): MInference picks each head's pattern offline; we pick it per
                      chunk from the chunk's own queries

With `sparse_keep_ratio=1` every visible block is kept: the result is dense attention (fp32 rounding apart).
Decodes, short chunks, sliding windows, soft caps, token pruning's observed steps and PyramidKV's hidden blocks are
attended densely (the backend decides: `attention_backends`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hf_paged.cache.kernels.block_sparse import (
    SPARSE_BLOCK,
    TILE_QUERY_BLOCKS,
    BlockSelection,
    block_sparse_attention,
    visible_blocks,
)
from hf_paged.cache.kernels.reference import PrefillGroup

SPARSE_PATTERNS = ("vertical_slash", "block", "auto")
NUM_SAMPLE_QUERIES = 64  # the last queries of a chunk whose exact attention drives "vertical_slash"
NUM_LOCAL_BLOCKS = 1  # key blocks before a query block's own that are always kept (with the ones it overlaps)

__all__ = ["SPARSE_PATTERNS", "SparsePrefill", "attend_sparse_groups", "select_blocks"]


@dataclass(slots=True, frozen=True)
class SparsePrefill:
    """The sparse prefill settings of an engine (from `PagedConfig`), handed to each step's attention backend."""

    pattern: str  # one of SPARSE_PATTERNS
    min_tokens: int  # context length from which a prefill chunk is attended sparsely
    keep_ratio: float  # share of each query block's visible key blocks kept (0 < r <= 1)

    @classmethod
    def from_config(cls, config) -> SparsePrefill | None:
        """None when `config.sparse_prefill` is None (dense prefill)."""
        if config.sparse_prefill is None:
            return None
        return cls(config.sparse_prefill, config.sparse_prefill_min_tokens, config.sparse_keep_ratio)

    def applies(self, q_len: int, context_len: int) -> bool:
        return q_len >= SPARSE_BLOCK and context_len >= self.min_tokens

    def select(self, q: torch.Tensor, keys: torch.Tensor, *, scale: float) -> BlockSelection:
        return select_blocks(q, keys, self.pattern, self.keep_ratio, scale=scale)


def select_blocks(q: torch.Tensor, keys: torch.Tensor, pattern: str, keep_ratio: float, *,
                  scale: float) -> BlockSelection:
    """The key blocks each query block keeps: q `[q_len, heads, dim]` (the last q_len positions), keys
    `[context_len, kv_heads, dim]`."""
    if pattern not in SPARSE_PATTERNS:
        raise ValueError(f"sparse prefill pattern must be one of {list(SPARSE_PATTERNS)}, got {pattern!r}")
    _check_keep_ratio(keep_ratio)
    q_len, num_heads, _ = q.shape
    context_len = keys.shape[0]
    nqb, nkb = -(-q_len // SPARSE_BLOCK), -(-context_len // SPARSE_BLOCK)
    group = num_heads // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, c, D]
    visible = visible_blocks(context_len, q_len, nqb, q.device)  # [nqb]
    if pattern == "block":
        scores = _per_kv_head(_block_scores(q, k, nqb, nkb, scale), group)
    elif pattern == "vertical_slash":
        scores = _per_kv_head(_vertical_slash_scores(q, k, nqb, nkb, scale), group)
    else:
        scores = _per_head_choice(q, k, nqb, nkb, visible, keep_ratio, scale, group)
    return _top_blocks(scores, visible, context_len - q_len, keep_ratio)


def _per_kv_head(scores: torch.Tensor, group: int) -> torch.Tensor:
    """[H, ...] -> [H / group, ...]: the query heads of a KV head read the same K/V blocks; their scores add up."""
    return scores.view(-1, group, *scores.shape[1:]).sum(1)


def _block_scores(q: torch.Tensor, k: torch.Tensor, nqb: int, nkb: int, scale: float) -> torch.Tensor:
    """[H, nqb, nkb]: pooled query block . pooled key block."""
    q_pool = _pool(q.float().transpose(0, 1), nqb)  # [H, nqb, D]
    k_pool = _pool(k, nkb)  # [H, nkb, D]
    return torch.matmul(q_pool, k_pool.transpose(1, 2)) * scale


def _pool(x: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """[H, n, D] -> [H, num_blocks, D]: the mean of each 64-row block (the last one over its real rows)."""
    heads, n, dim = x.shape
    pad = num_blocks * SPARSE_BLOCK - n
    sums = torch.cat([x, x.new_zeros(heads, pad, dim)], dim=1).view(heads, num_blocks, SPARSE_BLOCK, dim).sum(2)
    counts = torch.full((num_blocks, 1), float(SPARSE_BLOCK), device=x.device)
    counts[-1] = SPARSE_BLOCK - pad
    return sums / counts


def _sample_attention(q: torch.Tensor, k: torch.Tensor, rows: slice, scale: float) -> tuple[torch.Tensor, int]:
    """Exact attention `[H, s, c']` of the chunk's queries `rows` over the keys they may see, and the position of
    the first of them (c' = that position + s: the last sample query's visible keys)."""
    q_len, context_len = q.shape[0], k.shape[1]
    first = context_len - q_len + rows.start
    sample = q[rows].float().transpose(0, 1)  # [H, s, D]
    s = sample.shape[1]
    seen = first + s
    logits = torch.matmul(sample * scale, k[:, :seen].transpose(1, 2))  # [H, s, seen]
    future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)  # only the sample's own keys can be ahead
    logits[:, :, first:].masked_fill_(future, float("-inf"))
    return torch.softmax(logits, dim=-1), first


def _vertical_slash_scores(q: torch.Tensor, k: torch.Tensor, nqb: int, nkb: int, scale: float) -> torch.Tensor:
    """[H, nqb, nkb]: the sample's attention mass on each key block (vertical) plus its mass at the block's distance
    from the query block (slash, in whole blocks: sample query in key block b, key block j -> distance b - j)."""
    heads, context_len = k.shape[0], k.shape[1]
    s = min(NUM_SAMPLE_QUERIES, q.shape[0])
    probs, first = _sample_attention(q, k, slice(q.shape[0] - s, q.shape[0]), scale)  # [H, s, c]
    per_block = _block_sums(probs.view(heads * s, context_len), nkb).view(heads, s, nkb)
    vertical = per_block.sum(1)  # [H, nkb]
    own = (first + torch.arange(s, device=q.device)) // SPARSE_BLOCK  # each sample query's key block
    distance = (own[:, None] - torch.arange(nkb, device=q.device)).clamp(min=0)  # [s, nkb] (later blocks hold 0)
    slash = torch.zeros(heads, nkb, device=q.device)
    slash.scatter_add_(1, distance.flatten().expand(heads, -1), per_block.flatten(1))
    q_mid = (context_len - q.shape[0] + torch.arange(nqb, device=q.device) * SPARSE_BLOCK + SPARSE_BLOCK // 2)
    d = (q_mid[:, None] // SPARSE_BLOCK - torch.arange(nkb, device=q.device)).clamp(0, nkb - 1)  # [nqb, nkb]
    return vertical[:, None, :] + slash[:, d]


def _block_sums(x: torch.Tensor, nkb: int) -> torch.Tensor:
    """[H, c] -> [H, nkb]: sums over each 64-key block."""
    full = x.shape[1] // SPARSE_BLOCK
    sums = x[:, : full * SPARSE_BLOCK].reshape(x.shape[0], full, SPARSE_BLOCK).sum(-1)
    if full < nkb:  # the last, partial block
        sums = torch.cat([sums, x[:, full * SPARSE_BLOCK :].sum(-1, keepdim=True)], dim=1)
    return sums


def _per_head_choice(q: torch.Tensor, k: torch.Tensor, nqb: int, nkb: int, visible: torch.Tensor,
                     keep_ratio: float, scale: float, group: int) -> torch.Tensor:
    """Each KV head's scores from the pattern whose selection keeps more of the exact attention of the chunk's middle
    query block (held out: "vertical_slash" estimates from the chunk's last queries), summed over its query heads."""
    block_scores = _per_kv_head(_block_scores(q, k, nqb, nkb, scale), group)
    vs_scores = _per_kv_head(_vertical_slash_scores(q, k, nqb, nkb, scale), group)
    if nqb < 2:
        return vs_scores
    i = nqb // 2 - 1  # a full query block, away from the last one
    probs, _ = _sample_attention(q, k, slice(i * SPARSE_BLOCK, (i + 1) * SPARSE_BLOCK), scale)  # [H, 64, c_i]
    mass = _per_kv_head(_block_sums(probs.sum(1), nkb), group)  # [Hkv, nkb] (blocks past its keys hold 0)
    first = k.shape[1] - q.shape[0]
    recall = []
    for scores in (block_scores, vs_scores):
        chosen = _top_blocks(scores[:, i : i + 1], visible[i : i + 1], first + i * SPARSE_BLOCK, keep_ratio)
        kept = torch.arange(chosen.blocks.shape[-1], device=q.device) < chosen.keep[..., None]
        recall.append((mass.gather(1, chosen.blocks[:, 0]) * kept[:, 0]).sum(1))  # [Hkv] (local blocks: alike)
    use_block = (recall[0] > recall[1])[:, None, None]
    return torch.where(use_block, block_scores, vs_scores)


def _top_blocks(scores: torch.Tensor, visible: torch.Tensor, first: int, keep_ratio: float) -> BlockSelection:
    """scores [Hkv, n, nkb] -> each query block's kept blocks: the local ones (its own and `NUM_LOCAL_BLOCKS`
    before), the sink, then the best-scored distant ones up to `ceil(keep_ratio x visible)` in all (the most of its
    tile of `TILE_QUERY_BLOCKS`). `first`: the position of the first query of block 0; `visible[i]`: key blocks query
    block i may see."""
    heads, n, nkb = scores.shape
    device = scores.device
    j = torch.arange(nkb, device=device)
    local_first = ((first + torch.arange(n, device=device) * SPARSE_BLOCK) // SPARSE_BLOCK - NUM_LOCAL_BLOCKS
                   ).clamp(min=0)
    distant = j[None, :] < local_first[:, None]  # [n, nkb]
    sink = distant & (j[None, :] == 0)
    ranked = scores.float().masked_fill(sink, float("inf")).masked_fill(~distant, float("-inf"))
    wanted = torch.maximum(torch.ceil(visible.double() * keep_ratio).long() - (visible - local_first), sink.sum(1))
    # a tile of query blocks is attended together: each keeps its tile's largest count (when it has that many)
    pad = -n % TILE_QUERY_BLOCKS
    tile_max = torch.nn.functional.pad(wanted, (0, pad)).view(-1, TILE_QUERY_BLOCKS).amax(1)
    keep = tile_max.repeat_interleave(TILE_QUERY_BLOCKS)[:n].clamp(max=local_first)  # [n] distant blocks kept
    width = int(keep.max())
    blocks = torch.topk(ranked, width, dim=-1, sorted=True).indices  # [H, n, width]
    return BlockSelection(blocks, keep[None, :].expand(heads, n).contiguous(), local_first)


def _check_keep_ratio(value: float) -> None:  # the config's check, shared with direct callers
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1 or math.isnan(value):
        raise ValueError(f"sparse_keep_ratio must be in (0, 1], got {value!r}")


def attend_sparse_groups(sparse: SparsePrefill, groups: list[PrefillGroup], q: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor, *, scale: float, out: torch.Tensor) -> None:
    """Each prefill group (one sequence's chunk, `reference.PrefillGroup`) attended block-sparsely over the block
    pool `[num_blocks, block_size, kv_heads, dim]`; writes its rows of `out` `[T, heads, dim]`."""
    num_kv_heads, dim = key_cache.shape[-2:]
    flat_k, flat_v = key_cache.view(-1, num_kv_heads, dim), value_cache.view(-1, num_kv_heads, dim)
    for group in groups:
        if group.first_slot is not None:  # consecutive blocks: a slice of the pool
            end = group.first_slot + group.slots.numel()
            keys, values = flat_k[group.first_slot : end], flat_v[group.first_slot : end]
        else:
            keys, values = flat_k.index_select(0, group.slots), flat_v.index_select(0, group.slots)
        chunk = q[group.q_start : group.q_end]
        keys, values = keys.to(chunk.dtype), values.to(chunk.dtype)
        selection = sparse.select(chunk, keys, scale=scale)
        out[group.q_start : group.q_end] = block_sparse_attention(chunk, keys, values, selection, scale=scale)
