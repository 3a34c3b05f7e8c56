"""`PagedCache(Cache)` and `PagedLayer(CacheLayerMixin)`: K/V of every layer in preallocated blocks.

Two ways to drive it:

1. Stock path: pass it as `cache=` to stock `model.generate` (sdpa/eager attention). Each batch row is a sequence
   of the cache's own `KVCacheManager`; `update()` stores the new K/V into the rows' slots and returns the dense
   `[batch, kv_heads, kv_len, head_dim]` K/V that stock attention expects. Beam search reorders block tables
   (shared blocks, copy-on-write), it does not copy K/V.
2. Engine path: the engine passes a `PagedMetadata` as the `paged_metadata` model kwarg; `update()` stores the
   packed new K/V at `metadata.slot_mapping` and returns the block storage itself, which the registered
   `hf_paged` attention function reads through the block tables. No padding, no dense copy.

Storage of each layer is created at its first update, on the device and in the dtype of that layer's K/V (so a
model split over devices keeps each layer's pages beside the layer).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.compressed_cache import CompressedCacheMixin
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.metadata import PagedMetadata
from hf_paged.cache.sizing import KVShape, check_fits_device, kv_shape_of, num_blocks_for
from hf_paged.config import PagedConfig


class PagedLayer(CacheLayerMixin):
    """One decoder layer's K/V storage: `[num_blocks, block_size, num_kv_heads, head_dim]` each."""

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, cache: PagedCache, layer_idx: int) -> None:
        super().__init__()
        self.cache = cache
        self.layer_idx = layer_idx
        self.key_cache: torch.Tensor | None = None  # uncompressed storage ("auto" keys and values)
        self.value_cache: torch.Tensor | None = None
        self.compressed: tuple | None = None  # (keys, values) `CompressedKV` when a format quantizes
        self.store_fn = None  # the unchecked store backend, set by the first (checked) store of this layer

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        num_kv_heads, head_dim = key_states.shape[1], key_states.shape[-1]
        shape = (self.cache.num_blocks, self.cache.block_size, num_kv_heads, head_dim)
        self.device = key_states.device
        if self.cache.compressed:
            self.compressed = self.cache.new_compressed_storage(self.layer_idx, num_kv_heads, head_dim, key_states)
            self.is_initialized = True
            return
        # Normal (not inference-mode) tensors: the first update may run under inference_mode, but swaps and
        # copy-on-write must be able to write the storage outside it.
        with torch.inference_mode(False):
            self.key_cache = torch.empty(shape, dtype=key_states.dtype, device=key_states.device)
            self.value_cache = torch.empty(shape, dtype=value_states.dtype, device=value_states.device)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        model_kwargs = kwargs.get("kwargs") or {}
        metadata = model_kwargs.get("paged_metadata")
        if metadata is not None:
            return self._update_packed(key_states, value_states, metadata)
        return self.cache._update_dense(self, key_states, value_states)

    def _update_packed(self, key_states, value_states, metadata: PagedMetadata):
        # key_states [1, kv_heads, T, head_dim] -> [T, kv_heads, head_dim]
        key = key_states[0].transpose(0, 1)
        value = value_states[0].transpose(0, 1)
        if self.compressed is not None:
            return self.cache.write_and_read(self, key, value, self.cache.step_plan_of(metadata), defer_read=True)
        self.cache.store(self, key, value, metadata.slot_mapping_on(self.device))
        return self.key_cache, self.value_cache

    def copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        if self.compressed is not None:
            for store in self.compressed:
                for t in store.parts.values():
                    t[dst.to(self.device)] = t[src.to(self.device)]
        elif self.is_initialized:
            self.key_cache[dst.to(self.device)] = self.key_cache[src.to(self.device)]
            self.value_cache[dst.to(self.device)] = self.value_cache[src.to(self.device)]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.cache.stock_seq_length(self.layer_idx)

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        pass  # sequences are reset by the cache; storage is kept for reuse

    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        if self.compressed is not None:
            return sum(store.nbytes() for store in self.compressed)
        return self.key_cache.nbytes + self.value_cache.nbytes


