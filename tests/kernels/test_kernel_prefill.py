"""Paged prefill attention: Triton (interpreter on CPU) against dense SDPA and the torch reference."""

from __future__ import annotations

import pytest
import torch

from hf_paged.cache.kernels import paged_decode_attention, paged_prefill_attention
from hf_paged.cache.kernels.reference import ref_paged_prefill_attention
from tests.kernels.paged_cases import DEVICE, dense_attention, make_case, tolerance, zero_filled

BF16 = pytest.param(
    torch.bfloat16,
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(DEVICE.type != "cuda", reason="bf16 arithmetic is wrong in the Triton interpreter"),
    ],
)
DTYPES = [torch.float32, torch.float16, BF16]

# (context_len, q_len): whole prompt, prefix hit with a chunk, chunk ending mid-block, one query (decode-like),
# a chunk starting exactly at a block boundary.
RAGGED = ([5, 40, 70, 33, 48], [5, 7, 70, 1, 16])


def _prefill(case, **kwargs):
    return paged_prefill_attention(
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.query_start_loc,
        case.context_lens,
        scale=case.scale,
        **kwargs,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (8, 2), (8, 1)])  # GQA ratios 1, 4, 8
def test_prefill_matches_sdpa_and_reference(dtype, block_size, num_heads, num_kv_heads):
    case = make_case(
        *RAGGED,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=32,
        block_size=block_size,
        dtype=dtype,
        seed=block_size + num_heads,
    )
    out = _prefill(case, backend="triton")
    assert out.shape == case.query.shape and out.dtype == dtype
    torch.testing.assert_close(out, dense_attention(case), **tolerance(dtype))
    case = zero_filled(case)  # the reference reads slot 0 for padding, so it needs finite unused slots
    ref = ref_paged_prefill_attention(
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.query_start_loc,
        case.context_lens,
        scale=case.scale,
    )
    torch.testing.assert_close(out, ref, **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [1, 4, 16, 50])
def test_prefill_sliding_window(dtype, window):
    case = make_case(*RAGGED, num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=dtype, seed=window)
    out = _prefill(case, sliding_window=window, backend="triton")
    torch.testing.assert_close(out, dense_attention(case, window), **tolerance(dtype))
    case = zero_filled(case)  # the reference reads slot 0 for padding, so it needs finite unused slots
    ref = ref_paged_prefill_attention(
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.query_start_loc,
        case.context_lens,
        scale=case.scale,
        sliding_window=window,
    )
    torch.testing.assert_close(out, ref, **tolerance(dtype))


@pytest.mark.parametrize("block_size", [1, 4])
def test_blocks_smaller_than_a_tile(block_size):
    case = make_case(
        [13, 29],
        [13, 6],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=block_size,
        dtype=torch.float32,
        seed=block_size,
    )
    torch.testing.assert_close(_prefill(case, backend="triton"), dense_attention(case), **tolerance(torch.float32))


def test_group_not_a_power_of_two_and_odd_head_dim():
    # 6 query heads over 2 KV heads (group 3: 21 tokens x 3 heads in a 64-row tile) and head_dim 40 (padded to 64)
    case = make_case([30, 9], [30, 4], num_heads=6, num_kv_heads=2, head_dim=40, block_size=16, dtype=torch.float32)
    torch.testing.assert_close(_prefill(case, backend="triton"), dense_attention(case), **tolerance(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_unwritten_slots_hold_nan_and_output_stays_finite(dtype):
    case = make_case(
        *RAGGED, num_heads=8, num_kv_heads=2, head_dim=24, block_size=16, dtype=dtype, fill=float("nan"), pad_block=-1
    )
    out = _prefill(case, backend="triton")
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_attention(case), **tolerance(dtype))


def test_prefill_of_single_queries_equals_decode():
    case = make_case(
        [1, 17, 70], [1, 1, 1], num_heads=8, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32, seed=3
    )
    decode = paged_decode_attention(
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.context_lens,
        scale=case.scale,
        backend="triton",
    )
    torch.testing.assert_close(_prefill(case, backend="triton"), decode, atol=1e-6, rtol=1e-6)


def test_chunked_prefill_equals_one_shot_prefill():
    # The same 45-token prompt as one chunk, then as chunks of 16 + 16 + 13 after their K/V were stored.
    full = make_case([45], [45], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)
    one_shot = _prefill(full, backend="triton")
    pieces = []
    for end in (16, 32, 45):
        start = end - 16 if end < 45 else 32
        qsl = torch.tensor([0, end - start], dtype=torch.int32, device=DEVICE)
        ctx = torch.tensor([end], dtype=torch.int32, device=DEVICE)
        pieces.append(
            paged_prefill_attention(
                full.query[start:end],
                full.key_cache,
                full.value_cache,
                full.block_tables,
                qsl,
                ctx,
                scale=full.scale,
                backend="triton",
            )
        )
    torch.testing.assert_close(torch.cat(pieces), one_shot, atol=1e-6, rtol=1e-6)


def test_sequence_with_no_queries_in_the_batch_is_skipped():
    case = make_case(
        [20, 9, 12], [3, 0, 2], num_heads=2, num_kv_heads=1, head_dim=16, block_size=16, dtype=torch.float32
    )
    torch.testing.assert_close(_prefill(case, backend="triton"), dense_attention(case), **tolerance(torch.float32))
