"""Values quantized per (token, KV head) (`PagedConfig.value_quant_group="head"`): format, bytes, cache, kernels."""

from __future__ import annotations

import pytest
import torch

from hf_paged import PagedCache, PagedConfig
from hf_paged.cache.compression.formats import BlockFormat, formats_for
from tests.cache.engine_parity import check_engine_parity
from tests.kernels.paged_cases import make_case
from tests.kernels.quantized_cases import assert_kernels_match_oracle, quantize_case, requantize
from tests.tiny_models import left_pad, ragged_prompts, tiny_model


def _two_heads_far_apart() -> torch.Tensor:
    """One token, two KV heads x 8 dims: head 0 on the grid of step 0.5, head 1 on the grid of step 10."""
    x = torch.zeros(1, 1, 2, 8)
    x[0, 0, 0] = torch.tensor([0, 1, 2, 3, 4, 5, 6, 15]) * 0.5
    x[0, 0, 1] = torch.tensor([0, 15, 2, 3, 4, 5, 6, 7]) * 10.0
    return x


def test_int4_per_head_scales_are_exact_per_head_where_per_token_is_not():
    x = _two_heads_far_apart()
    fmt = BlockFormat("int4", per_head=True)
    parts = fmt.quantize(x)
    assert parts["scale"].shape == (1, 1, 2) and parts["zero"].shape == (1, 1, 2)
    assert parts["scale"][0, 0].tolist() == [0.5, 10.0] and parts["zero"][0, 0].tolist() == [0, 0]
    assert torch.equal(fmt.dequantize(parts, torch.float32), x)
    per_token = BlockFormat("int4")
    back = per_token.dequantize(per_token.quantize(x), torch.float32)  # one scale of 150 / 15 = 10 for both heads
    assert back[0, 0, 0].tolist() == [0, 0, 0, 0, 0, 0, 0, 10]


def test_int8_per_head_scales():
    x = _two_heads_far_apart()
    fmt = BlockFormat("int8", per_head=True)
    parts = fmt.quantize(x)
    assert parts["scale"][0, 0].tolist() == [torch.tensor(7.5 / 127).half().item(), torch.tensor(150 / 127).half().item()]
    back = fmt.dequantize(parts, torch.float32)
    assert (back - x)[0, 0, 0].abs().max() <= 7.5 / 127 / 2 * 1.01


def test_formats_and_config_choose_per_head_values_only():
    key, value = formats_for("int4", "int4", "head")
    assert key.per_channel and not key.per_head and value.per_head and not value.per_channel
    assert not formats_for("int4", "auto", "head")[1].per_head  # nothing to scale in full precision
    assert not formats_for("int4", "int4")[1].per_head  # the default stays per token
    with pytest.raises(ValueError, match=r"PagedConfig.value_quant_group must be one of \['token', 'head'\]"):
        PagedConfig(kv_cache_dtype="int4", value_quant_group="channel")
    with pytest.raises(ValueError, match=r"value_quant_group must be one of \['token', 'head'\]"):
        formats_for("int4", "int4", "dim")


def test_bytes_of_int4_with_per_head_values():
    # The default model's shape: 2 KV heads x 32 dims, block 16. Keys 512 data + 2x32 x 3 scale/zero bytes;
    # values 512 data + 16x2 x 3 (per head) instead of 16 x 3 (per token).
    key, value = formats_for("int4", "int4", "head")
    assert key.bytes_per_block(16, 2, 32, torch.bfloat16) == 704
    assert value.bytes_per_block(16, 2, 32, torch.bfloat16) == 608
    assert BlockFormat("int4").bytes_per_block(16, 2, 32, torch.bfloat16) == 560
    bf16 = 2 * BlockFormat("auto").bytes_per_block(16, 2, 32, torch.bfloat16)
    assert (704 + 608) / bf16 == 0.3203125  # vs (704 + 560) / 4096 = 0.30859375 per token


def test_cache_stores_per_head_value_scales_and_reports_their_bytes():
    model = tiny_model("llama")  # 2 layers, 2 KV heads x 8 dims
    ids, mask = left_pad(ragged_prompts([5, 9]))
    config = PagedConfig(block_size=4, num_blocks=10, max_num_seqs=2, kv_cache_dtype="int4", value_quant_group="head")
    cache = PagedCache(model.config, config)
    model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, cache=cache)
    keys, values = cache.layers[0].compressed
    assert values.parts["0.scale"].shape == (10, 4, 2) and values.parts["0.zero"].shape == (10, 4, 2)
    assert keys.parts["0.scale"].shape == (10, 2, 8)  # keys unchanged: per channel
    # per layer and block: keys 4x2x4 + 2x8 x 3 = 80 bytes, values 4x2x4 + 4x2 x 3 = 56 bytes
    assert cache.stats()["kv_bytes_per_block"] == 2 * (80 + 56)
    cache.check_integrity()


def test_stock_cache_argument_with_int8_per_head_values_keeps_greedy_tokens():
    model = tiny_model("llama")
    ids, mask = left_pad(ragged_prompts([3, 17, 33], seed=1))
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    cache = PagedCache(model.config, PagedConfig(block_size=16, num_blocks=64, kv_cache_dtype="int8",
                                                 value_quant_group="head"))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, cache=cache)
    assert torch.equal(out, stock)
    cache.check_integrity()


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_fused_kernels_read_per_head_value_scales(fmt):
    # Triton (the interpreter on CPU) and the torch reference against the dense oracle, decode and prefill.
    for context_lens, q_lens in (([1, 17, 40], [1, 1, 1]), ([20, 40], [7, 40])):
        case = make_case(context_lens, q_lens, num_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
                         dtype=torch.float32, seed=3)
        case.value_cache[:, :, 1] *= 30.0  # heads of very different magnitude: a per-token scale would blur head 0
        case.dense_values = [v.clone() for v in case.dense_values]
        for v in case.dense_values:
            v[:, 1] *= 30.0
        qc = requantize(quantize_case(case, fmt, fmt, seed=1), value=BlockFormat(fmt, per_head=True))
        assert_kernels_match_oracle(qc)


def test_engine_parity_with_per_head_values_chunked_swapped_and_prefix_shared():
    check_engine_parity({"block_size": 8, "kv_cache_dtype": "int4", "value_quant_group": "head"})
