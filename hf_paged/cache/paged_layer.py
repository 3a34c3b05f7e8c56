"""`PagedLayer`: one decoder layer's K/V in plain blocks of the model dtype.

    key_cache / value_cache  [num_blocks, block_size, num_kv_heads, head_dim]
    slot s = block_id * block_size + offset  ->  key_cache.view(-1, kv_heads, head_dim)[s]

The engine path stores the step's packed K/V at `metadata.slot_mapping` and returns the block storage itself as a
`PlainBlocks` (the step's attention backend reads it through the block tables: no padding, no dense copy). The
stock path stores each row's new tokens at its slots and gathers each row's history back into a dense tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hf_paged.cache.block_layer import BlockLayer
from hf_paged.cache.huge_pages import pool_empty
from hf_paged.cache.layer_kv import PlainBlocks
from hf_paged.cache.metadata import PagedMetadata
from hf_paged.cache.stock_rows import StockRows

if TYPE_CHECKING:  # pragma: no cover
    from hf_paged.cache.compression.planner import StagingCopy


@dataclass(slots=True)
class SavedPlainBlocks:
    """CPU copies of some blocks of a `PagedLayer` (swap)."""

    keys: torch.Tensor  # [n, block_size, kv_heads, head_dim]
    values: torch.Tensor


class PagedLayer(BlockLayer):
    """One decoder layer's K/V storage: `[num_blocks, block_size, num_kv_heads, head_dim]` each."""

    def __init__(self, layer_idx: int, rows: StockRows, *, num_blocks: int, block_size: int,
                 attention_backend: str = "auto", huge_pages: bool = False) -> None:
        super().__init__(layer_idx, rows)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.attention_backend = attention_backend  # `PagedConfig.attention_backend`: picks the store kernel
        self.key_cache: torch.Tensor | None = None
        self.value_cache: torch.Tensor | None = None
        self.store_fn = None  # the unchecked store backend, set by the first (checked) store of this layer
        self.huge_pages = huge_pages  # `PagedConfig.kv_huge_pages`: storage from `huge_pages.pool_empty`

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        num_kv_heads, head_dim = key_states.shape[1], key_states.shape[-1]
        shape = (self.num_blocks, self.block_size, num_kv_heads, head_dim)
        self.device = key_states.device
        # Normal (not inference-mode) tensors: the first update may run under inference_mode, but swaps and
        # copy-on-write must be able to write the storage outside it.
        with torch.inference_mode(False):
            self.key_cache = pool_empty(shape, key_states.dtype, key_states.device, huge_pages=self.huge_pages)[0]
            self.value_cache = pool_empty(shape, value_states.dtype, value_states.device,
                                          huge_pages=self.huge_pages)[0]
        self.is_initialized = True

    def _storage(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.key_cache is None or self.value_cache is None:
            raise RuntimeError(f"layer {self.layer_idx} has no storage before its first update")
        return self.key_cache, self.value_cache

    def store(self, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write key/value `[T, kv_heads, head_dim]` into their slots (every slot >= 0: the engine's slots always
        are). The checked public `store_kv` runs once; later calls go to the backend directly (the arguments come
        from the cache itself, every step alike)."""
        key_cache, value_cache = self._storage()
        key, value = key.to(key_cache.dtype), value.to(value_cache.dtype)
        if self.store_fn is None:
            from hf_paged.cache.kernels import store_kv, store_kv_backend

            store_kv(key, value, key_cache, value_cache, slot_mapping, backend=self.attention_backend)
            self.store_fn = store_kv_backend(self.attention_backend, key.device)
            return
        self.store_fn(key, value, key_cache, value_cache, slot_mapping)

    def store_packed(self, key: torch.Tensor, value: torch.Tensor, metadata: PagedMetadata) -> PlainBlocks:
        self.store(key, value, metadata.slot_mapping_on(key.device))  # the layer's device
        return PlainBlocks(*self._storage())

    def update_dense(self, key_states: torch.Tensor,
                     value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, heads, q_len, dim = key_states.shape
        write = self.rows.begin(self.layer_idx, batch, q_len)
        slots = self.rows.slots(write.start, write.end).view(-1).to(self.device)
        self.store(key_states.transpose(1, 2).reshape(batch * q_len, heads, dim),
                   value_states.transpose(1, 2).reshape(batch * q_len, heads, dim), slots)
        total = write.end
        gather = self.rows.slots(0, total).view(-1).to(self.device)
        key_cache, value_cache = self._storage()
        heads, dim = key_cache.shape[-2], key_cache.shape[-1]
        keys = key_cache.view(-1, heads, dim).index_select(0, gather).view(batch, total, heads, dim)
        values = value_cache.view(-1, heads, dim).index_select(0, gather).view(batch, total, heads, dim)
        return keys.transpose(1, 2), values.transpose(1, 2)

    def copy_blocks(self, src: torch.Tensor, dst: torch.Tensor,
                    staging_copies: list[StagingCopy] | None = None) -> None:
        if not self.is_initialized:
            return
        key_cache, value_cache = self._storage()
        key_cache[dst.to(self.device)] = key_cache[src.to(self.device)]
        value_cache[dst.to(self.device)] = value_cache[src.to(self.device)]

    def save_blocks(self, block_ids: list[int]) -> SavedPlainBlocks | None:
        if not self.is_initialized:
            return None
        key_cache, value_cache = self._storage()
        i = torch.tensor(block_ids, dtype=torch.long).to(self.device)
        return SavedPlainBlocks(key_cache[i].to("cpu"), value_cache[i].to("cpu"))

    def load_blocks(self, block_ids: list[int], saved: object) -> None:
        if not isinstance(saved, SavedPlainBlocks):
            raise TypeError(f"layer {self.layer_idx} holds plain blocks; got {type(saved).__name__} to load")
        key_cache, value_cache = self._storage()
        i = torch.tensor(block_ids, dtype=torch.long).to(self.device)
        key_cache[i] = saved.keys.to(self.device)
        value_cache[i] = saved.values.to(self.device)

    def nbytes(self) -> int:
        if self.key_cache is None or self.value_cache is None:
            return 0
        return self.key_cache.nbytes + self.value_cache.nbytes

    @property
    def storage_dtype(self) -> torch.dtype | None:
        return None if self.key_cache is None else self.key_cache.dtype
