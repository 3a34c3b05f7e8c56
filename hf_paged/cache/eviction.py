"""Token eviction at block granularity: which full blocks of a sequence's table to drop.

    table of a 10-block prompt, block_size 16, sinks 16, window 32, budget 5 blocks
    | s | . | . | x | . | x | . | . | w | w |      s: sink (kept)  w: recent window (kept)
                                                    x: kept for their attention score (SnapKV); .: evicted
Policies (`PagedConfig.kv_eviction`):
- "streaming" (StreamingLLM): sinks + the most recent window, applied after prefill and again as generation
  grows, so a long generation holds a bounded number of blocks.
- "snapkv" (SnapKV): when a prompt's prefill ends, the last queries of the prompt (the observation window) score
  every prompt key by attention (per head, the strongest attention any observed query gives it, max-pooled over
  neighbouring positions, summed per block, then the most interested head's score over heads and layers); the blocks with the highest scores fill the budget `ceil(kv_keep_ratio * prompt_tokens)` besides sinks and window.
- "pyramidkv" (PyramidKV): SnapKV with a budget per layer, from 1.5x the SnapKV budget in the first layer down to
  0.5x in the last (mean 1x), each layer choosing by its own scores. Blocks are shared by all layers of the pool,
  so the table keeps the union of the layers' choices (memory = that union, at least the first layer's budget)
  and each layer masks out the kept blocks it did not choose (`hide_positions`). With one pool for all layers
  this cannot use less memory than SnapKV at the first layer's budget; it spends the same memory differently.

Evicted blocks leave the block table, so a table position no longer equals a logical position: the manager keeps
the number of evicted tokens per sequence (new tokens land at `position - num_evicted_tokens`), and RoPE positions
stay logical (keys were rotated when stored). Only private blocks are evicted: a block shared through the prefix
cache or with a fork is kept whatever its score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hf_paged.cache.kernels.reference import AttentionPlan, DecodeGroup, PrefillGroup, span_tail

EVICTION_POLICIES = ("streaming", "snapkv", "pyramidkv")
OBSERVATION_WINDOW = 32  # SnapKV's observation window: the last prompt queries that vote
POOL_KERNEL = 7  # SnapKV's max-pool over neighbouring positions: keep a selected token's context with it


@dataclass(slots=True)
class EvictionPlan:
    """What to drop from one sequence's table."""

    evict_indices: list[int]  # table indices of the blocks to drop, ascending
    num_blocks_kept: int


def check_eviction(policy: str | None, keep_ratio: float, num_sink_tokens: int, window_tokens: int,
                   budget_tokens: int | None) -> None:
    """Raise `ValueError` (naming the field and its allowed values) for a setting eviction cannot honour."""
    if policy is None:
        return
    if policy not in EVICTION_POLICIES:
        raise ValueError(
            f"PagedConfig.kv_eviction={policy!r} is not implemented; use one of {[None, *EVICTION_POLICIES]}"
        )
    if budget_tokens is not None and budget_tokens < num_sink_tokens + window_tokens:
        raise ValueError(
            f"PagedConfig.kv_budget_tokens={budget_tokens} is smaller than num_sink_tokens + window_tokens = "
            f"{num_sink_tokens + window_tokens}; allowed: >= {num_sink_tokens + window_tokens} (or lower the "
            "window / sinks)"
        )


def prompt_budget_blocks(num_prompt_tokens: int, keep_ratio: float, block_size: int, budget_tokens: int | None,
                         num_sink_tokens: int, window_tokens: int) -> int:
    """Blocks a prompt keeps after SnapKV: its share of the prompt, never less than sinks + window."""
    budget = math.ceil(keep_ratio * num_prompt_tokens)
    if budget_tokens is not None:
        budget = min(budget, budget_tokens)
    budget = max(budget, num_sink_tokens + window_tokens)
    return -(-budget // block_size)


def select_blocks(
    num_tokens: int, block_size: int, evictable: list[bool], *, budget_blocks: int, num_sink_tokens: int,
    window_tokens: int, block_scores: torch.Tensor | None = None,
) -> EvictionPlan:
    """Choose the blocks to evict from a table of `num_tokens` tokens (`evictable[i]`: block i is full and private).

    Sinks (the blocks holding the first `num_sink_tokens` table positions) and the blocks holding the last
    `window_tokens` positions are kept. The rest of the budget goes to the highest `block_scores` (SnapKV); with no
    scores (StreamingLLM) nothing else is kept. Blocks that are not evictable are kept and count against the budget.
    """
    num_blocks = -(-num_tokens // block_size)
    sink_blocks = -(-num_sink_tokens // block_size)
    first_window_block = max(0, num_tokens - window_tokens) // block_size
    kept = set(range(min(sink_blocks, num_blocks))) | set(range(first_window_block, num_blocks))
    kept |= {i for i in range(num_blocks) if not evictable[i]}
    candidates = [i for i in range(num_blocks) if i not in kept]
    room = max(0, budget_blocks - len(kept))
    if block_scores is not None and room and candidates:
        order = sorted(candidates, key=lambda i: (-float(block_scores[i]), i))
        kept |= set(order[:room])
    evict = [i for i in range(num_blocks) if i not in kept]
    return EvictionPlan(evict, num_blocks - len(evict))


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


def pyramid_budgets(budget_blocks: int, num_layers: int, floor_blocks: int) -> list[int]:
    """Per-layer budgets, linear from 1.5x (first layer) to 0.5x (last), never under `floor_blocks`."""
    if num_layers == 1:
        return [budget_blocks]
    return [max(floor_blocks, round(budget_blocks * (1.5 - layer / (num_layers - 1)))) for layer in range(num_layers)]


def hide_positions(plan: AttentionPlan, hidden: dict[int, torch.Tensor], query_start_loc: list[int],
                   context_lens: list[int], block_size: int) -> AttentionPlan:
    """A copy of `plan` where sequence i's queries do not see the table positions `hidden[i]` (PyramidKV: blocks
    another layer kept but this one did not choose)."""
    row_of = {query_start_loc[i]: i for i in hidden}
    prefills = []
    for g in plan.prefills:
        i = row_of.get(g.q_start)
        if i is None:
            prefills.append(g)
            continue
        q_len, c = g.q_end - g.q_start, context_lens[i]
        mask = g.mask.clone() if g.mask is not None else torch.ones(q_len, c, dtype=torch.bool).tril(c - q_len)
        mask[:, hidden[i].to(mask.device)] = False
        prefills.append(PrefillGroup(g.q_start, g.q_end, g.slots, mask))
    decodes = []
    for d in plan.decodes:
        seqs = [row_of.get(r) for r in d.rows.tolist()]
        if all(i is None for i in seqs):
            decodes.append(d)
            continue
        shape = (d.rows.numel(), 1, 1, d.max_blocks * block_size)  # columns: table positions (whole blocks)
        mask = d.mask.clone() if d.mask is not None else torch.ones(shape, dtype=torch.bool, device=d.rows.device)
        invalid = d.invalid
        if d.span is not None:  # rows read as slices: with a mask, their blocks are read whole (tail zeroed)
            mask[..., : d.span.start] = False
            mask[..., d.span.end :] = False
            invalid = span_tail(d, block_size)
        for r, i in enumerate(seqs):
            if i is not None:
                mask[r, 0, 0, hidden[i].to(mask.device)] = False
        decodes.append(DecodeGroup(d.rows, d.blocks, d.max_blocks, invalid, mask))
    return AttentionPlan(plan.num_query_tokens, prefills, decodes)
