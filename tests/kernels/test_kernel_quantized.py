"""Fused dequantization in the paged kernels: Triton (interpreter on CPU) against the torch reference and SDPA.

Each case quantizes the blocks that are full, keeps the blocks of its queries in a full-precision tail, and
poisons everything else (NaN scales, 0xFF bytes, NaN tail slots, out-of-range tail table entries).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from hf_paged.cache.kernels import KernelArgumentError, QuantizedKV, paged_decode_attention, paged_prefill_attention
from hf_paged.cache.kernels.launch import DecodeLaunchConfig
from hf_paged.cache.kernels.triton_decode import decode_launches, paged_decode_attention_triton
from hf_paged.cache.kernels.triton_prefill import prefill_launch
from tests.kernels.paged_cases import DEVICE, dense_attention, make_case, tolerance
from tests.kernels.quantized_cases import dense_quantized_attention, quantize_case

BF16 = pytest.param(
    torch.bfloat16,
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(DEVICE.type != "cuda", reason="bf16 arithmetic is wrong in the Triton interpreter"),
    ],
)
FORMATS = ["int8", "fp8", "int4"]  # fp8 e4m3 loads work in the interpreter (triton 3.9)
# (context_len, q_len): whole prompt, prefix hit + chunk, chunk ending mid-block, one query, chunk at a boundary,
# a query that fills its block.
PREFILL = ([5, 40, 70, 33, 48, 32], [5, 7, 70, 1, 16, 3])
DECODE = [1, 16, 17, 70, 130]  # one key, a full block only, ending mid-block, several tiles


def _decode(qc, backend, **kwargs):
    c = qc.case
    return paged_decode_attention(c.query, qc.key, qc.value, c.block_tables, c.context_lens, scale=c.scale,
                                  tail=qc.tail, backend=backend, **kwargs)  # fmt: skip


def _prefill(qc, backend, **kwargs):
    c = qc.case
    return paged_prefill_attention(c.query, qc.key, qc.value, c.block_tables, c.query_start_loc, c.context_lens,
                                   scale=c.scale, tail=qc.tail, backend=backend, **kwargs)  # fmt: skip


def _check(out, qc, dtype, window=None):
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_quantized_attention(qc, window), **tolerance(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16])
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_decode_matches_reference_and_sdpa(fmt, block_size, dtype):
    case = make_case(DECODE, [1] * len(DECODE), num_heads=8, num_kv_heads=2, head_dim=32, block_size=block_size,
                     dtype=dtype, seed=block_size)  # fmt: skip
    qc = quantize_case(case, fmt, fmt, seed=1)
    out = _decode(qc, "triton")
    _check(out, qc, dtype)
    torch.testing.assert_close(out, _decode(qc, "torch"), **tolerance(dtype))
    if fmt == "int4" and dtype == torch.float32:  # the dequantized values were used, not the exact ones
        assert (out - dense_attention(case)).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16])
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_prefill_matches_reference_and_sdpa(fmt, block_size, dtype):
    case = make_case(*PREFILL, num_heads=4, num_kv_heads=1, head_dim=16, block_size=block_size, dtype=dtype,
                     seed=block_size + 1)  # fmt: skip
    qc = quantize_case(case, fmt, fmt, seed=2)
    out = _prefill(qc, "triton")
    _check(out, qc, dtype)
    torch.testing.assert_close(out, _prefill(qc, "torch"), **tolerance(dtype))


@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (8, 2), (8, 1)])  # GQA ratios 1, 4, 8
def test_quantized_gqa_ratios(num_heads, num_kv_heads):
    case = make_case([33, 20], [1, 1], num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=16, block_size=16,
                     dtype=torch.float16, seed=num_heads)  # fmt: skip
    qc = quantize_case(case, "int4", "int8")
    _check(_decode(qc, "triton"), qc, torch.float16)
    case = make_case([33, 20], [6, 20], num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=16, block_size=16,
                     dtype=torch.float16, seed=num_heads)  # fmt: skip
    qc = quantize_case(case, "int8", "int4")
    _check(_prefill(qc, "triton"), qc, torch.float16)


@pytest.mark.parametrize("key_format,value_format", [("int8", "int4"), ("auto", "int8"), ("int4", "auto")])
def test_mixed_key_and_value_formats(key_format, value_format):
    # K8V4, and one side left in the model dtype ("auto" main storage: still only full blocks there).
    case = make_case(*PREFILL, num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32, seed=3)
    qc = quantize_case(case, key_format, value_format)
    assert isinstance(qc.key, QuantizedKV) == (key_format != "auto")
    out = _prefill(qc, "triton")
    _check(out, qc, torch.float32)
    torch.testing.assert_close(out, _prefill(qc, "torch"), **tolerance(torch.float32))


@pytest.mark.parametrize("window", [1, 5, 20])
def test_quantized_sliding_window(window):
    case = make_case(*PREFILL, num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32,
                     seed=window)  # fmt: skip
    qc = quantize_case(case, "int8", "int4")
    out = _prefill(qc, "triton", sliding_window=window)
    _check(out, qc, torch.float32, window)
    torch.testing.assert_close(out, _prefill(qc, "torch", sliding_window=window), **tolerance(torch.float32))
    case = make_case(DECODE, [1] * 5, num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)
    qc = quantize_case(case, "int4", "int4")
    _check(_decode(qc, "triton", sliding_window=window), qc, torch.float32, window)


@pytest.mark.parametrize("num_splits", [2, 5])
def test_quantized_split_k(num_splits):
    # Splits cover the quantized part and the tail; some are empty.
    case = make_case([70, 5, 33], [1, 1, 1], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16,
                     dtype=torch.float32, seed=num_splits)  # fmt: skip
    qc = quantize_case(case, "int4", "fp8")
    config = DecodeLaunchConfig(block_g=16, block_n=16, block_d=16, num_splits=num_splits, num_warps=4,
                                num_stages=2, dot_precision="ieee")  # fmt: skip
    out = paged_decode_attention_triton(case.query, qc.key, qc.value, case.block_tables, case.context_lens,
                                        scale=case.scale, tail=qc.tail, config=config)  # fmt: skip
    _check(out, qc, torch.float32)


def test_poison_is_present_and_never_read():
    case = make_case([17, 40], [1, 1], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float16)
    qc = quantize_case(case, "int4", "int8")
    assert torch.isnan(qc.key.scale).any() and torch.isnan(qc.value.scale).any()
    assert (qc.key.data == 0xFF).any() and (qc.key.zero == 127).any()
    assert torch.isnan(qc.tail.key).any() and int(qc.tail.block_tables.max()) >= qc.tail.key.shape[0]
    out = _decode(qc, "triton")
    assert torch.isfinite(out).all()


def _small_quantized():
    case = make_case([20, 3], [1, 1], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)
    return case, quantize_case(case, "int4", "int8")


def test_quantized_arguments_are_checked():
    case, qc = _small_quantized()
    args = (case.query, qc.key, qc.value, case.block_tables, case.context_lens)
    with pytest.raises(KernelArgumentError, match="needs tail=FullPrecisionTail"):
        paged_decode_attention(*args, scale=case.scale, backend="triton")
    bad = QuantizedKV(qc.value.data, qc.value.scale[:, :8], "int8")
    with pytest.raises(KernelArgumentError, match=r"value_cache.scale has shape \(6, 8\), expected \(6, 16\)"):
        paged_decode_attention(case.query, qc.key, bad, case.block_tables, case.context_lens, scale=case.scale,
                               tail=qc.tail, backend="triton")  # fmt: skip
    no_zero = QuantizedKV(qc.key.data, qc.key.scale, "int4", None, True)
    with pytest.raises(KernelArgumentError, match="int4 needs zero points"):
        paged_decode_attention(case.query, no_zero, qc.value, case.block_tables, case.context_lens, scale=case.scale,
                               tail=qc.tail, backend="triton")  # fmt: skip
    narrow = type(qc.tail)(qc.tail.key, qc.tail.value, qc.tail.block_tables[:, :1].contiguous())
    with pytest.raises(KernelArgumentError, match="give both one width"):
        paged_decode_attention(*args, scale=case.scale, tail=narrow, backend="triton")
    half_tail = type(qc.tail)(qc.tail.key.half(), qc.tail.value.half(), qc.tail.block_tables)
    with pytest.raises(KernelArgumentError, match="query's dtype"):
        paged_decode_attention(*args, scale=case.scale, tail=half_tail, backend="triton")


def test_quantized_launch_parameters_for_the_gpu():
    # Llama-3-8B shape, int4 keys (per channel) and int8 values: tl.dot sizes >= 16, format constexprs set.
    num_blocks, bs, kv_heads, dim = 8, 16, 8, 128
    key = QuantizedKV(torch.zeros(num_blocks, bs, kv_heads, dim // 2, dtype=torch.uint8),
                      torch.zeros(num_blocks, kv_heads, dim, dtype=torch.float16), "int4",
                      torch.zeros(num_blocks, kv_heads, dim, dtype=torch.int8), per_channel=True)  # fmt: skip
    value = QuantizedKV(torch.zeros(num_blocks, bs, kv_heads, dim, dtype=torch.int8),
                        torch.zeros(num_blocks, bs, dtype=torch.float16), "int8")  # fmt: skip
    from hf_paged.cache.kernels import FullPrecisionTail

    query = torch.zeros(4, 32, dim, dtype=torch.bfloat16)
    tables = torch.zeros(4, 2, dtype=torch.int32)
    tail = FullPrecisionTail(torch.zeros(4, bs, kv_heads, dim, dtype=torch.bfloat16),
                             torch.zeros(4, bs, kv_heads, dim, dtype=torch.bfloat16), tables)  # fmt: skip
    (main, *_) = decode_launches(query, key, value, tables, torch.ones(4, dtype=torch.int32), query.clone(),
                                 scale=0.1, tail=tail)  # fmt: skip
    c = main.constexprs
    assert (c["K_FMT"], c["V_FMT"], c["K_PER_CHANNEL"], c["V_PER_CHANNEL"], c["HAS_TAIL"]) == (3, 1, True, False, True)
    assert min(c["BLOCK_G"], c["BLOCK_N"], c["BLOCK_D"]) >= 16 and c["BLOCK_D"] == dim
    qsl = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    p = prefill_launch(query, key, value, tables, qsl, torch.ones(4, dtype=torch.int32), query.clone(), scale=0.1,
                       tail=tail).constexprs  # fmt: skip
    assert (p["K_FMT"], p["V_FMT"], p["HAS_TAIL"]) == (3, 1, True)
    assert min(p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_D"]) >= 16


@pytest.mark.parametrize("as_bytes", [False, True])
def test_fp8_decoding_is_exact_for_every_byte(as_bytes):
    # Window 1: each sequence's output is exactly its last value row, dequantized. The last rows hold every e4m3
    # byte but the two NaNs (subnormals, both signs, 448): the native conversion and the integer decoding that
    # GPUs before sm_89 run (data given as uint8) must both give torch's float8 -> float32.
    from hf_paged.cache.kernels import FullPrecisionTail

    codes = torch.tensor([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=torch.uint8)
    num_seqs, bs, heads, dim = 8, 16, 2, 16
    data = torch.zeros(num_seqs, bs, heads, dim, dtype=torch.uint8)
    last = torch.cat((codes, codes[: num_seqs * heads * dim - codes.numel()]))
    data[:, -1] = last.view(num_seqs, heads, dim)
    data = data.to(DEVICE)
    fp8 = data.view(torch.float8_e4m3fn)
    scale = torch.ones(num_seqs, bs, dtype=torch.float16, device=DEVICE)
    value = QuantizedKV(data if as_bytes else fp8, scale, "fp8")
    key = QuantizedKV(torch.zeros_like(fp8), scale, "fp8")
    tables = torch.arange(num_seqs, dtype=torch.int32, device=DEVICE)[:, None]
    zeros = torch.zeros(1, bs, heads, dim, device=DEVICE)
    tail = FullPrecisionTail(zeros, zeros.clone(), torch.zeros_like(tables))
    lens = torch.full((num_seqs,), bs, dtype=torch.int32, device=DEVICE)
    query = torch.randn(num_seqs, heads, dim, device=DEVICE)
    out = paged_decode_attention(query, key, value, tables, lens, scale=0.25, sliding_window=1, tail=tail,
                                 backend="triton")  # fmt: skip
    assert torch.equal(out, fp8[:, -1].float())
    assert out.abs().max() == 448 and (out[out != 0].abs().min() == 2.0**-9)


def test_quantized_launch_configs_over_model_shapes():
    # Dequantized tiles live in registers: quantized launches get >= 8 warps (prefill: 16 keys per tile, one
    # stage), still tl.dot-legal (every dot dimension >= 16, powers of two). Same function the launchers call.
    from hf_paged.cache.kernels import launch

    for (heads, kv_heads), head_dim, dtype in itertools.product(
        ((32, 8), (28, 4), (32, 32), (8, 1), (2, 2)), (16, 64, 128, 256), (torch.float16, torch.bfloat16, torch.float32)
    ):
        d = launch.decode_launch_config(num_seqs=64, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                                        max_context_len=4096, dtype=dtype, num_sms=132, quantized=True)  # fmt: skip
        p = launch.prefill_launch_config(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
                                         quantized=True)  # fmt: skip
        assert min(d.block_g, d.block_n, d.block_d, p.block_m, p.block_n, p.block_d) >= 16
        assert all(x & (x - 1) == 0 for x in (d.block_g, d.block_n, d.block_d, p.block_m, p.block_n, p.block_d))
        assert d.num_warps >= 8 and p.num_warps >= 8 and p.block_n == 16 and p.num_stages == 1
        assert d.block_d >= head_dim and p.block_d >= head_dim
