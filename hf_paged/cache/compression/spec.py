"""`CompressionSpec`: what `PagedConfig` asks of compressed KV, checked against the model, and what it costs.

Built once per cache from the config and the model's `KVShape`; holds no tensors and no per-step state. It answers
which KV heads of a layer take which format (head groups), which heads stream (sinks + window), the bytes of a
block and of a streaming slot, and how many blocks a memory budget buys once the full-precision staging rows and
the streaming store are paid for. The runtime maps shared by the compressed layers live in `CompressedPlanner`; the
tensors in each `CompressedLayer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from hf_paged.cache.compression.formats import BlockFormat, formats_for
from hf_paged.cache.sizing import KVShape, budget_bytes, max_useful_blocks
from hf_paged.config import PagedConfig

HeadGroup = tuple[list[int], BlockFormat]  # (KV head indices, the format they are stored in)


class CompressionSpec:
    """Formats, head groups, streaming heads and byte costs of a cache's compressed KV.

    `enabled` is True when some block is stored in another format than the model dtype, or some head streams (the
    streaming store needs the compressed block life cycle, even under "auto")."""

    def __init__(self, cfg: PagedConfig, kv_shape: KVShape) -> None:
        if cfg.kv_key_derotate and not kv_shape.rope_frequencies:
            raise ValueError(
                "PagedConfig.kv_key_derotate=True needs the model's RoPE frequencies, but its config names no "
                "rope_theta (rope_parameters); set kv_key_derotate=False for this model"
            )
        self.cfg = cfg
        self.kv_shape = kv_shape
        self.block_size = cfg.block_size
        frequencies = kv_shape.rope_frequencies if cfg.kv_key_derotate else ()
        self.key_format, self.value_format = formats_for(cfg.key_dtype, cfg.value_dtype, cfg.value_quant_group,
                                                         cfg.kv_scale_format, frequencies)
        streaming = cfg.kv_streaming_heads
        self.has_streaming_heads = bool(streaming and any(streaming))
        self.enabled = self.key_format.is_quantized or self.value_format.is_quantized or self.has_streaming_heads
        for fmt in (self.key_format, self.value_format):  # e.g. int4 needs an even head_dim: fail now, not mid-forward
            fmt.part_shapes(self.block_size, kv_shape.num_kv_heads, kv_shape.head_dim)
        for name in ("kv_full_precision_heads", "kv_streaming_heads"):
            heads = getattr(cfg, name)
            if heads is not None and (len(heads) > kv_shape.num_layers
                                      or any(h >= kv_shape.num_kv_heads for l in heads for h in l)):
                raise ValueError(
                    f"PagedConfig.{name}={heads!r} does not fit the model: allowed at most "
                    f"{kv_shape.num_layers} layers of KV head indices in [0, {kv_shape.num_kv_heads})"
                )
        # Streaming heads keep sinks + window blocks per sequence (`streaming_heads`).
        self.sink_blocks = -(-cfg.num_sink_tokens // self.block_size)
        self.window_blocks = -(-cfg.window_tokens // self.block_size)

    # -- heads -----------------------------------------------------------------------------------------
    def _layer_heads(self, name: str, layer_idx: int) -> list[int]:
        chosen = getattr(self.cfg, name)
        return sorted(set(chosen[layer_idx])) if chosen is not None and layer_idx < len(chosen) else []

    def head_groups(self, layer_idx: int, num_kv_heads: int) -> tuple[list[HeadGroup], list[HeadGroup]]:
        """(key groups, value groups): heads named in `PagedConfig.kv_full_precision_heads[layer_idx]` stay in the
        model dtype, the rest use the configured format. Streaming heads (`streaming_groups`) are in neither."""
        full = self._layer_heads("kv_full_precision_heads", layer_idx)
        streaming = self._layer_heads("kv_streaming_heads", layer_idx)
        rest = [h for h in range(num_kv_heads) if h not in full and h not in streaming]
        auto = BlockFormat("auto")
        return [(full, auto), (rest, self.key_format)], [(full, auto), (rest, self.value_format)]

    def streaming_groups(self, layer_idx: int) -> tuple[HeadGroup, HeadGroup]:
        """(key, value) `(streaming KV heads, format)` of a layer: the format of its other compressed heads."""
        heads = self._layer_heads("kv_streaming_heads", layer_idx)
        return (heads, self.key_format), (heads, self.value_format)

    # -- costs -----------------------------------------------------------------------------------------
    @property
    def slots_per_seq(self) -> int:
        """Streaming-store slots one sequence can hold: sinks + window (+2: the block filling now, one released
        this step)."""
        return self.sink_blocks + self.window_blocks + 2

    def bytes_per_block(self, dtype: torch.dtype) -> int:
        """Main-storage bytes of one block over every layer (staging rows and streaming slots not included)."""
        return self._group_bytes(dtype, lambda i: self.head_groups(i, self.kv_shape.num_kv_heads))

    def streaming_bytes_per_slot(self, dtype: torch.dtype) -> int:
        """Bytes of one streaming-store slot over every layer (0 without streaming heads)."""
        return self._group_bytes(dtype, lambda i: [[g] for g in self.streaming_groups(i)])

    def _group_bytes(self, dtype: torch.dtype, groups_of: Callable[[int], Iterable[Iterable[HeadGroup]]]) -> int:
        s = self.kv_shape
        total = 0
        for layer_idx in range(s.num_layers):
            for groups in groups_of(layer_idx):
                for heads, fmt in groups:
                    if heads:
                        total += fmt.bytes_per_block(self.block_size, len(heads), s.head_dim, dtype)
        return total

    def num_blocks_for_budget(self, model_dtype: torch.dtype, device: torch.device | str | None) -> int:
        """What the budget buys in compressed blocks once the staging rows and the streaming heads' store are paid
        for, so that `max_cache_bytes` bounds all of it. n blocks need min(max_num_seqs, n) + 2 staging rows (one
        model-dtype block per partially written block, see `CompressedPlanner`)."""
        cfg = self.cfg
        dense = self.kv_shape.bytes_per_block(self.block_size, model_dtype)
        per_block = max(1, self.bytes_per_block(model_dtype))
        slots = min(cfg.max_num_seqs * self.slots_per_seq, 4 * self.slots_per_seq)
        budget = budget_bytes(cfg, device) - slots * self.streaming_bytes_per_slot(model_dtype) - 2 * dense
        blocks = budget // (per_block + dense)  # while n <= max_num_seqs, each block brings a staging row
        if blocks > cfg.max_num_seqs:
            blocks = (budget - cfg.max_num_seqs * dense) // per_block
        if cfg.max_cache_bytes is None:  # the default budget: no more than the sequences could use
            blocks = min(blocks, max_useful_blocks(cfg, self.kv_shape))
        if blocks < 1:
            raise ValueError(
                f"PagedConfig.max_cache_bytes={cfg.max_cache_bytes} cannot hold one compressed block beside the "
                f"full-precision staging rows of partially written blocks ({dense} bytes each, at least 3); raise "
                "max_cache_bytes"
            )
        return int(blocks)
