"""int4 decode on the split-nibble kernel (`triton_int4`) and on the joined tiles (`load_kv_tile`), both values of
`DecodeLaunchConfig.split_nibbles`: Triton (the interpreter on CPU) against the dense oracle and the torch reference.

The cases of test_kernel_quantized: poisoned unused bytes (nibbles 15), scales (NaN) and zero points (127), partial
blocks and odd context lengths (the full-precision tail), split-K on and off, GQA, fp16 / fp32 (bf16 on a GPU),
head_dim 32 / 64 / 128, log8 scale codes; every scale grouping of int4 (keys per channel as the engine stores them,
per token, per KV head).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hf_paged.cache.compression import BlockFormat
from hf_paged.cache.kernels import launch, paged_decode_attention
from hf_paged.cache.kernels.triton_decode import decode_launches, default_decode_config, paged_decode_attention_triton
from tests.kernels.paged_cases import make_case, tolerance
from tests.kernels.quantized_cases import dense_quantized_attention, quantize_case, requantize
from tests.kernels.test_kernel_quantized import BF16

DECODE = [1, 16, 17, 70, 130]  # one key, a full block only, ending mid-block, several tiles
TOKEN = BlockFormat("int4")
LAYOUTS = {  # (keys, values)
    "K per token, V per token": (TOKEN, TOKEN),
    "K per channel, V per token (the engine's)": (BlockFormat("int4", per_channel=True), TOKEN),
    "K per channel, V per head, log8": (BlockFormat("int4", per_channel=True, log_scale=True),
                                        BlockFormat("int4", per_head=True, log_scale=True)),
    "K per head, V per channel, log8": (BlockFormat("int4", per_head=True, log_scale=True),
                                        BlockFormat("int4", per_channel=True, log_scale=True)),
    "K per token, V per token, log8": (BlockFormat("int4", log_scale=True), BlockFormat("int4", log_scale=True)),
}


def _case(key: BlockFormat, value: BlockFormat, *, dtype=torch.float32, head_dim=32, num_heads=8, num_kv_heads=2,
          lens=DECODE, seed=0):  # fmt: skip
    case = make_case(lens, [1] * len(lens), num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     block_size=16, dtype=dtype, seed=seed)  # fmt: skip
    return requantize(quantize_case(case, "int4", "int4", seed=seed + 1), key, value)


def _run(qc, split_nibbles: bool, num_splits: int | None = None, window: int | None = None):
    c = qc.case
    config = default_decode_config(c.query, qc.key, qc.value, c.block_tables)
    config = dataclasses.replace(config, split_nibbles=split_nibbles, num_splits=num_splits or config.num_splits)
    (main, *_) = decode_launches(c.query, qc.key, qc.value, c.block_tables, c.context_lens, c.query.clone(),
                                 scale=c.scale, tail=qc.tail, sliding_window=window, config=config)  # fmt: skip
    assert main.kernel.__name__ == ("_decode_split_kernel" if split_nibbles else "_decode_kernel")
    return paged_decode_attention_triton(c.query, qc.key, qc.value, c.block_tables, c.context_lens, scale=c.scale,
                                         tail=qc.tail, sliding_window=window, config=config)  # fmt: skip

# The joined tiles (False) are the default kernel, which test_kernel_quantized.py and test_kernel_log_scales.py run
# on the same formats in the default run; here they are the control, in the slow run only (CI's time).
BOTH_KERNELS = [True, pytest.param(False, marks=pytest.mark.slow)]


def _check(out, qc, dtype, window=None):
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_quantized_attention(qc, window), **tolerance(dtype))


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16])
@pytest.mark.parametrize("split_nibbles", BOTH_KERNELS)
def test_int4_per_token_decode_matches_oracle_and_reference(split_nibbles, dtype, head_dim):
    qc = _case(TOKEN, TOKEN, dtype=dtype, head_dim=head_dim, seed=head_dim)
    reference = paged_decode_attention(qc.case.query, qc.key, qc.value, qc.case.block_tables, qc.case.context_lens,
                                       scale=qc.case.scale, tail=qc.tail, backend="torch")  # fmt: skip
    for num_splits in (1, 3):  # one program per sequence and head (direct store), and split-K + merge
        out = _run(qc, split_nibbles, num_splits)
        _check(out, qc, dtype)
        torch.testing.assert_close(out, reference, **tolerance(dtype))


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("split_nibbles", BOTH_KERNELS)
def test_int4_scale_groupings_and_log_codes(split_nibbles, layout):
    key, value = LAYOUTS[layout]
    for dtype in (torch.float32, torch.float16):
        qc = _case(key, value, dtype=dtype, seed=7)
        assert (qc.key.data == 0xFF).any() and (qc.value.zero == 127).any()  # the poison is there
        for num_splits in (1, 2):
            _check(_run(qc, split_nibbles, num_splits), qc, dtype)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (8, 1), (12, 4)])  # GQA 1, 8, 3 (rows padded)
@pytest.mark.parametrize("split_nibbles", BOTH_KERNELS)
def test_int4_gqa_ratios_and_a_head_dim_not_a_power_of_two(split_nibbles, num_heads, num_kv_heads):
    key, value = LAYOUTS["K per channel, V per token (the engine's)"]
    for head_dim in (32, 48):  # 48: BLOCK_D 64, the last 8 pairs masked
        qc = _case(key, value, head_dim=head_dim, num_heads=num_heads, num_kv_heads=num_kv_heads, lens=[33, 5, 64],
                   seed=num_heads + head_dim)  # fmt: skip
        _check(_run(qc, split_nibbles), qc, torch.float32)


@pytest.mark.parametrize("window", [1, 5, 20])
def test_int4_split_sliding_window(window):
    qc = _case(TOKEN, TOKEN, seed=window)
    _check(_run(qc, True, 2, window=window), qc, torch.float32, window)


def test_split_nibbles_applies_to_int4_k_and_v_of_head_dim_32_and_up():
    # head_dim 16 (dots of inner dim 8) and a K or V in another format keep the joined-tile kernel.
    def kernel(key_format, value_format, head_dim, split_nibbles=True):
        case = make_case([20], [1], num_heads=4, num_kv_heads=2, head_dim=head_dim, block_size=16,
                         dtype=torch.float32)  # fmt: skip
        qc = quantize_case(case, key_format, value_format)
        config = dataclasses.replace(default_decode_config(case.query, qc.key, qc.value, case.block_tables),
                                     split_nibbles=split_nibbles)  # fmt: skip
        (main, *_) = decode_launches(case.query, qc.key, qc.value, case.block_tables, case.context_lens,
                                     case.query.clone(), scale=case.scale, tail=qc.tail, config=config)  # fmt: skip
        return main.kernel.__name__

    assert kernel("int4", "int4", 32) == "_decode_split_kernel"
    assert kernel("int4", "int4", 32, split_nibbles=False) == "_decode_kernel"
    assert kernel("int4", "int4", 16) == "_decode_kernel"
    assert kernel("int4", "int8", 64) == kernel("int8", "int4", 64) == "_decode_kernel"
    assert kernel("auto", "int4", 64) == "_decode_kernel"


def test_the_default_comes_from_one_constant(monkeypatch):
    case = make_case([20], [1], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, dtype=torch.float32)
    qc = quantize_case(case, "int4", "int4")
    for value in (True, False):
        monkeypatch.setattr(launch, "INT4_SPLIT_NIBBLES", value)
        assert default_decode_config(case.query, qc.key, qc.value, case.block_tables).split_nibbles is value


def test_a_per_channel_scale_off_its_word_alignment_keeps_the_joined_tiles():
    # The split kernel reads a channel pair's two fp16 scales as one 32-bit word; a scale view 2 bytes off that
    # alignment (legal: last dim contiguous) must take the joined tiles, and still be right.
    from hf_paged.cache.kernels import QuantizedKV

    qc = _case(BlockFormat("int4", per_channel=True), TOKEN, seed=11)
    scale = qc.key.scale
    shifted = torch.empty(scale.numel() + 1, dtype=scale.dtype, device=scale.device)[1:].view(scale.shape)
    shifted.copy_(scale)
    assert shifted.data_ptr() % 4 == 2
    qc.key = QuantizedKV(qc.key.data, shifted, "int4", qc.key.zero, per_channel=True)
    c = qc.case
    config = dataclasses.replace(default_decode_config(c.query, qc.key, qc.value, c.block_tables), split_nibbles=True)
    (main, *_) = decode_launches(c.query, qc.key, qc.value, c.block_tables, c.context_lens, c.query.clone(),
                                 scale=c.scale, tail=qc.tail, config=config)  # fmt: skip
    assert main.kernel.__name__ == "_decode_kernel"
    _check(paged_decode_attention_triton(c.query, qc.key, qc.value, c.block_tables, c.context_lens, scale=c.scale,
                                         tail=qc.tail, config=config), qc, torch.float32)  # fmt: skip
