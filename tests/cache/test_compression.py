"""Block formats (quantize / dequantize / packing), their byte cost, and the staging map."""

import pytest
import torch

from hf_paged import PagedCache, PagedConfig
from hf_paged.cache.compression.blocks import SeqSpan, StagingMap, plan_step
from hf_paged.cache.compression.formats import BlockFormat, formats_for
from tests.tiny_models import left_pad, ragged_prompts, tiny_model


def test_int8_is_symmetric_per_token_with_exact_grid_values():
    x = torch.zeros(1, 2, 2, 4)
    x[0, 0, 0] = torch.tensor([127.0, -127.0, 1.0, 0.0]) / 64  # scale 1/64: every value on the grid
    x[0, 1] = 3.0
    parts = BlockFormat("int8").quantize(x)
    assert parts["data"].dtype == torch.int8 and parts["scale"].dtype == torch.float16
    assert parts["data"][0, 0, 0].tolist() == [127, -127, 1, 0]
    assert parts["scale"][0].tolist() == [1 / 64, torch.tensor(3 / 127).half().item()]  # stored in fp16
    assert torch.equal(BlockFormat("int8").dequantize(parts, torch.float32)[0, 0], x[0, 0])


def test_int4_packs_two_values_per_byte_low_nibble_first():
    x = torch.arange(8, dtype=torch.float32).view(1, 1, 1, 8)  # one token: values 0..7, min 0, scale 7/15
    parts = BlockFormat("int4").quantize(x)
    assert parts["data"].shape == (1, 1, 1, 4) and parts["data"].dtype == torch.uint8
    q = (x / (7 / 15)).round().to(torch.uint8)[0, 0, 0]
    expected = [int(q[i]) | int(q[i + 1]) << 4 for i in range(0, 8, 2)]
    assert parts["data"][0, 0, 0].tolist() == expected
    assert parts["zero"].tolist() == [[0]] and parts["zero"].dtype == torch.int8


def test_int4_keys_are_per_channel_over_the_block():
    x = torch.zeros(1, 4, 1, 2)
    x[0, :, 0, 0] = torch.tensor([0.0, 1.0, 2.0, 3.0])  # channel 0 ranges 0..3
    x[0, :, 0, 1] = 100.0  # channel 1 is constant: an outlier channel must not spoil channel 0
    key, value = formats_for("int4", "int4")
    assert key.per_channel and not value.per_channel
    parts = key.quantize(x)
    assert parts["scale"].shape == (1, 1, 2)
    back = key.dequantize(parts, torch.float32)
    assert torch.allclose(back[0, :, 0, 0], x[0, :, 0, 0], atol=0.11)  # per-token scale would be 100/15
    assert torch.allclose(back[0, :, 0, 1], x[0, :, 0, 1], atol=0.05)


@pytest.mark.parametrize("name, per_channel, bound", [("fp8", False, 0.07), ("int8", False, 0.005),
                                                       ("int4", False, 0.07), ("int4", True, 0.07)])
def test_round_trip_error_is_within_the_format_step(name, per_channel, bound):
    torch.manual_seed(0)
    x = torch.rand(3, 16, 2, 32) * 2 - 1
    fmt = BlockFormat(name, per_channel)
    back = fmt.dequantize(fmt.quantize(x), torch.float32)
    assert 0 < (back - x).abs().max() <= bound


@pytest.mark.parametrize("key, value, most", [("int8", "int8", 0.53), ("fp8", "fp8", 0.53), ("int4", "int4", 0.32),
                                              ("int8", "int4", 0.40)])
def test_bytes_per_block_against_bf16_scales_included(key, value, most):
    # The default model's shape: 2 KV heads x 32 dims, block size 16.
    k, v = formats_for(key, value)
    bf16 = BlockFormat("auto").bytes_per_block(16, 2, 32, torch.bfloat16)
    ratio = (k.bytes_per_block(16, 2, 32, torch.bfloat16) + v.bytes_per_block(16, 2, 32, torch.bfloat16)) / (2 * bf16)
    assert ratio <= most


def test_unknown_format_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"key_cache_dtype must be one of \['auto', 'fp8', 'int8', 'int4'\]"):
        formats_for("int3", "int8")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        PagedConfig(kv_cache_dtype="nf4")


