"""`PagedCache(Cache)`: K/V of every layer in preallocated blocks, shared through block tables.

Two ways to drive it:

1. Stock path: pass it as `cache=` to stock `model.generate` (sdpa/eager attention). Each batch row is a sequence
   of the cache's own `KVCacheManager` (`StockRows`); each layer's `update()` stores the new K/V into the rows'
   slots and returns the dense `[batch, kv_heads, kv_len, head_dim]` K/V that stock attention expects. Beam search
   reorders block tables (shared blocks, copy-on-write), it does not copy K/V.
2. Engine path: the engine passes the step's attention backend (over its `PagedMetadata`) as the `paged_backend`
   model kwarg; the registered `hf_paged` attention function has it call each layer's `update_packed`, which
   stores the packed new K/V at its slots and returns a typed `LayerKV` the backend reads through the block
   tables (`cache.update` hands the new K/V through untouched). No padding, no dense copy.

As in transformers' `cache_utils`, the layers own their storage and their `update`: `PagedLayer` (blocks in the
model dtype) or, when `PagedConfig` compresses KV, `CompressedLayer` (quantized blocks, head groups, streaming
heads). The cache holds what they share:

    PagedCache
     |- pool (BlockPool), manager (KVCacheManager, optional RadixCache)   blocks, block tables, copy-on-write
     |- rows (StockRows)                                                  the stock path's batch rows
     |- compression (CompressionSpec), planner (CompressedPlanner)       formats and costs; staging rows,
     |                                                                    streaming slots, one plan per step
     '- layers: PagedLayer | CompressedLayer | MergedLayer (head_merge)  tensors, update, copies, swaps
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from hf_paged.cache.block_layer import BlockLayer
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.block_size import resolve_block_size
from hf_paged.cache.compression import (
    BlockFormat,
    CompressedLayer,
    CompressedPlanner,
    CompressionSpec,
    SlotMap,
    StagingMap,
)
from hf_paged.cache.head_merge import merged_bytes_per_block, merged_num_blocks, merges_for_cache
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.merged_layer import MergedLayer
from hf_paged.cache.paged_layer import PagedLayer
from hf_paged.cache.sizing import KVShape, check_fits_device, kv_shape_of, num_blocks_for
from hf_paged.cache.stock_rows import StockRows
from hf_paged.config import PagedConfig

__all__ = ["BlockLayer", "CompressedLayer", "PagedCache", "PagedLayer"]


class PagedCache(Cache):
    """A transformers `Cache` whose K/V live in fixed-size blocks shared through block tables.

    Args:
        config: the model's `PretrainedConfig` (used for layer count, KV heads, head size).
        paged_config: a `PagedConfig`; `None` for defaults.
        dtype: dtype used to size the pool from `max_cache_bytes` (storage takes the K/V dtype at first use).
        device: device used to size the default budget.
        prefix_cache: whether to attach a prefix cache (`RadixCache`); default `paged_config.enable_prefix_caching`
            in the engine, off for the stock `cache=` path.

    Example:
        >>> cache = PagedCache(model.config, PagedConfig(block_size=16))       # doctest: +SKIP
        >>> model.generate(input_ids, attention_mask=mask, cache=cache)        # doctest: +SKIP
    """

    def __init__(
        self,
        config,
        paged_config: PagedConfig | None = None,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        prefix_cache: bool = False,
    ) -> None:
        model_dtype = dtype or _config_dtype(config)
        # block_size "auto": the number it picks for this model and machine (cache/block_size.py)
        cfg = self.paged_config = resolve_block_size(paged_config or PagedConfig(), config, model_dtype, device)
        self.kv_shape: KVShape = kv_shape_of(config)
        self.block_size = cfg.block_size
        self.num_blocks = num_blocks_for(cfg, self.kv_shape, model_dtype, device)
        self.compression = CompressionSpec(cfg, self.kv_shape)
        self.compressed = self.compression.enabled  # some layer stores blocks compressed (or streams heads)
        if self.compressed and cfg.num_blocks is None:
            self.num_blocks = self.compression.num_blocks_for_budget(model_dtype, device)
        self.head_merges = merges_for_cache(config, cfg)  # per layer, or None (`head_merge`: narrower key blocks)
        if self.head_merges is not None:
            self.num_blocks = merged_num_blocks(cfg, self.kv_shape, self.bytes_per_block(model_dtype), device)
        check_fits_device(cfg, self.num_blocks, self.bytes_per_block(model_dtype), device)
        self.pool = BlockPool(self.num_blocks)
        radix = None
        if prefix_cache:
            from hf_paged.cache.radix import RadixCache

            radix = RadixCache(self.pool, self.block_size, policy=cfg.prefix_eviction_policy)
        self.manager = KVCacheManager(self.pool, self.block_size, radix)
        self.manager.partial_reuse = not self.compressed  # a compressed layer's partial block lives in its staging
        self.rows = StockRows(self.manager, self.kv_shape.num_layers, cfg, apply_copies=self.apply_pending_copies)
        # The planner's maps are small and always there (`staging`, `slots`); only compressed layers use them.
        self.planner = CompressedPlanner(self.compression, self.num_blocks, self.manager)
        # `block_layers`: the same objects as transformers' `layers`, typed as ours.
        self.block_layers: list[BlockLayer] = [self._new_layer(i) for i in range(self.kv_shape.num_layers)]
        super().__init__(layers=list(self.block_layers))
        if (cfg.attention_backend == "auto" and model_dtype == torch.float32 and device is not None
                and torch.device(device).type == "cpu"):  # the engine's attention will call the CPU kernels
            from hf_paged.cache.kernels import cpu_warm

            spec = self.compression
            cpu_warm.prepare([cpu_warm.variant_of(spec.key_format, spec.value_format) if self.compressed
                              else cpu_warm.PLAIN])

    def _new_layer(self, layer_idx: int) -> BlockLayer:
        if self.compressed:
            return CompressedLayer(layer_idx, self.rows, self.planner)
        merge = self.head_merges[layer_idx] if self.head_merges is not None else None
        if merge is not None and not merge.is_identity:
            return MergedLayer(layer_idx, self.rows, merge, num_blocks=self.num_blocks, block_size=self.block_size,
                               huge_pages=self.paged_config.kv_huge_pages)
        return PagedLayer(layer_idx, self.rows, num_blocks=self.num_blocks, block_size=self.block_size,
                          attention_backend=self.paged_config.attention_backend,
                          huge_pages=self.paged_config.kv_huge_pages)

    # -- shared storage mechanics --------------------------------------------------------------------------
    def apply_pending_copies(self) -> None:
        """Perform the copy-on-write block copies queued by the manager, in every layer."""
        copies = self.manager.take_pending_copies()
        if not copies:
            return
        staging_copies = self.planner.staging_copies(copies) if self.compressed else None
        src = torch.tensor([c.src_block_id for c in copies])
        dst = torch.tensor([c.dst_block_id for c in copies])
        for layer in self.block_layers:
            layer.copy_blocks(src, dst, staging_copies)

    # -- swap (preemption) ---------------------------------------------------------------------------------
    def save_blocks(self, block_ids: list[int]) -> list:
        """CPU copies of the blocks' K/V in every layer (staged contents of partial blocks included); None for a
        layer never written."""
        return [layer.save_blocks(block_ids) for layer in self.block_layers]

    def load_blocks(self, block_ids: list[int], saved: list) -> None:
        """Write back what `save_blocks` copied, into (possibly other) blocks `block_ids`."""
        for layer, entry in zip(self.block_layers, saved):
            if entry is not None:
                layer.load_blocks(block_ids, entry)

    # -- stock path (batch rows of stock generate) ------------------------------------------------------------
    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row i takes the history of row beam_idx[i] (block tables shared, copy-on-write)."""
        self.rows.remap([int(i) for i in beam_idx.tolist()])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.rows.remap([r for r in range(self.rows.num_rows) for _ in range(repeats)])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.rows.remap([int(i) for i in indices.tolist()])

    def crop(self, max_length: int) -> None:
        """Drop tokens past `max_length` (negative: drop that many from the end) in every row."""
        length = self.rows.seq_length(0)
        keep = max_length if max_length >= 0 else length + max_length
        if keep >= length:
            return
        if self.compressed and keep % self.block_size:
            raise NotImplementedError(
                f"crop to {keep} tokens would reopen a quantized block (block_size {self.block_size}); crop to a "
                "multiple of block_size or use kv_cache_dtype='auto'"
            )
        self.rows.truncate(keep)

    def reset(self) -> None:
        self.rows.reset()

    # -- compression (what the compressed layers share) ------------------------------------------------------
    @property
    def key_format(self) -> BlockFormat:
        return self.compression.key_format

    @property
    def value_format(self) -> BlockFormat:
        return self.compression.value_format

    @property
    def staging(self) -> StagingMap:
        """Block id -> staging row of partially written blocks, shared by the compressed layers."""
        return self.planner.staging

    @property
    def slots(self) -> SlotMap:
        """Block id -> streaming-store slot, shared by the compressed layers."""
        return self.planner.slots

    def compressed_bytes_per_block(self, dtype: torch.dtype) -> int:
        """Main-storage bytes of one compressed block over every layer (staging rows and streaming slots not
        included)."""
        return self.compression.bytes_per_block(dtype)

    def streaming_bytes_per_slot(self, dtype: torch.dtype) -> int:
        """Bytes of one streaming-store slot over every layer (0 without streaming heads)."""
        return self.compression.streaming_bytes_per_slot(dtype)

    # -- introspection -----------------------------------------------------------------------------------
    def kv_bytes_in_use(self, dtype: torch.dtype) -> int:
        """KV bytes the live sequences hold, costing "auto" parts in `dtype`: blocks in block tables x bytes of
        the block groups, plus streaming slots of those blocks x bytes of the streaming groups. Staging rows (one
        partial block per sequence, model dtype) are not included."""
        num_live = len(self.manager.live_block_ids())
        if not self.compressed:
            return num_live * self.bytes_per_block(dtype)
        return (num_live * self.compression.bytes_per_block(dtype)
                + self.planner.live_slots() * self.compression.streaming_bytes_per_slot(dtype))

    def stats(self) -> dict[str, int]:
        """Blocks total/used/free/cached/pinned, KV bytes allocated and in use, and slots allocated but unused."""
        radix = self.manager.prefix_cache
        return {
            "blocks_total": self.num_blocks,
            "blocks_used": self.pool.num_used_blocks,
            "blocks_free": self.pool.num_free_blocks,
            "blocks_cached": self.pool.num_cached_blocks,
            "block_size": self.block_size,
            "kv_bytes_allocated": sum(layer.nbytes() for layer in self.block_layers),
            "kv_bytes_per_block": self.bytes_per_block(self._storage_dtype()),
            # what the live sequences hold (streaming heads' slots included), not what is preallocated
            "kv_bytes_in_use": self.kv_bytes_in_use(self._storage_dtype()),
            "kv_staging_bytes": sum(layer.staging_nbytes() for layer in self.block_layers),
            "unused_slots": self.manager.num_unused_slots(),
            "live_sequences": len(self.manager.seqs),
            # the prefix cache's pinned blocks and the evicted blocks the "cost" policy remembers
            "prefix_pinned_blocks": radix.num_pinned_blocks if radix is not None else 0,
            "prefix_ghost_blocks": radix.num_ghosts if radix is not None else 0,
        }

    def bytes_per_block(self, dtype: torch.dtype) -> int:
        """Main-storage bytes of one block over every layer, "auto" parts costed in `dtype`."""
        if self.compressed:
            return self.compression.bytes_per_block(dtype)
        if self.head_merges is not None:
            return merged_bytes_per_block(self.head_merges, self.block_size, self.kv_shape.head_dim, dtype)
        return self.kv_shape.bytes_per_block(self.block_size, dtype)

    def _storage_dtype(self) -> torch.dtype:
        """The dtype of the first layer written (float32 before any)."""
        for layer in self.block_layers:
            if layer.storage_dtype is not None:
                return layer.storage_dtype
        return torch.float32

    def check_integrity(self) -> None:
        self.manager.check_integrity()


def _config_dtype(config) -> torch.dtype:
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32
