"""`MergedLayer`: a layer under `head_merge` whose key blocks hold only the representatives' KV heads.

    key_cache    [num_blocks, block_size, len(merge.kept_kv_heads), head_dim]   the kept key heads, ascending
    value_cache  [num_blocks, block_size, num_kv_heads, head_dim]               every value head, as unmerged

Same slots, copies and swaps as `PagedLayer` (it is one, with narrower keys): the engine path stores the kept key
heads and every value head and returns a `MergedBlocks`, which the step's backend attends with scores once per
cluster (`head_merge_attention`). The stock `cache=` path cannot: stock attention computes every query head's scores
against its own key head, which is not stored; it raises.
"""

from __future__ import annotations

import torch

from hf_paged.cache.head_merge import LayerMerge
from hf_paged.cache.head_merge_attention import MergedIndices
from hf_paged.cache.huge_pages import pool_empty
from hf_paged.cache.layer_kv import MergedBlocks
from hf_paged.cache.metadata import PagedMetadata
from hf_paged.cache.paged_layer import PagedLayer
from hf_paged.cache.stock_rows import StockRows
from hf_paged.errors import UnsupportedGenerationError

__all__ = ["MergedLayer"]


class MergedLayer(PagedLayer):
    """A `PagedLayer` whose keys are stored for `merge.kept_kv_heads` only."""

    def __init__(self, layer_idx: int, rows: StockRows, merge: LayerMerge, *, num_blocks: int,
                 block_size: int, huge_pages: bool = False) -> None:
        super().__init__(layer_idx, rows, num_blocks=num_blocks, block_size=block_size, attention_backend="torch",
                         huge_pages=huge_pages)
        self.merge = merge
        self._kept: dict[torch.device, torch.Tensor] = {}
        self._indices: dict[torch.device, MergedIndices] = {}

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        num_kv_heads, head_dim = value_states.shape[1], value_states.shape[-1]
        if num_kv_heads != self.merge.num_kv_heads:
            raise ValueError(
                f"layer {self.layer_idx}: head_merge was made for {self.merge.num_kv_heads} KV heads, attention "
                f"gives {num_kv_heads} (tensor parallelism splits heads: head merging needs the whole layer)"
            )
        self.device = value_states.device
        keys = (self.num_blocks, self.block_size, len(self.merge.kept_kv_heads), head_dim)
        values = (self.num_blocks, self.block_size, num_kv_heads, head_dim)
        with torch.inference_mode(False):  # swaps and copy-on-write write the storage outside inference mode
            self.key_cache = pool_empty(keys, key_states.dtype, self.device, huge_pages=self.huge_pages)[0]
            self.value_cache = pool_empty(values, value_states.dtype, self.device, huge_pages=self.huge_pages)[0]
        self.is_initialized = True

    def store(self, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write the kept key heads and every value head of `[T, kv_heads, head_dim]` into their slots."""
        key_cache, value_cache = self._storage()
        kept = self._kept.get(key.device)
        if kept is None:
            kept = self._kept[key.device] = torch.tensor(self.merge.kept_kv_heads, dtype=torch.long,
                                                         device=key.device)
        slots = slot_mapping.long()
        key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slots, key.index_select(1, kept).to(key_cache.dtype))
        value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slots, value.to(value_cache.dtype))

    def store_packed(self, key: torch.Tensor, value: torch.Tensor, metadata: PagedMetadata) -> MergedBlocks:
        self.store(key, value, metadata.slot_mapping_on(key.device))
        key_cache, value_cache = self._storage()
        indices = self._indices.get(key.device)
        if indices is None:
            indices = self._indices[key.device] = MergedIndices(self.merge, key.device)
        return MergedBlocks(key_cache, value_cache, self.merge, indices)

    def update_dense(self, key_states: torch.Tensor,
                     value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise UnsupportedGenerationError(
            "PagedConfig.head_merge serves the paged engine only (Engine, a wrapped model's generate): stock "
            "attention over `cache=` needs every key head, and a merged layer stores the representatives' only; "
            "use the engine, or head_merge=None for the stock cache= path"
        )
