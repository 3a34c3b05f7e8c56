"""What a layer's engine-path update hands to attention: typed values, one class per storage kind.

    BlockLayer.update_packed(key, value, metadata) -> LayerKV
      PlainBlocks       PagedLayer: the block storage itself, read through the step's block tables
      CompressedBlocks  CompressedLayer: the quantized stores in place, the step's touched blocks in full
                        precision, the step's plan (which rows a query reads) and the layer's streaming heads
      MergedBlocks      MergedLayer (`head_merge`): plain blocks whose keys hold only the representatives' KV
                        heads, and the layer's merge (which query head uses whose probabilities)

Attention (`attention_backends`) matches on the class: the set is closed, and each value carries everything the
backends read, so nothing travels through the step's metadata. Which layer an attention module stores into is its
`layer_idx` (`layer_index`: required, never defaulted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hf_paged.errors import UnsupportedModelError

if TYPE_CHECKING:  # pragma: no cover
    from hf_paged.cache.compression.blocks import CompressedKV, StepPlan
    from hf_paged.cache.head_merge import LayerMerge
    from hf_paged.cache.head_merge_attention import MergedIndices

__all__ = ["CompressedBlocks", "LayerKV", "MergedBlocks", "PlainBlocks", "layer_index"]


@dataclass(frozen=True, slots=True)
class PlainBlocks:
    """A plain layer's storage after this step's K/V were stored: slot s of block b is `keys[b, s]`."""

    keys: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim], model dtype
    values: torch.Tensor


@dataclass(frozen=True, slots=True)
class CompressedBlocks:
    """A compressed layer after this step's writes: blocks that filled are quantized in `stores`, the blocks the
    step wrote are in `touched_*` (full precision, indexed as `plan.touched_ids`)."""

    plan: StepPlan  # the step's writes and reads, shared by every layer
    stores: tuple[CompressedKV, CompressedKV]  # (keys, values): quantized main storage, read in place by kernels
    touched_keys: torch.Tensor  # [len(plan.touched_ids), block_size, kv_heads, head_dim]
    touched_values: torch.Tensor
    streaming_heads: tuple[int, ...]  # this layer's KV heads that see only sinks + window (DuoAttention)

    @property
    def kernel_readable(self) -> bool:
        """The fused-dequant kernels can read both stores in place (one format for every head, no streaming
        heads, keys not in the block's RoPE frame)."""
        return self.stores[0].kernel_readable and self.stores[1].kernel_readable

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The torch path's read buffers `[n, bs, H, D]`: the step's full blocks dequantized, then the touched
        blocks (indexed through `plan.virtual_tables`)."""
        keys, values = self.stores
        return keys.read(self.plan, self.touched_keys), values.read(self.plan, self.touched_values)


@dataclass(frozen=True, slots=True)
class MergedBlocks:
    """A merged layer's storage after this step's writes (`head_merge`): slot s of block b is `keys[b, s]` and
    `values[b, s]`, keys for `merge.kept_kv_heads` only."""

    keys: torch.Tensor  # [num_blocks, block_size, len(merge.kept_kv_heads), head_dim], model dtype
    values: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    merge: LayerMerge
    indices: MergedIndices  # the merge as index tensors on the layer's device (`head_merge_attention`)


LayerKV = PlainBlocks | CompressedBlocks | MergedBlocks


def layer_index(module: torch.nn.Module) -> int:
    """The decoder layer an attention module belongs to (transformers sets `layer_idx` on attention modules)."""
    layer_idx = getattr(module, "layer_idx", None)
    if not isinstance(layer_idx, int):
        raise UnsupportedModelError(
            f"{type(module).__name__} has no integer `layer_idx` (got {layer_idx!r}): the paged engine finds each "
            "layer's cache by it; this model's attention modules cannot run under hf_paged (use stock generate)"
        )
    return layer_idx
