"""int4 keys quantized in the block's RoPE frame (`PagedConfig.kv_key_derotate`, `cache/key_frame.py`)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, Phi3Config

from hf_paged import PagedCache, PagedConfig
from hf_paged.cache.compression.formats import BlockFormat, formats_for
from hf_paged.cache.compression.key_frame import rope_frequencies, rotate_by_offset
from tests.cache.engine_parity import check_engine_parity
from tests.tiny_models import ragged_prompts, tiny_model


def test_rope_frequencies_of_configs():
    llama = LlamaConfig(hidden_size=32, num_attention_heads=4, rope_parameters={"rope_type": "default",
                                                                               "rope_theta": 10000.0})
    assert rope_frequencies(llama) == pytest.approx((1.0, 0.1, 0.01, 0.001))  # head_dim 8: theta^(-2i/8)
    phi3 = Phi3Config(hidden_size=32, num_attention_heads=4, partial_rotary_factor=0.5)
    assert rope_frequencies(phi3) == pytest.approx((1.0, 10000.0**-0.5))  # 4 rotary dims of 8
    assert rope_frequencies(tiny_model("gpt2").config) == ()  # learned positions: no RoPE


def test_rotation_by_offset_is_undone_and_leaves_offset_zero_and_non_rotary_dims_alone():
    x = torch.randn(2, 4, 3, 10)
    freqs = (1.0, 0.3, 0.01, 0.2)  # rotary dims 0..7 in pairs (d, d + 4); dims 8, 9 untouched
    turned = rotate_by_offset(x, freqs, -1.0)
    assert torch.equal(turned[:, 0], x[:, 0]) and torch.equal(turned[..., 8:], x[..., 8:])
    # offset 2, pair (0, 4) at frequency 1: turned by -2 rad
    c, s = math.cos(-2.0), math.sin(-2.0)
    expected = torch.stack((x[:, 2, :, 0] * c - x[:, 2, :, 4] * s, x[:, 2, :, 4] * c + x[:, 2, :, 0] * s), -1)
    torch.testing.assert_close(turned[:, 2, :, [0, 4]], expected)
    torch.testing.assert_close(rotate_by_offset(turned, freqs, 1.0), x, atol=1e-5, rtol=1e-5)
    assert rotate_by_offset(x, (), -1.0) is x


def _rotating_keys() -> tuple[torch.Tensor, tuple[float, ...]]:
    """One block of 16 tokens, 1 head x 8 dims: a constant key turned by RoPE at each position 100 + offset."""
    freqs = (1.0, 0.5, 0.05, 0.001)
    k0 = torch.tensor([3.0, -1.0, 0.5, 2.0, 1.0, 2.5, -0.25, -2.0])
    pos = torch.arange(100, 116, dtype=torch.float64)
    angles = (pos[:, None] * torch.tensor(freqs, dtype=torch.float64)).float()
    a, b = k0[:4], k0[4:]
    x = torch.cat((a * angles.cos() - b * angles.sin(), b * angles.cos() + a * angles.sin()), -1)
    return x[None, :, None, :], freqs


@pytest.mark.parametrize("log_scale", [False, True])
def test_keys_that_only_rotate_are_nearly_exact_in_the_block_frame(log_scale):
    x, freqs = _rotating_keys()
    plain = BlockFormat("int4", per_channel=True, log_scale=log_scale)
    framed = BlockFormat("int4", per_channel=True, log_scale=log_scale, rope_frequencies=freqs)
    plain_error = (plain.dequantize(plain.quantize(x), torch.float32) - x).abs().max()
    framed_error = (framed.dequantize(framed.quantize(x), torch.float32) - x).abs().max()
    # In the frame every channel is constant over the block: range 0, scale |value| / 127 (rounded up <= 7.2%),
    # so the error is at most half a step of 3.2 / 127 (the largest |value| is |k0| rotated: <= 3.2) + fp32 noise.
    assert framed_error <= 3.2 / 127 / 2 * 1.08 + 1e-5
    assert plain_error > 0.05  # the fast pairs sweep their circle: steps of range / 15
    assert framed.bytes_per_block(16, 2, 32, torch.bfloat16) == plain.bytes_per_block(16, 2, 32, torch.bfloat16)


def test_formats_and_config_validate_the_key_frame():
    key, value = formats_for("int4", "int4", "head", "log8", (1.0, 0.5))
    assert key.rope_frequencies == (1.0, 0.5) and value.rope_frequencies == ()  # keys only
    assert formats_for("int8", "int4", "token", "fp16", (1.0,))[0].rope_frequencies == ()  # per token: no effect
    with pytest.raises(ValueError, match=r"kv_key_derotate=True acts on int4 keys .* but the keys are 'int8'"):
        PagedConfig(kv_cache_dtype="int8", kv_key_derotate=True)
    with pytest.raises(ValueError, match=r"PagedConfig.kv_key_derotate must be True or False, got 1"):
        PagedConfig(kv_cache_dtype="int4", kv_key_derotate=1)
    PagedConfig(key_cache_dtype="int4", value_cache_dtype="int8", kv_key_derotate=True)  # int4 keys: accepted
    with pytest.raises(ValueError, match=r"kv_key_derotate=True needs the model's RoPE frequencies"):
        PagedCache(tiny_model("gpt2").config, PagedConfig(kv_cache_dtype="int4", kv_key_derotate=True, num_blocks=4))


def test_cache_keeps_derotated_keys_and_the_fused_kernels_refuse_them():
    model = tiny_model("llama")
    cache = PagedCache(model.config, PagedConfig(block_size=4, num_blocks=8, kv_cache_dtype="int4",
                                                 kv_key_derotate=True))
    assert cache.key_format.rope_frequencies == rope_frequencies(model.config)
    assert len(cache.key_format.rope_frequencies) == 4  # tiny llama: head_dim 8
    ids = torch.tensor([ragged_prompts([9])[0]])
    model.generate(ids, max_new_tokens=3, do_sample=False, cache=cache)
    keys, values = cache.layers[0].compressed
    assert not keys.kernel_readable and values.kernel_readable
    with pytest.raises(ValueError, match=r"fused kernels cannot read keys stored in the block's RoPE frame"):
        keys.kernel_operand()
    cache.check_integrity()


@pytest.mark.parametrize("streaming", [None, {"kv_streaming_heads": ((1,), ()), "num_sink_tokens": 8,
                                              "window_tokens": 8}])
def test_engine_parity_with_derotated_keys_chunked_swapped_and_prefix_shared(streaming):
    # streaming heads read their derotated keys through the same format
    check_engine_parity({"block_size": 8, "kv_cache_dtype": "int4", "value_quant_group": "head",
                         "kv_scale_format": "log8", "kv_key_derotate": True}, streaming)
