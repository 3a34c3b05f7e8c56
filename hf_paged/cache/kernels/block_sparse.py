"""Block-sparse causal attention of one sequence's prefill chunk: each query block reads only its chosen key blocks.

    keys      0 ......................................................... c-1   (cut into blocks of 64)
    queries                                       c-q ........................ c-1 (cut into blocks of 64 from c-q)
    key blocks of query block i, per KV head h (shared by the query heads of its group, which read the same K/V):
      | distant: blocks[h, i, :keep[h, i]]  | local: local_first[i] .. visible[i] - 1          |
        wholly before its first query         its own blocks and NUM_LOCAL before: the causal
        (any order, never masked)             mask applies here only

The work is the kept blocks only: for a tile of `TILE_QUERY_BLOCKS` query blocks, each KV head's kept key blocks are
gathered once (`[kv_heads x tile, kept x 64, dim]`), its query heads' queries stacked (`group x 64` rows, so each
matmul is taller than one head's), then one matmul, softmax and matmul. Its cost is the kept share of the causal
triangle plus the gather. With every visible block kept this is dense causal attention (the same softmax over the
same keys; fp32 rounding apart). Torch only, so it runs on any device; the CPU is where it is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SPARSE_BLOCK = 64  # tokens per query block and per key block (MInference's granularity)
TILE_QUERY_BLOCKS = 4  # query blocks attended together (the selection keeps the same count within a tile)

__all__ = ["SPARSE_BLOCK", "TILE_QUERY_BLOCKS", "BlockSelection", "block_sparse_attention", "visible_blocks"]


@dataclass(slots=True, frozen=True)
class BlockSelection:
    """Which key blocks each query block of a chunk attends to, per KV head (see the module's sketch)."""

    blocks: torch.Tensor  # [kv_heads, num_query_blocks, max_keep] int64 distant key blocks, the kept ones first
    keep: torch.Tensor  # [kv_heads, num_query_blocks] int64 how many leading entries of `blocks` are kept
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
    bs, nqb, group = SPARSE_BLOCK, -(-q_len // SPARSE_BLOCK), num_heads // num_kv_heads
    if selection.blocks.shape[:2] != (num_kv_heads, nqb):
        raise ValueError(f"selection covers {tuple(selection.blocks.shape[:2])} (KV heads, query blocks); the chunk "
                         f"has ({num_kv_heads}, {nqb})")
    nkb, device = -(-context_len // bs), q.device
    kb, vb = _key_blocks(keys, nkb), _key_blocks(values, nkb)  # [kv_heads, nkb + 1, 64, dim]; block nkb: null
    qb = _query_blocks(q * scale, nqb, num_kv_heads)  # [kv_heads, nqb, group * 64, dim]
    qpos = torch.clamp(context_len - q_len + torch.arange(nqb * bs, device=device), max=context_len - 1).view(nqb, bs)
    kv_index = torch.arange(num_kv_heads, device=device)[:, None, None]
    offsets = torch.arange(bs, device=device)
    visible = visible_blocks(context_len, q_len, nqb, device)
    out = torch.empty(num_kv_heads, nqb, group * bs, dim, dtype=q.dtype, device=device)
    for i0 in range(0, nqb, TILE_QUERY_BLOCKS):
        i1 = min(i0 + TILE_QUERY_BLOCKS, nqb)
        n, keep = i1 - i0, selection.keep[:, i0:i1]
        width = int(keep.max())
        local_width = int((visible[i0:i1] - selection.local_first[i0:i1]).max())
        local = selection.local_first[i0:i1, None] + torch.arange(local_width, device=device)
        local = torch.where(local < visible[i0:i1, None], local, nkb)  # past the visible ones: the null block
        blocks = torch.cat([selection.blocks[:, i0:i1, :width], local.expand(num_kv_heads, n, local_width)], dim=2)
        k = kb[kv_index, blocks].view(num_kv_heads * n, -1, dim)  # [Hkv*n, (W + L)*64, D]
        v = vb[kv_index, blocks].view(num_kv_heads * n, -1, dim)
        scores = torch.bmm(qb[:, i0:i1].reshape(num_kv_heads * n, group * bs, dim), k.transpose(1, 2))
        scores = scores.view(num_kv_heads, n, group, bs, -1)
        if width and bool((keep < width).any()):  # padding entries of the distant part: masked per key
            padded = (torch.arange(width, device=device) >= keep[..., None]).repeat_interleave(bs, dim=2)
            scores[..., : width * bs].masked_fill_(padded[:, :, None, None, :], float("-inf"))
        kpos = (local[..., None] * bs + offsets).flatten(1)  # [n, L*64] (the null block lies past every query)
        future = (kpos[:, None, :] > qpos[i0:i1, :, None])[None, :, None]  # [1, n, 1, 64, L*64]
        scores[..., width * bs :].masked_fill_(future, float("-inf"))
        probs = torch.softmax(scores.view(num_kv_heads * n, group * bs, -1), dim=-1)
        out[:, i0:i1] = torch.bmm(probs, v).view(num_kv_heads, n, group * bs, dim)
    # [Hkv, nqb, group, 64, D] -> [nqb * 64, Hkv * group, D]
    out = out.view(num_kv_heads, nqb, group, bs, dim).permute(1, 3, 0, 2, 4).reshape(nqb * bs, num_heads, dim)
    return out[:q_len]


def _key_blocks(x: torch.Tensor, nkb: int) -> torch.Tensor:
    """[c, kv_heads, dim] -> [kv_heads, nkb + 1, 64, dim], zero-padded past the context; block nkb is the null block
    (zeros, masked by position: it lies past every query)."""
    pad = (nkb + 1) * SPARSE_BLOCK - x.shape[0]
    x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
    return x.view(nkb + 1, SPARSE_BLOCK, *x.shape[1:]).permute(2, 0, 1, 3).contiguous()


def _query_blocks(q: torch.Tensor, nqb: int, num_kv_heads: int) -> torch.Tensor:
    """[q_len, heads, dim] -> [kv_heads, nqb, group * 64, dim]: each KV head's query heads stacked per block."""
    pad = nqb * SPARSE_BLOCK - q.shape[0]
    if pad:  # padding rows attend like the last query and are dropped
        q = torch.cat([q, q[-1:].expand(pad, *q.shape[1:])])
    heads, dim = q.shape[1:]
    q = q.view(nqb, SPARSE_BLOCK, num_kv_heads, heads // num_kv_heads, dim)
    return q.permute(2, 0, 3, 1, 4).reshape(num_kv_heads, nqb, -1, dim)
