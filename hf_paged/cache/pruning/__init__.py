"""Token pruning (SnapKV, StreamingLLM, PyramidKV): full blocks dropped from a live sequence's table.

    selection   which blocks to drop: policies, budgets (`prompt_budget_blocks`, `pyramid_budgets`),
                `select_blocks` -> `PruningPlan`; the settings check (`check_pruning`)
    scores      what SnapKV ranks blocks by: the last prompt queries' attention (`observation_scores`, taken by
                the attention path), pooled into one score per block (`pooled_block_scores`)
    hiding      PyramidKV: the kept blocks a layer did not choose, masked out of its attention plan

The policy is chosen by `PagedConfig.kv_pruning` (formerly `kv_eviction`); the engine side that applies it
after each forward is `hf_paged.batching.kv_pruning.KVPruner`. "Eviction" elsewhere in the cache means the prefix
cache giving back idle cached blocks (`radix.py`, `eviction_policy.py`), never this.
"""

from __future__ import annotations

from hf_paged.cache.pruning.hiding import hide_positions
from hf_paged.cache.pruning.scores import OBSERVATION_WINDOW, observation_scores, pooled_block_scores
from hf_paged.cache.pruning.selection import (
    PRUNING_POLICIES,
    PruningPlan,
    check_pruning,
    prompt_budget_blocks,
    pyramid_budgets,
    select_blocks,
)

__all__ = [
    "OBSERVATION_WINDOW",
    "PRUNING_POLICIES",
    "PruningPlan",
    "check_pruning",
    "hide_positions",
    "observation_scores",
    "pooled_block_scores",
    "prompt_budget_blocks",
    "pyramid_budgets",
    "select_blocks",
]