def test_staging_rows_follow_blocks_through_a_step():
    staging = StagingMap(2)
    # Sequence A writes 0..5 of [b3, b4] (b3 full, b4 partial); B writes 0..1 of [b7].
    step = plan_step([SeqSpan([3, 4], 0, 6), SeqSpan([7], 0, 2)], 4, staging, lambda: {3, 4, 7})
    assert step.full_ids.tolist() == [3] and staging.rows.keys() == {4, 7}
    assert step.token_rows.tolist() == [0, 1, 2, 3, 4, 5, 8, 9]
    # Next step: A writes 6..7 (b4 becomes full: its row is read, then released), B writes 2.
    step = plan_step([SeqSpan([3, 4], 6, 8), SeqSpan([7], 2, 3)], 4, staging, lambda: {3, 4, 7})
    assert step.read_pos.tolist() == [0, 1] and step.full_ids.tolist() == [4]
    assert staging.rows.keys() == {7}
    assert step.virtual_tables == [[0, 1], [3]]  # full blocks b3, b4 dequantized first, then touched b4, b7


def test_staging_reclaims_rows_of_dead_blocks_before_growing():
    staging = StagingMap(1)
    staging.assign(5, lambda: set())
    assert staging.assign(6, lambda: set()) == 0 and staging.capacity == 1  # block 5's sequence is gone
    staging.assign(7, lambda: {6})
    assert staging.capacity > 1 and set(staging.rows) == {6, 7}


def test_stats_report_the_packed_storage():
    model = tiny_model("llama")  # 2 layers, 2 KV heads x 8 dims
    ids, mask = left_pad(ragged_prompts([5, 9]))
    cache = PagedCache(model.config, PagedConfig(block_size=4, num_blocks=10, max_num_seqs=2, kv_cache_dtype="int4"))
    model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, cache=cache)
    stats = cache.stats()
    # per layer: keys 10 x (4x2x4 bytes + 2x8 x (2+1)), values 10 x (32 + 4 x 3); staging rows x 4x2x8 fp32, x2:
    # the rows grow with use (two sequences held a partial block at once), not to the map's capacity of 4
    rows = cache.layers[0].compressed[0].staging.shape[0]
    assert cache.staging.high_water == 2 and rows == 2 and cache.staging.capacity == 4
    per_layer = 10 * (32 + 48) + 10 * (32 + 12) + 2 * rows * 64 * 4
    assert stats["kv_bytes_allocated"] == 2 * per_layer
    assert stats["kv_bytes_per_block"] == 2 * (32 + 48 + 32 + 12)
    layer = cache.layers[0]
    assert not hasattr(layer, "key_cache") and layer.compressed[0].parts["0.data"].shape == (10, 4, 2, 4)


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_stock_cache_argument_with_8_bit_kv_keeps_greedy_tokens(dtype):
    model = tiny_model("llama")
    ids, mask = left_pad(ragged_prompts([3, 17, 33], seed=1))
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    cache = PagedCache(model.config, PagedConfig(block_size=16, num_blocks=64, kv_cache_dtype=dtype))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, cache=cache)
    assert torch.equal(out, stock)
    cache.check_integrity()


def test_head_aware_precision_keeps_chosen_heads_exact():
    model = tiny_model("llama")  # 2 layers x 2 KV heads
    ids, mask = left_pad(ragged_prompts([21], seed=3))
    config = PagedConfig(block_size=4, num_blocks=16, max_num_seqs=1, kv_cache_dtype="int4",
                         kv_full_precision_heads=((1,), ()))
    cache = PagedCache(model.config, config)
    model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, cache=cache)
    keys = cache.layers[0].compressed[0]
    assert set(keys.parts) == {"0.data", "1.data", "1.scale", "1.zero"}  # head 1 in fp32, head 0 in int4
    assert keys.parts["0.data"].dtype == torch.float32 and keys.parts["0.data"].shape[2] == 1
    # Block 0 of the layer-0 keys: head 1 equals what a plain cache stores, head 0 only approximately.
    plain = PagedCache(model.config, PagedConfig(block_size=4, num_blocks=16))
    model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, cache=plain)
    block = torch.tensor([cache.manager.block_ids(0)[0]])
    exact = plain.layers[0].key_cache[plain.manager.block_ids(0)[0]]
    got = keys.dequantize(block)[0]
    assert torch.equal(got[:, 1], exact[:, 1]) and not torch.equal(got[:, 0], exact[:, 0])
    assert torch.allclose(got[:, 0], exact[:, 0], atol=0.3)
    per_block = cache.stats()["kv_bytes_per_block"]
    # layer 0: K = fp32 head (4x8x4) + int4 head (data 16, scale 8x2, zero 8); V = 128 + (16 + 4x2 + 4)
    # layer 1: K = int4 2 heads (data 32, scale 2x8x2, zero 16); V = data 32 + scale 8 + zero 4
    assert per_block == (128 + 40) + (128 + 28) + (32 + 32 + 16) + (32 + 8 + 4)


