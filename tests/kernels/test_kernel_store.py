"""store_kv: Triton (interpreter on CPU) against an explicit scatter and the torch reference."""

from __future__ import annotations

import pytest
import torch

from hf_paged.cache.kernels import store_kv
from hf_paged.cache.kernels.reference import ref_store_kv
from tests.kernels.paged_cases import DEVICE

BF16 = pytest.param(
    torch.bfloat16,
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(DEVICE.type != "cuda", reason="bf16 is not supported by the Triton interpreter"),
    ],
)


def _setup(dtype, block_size, num_kv_heads=3, head_dim=24, num_blocks=4):
    gen = torch.Generator().manual_seed(block_size)
    slots = [0, 5, -1, block_size + 1, 3 * block_size + block_size - 1, -7, 2 * block_size]
    key = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    value = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)
    value_cache = torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    return key, value, key_cache, value_cache, slot_mapping


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16])
@pytest.mark.parametrize("block_size", [16, 64])
def test_store_writes_each_row_to_its_slot_and_skips_negative_slots(dtype, block_size):
    key, value, key_cache, value_cache, slot_mapping = _setup(dtype, block_size)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            expected_k[slot // block_size, slot % block_size] = key[t]
            expected_v[slot // block_size, slot % block_size] = value[t]
    store_kv(key, value, key_cache, value_cache, slot_mapping, backend="triton")
    # exact copy; slots never written (including those of the skipped tokens) are still NaN
    torch.testing.assert_close(key_cache, expected_k, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(value_cache, expected_v, atol=0, rtol=0, equal_nan=True)
    assert int(torch.isnan(key_cache[..., 0, 0]).logical_not().sum()) == 5  # five non-negative slots


def test_store_matches_reference_and_respects_input_strides():
    key, value, key_cache, value_cache, slot_mapping = _setup(torch.float32, 16)
    # key/value as column slices of one fused projection: token stride 2x the row size, head stride 24
    fused = torch.cat([key, value], dim=1)
    key_view, value_view = fused[:, :3], fused[:, 3:]
    assert not key_view.is_contiguous()
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    ref_store_kv(key, value, ref_k, ref_v, slot_mapping)
    store_kv(key_view, value_view, key_cache, value_cache, slot_mapping, backend="triton")
    torch.testing.assert_close(key_cache, ref_k, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(value_cache, ref_v, atol=0, rtol=0, equal_nan=True)


def test_store_of_zero_tokens_changes_nothing():
    key, value, key_cache, value_cache, slot_mapping = _setup(torch.float32, 16)
    before = key_cache.clone()
    store_kv(key[:0], value[:0], key_cache, value_cache, slot_mapping[:0], backend="triton")
    torch.testing.assert_close(key_cache, before, atol=0, rtol=0, equal_nan=True)
