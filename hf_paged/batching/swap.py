"""Preemption by swapping: a request's K/V blocks go to CPU memory and come back into fresh blocks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hf_paged.batching.request import Request
from hf_paged.cache.paged_cache import PagedCache


@dataclass(slots=True)
class SwappedKV:
    num_tokens: int  # computed tokens held by the copy
    layers: list[tuple[torch.Tensor, torch.Tensor] | None]  # per layer (keys, values) [blocks, block_size, ...]


def swap_out(cache: PagedCache, request: Request) -> None:
    """Copy the request's computed K/V to CPU (its blocks are freed by the scheduler right after)."""
    block_ids = cache.manager.block_ids(request.request_id)
    num_blocks = -(-request.num_computed_tokens // cache.block_size)
    idx = torch.tensor(block_ids[:num_blocks], dtype=torch.long)
    layers = []
    for layer in cache.layers:
        if not layer.is_initialized:
            layers.append(None)
            continue
        i = idx.to(layer.device)
        layers.append((layer.key_cache[i].to("cpu"), layer.value_cache[i].to("cpu")))
    request.swapped = SwappedKV(request.num_computed_tokens, layers)


def swap_in(cache: PagedCache, request: Request) -> bool:
    """Take fresh blocks for the swapped tokens and copy the K/V back; False (nothing taken) if they do not fit."""
    swapped: SwappedKV = request.swapped
    manager = cache.manager
    manager.add_sequence(request.request_id)
    if not manager.allocate_slots(request.request_id, swapped.num_tokens):
        manager.free(request.request_id)
        return False
    idx = torch.tensor(manager.block_ids(request.request_id), dtype=torch.long)
    for layer, saved in zip(cache.layers, swapped.layers):
        if saved is None:
            continue
        i = idx.to(layer.device)
        layer.key_cache[i] = saved[0].to(layer.device)
        layer.value_cache[i] = saved[1].to(layer.device)
    request.num_computed_tokens = swapped.num_tokens
    return True
