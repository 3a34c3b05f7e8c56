"""Attention scores that decide which blocks SnapKV and PyramidKV keep.

The last `OBSERVATION_WINDOW` queries of a prompt vote: per head, the strongest attention any of them gives each
key (`observation_scores`, computed by the attention path in whichever chunks run those queries, merged by max in
`KVPruner`), max-pooled over neighbouring positions, summed per block, then the most interested head's score over
heads and layers (`pooled_block_scores`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

OBSERVATION_WINDOW = 32  # SnapKV's observation window: the last prompt queries that vote
POOL_KERNEL = 7  # SnapKV's max-pool over neighbouring positions: keep a selected token's context with it


def observation_scores(query: torch.Tensor, keys: torch.Tensor, num_observed: int, scale: float) -> torch.Tensor:
    """Per query head, the strongest attention any of the last `num_observed` queries gives each key.

    A max, not SnapKV's sum over the window: the query that asks for a far fact (the last prompt token, which
    predicts the answer) may be the only one looking there, and a sum drowns it under the window's other queries
    (measured: passkey 0.0 with a sum, 1.0 with the max at keep 0.25 on the default model's first examples).

    Args:
        query: `[q_len, num_heads, head_dim]` the sequence's queries of this step (its last prompt tokens).
        keys: `[context_len, num_kv_heads, head_dim]` every key of the sequence in table order.
    Returns:
        `[num_heads, context_len]` float32 scores.
    """
    q = query[-num_observed:].float().transpose(0, 1)  # [H, n, D]
    k = keys.float().transpose(0, 1)  # [Hkv, C, D]
    k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
    logits = torch.matmul(q, k.transpose(1, 2)) * scale  # [H, n, C]
    context_len, n = k.shape[1], q.shape[1]
    query_pos = torch.arange(context_len - n, context_len, device=q.device)[:, None]
    logits = logits.masked_fill(torch.arange(context_len, device=q.device)[None, :] > query_pos, float("-inf"))
    return torch.softmax(logits, dim=-1).amax(dim=1)


def pooled_block_scores(token_scores: torch.Tensor, block_size: int) -> torch.Tensor:
    """Per-head scores `[..., heads, context_len]` -> one score per block `[num_blocks]`.

    Each head's scores are max-pooled over neighbours (SnapKV's clustering) and summed per block; a block then
    scores what the head that wants it most gives it (max over heads and layers). A sum over heads would let the
    many heads that look at sinks and recent tokens drown the few retrieval heads that look far back.
    """
    flat = token_scores.reshape(-1, token_scores.shape[-1])
    pooled = F.max_pool1d(flat[:, None], POOL_KERNEL, stride=1, padding=POOL_KERNEL // 2)[:, 0]
    pad = (-pooled.shape[-1]) % block_size
    return F.pad(pooled, (0, pad)).view(flat.shape[0], -1, block_size).sum(-1).amax(0)
