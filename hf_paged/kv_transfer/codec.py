"""The engine's swap copies (`PagedCache.save_blocks`) cut into one block's named tensors, and stacked back.

    save_blocks(ids) -> per layer: SavedPlainBlocks(keys [n, ...], values [n, ...])
                                   | SavedCompressedBlocks(stores: keys, values -> parts {name: [n, ...]})
    block_tensors(saved, i)   -> [("0.k", keys[i]), ("0.v", values[i]), ...]    or  ("0.k.<part>", ...)
    stack_blocks([named, ...]) -> the per-layer objects `load_blocks` takes, for those blocks in order

Only full blocks travel (a partial block's staged rows never do). `ensure_storage` gives a fresh engine's layers
their tensors before its first forward, so blocks can be loaded into them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hf_paged.cache.compression.layer import SavedCompressedBlocks, SavedStore
from hf_paged.cache.paged_cache import PagedCache
from hf_paged.cache.paged_layer import SavedPlainBlocks

__all__ = ["block_tensors", "check_table", "ensure_storage", "is_transferable", "stack_blocks"]

_SIDES = ("k", "v")


def is_transferable(saved: list) -> bool:
    """Whether a `save_blocks` result holds every layer (a layer never written has nothing to send).

    A full block's main storage is the whole block: a compressed layer quantizes a block in the step it fills (and
    a loaded block arrives whole), so a staged copy that may still sit under a full block's id is stale and is not
    sent."""
    return all(layer is not None for layer in saved)


def block_tensors(saved: list, i: int) -> list[tuple[str, torch.Tensor]]:
    """Block `i` of a `save_blocks` result as named tensors, layer by layer."""
    out: list[tuple[str, torch.Tensor]] = []
    for layer_idx, layer in enumerate(saved):
        if isinstance(layer, SavedPlainBlocks):
            out += [(f"{layer_idx}.k", layer.keys[i]), (f"{layer_idx}.v", layer.values[i])]
        elif isinstance(layer, SavedCompressedBlocks):
            for side, store in zip(_SIDES, layer.stores):
                out += [(f"{layer_idx}.{side}.{part}", t[i]) for part, t in store.parts.items()]
        else:
            raise TypeError(f"layer {layer_idx}: cannot transfer {type(layer).__name__}")
    return out


def check_table(cache: PagedCache, block_id: int, blocks: Sequence[dict[str, torch.Tensor]]) -> None:
    """Raise `ValueError` unless every block holds exactly the tensors (names, dtypes, shapes) of this engine's own
    copy of a block (`save_blocks` of `block_id`): the pool's indexed writes would broadcast a narrower tensor over
    every head, or cast another dtype, without a word."""
    expected = {name: (t.dtype, t.shape) for name, t in block_tensors(cache.save_blocks([block_id]), 0)}
    for block in blocks:
        if {name: (t.dtype, t.shape) for name, t in block.items()} != expected:
            raise ValueError("a stored block's tensors are not this engine's block storage")


def stack_blocks(blocks: Sequence[dict[str, torch.Tensor]], num_layers: int, compressed: bool) -> list:
    """What `PagedCache.load_blocks` takes for these blocks, in order, from their named tensors."""
    def stacked(name: str) -> torch.Tensor:
        return torch.stack([b[name] for b in blocks])

    if not compressed:
        return [SavedPlainBlocks(stacked(f"{i}.k"), stacked(f"{i}.v")) for i in range(num_layers)]
    layers = []
    for i in range(num_layers):
        stores = []
        for side in _SIDES:
            prefix = f"{i}.{side}."
            parts = {name[len(prefix):]: stacked(name) for name in blocks[0] if name.startswith(prefix)}
            stores.append(SavedStore(parts))
        layers.append(SavedCompressedBlocks(stores))
    return layers


def ensure_storage(cache: PagedCache, model: torch.nn.Module) -> bool:
    """Whether every layer of `cache` has its tensors. Layers get them at their first forward; before it (a fresh
    engine after a restart) they are created here when the model sits on one device, as that forward would (the
    model's dtype and device, the config's KV heads). Elsewhere (several devices, tensor parallelism: a rank holds
    its own heads) the loads wait for that forward."""
    layers = cache.block_layers
    if all(layer.is_initialized for layer in layers):
        return True
    devices = {p.device for p in model.parameters()}
    if len(devices) != 1 or (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    param, shape = next(model.parameters()), cache.kv_shape
    empty = torch.empty(1, shape.num_kv_heads, 0, shape.head_dim, dtype=param.dtype, device=param.device)
    for layer in layers:
        if not layer.is_initialized:
            layer.lazy_initialization(empty, empty)
    return True
