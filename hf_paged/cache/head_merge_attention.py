"""Attention of a merged layer (`head_merge`): scores once per cluster, values per head.

Reads the same `AttentionPlan` as the torch reference (`kernels/reference`): the step's prefill groups and decode
groups (spans, padded groups, cascades), over the layer's block storage in place. For each group:

    qc = q[:, merge.rep_heads]                           [n, C, q, D]   one query per cluster
    kc = K[:, merge.key_of_cluster]                      [n, C, L, D]   its representative's key head
    p  = softmax(qc kc^T * scale, masked)                [n, C, q, L]   computed once per cluster
    out[h] = p[cluster_of[h]] @ V[kv(h)]                 [n, H, q, D]   every member on its own value head

The last line runs as one grouped matmul: the query heads of a KV group are adjacent, so the expanded probabilities
`[n, H, q, L]` viewed as `[n, kv_heads, group * q, L]` multiply the values `[n, kv_heads, L, D]` without copying
them. With every cluster one head this is exactly attention (eager: matmul, float32 softmax, matmul).
"""

from __future__ import annotations

import torch

from hf_paged.cache.head_merge import LayerMerge
from hf_paged.cache.kernels.reference import AttentionPlan, DecodeGroup, uncascade

__all__ = ["MergedIndices", "run_merged_plan"]


class MergedIndices:
    """A layer's merge as index tensors on one device (built once per layer and device)."""

    __slots__ = ("cluster_of", "clusters_per_key", "key_of_cluster", "rep_heads")

    def __init__(self, merge: LayerMerge, device: torch.device) -> None:
        self.rep_heads = torch.tensor(merge.rep_heads, dtype=torch.long, device=device)
        self.cluster_of = torch.tensor(merge.cluster_of, dtype=torch.long, device=device)
        self.key_of_cluster = torch.tensor(merge.key_of_cluster, dtype=torch.long, device=device)
        # Clusters come in key-head order (representatives ascending); when every kept key head serves as many
        # clusters, the scores are one matmul per key head with no copy of the keys.
        counts = {merge.key_of_cluster.count(k) for k in range(len(merge.kept_kv_heads))}
        self.clusters_per_key = counts.pop() if len(counts) == 1 else None


def run_merged_plan(plan: AttentionPlan, idx: MergedIndices, query: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, *, scale: float, softcap: float | None = None) -> torch.Tensor:
    """query `[T, heads, D]`; key_cache `[blocks, bs, kept_kv_heads, D]`; value_cache `[blocks, bs, kv_heads, D]`
    -> `[T, heads, D]` (the rows of the plan's groups)."""
    num_keys, num_values, dim = key_cache.shape[-2], value_cache.shape[-2], key_cache.shape[-1]
    flat_k, flat_v = key_cache.view(-1, num_keys, dim), value_cache.view(-1, num_values, dim)
    out = torch.empty_like(query)
    for group in plan.prefills:
        q = query[group.q_start : group.q_end].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
        if group.first_slot is not None:  # consecutive blocks: one slice of the pool
            end = group.first_slot + group.slots.numel()
            k, v = flat_k[group.first_slot : end], flat_v[group.first_slot : end]
        else:
            k, v = flat_k.index_select(0, group.slots), flat_v.index_select(0, group.slots)
        mask = group.mask
        if mask is None:  # plain causal: q_len == context_len
            n = q.shape[2]
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        o = _attend(q, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), mask, idx, scale, softcap)
        out[group.q_start : group.q_end] = o[0].transpose(0, 1)
    for d in plan.decodes:
        k, v, mask = _decode_context(d, key_cache, value_cache)
        q = query.index_select(0, d.rows).unsqueeze(2)  # [n, H, 1, D]
        out[d.rows] = _attend(q, k, v, mask, idx, scale, softcap).squeeze(2)
    return out


def _decode_context(d: DecodeGroup, key_cache: torch.Tensor, value_cache: torch.Tensor):
    """A decode group's keys `[n, kept, L, D]`, values `[n, kv_heads, L, D]` and mask `[n, 1, 1, L]` (or None):
    the shared blocks of a cascade first, then each row's own blocks (unwritten slots zeroed and masked)."""
    n, bs, dim = d.rows.numel(), key_cache.shape[1], key_cache.shape[-1]
    d = uncascade(d, bs)
    if d.span is not None and d.mask is None:  # rows of one length: positions start .. end - 1, nothing masked
        k = key_cache.index_select(0, d.blocks).view(n, -1, key_cache.shape[2], dim)[:, d.span.start : d.span.end]
        v = value_cache.index_select(0, d.blocks).view(n, -1, value_cache.shape[2], dim)[:, d.span.start : d.span.end]
        return k.transpose(1, 2), v.transpose(1, 2), None
    parts = []
    for cache in (key_cache, value_cache):
        heads = cache.shape[2]
        own = cache.index_select(0, d.blocks).view(n * d.max_blocks * bs, heads, dim)
        if d.invalid.numel():
            own.index_fill_(0, d.invalid, 0)
        parts.append(own.view(n, d.max_blocks * bs, heads, dim).transpose(1, 2))
    return parts[0], parts[1], d.mask


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, idx: MergedIndices,
            scale: float, softcap: float | None) -> torch.Tensor:
    """q `[n, H, q, D]`, k `[n, kept, L, D]`, v `[n, kv_heads, L, D]`, mask broadcastable to `[n, C, q, L]`."""
    n, num_heads, q_len, dim = q.shape
    num_kv_heads, length = v.shape[1], v.shape[2]
    qc = q.index_select(1, idx.rep_heads)
    if idx.clusters_per_key is not None:  # [n, kept, per * q, D] x [n, kept, D, L]: the keys read in place
        kept = k.shape[1]
        scores = torch.matmul(qc.reshape(n, kept, -1, dim), k.to(q.dtype).transpose(-1, -2))
        scores = scores.view(n, -1, q_len, length).float() * scale  # [n, C, q, L]
    else:
        kc = k.index_select(1, idx.key_of_cluster).to(q.dtype)
        scores = torch.matmul(qc, kc.transpose(-1, -2)).float() * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype).index_select(1, idx.cluster_of)  # [n, H, q, L]
    group = num_heads // num_kv_heads
    out = torch.matmul(probs.view(n, num_kv_heads, group * q_len, length), v.to(q.dtype))
    return out.view(n, num_heads, q_len, dim)
