"""Torch reference of the paged kernels: the CPU path, and the yardstick of the Triton kernels.

Every function here reads only the slots a sequence owns (positions 0 .. context_len - 1 through its block
table), so unwritten slots (which may hold NaN) never reach the arithmetic.

The work of turning block tables into gather indices is the same for every layer of a forward, so it is split
out into an `AttentionPlan` that the caller may build once per step and reuse for all layers.

    sequence i, context_len c, q_len q (the last q positions of the context are the new queries)
    positions   0 ........................ c-q-1 | c-q ......... c-1
                cached prefix (earlier steps)     | this chunk (already stored)
    query j (position c-q+j) sees keys at positions <= c-q+j (and > c-q+j-window with a sliding window)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hf_paged.cache.kernels import causal_rows as rows_
from hf_paged.cache.kernels.causal_rows import CausalRows


@dataclass(slots=True)
class PrefillGroup:
    """One sequence with several new queries: attended on its own."""

    q_start: int  # first row of the packed queries
    q_end: int  # one past its last row
    slots: torch.Tensor  # [context_len] int64 flat slot of every key position
    mask: torch.Tensor | None  # [q_len, context_len] bool (True = attend); None = plain causal, q_len == context_len
    first_slot: int | None = None  # `slots` are first_slot, first_slot + 1, ... (consecutive blocks): read in place
    # plain causal (query j sees keys 0 .. context_len - q_len + j, nothing else), set by `build_attention_plan`
    # only: a group whose mask or slots are changed afterwards leaves it False and runs as one SDPA call
    causal: bool = False
    row_blocks: list[CausalRows] | None = None  # its `causal_rows.causal_rows`, built by the step's first layer


@dataclass(slots=True)
class DecodeGroup:
    """Sequences with exactly one new query and similar context lengths, attended together.

    Their blocks are gathered whole (contiguous copies, about twice as fast as gathering slot by slot), padded to
    the group's longest table with the row's own first block; positions past each context are zeroed (so stale
    NaN/inf in a tail slot cannot leak through the masked softmax) and masked out.
    """

    rows: torch.Tensor  # [n] int64 rows of the packed queries
    blocks: torch.Tensor  # [n * max_blocks] int64 block ids, row-major
    max_blocks: int
    invalid: torch.Tensor  # flat positions in [n * max_blocks * block_size] past each row's context
    mask: torch.Tensor | None  # [n, 1, 1, max_blocks * block_size] bool; None when nothing is masked
    shared_blocks: torch.Tensor | None = None  # leading blocks every row shares (cascade); `blocks` then holds
    # only each row's remaining blocks, and `mask`/`invalid` are relative to them
    span: RowSpan | None = None  # rows of one context length: read as one slice each, nothing zeroed or masked


@dataclass(slots=True)
class RowSpan:
    """Rows of a decode group that all hold the same context length: positions `start .. end - 1` of each row's
    gathered blocks are attended (the whole context, or its sliding window) and nothing else, so neither zeroing
    nor a mask is needed.

        blocks of a row       | b0 | b1 | b2 |        (one row, b0 b1 b2 consecutive: a view of the pool, no copy)
        positions             0 ...... start ... end-1 | tail (never written: never read)
    """

    start: int
    end: int
    first_block: int | None  # one row whose blocks are first_block, first_block + 1, ...: read in place


@dataclass(slots=True)
class AttentionPlan:
    """Gather indices of one forward, shared by every layer."""

    num_query_tokens: int
    prefills: list[PrefillGroup]
    decodes: list[DecodeGroup]


def _positions_to_slots(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    return block_table[positions // block_size].long() * block_size + positions % block_size


def build_attention_plan(
    block_tables: torch.Tensor,
    query_start_loc: list[int],
    context_lens: list[int],
    block_size: int,
    sliding_window: int | None = None,
    skip: list[bool] | None = None,
    in_place: bool = False,
) -> AttentionPlan:
    """Gather indices for a packed batch. `query_start_loc`/`context_lens` are python lists (host metadata).
    Sequences with `skip[i]` are left out (another kernel attends them; their rows of the output stay as they are).
    `in_place`: the plan reads the block pool itself and keeps its slots as built, so a prefill whose blocks are
    consecutive reads its context as a slice (callers that extend a group's slots afterwards leave it False)."""
    device = block_tables.device
    prefills: list[PrefillGroup] = []
    decode_rows: list[int] = []
    decode_lens: list[int] = []
    decode_seqs: list[int] = []
    for i, context_len in enumerate(context_lens):
        q_start, q_end = query_start_loc[i], query_start_loc[i + 1]
        q_len = q_end - q_start
        if q_len == 0 or (skip is not None and skip[i]):
            continue
        if q_len == 1:
            decode_rows.append(q_start)
            decode_lens.append(context_len)
            decode_seqs.append(i)
            continue
        positions = torch.arange(context_len, device=device)
        slots = _positions_to_slots(block_tables[i], positions, block_size)
        mask = None
        if q_len != context_len or sliding_window is not None:
            query_pos = torch.arange(context_len - q_len, context_len, device=device)[:, None]
            mask = positions[None, :] <= query_pos
            if sliding_window is not None:
                mask &= positions[None, :] > query_pos - sliding_window
        first = _consecutive_first(block_tables[i], -(-context_len // block_size)) if in_place else None
        prefills.append(PrefillGroup(q_start, q_end, slots, mask, None if first is None else first * block_size,
                                     causal=in_place and sliding_window is None))
    decodes = [
        _decode_group(block_tables, [decode_rows[i] for i in g], [decode_seqs[i] for i in g],
                      [decode_lens[i] for i in g], block_size, sliding_window)
        for g in _length_buckets(decode_lens)
    ]
    return AttentionPlan(query_start_loc[-1], prefills, decodes)


def _consecutive_first(table: torch.Tensor, num_blocks: int) -> int | None:
    """The first of a row's `num_blocks` blocks when they are consecutive in the pool (a fresh sequence's usually
    are), else None."""
    ids = table[:num_blocks].tolist()
    return ids[0] if ids == list(range(ids[0], ids[0] + num_blocks)) else None


def _length_buckets(lens: list[int], min_len: int = 64) -> list[list[int]]:
    """Group indices by context length so padding at most doubles a group's gather (ragged batches would
    otherwise pad every row to the longest context)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lens)), key=lens.__getitem__):
        if groups and lens[i] <= 2 * max(lens[groups[-1][0]], min_len):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


_CASCADE_MIN_SHARED_BLOCKS = 4  # shared prefix (in blocks) from which rows attend to it once, together


def _shared_prefix_blocks(tables: torch.Tensor, lens: list[int], block_size: int) -> int:
    """Leading block ids common to every row and full in every row (prefix-cache hits, forks)."""
    if tables.shape[0] < 2:
        return 0
    same = (tables == tables[:1]).all(dim=0).tolist()
    shared = next((i for i, s in enumerate(same) if not s), len(same))
    return min(shared, min(lens) // block_size)


def _decode_group(block_tables, rows, seqs, lens, block_size, sliding_window, *, cascade_part=False) -> DecodeGroup:
    device = block_tables.device
    n = len(rows)
    max_blocks = -(-max(lens) // block_size)
    tables = block_tables[seqs, :max_blocks].long()
    shared = 0 if sliding_window is not None else _shared_prefix_blocks(tables, lens, block_size)
    if shared >= _CASCADE_MIN_SHARED_BLOCKS:
        # Cascade: the shared blocks are gathered once for all rows; each row gathers only what follows.
        group = _decode_group(tables[:, shared:], rows, list(range(n)), [n_ - shared * block_size for n_ in lens],
                              block_size, None, cascade_part=True)
        group.shared_blocks = tables[0, :shared]
        return group
    max_blocks = max(max_blocks, 1)
    if shared == 0 and not cascade_part and min(lens) == max(lens):  # (a cascade's part needs its mask)
        return _equal_rows(tables, rows, lens[0], max_blocks, block_size, sliding_window)
    counts = torch.tensor([-(-length // block_size) for length in lens], device=device)
    used = torch.arange(max_blocks, device=device)[None, :] < counts[:, None]
    tables = torch.where(used, tables[:, :max_blocks], tables[:, :1])  # pad with the row's own first block
    positions = torch.arange(max_blocks * block_size, device=device)
    lens_t = torch.tensor(lens, device=device)
    valid = positions[None, :] < lens_t[:, None]
    invalid = (~valid).reshape(-1).nonzero().squeeze(1)
    if sliding_window is not None:
        valid &= positions[None, :] > (lens_t[:, None] - 1 - sliding_window)
    mask = None if bool(valid.all()) else valid[:, None, None, :]
    return DecodeGroup(torch.tensor(rows, device=device), tables.reshape(-1), max_blocks, invalid, mask)


def _equal_rows(tables, rows, length, max_blocks, block_size, sliding_window) -> DecodeGroup:
    device, n = tables.device, len(rows)
    tables = tables[:, :max_blocks]
    first = _consecutive_first(tables[0], max_blocks) if n == 1 else None
    start = max(0, length - sliding_window) if sliding_window is not None else 0
    nothing = torch.empty(0, dtype=torch.long, device=device)  # a span reads no tail: nothing to zero
    return DecodeGroup(torch.tensor(rows, device=device), tables.reshape(-1), max_blocks, nothing, None,
                       span=RowSpan(start, length, first))


def uncascade(d: DecodeGroup, block_size: int) -> DecodeGroup:
    """A cascade group as a plain one: the shared blocks put back at the head of every row (their positions
    visible), `invalid` and `mask` shifted past them. For what the cascade's two-part softmax cannot do: a
    soft-capped score, or per-row hidden positions in the shared part (PyramidKV)."""
    if d.shared_blocks is None:
        return d
    n, own, shared = d.rows.numel(), d.max_blocks, d.shared_blocks.numel()
    blocks = torch.cat([d.shared_blocks.expand(n, shared), d.blocks.view(n, own)], dim=1).reshape(-1)
    old, width = own * block_size, (shared + own) * block_size
    invalid = d.invalid // old * width + shared * block_size + d.invalid % old
    mask = d.mask
    if mask is not None:
        seen = torch.ones(n, 1, 1, shared * block_size, dtype=torch.bool, device=mask.device)
        mask = torch.cat([seen, mask], dim=-1)
    return DecodeGroup(d.rows, blocks, shared + own, invalid, mask)


def span_tail(d: DecodeGroup, block_size: int) -> torch.Tensor:
    """The flat positions past the context of a span group's rows (what a masked read of its blocks zeroes)."""
    width = d.max_blocks * block_size
    tail = torch.arange(d.span.end, width, device=d.rows.device)
    return (torch.arange(d.rows.numel(), device=d.rows.device)[:, None] * width + tail[None, :]).reshape(-1)


def _read_span(d: DecodeGroup, key_cache, value_cache, dtype):
    """The rows' keys and values `[n, kv_heads, end - start, head_dim]` (a view of the pool for one row whose
    blocks are consecutive)."""
    span, (num_kv_heads, head_dim), n = d.span, key_cache.shape[-2:], d.rows.numel()
    if span.first_block is not None:
        k = key_cache[span.first_block : span.first_block + d.max_blocks]
        v = value_cache[span.first_block : span.first_block + d.max_blocks]
    else:
        k, v = key_cache.index_select(0, d.blocks), value_cache.index_select(0, d.blocks)
    k = k.view(n, -1, num_kv_heads, head_dim)[:, span.start : span.end]
    v = v.view(n, -1, num_kv_heads, head_dim)[:, span.start : span.end]
    return k.transpose(1, 2).to(dtype), v.transpose(1, 2).to(dtype)


def run_attention_plan(
    plan: AttentionPlan,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    *,
    scale: float,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """query [num_query_tokens, num_heads, head_dim] -> output of the same shape (written into `out` if given:
    only the rows of the plan's groups)."""
    num_kv_heads, head_dim = key_cache.shape[-2], key_cache.shape[-1]
    flat_k = key_cache.view(-1, num_kv_heads, head_dim)
    flat_v = value_cache.view(-1, num_kv_heads, head_dim)
    if out is None and not plan.prefills and len(plan.decodes) == 1 and plan.decodes[0].span is not None \
            and plan.decodes[0].mask is None and plan.decodes[0].rows.numel() == query.shape[0]:
        d = plan.decodes[0]  # every query is a decode of one context length (rows in order): no scatter
        k, v = _read_span(d, key_cache, value_cache, query.dtype)
        return _sdpa(query.unsqueeze(2), k, v, None, causal=False, scale=scale, softcap=softcap).squeeze(2)
    out = torch.empty_like(query) if out is None else out
    for group in plan.prefills:
        q = query[group.q_start : group.q_end].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
        if group.first_slot is not None:  # consecutive blocks: the context is one slice of the pool
            end = group.first_slot + group.slots.numel()
            k, v = flat_k[group.first_slot : end], flat_v[group.first_slot : end]
        else:
            k, v = flat_k.index_select(0, group.slots), flat_v.index_select(0, group.slots)
        k = k.transpose(0, 1).unsqueeze(0).to(query.dtype)
        v = v.transpose(0, 1).unsqueeze(0).to(query.dtype)
        after_prefix = group.mask is not None  # a causal group has a mask only when it follows a cached prefix
        if group.causal and softcap is None and query.device.type == "cpu" and rows_.pays(q.shape[2], after_prefix):
            blocks = group.row_blocks  # built by the step's first layer, kept for the others (one plan a step)
            if blocks is None or (blocks[0].mask is not None and blocks[0].mask.dtype != query.dtype):
                blocks = group.row_blocks = rows_.causal_rows(q.shape[2], k.shape[2], query.dtype, query.device)
            rows = out[group.q_start : group.q_end].transpose(0, 1)  # [H, q, D], a view of `out`
            for b in blocks:
                rows[:, b.start : b.end] = _sdpa(q[:, :, b.start : b.end], k[:, :, : b.num_keys],
                                                 v[:, :, : b.num_keys], b.mask, causal=False, scale=scale,
                                                 softcap=None)[0]
            continue
        o = _sdpa(q, k, v, group.mask, causal=group.mask is None, scale=scale, softcap=softcap)
        out[group.q_start : group.q_end] = o[0].transpose(0, 1)
    for d in plan.decodes:
        if d.shared_blocks is not None and softcap is not None:  # the cascade's merge has no soft-capping
            d = uncascade(d, key_cache.shape[1])
        n, length = d.rows.numel(), d.max_blocks * key_cache.shape[1]
        q = query.index_select(0, d.rows).unsqueeze(2)  # [n, H, 1, D]
        if d.span is not None and d.mask is None:
            k, v = _read_span(d, key_cache, value_cache, query.dtype)
            out[d.rows] = _sdpa(q, k, v, None, causal=False, scale=scale, softcap=softcap).squeeze(2)
            continue
        k = key_cache.index_select(0, d.blocks).view(n * length, num_kv_heads, head_dim)
        v = value_cache.index_select(0, d.blocks).view(n * length, num_kv_heads, head_dim)
        if d.invalid.numel():
            k.index_fill_(0, d.invalid, 0)
            v.index_fill_(0, d.invalid, 0)
        k = k.view(n, length, num_kv_heads, head_dim).transpose(1, 2).to(query.dtype)
        v = v.view(n, length, num_kv_heads, head_dim).transpose(1, 2).to(query.dtype)
        if d.shared_blocks is not None:
            shared_k = key_cache.index_select(0, d.shared_blocks).view(-1, num_kv_heads, head_dim).to(query.dtype)
            shared_v = value_cache.index_select(0, d.shared_blocks).view(-1, num_kv_heads, head_dim).to(query.dtype)
            out[d.rows] = _cascade_decode(q.squeeze(2), shared_k, shared_v, k, v, d.mask, scale)
            continue
        o = _sdpa(q, k, v, d.mask, causal=False, scale=scale, softcap=softcap)
        out[d.rows] = o.squeeze(2)
    return out


def _cascade_decode(q, shared_k, shared_v, k, v, mask, scale: float) -> torch.Tensor:
    """One query per row over [shared prefix | own suffix], with one softmax across both parts.

    q [n, H, D]; shared_k/v [Ls, Hkv, D] (read once for all rows); k/v [n, Hkv, L, D] (each row's suffix);
    mask [n, 1, 1, L] or None. Scores of both parts share one running maximum, so the merge is exact."""
    n, num_heads, dim = q.shape
    num_kv_heads = shared_k.shape[1]
    g = num_heads // num_kv_heads
    qg = q.view(n, num_kv_heads, g, dim).float()
    sk = shared_k.permute(1, 2, 0).float()  # [Hkv, D, Ls]
    s1 = torch.matmul(qg.permute(1, 0, 2, 3).reshape(num_kv_heads, n * g, dim), sk) * scale  # [Hkv, n*g, Ls]
    s1 = s1.view(num_kv_heads, n, g, -1).permute(1, 0, 2, 3)  # [n, Hkv, g, Ls]
    s2 = torch.matmul(qg, k.float().transpose(-1, -2)) * scale  # [n, Hkv, g, L]
    if mask is not None:
        s2 = s2.masked_fill(~mask, float("-inf"))
    m = torch.maximum(s1.amax(dim=-1), s2.amax(dim=-1)).unsqueeze(-1)  # finite: the shared part is never empty
    p1, p2 = torch.exp(s1 - m), torch.exp(s2 - m)
    denom = p1.sum(dim=-1, keepdim=True) + p2.sum(dim=-1, keepdim=True)
    o1 = torch.matmul(p1.permute(1, 0, 2, 3).reshape(num_kv_heads, n * g, -1), shared_v.permute(1, 0, 2).float())
    o1 = o1.view(num_kv_heads, n, g, dim).permute(1, 0, 2, 3)
    o2 = torch.matmul(p2, v.float())
    return ((o1 + o2) / denom).reshape(n, num_heads, dim).to(q.dtype)


def _sdpa(q, k, v, mask, *, causal: bool, scale: float, softcap: float | None) -> torch.Tensor:
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
    # Soft-capped logits (Gemma 2): eager, since SDPA cannot cap.
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if causal:
        q_len, k_len = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)


# -- the kernel-shaped reference API (same signatures as the Triton functions) ----------------------------------


def ref_store_kv(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Scatter key/value [num_tokens, num_kv_heads, head_dim] into their slots; slots < 0 are skipped."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    ref_store_kv_nonnegative(key.to(key_cache.dtype), value.to(value_cache.dtype), key_cache, value_cache,
                             slot_mapping.long())


def ref_store_kv_nonnegative(key, value, key_cache, value_cache, slot_mapping) -> None:
    """`ref_store_kv` for int64 slots that are all >= 0 and K/V already in the cache's dtype (no checks)."""
    num_kv_heads, head_dim = key_cache.shape[-2], key_cache.shape[-1]
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def ref_paged_prefill_attention(
    query, key_cache, value_cache, block_tables, query_start_loc, context_lens, *, scale, sliding_window=None
) -> torch.Tensor:
    plan = build_attention_plan(
        block_tables, query_start_loc.tolist(), context_lens.tolist(), key_cache.shape[1], sliding_window
    )
    return run_attention_plan(plan, query, key_cache, value_cache, scale=scale)


def ref_paged_decode_attention(
    query, key_cache, value_cache, block_tables, context_lens, *, scale, sliding_window=None
) -> torch.Tensor:
    num_seqs = query.shape[0]
    query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32)
    return ref_paged_prefill_attention(
        query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale=scale,
        sliding_window=sliding_window,
    )