class PagedCache(CompressedCacheMixin, Cache):
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
        self.paged_config = paged_config or PagedConfig()
        self.kv_shape: KVShape = kv_shape_of(config)
        self.block_size = self.paged_config.block_size
        self.num_blocks = num_blocks_for(self.paged_config, self.kv_shape, dtype or _config_dtype(config), device)
        self._init_compression()
        if self.compressed and self.paged_config.num_blocks is None:
            self.num_blocks = self._compressed_num_blocks(dtype or _config_dtype(config), device)
            self._init_compression()
        check_fits_device(self.paged_config, self.num_blocks, self._bytes_per_block_for(dtype or _config_dtype(config)),
                          device)
        super().__init__(layers=[PagedLayer(self, i) for i in range(self.kv_shape.num_layers)])
        self.pool = BlockPool(self.num_blocks)
        radix = None
        if prefix_cache:
            from hf_paged.cache.radix import RadixCache

            radix = RadixCache(self.pool, self.block_size, policy=self.paged_config.prefix_eviction_policy)
        self.manager = KVCacheManager(self.pool, self.block_size, radix)
        self._rows: int = 0  # stock path: number of batch rows (sequence ids 0 .. rows-1)
        self._row_len: list[int] = [0] * self.kv_shape.num_layers  # stock path: tokens stored per layer

    # -- shared storage mechanics --------------------------------------------------------------------------
    def store(self, layer: PagedLayer, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write key/value `[T, kv_heads, head_dim]` into their slots of `layer` (every slot >= 0: the engine's
        slots always are). The checked public `store_kv` runs once per layer; later calls go to the backend
        directly (the arguments come from the cache itself, every step alike)."""
        key, value = key.to(layer.key_cache.dtype), value.to(layer.value_cache.dtype)
        if layer.store_fn is None:
            from hf_paged.cache.kernels import store_kv, store_kv_backend

            store_kv(key, value, layer.key_cache, layer.value_cache, slot_mapping,
                     backend=self.paged_config.attention_backend)
            layer.store_fn = store_kv_backend(self.paged_config.attention_backend, key.device)
            return
        layer.store_fn(key, value, layer.key_cache, layer.value_cache, slot_mapping)

    def apply_pending_copies(self) -> None:
        """Perform the copy-on-write block copies queued by the manager, in every layer."""
        copies = self.manager.take_pending_copies()
        if not copies:
            return
        if self.compressed:
            for c in copies:
                self.copy_staging(c.src_block_id, c.dst_block_id)
        src = torch.tensor([c.src_block_id for c in copies])
        dst = torch.tensor([c.dst_block_id for c in copies])
        for layer in self.layers:
            layer.copy_blocks(src, dst)

    # -- stock path (dense K/V for stock attention) ----------------------------------------------------------
    def stock_seq_length(self, layer_idx: int) -> int:
        return self._row_len[layer_idx]

    def _update_dense(self, layer: PagedLayer, key_states: torch.Tensor, value_states: torch.Tensor):
        if self.paged_config.kv_eviction is not None:
            raise ValueError(
                f"PagedConfig.kv_eviction={self.paged_config.kv_eviction!r} needs the hf_paged attention (it scores "
                "and drops blocks the stock attention cannot see); allowed on the stock cache= path: None. Use "
                "hf_paged.wrap(model, config) so generate runs on the engine"
            )
        if self.paged_config.kv_streaming_heads and any(self.paged_config.kv_streaming_heads):
            raise ValueError(
                "PagedConfig.kv_streaming_heads needs the hf_paged attention (stock attention cannot restrict some "
                "heads to sinks + window); allowed on the stock cache= path: None. Use hf_paged.wrap(model, config) "
                "so generate runs on the engine"
            )
        batch, _, q_len, _ = key_states.shape
        idx = layer.layer_idx
        start = self._row_len[idx]
        if start == 0 and idx == 0:
            self._start_rows(batch)
        if batch != self._rows:
            raise ValueError(f"PagedCache holds {self._rows} rows but got a batch of {batch}; use a new cache")
        new_step = self._row_len[idx] == self._max_claimed()
        if new_step:
            self._claim(q_len)  # first layer to see this step's tokens claims their slots for every layer
        if layer.compressed is not None:
            self._row_len[idx] = start + q_len
            return self.dense_compressed(layer, key_states, value_states, start, new_step)
        slots = torch.tensor([self.manager.slots(r, start, start + q_len) for r in range(batch)], dtype=torch.long)
        key = key_states.transpose(1, 2).reshape(batch * q_len, *key_states.shape[-3:-2], key_states.shape[-1])
        value = value_states.transpose(1, 2).reshape(batch * q_len, *value_states.shape[-3:-2], value_states.shape[-1])
        self.store(layer, key, value, slots.view(-1).to(layer.device))
        self._row_len[idx] = start + q_len
        total = start + q_len
        gather = torch.tensor([self.manager.slots(r, 0, total) for r in range(batch)], dtype=torch.long)
        gather = gather.view(-1).to(layer.device)
        heads, dim = layer.key_cache.shape[-2], layer.key_cache.shape[-1]
        keys = layer.key_cache.view(-1, heads, dim).index_select(0, gather).view(batch, total, heads, dim)
        values = layer.value_cache.view(-1, heads, dim).index_select(0, gather).view(batch, total, heads, dim)
        return keys.transpose(1, 2), values.transpose(1, 2)

    def _start_rows(self, batch: int) -> None:
        self.manager.reset()
        self._rows = batch
        for r in range(batch):
            self.manager.add_sequence(r)

    def _max_claimed(self) -> int:
        return self.manager.num_tokens(0) if self._rows else 0

    def _claim(self, q_len: int) -> None:
        from hf_paged.cache.sizing import out_of_blocks

        need = sum(self.manager.blocks_needed(r, q_len) for r in range(self._rows))
        if not self.pool.can_allocate(need):
            raise out_of_blocks(need, self.pool.num_free_blocks, self.num_blocks, self.block_size)
        for r in range(self._rows):
            self.manager.allocate_slots(r, q_len)
        self.apply_pending_copies()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row i takes the history of row beam_idx[i] (block tables shared, copy-on-write)."""
        self._remap_rows([int(i) for i in beam_idx.tolist()])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._remap_rows([r for r in range(self._rows) for _ in range(repeats)])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._remap_rows([int(i) for i in indices.tolist()])

    def _remap_rows(self, sources: list[int]) -> None:
        if not self._rows:
            return
        tmp = [("old", r) for r in range(self._rows)]
        for r in range(self._rows):
            self.manager.fork(r, tmp[r])
            self.manager.free(r)
        for new_row, src in enumerate(sources):
            self.manager.fork(tmp[src], new_row)
        for t in tmp:
            self.manager.free(t)
        self._rows = len(sources)

    def crop(self, max_length: int) -> None:
        """Drop tokens past `max_length` (negative: drop that many from the end) in every row."""
        length = self._row_len[0]
        keep = max_length if max_length >= 0 else length + max_length
        if keep >= length:
            return
        if self.compressed and keep % self.block_size:
            raise NotImplementedError(
                f"crop to {keep} tokens would reopen a quantized block (block_size {self.block_size}); crop to a "
                "multiple of block_size or use kv_cache_dtype='auto'"
            )
        for r in range(self._rows):
            self.manager.truncate(r, keep)
        self._row_len = [min(n, keep) for n in self._row_len]

    def reset(self) -> None:
        self.manager.reset()
        self._rows = 0
        self._row_len = [0] * len(self._row_len)

    # -- introspection -----------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Blocks total/used/free/cached, KV bytes allocated and in use, and slots allocated but unused."""
        return {
            "blocks_total": self.num_blocks,
            "blocks_used": self.pool.num_used_blocks,
            "blocks_free": self.pool.num_free_blocks,
            "blocks_cached": self.pool.num_cached_blocks,
            "block_size": self.block_size,
            "kv_bytes_allocated": sum(layer.nbytes() for layer in self.layers),
            "kv_bytes_per_block": self._bytes_per_block(),
            # what the live sequences hold (streaming heads' slots included), not what is preallocated
            "kv_bytes_in_use": self.kv_bytes_in_use(_storage_dtype(self)),
            "kv_staging_bytes": sum(s.staging.nbytes for layer in self.layers if layer.compressed for s in layer.compressed),
            "unused_slots": self.manager.num_unused_slots(),
            "live_sequences": len(self.manager.seqs),
        }

    def _bytes_per_block(self) -> int:
        return self._bytes_per_block_for(_storage_dtype(self))

    def _bytes_per_block_for(self, dtype: torch.dtype) -> int:
        if self.compressed:
            return self.compressed_bytes_per_block(dtype)
        return self.kv_shape.bytes_per_block(self.block_size, dtype)

    def check_integrity(self) -> None:
        self.manager.check_integrity()


def _config_dtype(config) -> torch.dtype:
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _storage_dtype(cache: PagedCache) -> torch.dtype:
    for layer in cache.layers:
        if layer.is_initialized:
            return layer.compressed[0].dtype if layer.compressed else layer.key_cache.dtype
    return torch.float32