def test_full_precision_heads_are_validated():
    with pytest.raises(ValueError, match="kv_full_precision_heads must be None or one tuple of KV head indices"):
        PagedConfig(kv_full_precision_heads=((0, -1),))


@pytest.mark.parametrize("setting", [
    {"kv_cache_dtype": "int4"},
    {"kv_cache_dtype": "int8"},
    {"kv_cache_dtype": "int4", "kv_streaming_heads": ((1,), (0, 1)), "num_sink_tokens": 8, "window_tokens": 16,
     "enable_prefix_caching": False},
])
def test_max_cache_bytes_bounds_compressed_storage_staging_and_streaming_store(setting):
    from hf_paged import Engine, SamplingParams
    from tests.tiny_models import ragged_prompts, tiny_model

    model = tiny_model("llama")
    budget = 200_000
    engine = Engine(model, PagedConfig(block_size=8, max_cache_bytes=budget, **setting))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=4)) for p in ragged_prompts([10, 19], seed=2)]
    engine.run(ids)
    stats = engine.cache.stats()
    assert stats["kv_staging_bytes"] > 0 and stats["kv_bytes_allocated"] <= budget
    with pytest.raises(ValueError, match="max_cache_bytes"):  # staging rows alone exceed it
        Engine(model, PagedConfig(block_size=8, max_cache_bytes=stats["kv_bytes_per_block"] * 2, **setting))


@pytest.mark.parametrize("fmt", [BlockFormat("int4"), BlockFormat("int4", per_head=True),
                                  BlockFormat("int4", per_channel=True), BlockFormat("int8"), BlockFormat("fp8")])
def test_fp16_scales_saturate_instead_of_turning_huge_groups_into_nan(fmt):
    """A group wider than the fp16 scale can express (int4: 15 x 65504 ~ 1e6) stores the largest finite scale, so its
    values read back finite (the extremes clipped) and its small values as they were (the h7 pass: max|v| 3.5e6
    gave an inf scale, NaN logits and token 0 with no error)."""
    x = torch.randn(2, 16, 2, 8)
    x[0, 3] *= 3.5e6 if fmt.name == "int4" else 5e7  # one token far past the fp16 range of its format's scale
    back = fmt.dequantize(fmt.quantize(x), torch.float32)
    assert torch.isfinite(back).all()
    assert (back[0, 3].abs().max() > 1e5) and (back[0, 3].sign() == x[0, 3].sign()).float().mean() > 0.9
    torch.testing.assert_close(back[1], x[1], atol=0.5, rtol=0)  # the other block is untouched by it


def test_int4_cache_over_huge_values_gives_finite_logits():
    from hf_paged import Engine, SamplingParams

    model = tiny_model("gpt2")
    with torch.no_grad():  # layer 0's values ~1e5..1e6: fp32 holds them, an fp16 int4 scale did not
        attn = model.transformer.h[0].attn.c_attn
        width = attn.weight.shape[1] // 3
        attn.weight[:, 2 * width:] *= 1e7
        attn.bias[2 * width:] *= 1e7
    engine = Engine(model, PagedConfig(num_blocks=32, block_size=8, kv_cache_dtype="int4"))
    rid = engine.add_request(ragged_prompts([40], seed=3)[0], SamplingParams(max_new_tokens=4, logprobs=0))
    while engine.has_unfinished:
        engine.step()
    out = engine.pop_output(rid)
    assert out.error is None and all(torch.isfinite(torch.tensor(x.logprob)) for x in out.logprobs)


def test_a_group_within_the_scale_range_keeps_its_zero_point():
    """The saturation fix pinned wide groups' zero points at their centre; an fp16 scale rounded a hair below
    (high - low) / 15 made 0.07% of ordinary groups take that branch too (zero points off by one). Within the
    range a group's zero point is round(-low / scale), as before."""
    from hf_paged.cache.compression.formats import _quantize_int4

    torch.manual_seed(0)
    for trial in range(40):
        x = torch.randn(64, 16, 4, 32) * 10 ** (trial / 8 - 2) + 3 * torch.randn(1).item()
        for per_channel, dims in ((False, (2, 3)), (True, (1,))):
            parts = _quantize_int4(x, per_channel=per_channel)
            low = x.amin(dim=dims)
            expected = (-low / parts["scale"].float()).round().clamp(-128, 127).to(torch.int8)
            assert torch.equal(parts["zero"].reshape(expected.shape), expected)
