"""Block-sparse causal attention of one sequence's prefill chunk: each query block reads only its chosen key blocks.

    keys      0 ......................................................... c-1   (cut into blocks of 64)
    queries                                       c-q ........................ c-1 (cut into blocks of 64 from c-q)
    query block i keeps `keep[h, i]` key blocks for head h: `blocks[h, i, :keep[h, i]]` (the rest of the row is
    padding). A kept block may straddle the diagonal: keys after a query's position are masked as in dense attention.

The work is the kept blocks only: for a tile of query blocks, the kept key blocks of every head are gathered
(`[heads x tile, kept x 64, dim]`), and one masked SDPA runs over them, so its cost is the kept share of the causal
triangle (plus the gather). With every visible block kept, this is dense causal attention (same softmax over the same
keys; fp32 rounding apart). Torch only, so it runs on any device; the CPU is where it is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SPARSE_BLOCK = 64  # tokens per query block and per key block (MInference's granularity)
_TILE_SCORES = 1 << 22  # score elements (heads x tile x 64 x kept x 64) one SDPA call holds at most

__all__ = ["SPARSE_BLOCK", "BlockSelection", "block_sparse_attention", "visible_blocks"]


@dataclass(slots=True, frozen=True)
class BlockSelection:
    """Which key blocks each query block of a chunk attends to, per query head.

        key blocks of query block i:  | distant: blocks[h, i, :keep[h, i]] | local: local_first[i] .. visible - 1 |
                                        fully before its queries             its own blocks and the ones before
                                        (any order, no mask)                 (the causal mask applies here only)
    """

    blocks: torch.Tensor  # [heads, num_query_blocks, max_keep] int64 distant key blocks, the kept ones first
    keep: torch.Tensor  # [heads, num_query_blocks] int64 how many leading entries of `blocks` are kept
    local_first: torch.Tensor  # [num_query_blocks] int64 the first local key block (every later visible one too)

    def kept_share(self, context_len: int, q_len: int) -> float:
        """Kept blocks over the blocks causal attention would read (1.0 = dense)."""
        visible = visible_blocks(context_len, q_len, self.keep.shape[1], self.keep.device)
        kept = self.keep.sum() + (visible - self.local_first).sum() * self.keep.shape[0]
        return float(kept) / float(visible.sum() * self.keep.shape[0])


def visible_blocks(context_len: int, q_len: int, num_query_blocks: int, device: torch.device) -> torch.Tensor:
    """[num_query_blocks] int64: key blocks 0 .. n-1 hold a key that query block i may see."""
    first = context_len - q_len
    last = torch.clamp(first + (torch.arange(num_query_blocks, device=device) + 1) * SPARSE_BLOCK - 1,
                       max=context_len - 1)
    return last // SPARSE_BLOCK + 1


def block_sparse_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, selection: BlockSelection,
                           *, scale: float) -> torch.Tensor:
    """q `[q_len, heads, dim]` (the last q_len positions of the context); keys/values `[context_len, kv_heads, dim]`
    -> `[q_len, heads, dim]`."""
    q_len, num_heads, dim = q.shape
    context_len, num_kv_heads = keys.shape[0], keys.shape[1]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    bs, nqb = SPARSE_BLOCK, -(-q_len // SPARSE_BLOCK)
    if selection.blocks.shape[:2] != (num_heads, nqb):
        raise ValueError(f"selection covers {tuple(selection.blocks.shape[:2])} (heads, query blocks); the chunk "
                         f"has ({num_heads}, {nqb})")
    nkb, device = -(-context_len // bs), q.device
    kb, vb = _key_blocks(keys, nkb), _key_blocks(values, nkb)  # [kv_heads, nkb + 1, 64, dim]; block nkb: null
    qb = _query_blocks(q * scale, nqb)  # [heads, nqb, 64, dim]
    qpos = torch.clamp(context_len - q_len + torch.arange(nqb * bs, device=device), max=context_len - 1).view(nqb, bs)
    kv_of_head = (torch.arange(num_heads, device=device) // (num_heads // num_kv_heads))[:, None, None]
    offsets = torch.arange(bs, device=device)
    visible = visible_blocks(context_len, q_len, nqb, device)
    out = torch.empty(num_heads, nqb, bs, dim, dtype=q.dtype, device=device)
    for i0, i1 in _tiles(selection, visible, num_heads):
        n, keep = i1 - i0, selection.keep[:, i0:i1]
        width = int(keep.max())
        local_width = int((visible[i0:i1] - selection.local_first[i0:i1]).max())
        local = torch.clamp(selection.local_first[i0:i1, None] + torch.arange(local_width, device=device), max=nkb)
        local = torch.where(local < visible[i0:i1, None], local, nkb)  # past the visible ones: the null block
        blocks = torch.cat([selection.blocks[:, i0:i1, :width], local.expand(num_heads, n, local_width)], dim=2)
        k = kb[kv_of_head, blocks].view(num_heads * n, -1, dim)  # [H*n, (W + L)*64, D]
        v = vb[kv_of_head, blocks].view(num_heads * n, -1, dim)
        scores = torch.bmm(qb[:, i0:i1].reshape(num_heads * n, bs, dim), k.transpose(1, 2)).view(
            num_heads, n, bs, -1)
        if width and bool((keep < width).any()):  # padding entries of the distant part: masked per key
            padded = (torch.arange(width, device=device) >= keep[..., None]).repeat_interleave(bs, dim=2)
            scores[..., : width * bs].masked_fill_(padded[:, :, None, :], float("-inf"))
        kpos = (local[..., None] * bs + offsets).flatten(1)  # [n, L*64] (the null block sits past every query)
        scores[..., width * bs :].masked_fill_((kpos[:, None, :] > qpos[i0:i1, :, None])[None], float("-inf"))
        probs = torch.softmax(scores.view(num_heads * n, bs, -1), dim=-1)
        out[:, i0:i1] = torch.bmm(probs, v).view(num_heads, n, bs, dim)
    return out.flatten(1, 2)[:, :q_len].transpose(0, 1)


def _key_blocks(x: torch.Tensor, nkb: int) -> torch.Tensor:
    """[c, kv_heads, dim] -> [kv_heads, nkb + 1, 64, dim], zero-padded past the context; block nkb is the null block
    (zeros, masked by position: it lies past every query)."""
    pad = (nkb + 1) * SPARSE_BLOCK - x.shape[0]
    x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
    return x.view(nkb + 1, SPARSE_BLOCK, *x.shape[1:]).permute(2, 0, 1, 3).contiguous()


def _query_blocks(q: torch.Tensor, nqb: int) -> torch.Tensor:
    pad = nqb * SPARSE_BLOCK - q.shape[0]
    if pad:  # padding rows attend like the last query and are dropped
        q = torch.cat([q, q[-1:].expand(pad, *q.shape[1:])])
    return q.view(nqb, SPARSE_BLOCK, *q.shape[1:]).permute(2, 0, 1, 3)


def _tiles(selection: BlockSelection, visible: torch.Tensor, num_heads: int) -> list[tuple[int, int]]:
    """Consecutive query blocks whose gathered scores stay under `_TILE_SCORES` (kept counts grow along the chunk, so
    each tile pads only to its own widest row)."""
    widths = (selection.keep.max(dim=0).values + visible - selection.local_first).tolist()
    tiles, start, per_block = [], 0, num_heads * SPARSE_BLOCK * SPARSE_BLOCK
    while start < len(widths):
        end, widest = start + 1, widths[start]
        while end < len(widths) and max(widest, widths[end]) * per_block * (end + 1 - start) <= _TILE_SCORES:
            widest = max(widest, widths[end])
            end += 1
        tiles.append((start, end))
        start = end
    return tiles
