"""Preemption by swapping: a request's K/V blocks go to CPU memory and come back into fresh blocks."""

from __future__ import annotations

from dataclasses import dataclass

from hf_paged.batching.request import Request
from hf_paged.cache.paged_cache import PagedCache


@dataclass(slots=True)
class SwappedKV:
    num_tokens: int  # computed tokens held by the copy (logical: dropped ones included)
    num_dropped_tokens: int  # of those, dropped by token pruning before the swap
    layers: list  # per layer: what `PagedCache.save_blocks` copied (None for a layer never written)
    hidden: dict[int, list[int]] | None = None  # PyramidKV's hidden table blocks per layer (`hidden_blocks`)
    num_prefix_blocks: int | None = None  # leading blocks the prefix cache may take (`KVCacheManager.prefix_blocks`)


def swap_out(cache: PagedCache, request: Request) -> None:
    """Copy the request's computed K/V to CPU (its blocks are freed by the scheduler right after)."""
    block_ids = cache.manager.block_ids(request.request_id)
    dropped = cache.manager.num_dropped_tokens(request.request_id)
    num_blocks = -(-(request.num_computed_tokens - dropped) // cache.block_size)
    layers = cache.save_blocks(block_ids[:num_blocks])
    request.swapped = SwappedKV(request.num_computed_tokens, dropped, layers,
                                cache.manager.hidden_blocks(request.request_id),
                                cache.manager.prefix_blocks(request.request_id))


def swap_in(cache: PagedCache, request: Request) -> bool:
    """Take fresh blocks for the swapped tokens and copy the K/V back; False (nothing taken) if they do not fit."""
    swapped: SwappedKV = request.swapped
    manager = cache.manager
    manager.add_sequence(request.request_id)
    if not manager.allocate_slots(request.request_id, swapped.num_tokens - swapped.num_dropped_tokens):
        manager.free(request.request_id)
        return False
    manager.restore_dropped(request.request_id, swapped.num_dropped_tokens, swapped.hidden, swapped.num_prefix_blocks)
    cache.load_blocks(manager.block_ids(request.request_id), swapped.layers)
    request.num_computed_tokens = swapped.num_tokens
    return True
