"""KV compression: full blocks quantized once, the open block in full precision, streaming heads beside them.

    PagedConfig --CompressionSpec (spec)--> formats per head group, streaming heads, bytes, blocks per budget
    BlockFormat (formats)      quantize a full block once, dequantize what a step reads (int8 / int4 / fp8, log8
                               scales, int4 keys in the block's RoPE frame: key_frame)
    CompressedKV (blocks)      one K or V store: quantized blocks + the full-precision staging rows; the plan of a
                               step (`StepPlan`: which rows a query reads, which blocks fill and get quantized)
    CompressedPlanner (planner) the staging-row and slot maps shared by the layers, a `StepPlan` once per step
    CompressedLayer (layer)    one decoder layer's stores, its `update`, swap and copy-on-write copies
    streaming_heads            heads that keep sinks + a recent window in their own slots (`SlotMap`), chosen by
                               calibration (`calibrate_streaming_heads`, `calibrate_retrieval_heads`)

Loaded on first use: the modules of this package import the cache's bookkeeping (`sizing`, `block_layer`,
`kernels`), which import this face back, so the face resolves a name only when it is asked for. Modules inside the
package import each other by their own paths, never through the face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_paged.lazy import lazy_attributes

_LAZY = {
    "StagingMap": "hf_paged.cache.compression.blocks",
    "StepPlan": "hf_paged.cache.compression.blocks",
    "calibrate_retrieval_heads": "hf_paged.cache.compression.calibration",
    "calibrate_streaming_heads": "hf_paged.cache.compression.calibration",
    "choose_streaming_heads": "hf_paged.cache.compression.calibration",
    "BlockFormat": "hf_paged.cache.compression.formats",
    "rope_frequencies": "hf_paged.cache.compression.key_frame",
    "CompressedLayer": "hf_paged.cache.compression.layer",
    "CompressedPlanner": "hf_paged.cache.compression.planner",
    "StagingCopy": "hf_paged.cache.compression.planner",
    "CompressionSpec": "hf_paged.cache.compression.spec",
    "SlotMap": "hf_paged.cache.compression.streaming_heads",
    "split_attention": "hf_paged.cache.compression.streaming_heads",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


if TYPE_CHECKING:  # pragma: no cover
    from hf_paged.cache.compression.blocks import StagingMap, StepPlan
    from hf_paged.cache.compression.calibration import (
        calibrate_retrieval_heads,
        calibrate_streaming_heads,
        choose_streaming_heads,
    )
    from hf_paged.cache.compression.formats import BlockFormat
    from hf_paged.cache.compression.key_frame import rope_frequencies
    from hf_paged.cache.compression.layer import CompressedLayer
    from hf_paged.cache.compression.planner import CompressedPlanner, StagingCopy
    from hf_paged.cache.compression.spec import CompressionSpec
    from hf_paged.cache.compression.streaming_heads import SlotMap, split_attention

__all__ = [
    "BlockFormat",
    "CompressedLayer",
    "CompressedPlanner",
    "CompressionSpec",
    "SlotMap",
    "StagingCopy",
    "StagingMap",
    "StepPlan",
    "calibrate_retrieval_heads",
    "calibrate_streaming_heads",
    "choose_streaming_heads",
    "rope_frequencies",
    "split_attention",
]
