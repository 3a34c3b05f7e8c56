"""Token pruning at block granularity: which full blocks of a sequence's table to drop.

    table of a 10-block prompt, block_size 16, sinks 16, window 32, budget 5 blocks
    | s | . | . | x | . | x | . | . | w | w |      s: sink (kept)  w: recent window (kept)
                                                    x: kept for their attention score (SnapKV); .: dropped
Policies (`PagedConfig.kv_pruning`, the config's name for the pruning policy):
- "streaming" (StreamingLLM): sinks + the most recent window, applied after prefill and again as generation
  grows, so a long generation holds a bounded number of blocks.
- "snapkv" (SnapKV): when a prompt's prefill ends, the last queries of the prompt (the observation window) score
  every prompt key by attention (`scores.py`); the blocks with the highest scores fill the budget
  `ceil(kv_keep_ratio * prompt_tokens)` besides sinks and window.
- "pyramidkv" (PyramidKV): SnapKV with a budget per layer, from 1.5x the SnapKV budget in the first layer down to
  0.5x in the last (mean 1x), each layer choosing by its own scores. Blocks are shared by all layers of the pool,
  so the table keeps the union of the layers' choices (memory = that union, at least the first layer's budget)
  and each layer masks out the kept blocks it did not choose (`hiding.hide_positions`). With one pool for all
  layers this cannot use less memory than SnapKV at the first layer's budget; it spends the same memory differently.

Dropped blocks leave the block table, so a table position no longer equals a logical position: the manager keeps
the number of dropped tokens per sequence (`KVCacheManager.num_dropped_tokens`; new tokens land at
`position - num_dropped_tokens`), and RoPE positions stay logical (keys were rotated when stored). Any full block
may be dropped: a block shared through the prefix cache or with a fork only leaves this table (the others keep it),
so what a request keeps depends on its tokens, never on what the prefix cache held when it started.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PRUNING_POLICIES = ("streaming", "snapkv", "pyramidkv")


@dataclass(slots=True)
class PruningPlan:
    """What to drop from one sequence's table."""

    drop_indices: list[int]  # table indices of the blocks to drop, ascending (`KVCacheManager.drop_blocks`)
    num_blocks_kept: int


def check_pruning(policy: str | None, keep_ratio: float, num_sink_tokens: int, window_tokens: int,
                  budget_tokens: int | None) -> None:
    """Raise `ValueError` (naming the field and its allowed values) for a pruning setting that cannot be honoured."""
    if policy is None:
        return
    if policy not in PRUNING_POLICIES:
        raise ValueError(
            f"PagedConfig.kv_pruning={policy!r} is not implemented; use one of {[None, *PRUNING_POLICIES]}"
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
    num_tokens: int, block_size: int, droppable: list[bool], *, budget_blocks: int, num_sink_tokens: int,
    window_tokens: int, block_scores: torch.Tensor | None = None,
) -> PruningPlan:
    """Choose the blocks to drop from a table of `num_tokens` tokens (`droppable[i]`: block i may go; the engine
    passes every full block).

    Sinks (the blocks holding the first `num_sink_tokens` table positions) and the blocks holding the last
    `window_tokens` positions are kept. The rest of the budget goes to the highest `block_scores` (SnapKV); with no
    scores (StreamingLLM) nothing else is kept. Blocks that are not droppable are kept and count against the budget.
    """
    num_blocks = -(-num_tokens // block_size)
    sink_blocks = -(-num_sink_tokens // block_size)
    first_window_block = max(0, num_tokens - window_tokens) // block_size
    kept = set(range(min(sink_blocks, num_blocks))) | set(range(first_window_block, num_blocks))
    kept |= {i for i in range(num_blocks) if not droppable[i]}
    candidates = [i for i in range(num_blocks) if i not in kept]
    room = max(0, budget_blocks - len(kept))
    if block_scores is not None and room and candidates:
        order = sorted(candidates, key=lambda i: (-float(block_scores[i]), i))
        kept |= set(order[:room])
    drop = [i for i in range(num_blocks) if i not in kept]
    return PruningPlan(drop, num_blocks - len(drop))


def pyramid_budgets(budget_blocks: int, num_layers: int, floor_blocks: int) -> list[int]:
    """Per-layer budgets, linear from 1.5x (first layer) to 0.5x (last), never under `floor_blocks`."""
    if num_layers == 1:
        return [budget_blocks]
    return [max(floor_blocks, round(budget_blocks * (1.5 - layer / (num_layers - 1)))) for layer in range(num_layers)]
