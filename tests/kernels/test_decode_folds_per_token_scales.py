"""Which decode variant the host picks for a quantized cache (`triton_decode.decode_launches`): K and V with one
scale per token (int8, fp8) fold their scales into the scores and probabilities (`FOLD_SCALES`, no per-element
dequant); int4, per-channel keys, a full-precision side, or `fold_scales=False` dequantize the tiles."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hf_paged.cache.compression import BlockFormat
from hf_paged.cache.kernels.triton_decode import decode_launches, default_decode_config
from tests.kernels.paged_cases import make_case
from tests.kernels.quantized_cases import quantize_case, requantize


@pytest.mark.parametrize(("key", "value", "folded"), [
    (BlockFormat("int8"), BlockFormat("int8"), True),
    (BlockFormat("fp8"), BlockFormat("fp8"), True),
    (BlockFormat("int8"), BlockFormat("fp8"), True),
    (BlockFormat("int8", per_head=True, log_scale=True), BlockFormat("int8", per_head=True, log_scale=True), True),
    (BlockFormat("int8"), BlockFormat("int4"), False),
    (BlockFormat("int4", per_channel=True), BlockFormat("int8"), False),
    (BlockFormat("auto"), BlockFormat("int8"), False),
])
def test_per_token_scales_are_folded(key, value, folded):
    case = make_case([20, 9], [1, 1], num_heads=4, num_kv_heads=2, head_dim=32, block_size=8, dtype=torch.float32)
    qc = requantize(quantize_case(case, "int8", "int8"), key, value)
    config = default_decode_config(case.query, qc.key, qc.value, case.block_tables)
    for fold, want in ((True, folded), (False, False)):
        (main, *_) = decode_launches(case.query, qc.key, qc.value, case.block_tables, case.context_lens,
                                     case.query.clone(), scale=case.scale, tail=qc.tail,
                                     config=dataclasses.replace(config, fold_scales=fold))
        assert main.constexprs["FOLD_SCALES"] is want, (key, value, fold)
