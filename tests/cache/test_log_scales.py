"""Scales stored as one-byte log codes (`PagedConfig.kv_scale_format="log8"`): codes, formats, bytes, cache, engine."""

from __future__ import annotations

import pytest
import torch

from hf_paged import PagedCache, PagedConfig
from hf_paged.cache.compression.formats import BlockFormat, decode_log_scale, encode_log_scale, formats_for
from tests.cache.engine_parity import check_engine_parity
from tests.tiny_models import left_pad, ragged_prompts, tiny_model


def test_codes_are_powers_of_two_to_the_tenth_rounded_up():
    scales = torch.tensor([1.0, 0.5, 0.3, 2.0**-16, 1e-9, 2.0**9.5, 1e6])
    codes = encode_log_scale(scales)
    assert codes.dtype == torch.uint8
    assert codes.tolist() == [160, 150, 143, 0, 0, 255, 255]  # 0.3 -> 2^-1.7 = 0.3078; beyond 2^9.5: the last code
    assert decode_log_scale(codes)[:2].tolist() == [1.0, 0.5]
    assert decode_log_scale(torch.tensor([0, 255], dtype=torch.uint8)).tolist() == [2.0**-16, pytest.approx(2**9.5)]


def test_encoding_picks_the_smallest_code_not_below_the_scale():
    scales = torch.logspace(-15.95, 9.45, 20001, base=2.0)  # inside the range, dense enough to hit every code
    codes = encode_log_scale(scales)
    above, below = decode_log_scale(codes), decode_log_scale(codes.float() - 1)
    assert bool((above >= scales).all()) and bool((below < scales).all())
    assert float((above / scales).max()) <= 2 ** 0.1 + 1e-6  # at most one step (7.2%) above
    assert set(codes.tolist()) == set(range(1, 256))  # 2^-15.95 -> code 1 (2^-15.9), 2^9.45 -> 255 (2^9.5)


def test_int4_key_channels_on_a_power_of_two_grid_round_trip_exactly():
    # One block of 16 tokens, 1 head x 4 dims; channel d holds t * 2^(d - 2) + offset: a range of 15 x 2^(d - 2),
    # so the scale is exactly 2^(d - 2) (codes 140, 150, 160, 170) and every value is on the grid.
    t = torch.arange(16.0)[:, None]
    x = (t * 2.0 ** torch.arange(-2.0, 2.0) + torch.tensor([0.0, -3.0, 1.0, -60.0]))[None, :, None, :]
    fmt = BlockFormat("int4", per_channel=True, log_scale=True)
    parts = fmt.quantize(x)
    assert parts["scale"].dtype == torch.uint8 and parts["scale"][0, 0].tolist() == [140, 150, 160, 170]
    assert parts["zero"][0, 0].tolist() == [0, 6, -1, 30]
    assert torch.equal(fmt.dequantize(parts, torch.float32), x)


def test_int8_per_head_log_scales_round_up_and_stay_within_one_step():
    x = torch.tensor([[[[127.0, -3.0], [0.3, 0.1]]]])  # [1 block, 1 token, 2 heads, 2 dims]
    fmt = BlockFormat("int8", per_head=True, log_scale=True)
    parts = fmt.quantize(x)
    # head 0: 127 / 127 = 1 exactly (code 160); head 1: 0.3 / 127 = 2^-8.73, rounded up to 2^-8.7 (code 73)
    assert parts["scale"][0, 0].tolist() == [160, 73]
    assert parts["data"][0, 0].tolist() == [[127, -3], [125, 42]]  # 0.3 / 2^-8.7 = 124.8, 0.1 / 2^-8.7 = 41.6
    back = fmt.dequantize(parts, torch.float32)
    assert back[0, 0, 0].tolist() == [127.0, -3.0]
    assert (back - x)[0, 0, 1].abs().max() <= 2.0**-8.7 / 2


