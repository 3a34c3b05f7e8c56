"""Paged decode attention: Triton (interpreter on CPU) against dense SDPA and the torch reference."""

from __future__ import annotations

import pytest
import torch

from hf_paged.cache.kernels import paged_decode_attention
from hf_paged.cache.kernels.launch import DecodeLaunchConfig
from hf_paged.cache.kernels.reference import ref_paged_decode_attention
from hf_paged.cache.kernels.triton_decode import paged_decode_attention_triton
from tests.kernels.paged_cases import DEVICE, dense_attention, make_case, tolerance, zero_filled

BF16 = pytest.param(
    torch.bfloat16,
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(DEVICE.type != "cuda", reason="bf16 arithmetic is wrong in the Triton interpreter"),
    ],
)
DTYPES = [torch.float32, torch.float16, BF16]


def _decode(case, **kwargs):
    return paged_decode_attention(
        case.query, case.key_cache, case.value_cache, case.block_tables, case.context_lens, scale=case.scale, **kwargs
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (8, 2), (8, 1)])  # GQA ratios 1, 4, 8
def test_decode_matches_sdpa_and_reference(dtype, block_size, num_heads, num_kv_heads):
    # ragged, ending mid-block, one sequence of a single key, one spanning several blocks / tiles
    case = make_case(
        [1, 17, 70, 130],
        [1, 1, 1, 1],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=32,
        block_size=block_size,
        dtype=dtype,
        seed=block_size + num_heads,
    )
    out = _decode(case, backend="triton")
    assert out.shape == case.query.shape and out.dtype == dtype
    torch.testing.assert_close(out, dense_attention(case), **tolerance(dtype))
    case = zero_filled(case)  # the reference reads slot 0 for padding, so it needs finite unused slots
    ref = ref_paged_decode_attention(
        case.query, case.key_cache, case.value_cache, case.block_tables, case.context_lens, scale=case.scale
    )
    torch.testing.assert_close(out, ref, **tolerance(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 8])
def test_split_k_merge_matches_dense(num_splits, window, dtype):
    # 8 splits of a 70-key context in tiles of 16 leave some splits empty (their lse is -inf and must weigh 0);
    # a window of 20 leaves 2 tiles of it to split, so most splits are empty.
    case = make_case(
        [70, 5, 33], [1, 1, 1], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=dtype, seed=num_splits
    )
    config = DecodeLaunchConfig(
        block_g=16,
        block_n=16,
        block_d=16,
        num_splits=num_splits,
        num_warps=4,
        num_stages=2,
        dot_precision="ieee" if dtype == torch.float32 else "tf32",
    )
    out = paged_decode_attention_triton(
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.context_lens,
        scale=case.scale,
        sliding_window=window,
        config=config,
    )
    torch.testing.assert_close(out, dense_attention(case, window), **tolerance(dtype))


@pytest.mark.parametrize("block_size", [1, 4, 8])
def test_blocks_smaller_than_a_tile(block_size):
    # A key tile (>= 16 keys, the tl.dot minimum) then spans several blocks: each key finds its own block id.
    case = make_case(
        [1, 13, 29],
        [1, 1, 1],
        num_heads=4,
        num_kv_heads=1,
        head_dim=16,
        block_size=block_size,
        dtype=torch.float32,
        seed=block_size,
    )
    torch.testing.assert_close(_decode(case, backend="triton"), dense_attention(case), **tolerance(torch.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [1, 5, 16, 40, 1000])
def test_decode_sliding_window(dtype, window):
    case = make_case(
        [3, 20, 77], [1, 1, 1], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=dtype, seed=window
    )
    out = _decode(case, sliding_window=window, backend="triton")
    torch.testing.assert_close(out, dense_attention(case, window), **tolerance(dtype))
    case = zero_filled(case)  # the reference reads slot 0 for padding, so it needs finite unused slots
    ref = ref_paged_decode_attention(
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.context_lens,
        scale=case.scale,
        sliding_window=window,
    )
    torch.testing.assert_close(out, ref, **tolerance(dtype))


def test_window_of_one_returns_the_last_value_exactly():
    case = make_case([9, 40], [1, 1], num_heads=2, num_kv_heads=1, head_dim=16, block_size=16, dtype=torch.float32)
    out = _decode(case, sliding_window=1, backend="triton")
    expected = torch.stack([v[-1].expand(2, -1) for v in case.dense_values])  # one key: softmax weight exactly 1
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_unwritten_slots_hold_nan_and_output_stays_finite(dtype):
    # Every slot no sequence owns is NaN, table padding is -1, the spare table column too: any unmasked load
    # of K, V or the table would make the output NaN or crash.
    case = make_case(
        [1, 15, 17, 63],
        [1, 1, 1, 1],
        num_heads=8,
        num_kv_heads=2,
        head_dim=24,
        block_size=16,
        dtype=dtype,
        fill=float("nan"),
        pad_block=-1,
    )
    assert torch.isnan(case.key_cache).any() and torch.isnan(case.value_cache).any()
    out = _decode(case, backend="triton")
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_attention(case), **tolerance(dtype))


def test_auto_backend_runs_triton_on_cuda_and_the_reference_on_cpu():
    case = make_case(
        [10, 33],
        [1, 1],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=16,
        dtype=torch.float32,
        fill=0.0,
        pad_block=0,
    )
    auto = _decode(case, backend="auto")
    chosen = "triton" if DEVICE.type == "cuda" else "torch"
    assert torch.equal(auto, _decode(case, backend=chosen))


def test_empty_batch_returns_empty_output():
    case = make_case([4], [1], num_heads=2, num_kv_heads=1, head_dim=16, block_size=16, dtype=torch.float32)
    out = paged_decode_attention(
        case.query[:0],
        case.key_cache,
        case.value_cache,
        case.block_tables[:0],
        case.context_lens[:0],
        scale=case.scale,
        backend="triton",
    )
    assert out.shape == (0, 2, 16)
