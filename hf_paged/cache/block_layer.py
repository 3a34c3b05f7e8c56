"""`BlockLayer(CacheLayerMixin)`: what every layer of a `PagedCache` shares, whatever its storage.

As in transformers' `cache_utils` (`DynamicLayer`, `QuantizedLayer`), each layer owns its tensors and its
`update`; the cache holds the layers and the bookkeeping they share (block pool, block tables, the stock path's
rows). Two storages derive from it: `PagedLayer` (blocks in the model dtype) and `CompressedLayer` (quantized
blocks, head groups, streaming heads).

Two paths:
- engine: the step's attention backend (`attention_backends`, a model kwarg `paged_backend`) calls
  `update_packed` itself, as vLLM's attention implementations write the cache and then attend: the packed new K/V
  `[T, kv_heads, head_dim]` go to their slots and the layer returns a typed `LayerKV` (`layer_kv`) that the backend
  reads. Transformers' `update` sees the engine's kwarg and hands the new K/V through untouched (the backend stores
  them), so the value never travels through the step's metadata or a per-layer lookup;
- stock `cache=`: dense `[batch, kv_heads, q_len, head_dim]` K/V of the rows of `StockRows`; `update` returns the
  dense history `[batch, kv_heads, kv_len, head_dim]` stock attention expects (transformers' contract).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import CacheLayerMixin

from hf_paged.cache.metadata import PagedMetadata
from hf_paged.cache.stock_rows import StockRows

if TYPE_CHECKING:  # pragma: no cover
    from hf_paged.cache.compression.planner import StagingCopy
    from hf_paged.cache.layer_kv import LayerKV


class BlockLayer(CacheLayerMixin):
    """One decoder layer's K/V in blocks of `block_size` slots, created at its first update (device and dtype of
    that layer's K/V, so a model split over devices keeps each layer's blocks beside the layer)."""

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, layer_idx: int, rows: StockRows) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.rows = rows  # the stock path's rows, shared by every layer of the cache
        self.device: torch.device | None = None  # set by `lazy_initialization`

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        model_kwargs = kwargs.get("kwargs") or {}
        if model_kwargs.get("paged_backend") is not None:
            return key_states, value_states  # engine path: the step's attention backend stores them (module doc)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self.update_dense(key_states, value_states)

    def update_packed(self, key: torch.Tensor, value: torch.Tensor, metadata: PagedMetadata) -> LayerKV:
        """Engine path: store `[T, kv_heads, head_dim]` at the step's slots; return what attention reads."""
        if not self.is_initialized:  # transformers' layout [1, kv_heads, T, head_dim]
            self.lazy_initialization(key.transpose(0, 1)[None], value.transpose(0, 1)[None])
        metadata.store_once(self)
        return self.store_packed(key, value, metadata)

    @abstractmethod
    def store_packed(self, key: torch.Tensor, value: torch.Tensor, metadata: PagedMetadata) -> LayerKV:
        """`update_packed` on an initialized layer."""

    @abstractmethod
    def update_dense(self, key_states: torch.Tensor,
                     value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stock path: store `[batch, kv_heads, q_len, head_dim]` for every row; return the dense history."""

    @abstractmethod
    def copy_blocks(self, src: torch.Tensor, dst: torch.Tensor,
                    staging_copies: list[StagingCopy] | None = None) -> None:
        """Copy-on-write: block `dst[i]` takes the contents of `src[i]`; `staging_copies`: the staging rows of
        partially written blocks (compressed layers only), copied in order."""

    @abstractmethod
    def save_blocks(self, block_ids: list[int]) -> object | None:
        """CPU copies of the blocks' K/V (swap out); None for a layer never written."""

    @abstractmethod
    def load_blocks(self, block_ids: list[int], saved: object) -> None:
        """Write back what `save_blocks` copied, into (possibly other) blocks `block_ids` (swap in)."""

    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of every tensor the layer holds (0 before its first update)."""

    def staging_nbytes(self) -> int:
        """Bytes of the full-precision staging rows of partially written blocks (compressed layers)."""
        return 0

    @property
    @abstractmethod
    def storage_dtype(self) -> torch.dtype | None:
        """The model dtype the layer's K/V arrived in (None before its first update)."""

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.rows.seq_length(self.layer_idx)

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        pass  # sequences are reset by the cache; storage is kept for reuse