@pytest.mark.parametrize(("name", "per_channel", "per_head", "fp16", "log8"), [
    ("int4", True, False, 704, 640),  # keys: 512 data + 2x32 x (2 + 1) -> x (1 + 1)
    ("int4", False, True, 608, 576),  # values per head: 512 + 16x2 x 3 -> x 2
    ("int4", False, False, 560, 544),
    ("int8", False, False, 1056, 1040),  # 1024 + 16 x 2 -> x 1
    ("fp8", False, True, 1088, 1056),
])  # fmt: skip
def test_bytes_per_block_with_one_byte_scales(name, per_channel, per_head, fp16, log8):
    # The default model's shape: 2 KV heads x 32 dims, block 16
    for log_scale, expected in ((False, fp16), (True, log8)):
        fmt = BlockFormat(name, per_channel=per_channel, per_head=per_head, log_scale=log_scale)
        assert fmt.bytes_per_block(16, 2, 32, torch.bfloat16) == expected
    key, value = formats_for("int4", "int4", "head", "log8")
    bf16 = 2 * BlockFormat("auto").bytes_per_block(16, 2, 32, torch.bfloat16)
    assert (key.bytes_per_block(16, 2, 32, torch.bfloat16) + value.bytes_per_block(16, 2, 32, torch.bfloat16)) / bf16 \
        == 0.296875  # vs 0.3203125 with fp16 scales


def test_config_and_formats_validate_the_scale_format():
    with pytest.raises(ValueError, match=r"PagedConfig.kv_scale_format must be one of \['fp16', 'log8'\], got 'fp8'"):
        PagedConfig(kv_cache_dtype="int4", kv_scale_format="fp8")
    with pytest.raises(ValueError, match=r"kv_scale_format must be one of \['fp16', 'log8'\]"):
        formats_for("int4", "int4", "token", "e8m0")
    key, value = formats_for("int8", "auto", "token", "log8")
    assert key.log_scale and not value.log_scale  # nothing to scale in full precision
    assert not any(f.log_scale for f in formats_for("int4", "int4"))  # the default stays fp16


def test_cache_stores_uint8_scales_and_reports_their_bytes():
    model = tiny_model("llama")  # 2 layers, 2 KV heads x 8 dims
    ids, mask = left_pad(ragged_prompts([5, 9]))
    config = PagedConfig(block_size=4, num_blocks=10, max_num_seqs=2, kv_cache_dtype="int4", value_quant_group="head",
                         kv_scale_format="log8")
    cache = PagedCache(model.config, config)
    model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, cache=cache)
    keys, values = cache.layers[0].compressed
    assert keys.parts["0.scale"].dtype == torch.uint8 and keys.parts["0.scale"].shape == (10, 2, 8)
    assert values.parts["0.scale"].dtype == torch.uint8 and values.parts["0.scale"].shape == (10, 4, 2)
    assert int(keys.parts["0.scale"].max()) > 0  # written (blocks filled), not the zeros it was allocated with
    # per layer and block: keys 4x2x4 + 2x8 x 2 = 64 bytes, values 4x2x4 + 4x2 x 2 = 48 bytes
    assert cache.stats()["kv_bytes_per_block"] == 2 * (64 + 48)
    cache.check_integrity()


def test_stock_cache_argument_with_int8_log_scales_keeps_greedy_tokens():
    model = tiny_model("llama")
    ids, mask = left_pad(ragged_prompts([3, 17, 33], seed=1))
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    cache = PagedCache(model.config, PagedConfig(block_size=16, num_blocks=64, kv_cache_dtype="int8",
                                                 kv_scale_format="log8"))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, cache=cache)
    assert torch.equal(out, stock)
    cache.check_integrity()


@pytest.mark.parametrize("streaming", [None, {"kv_streaming_heads": ((1,), ()), "num_sink_tokens": 8,
                                              "window_tokens": 8}])
def test_engine_parity_with_log_scales_chunked_swapped_and_prefix_shared(streaming):
    check_engine_parity({"block_size": 8, "kv_cache_dtype": "int4", "value_quant_group": "head",
                         "kv_scale_format": "log8"}, streaming)
