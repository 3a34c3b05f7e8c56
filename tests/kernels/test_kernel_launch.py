"""Launch parameters the GPU path would use: the constraints the interpreter does not check.

`launch_config` is pure Python; these tests run the same function the launchers call, over the shapes of real
models (Llama 3 8B/70B, Qwen2 7B with group 7, MQA with 128 heads, head_dim 64..256) and of our tiny tests.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from hf_paged.cache.kernels import launch, paged_decode_attention, paged_prefill_attention, store_kv
from tests.kernels.paged_cases import make_case

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEADS = ((32, 8), (64, 8), (28, 4), (32, 32), (128, 1), (2, 2), (8, 1))
HEAD_DIMS = (16, 24, 64, 80, 96, 128, 256)


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _elem_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _assert_register_budget(rows, c, dtype):
    registers = launch.registers_per_thread(
        rows=rows, block_n=c.block_n, block_d=c.block_d, elem_bytes=_elem_bytes(dtype), num_warps=c.num_warps
    )
    if rows * c.block_d * _elem_bytes(dtype) < 128 * 256 * 4:
        assert registers <= launch.MAX_REGISTERS_PER_THREAD
    else:  # fp32, 128 query heads per KV head, head_dim 256: over budget even at 16 warps; it spills (slow)
        assert c.num_warps == 16 and registers <= 1.05 * launch.MAX_REGISTERS_PER_THREAD


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_launch_config_respects_gpu_constraints(dtype):
    for (heads, kv_heads), head_dim, num_seqs, max_ctx, sms in itertools.product(
        HEADS, HEAD_DIMS, (1, 3, 64, 512), (1, 17, 4096, 131072), (4, 132)
    ):
        c = launch.decode_launch_config(
            num_seqs=num_seqs,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            max_context_len=max_ctx,
            dtype=dtype,
            num_sms=sms,
        )
        # tl.dot needs M, N, K >= 16 for 16-bit inputs; arange sizes must be powers of two
        assert min(c.block_g, c.block_n, c.block_d) >= 16
        assert all(_pow2(x) for x in (c.block_g, c.block_n, c.block_d, c.num_warps))
        assert c.block_g >= heads // kv_heads and c.block_d >= head_dim
        assert c.num_warps in (4, 8, 16) and c.num_stages == 2
        assert c.dot_precision == ("ieee" if dtype == torch.float32 else "tf32")
        assert 1 <= c.num_splits <= launch.MAX_SPLITS
        if c.num_splits > 1:  # every split gets at least MIN_TILES_PER_SPLIT tiles of the longest context
            assert c.num_splits * launch.MIN_TILES_PER_SPLIT * c.block_n <= max_ctx
        _assert_register_budget(c.block_g, c, dtype)
        assert (
            launch.shared_memory_bytes(
                block_n=c.block_n, block_d=c.block_d, elem_bytes=_elem_bytes(dtype), num_stages=c.num_stages
            )
            <= launch.MAX_SHARED_MEMORY_BYTES
        )


def test_decode_launch_config_for_the_benchmark_shape():
    # Llama-3-8B shape at batch 64, context 4k, on an H100/H200 (132 SMs): the acceptance benchmark.
    c = launch.decode_launch_config(
        num_seqs=64, num_heads=32, num_kv_heads=8, head_dim=128, max_context_len=4096, dtype=torch.bfloat16, num_sms=132
    )
    assert (c.block_g, c.block_n, c.block_d, c.num_splits, c.num_warps) == (16, 64, 128, 2, 4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_launch_config_respects_gpu_constraints(dtype):
    for (heads, kv_heads), head_dim in itertools.product(HEADS, HEAD_DIMS):
        group = heads // kv_heads
        c = launch.prefill_launch_config(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)
        assert min(c.block_m, c.block_n, c.block_d) >= 16
        assert all(_pow2(x) for x in (c.block_m, c.block_n, c.block_d, c.num_warps))
        assert c.block_q >= 1 and c.block_q * group <= c.block_m < (c.block_q + 1) * group
        assert c.block_d >= head_dim
        _assert_register_budget(c.block_m, c, dtype)
        assert (
            launch.shared_memory_bytes(
                block_n=c.block_n, block_d=c.block_d, elem_bytes=_elem_bytes(dtype), num_stages=c.num_stages
            )
            <= launch.MAX_SHARED_MEMORY_BYTES
        )


def test_store_launch_config_covers_a_token_row():
    for kv_heads, head_dim, dtype in itertools.product((1, 3, 8, 32), HEAD_DIMS, DTYPES):
        c = launch.store_launch_config(num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)
        assert _pow2(c.block_h) and c.block_h >= kv_heads and _pow2(c.block_d) and c.block_d >= head_dim
        assert c.num_warps in (1, 2, 4, 8)
    assert launch.store_launch_config(num_kv_heads=8, head_dim=128, dtype=torch.bfloat16).num_warps == 4


def _spy(monkeypatch, name):
    calls = []
    original = getattr(launch, name)

    def spy(**kwargs):
        calls.append(original(**kwargs))
        return calls[-1]

    monkeypatch.setattr(launch, name, spy)
    return calls


def test_launchers_use_the_launch_config_functions(monkeypatch):
    case = make_case([20, 3], [4, 1], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)
    sms = launch.num_sms(case.query.device)
    # max_context_len is the table's capacity (3 blocks of 16), known without reading context_lens
    assert case.block_tables.shape == (2, 3)
    expected_decode = launch.decode_launch_config(
        num_seqs=2, num_heads=4, num_kv_heads=2, head_dim=16, max_context_len=48, dtype=torch.float32, num_sms=sms
    )
    expected_prefill = launch.prefill_launch_config(num_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float32)
    expected_store = launch.store_launch_config(num_kv_heads=2, head_dim=16, dtype=torch.float32)
    decode_calls = _spy(monkeypatch, "decode_launch_config")
    prefill_calls = _spy(monkeypatch, "prefill_launch_config")
    store_calls = _spy(monkeypatch, "store_launch_config")
    paged_prefill_attention(
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.query_start_loc,
        case.context_lens,
        scale=case.scale,
        backend="triton",
    )
    paged_decode_attention(
        case.query[:2],
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.context_lens,
        scale=case.scale,
        backend="triton",
    )
    store_kv(
        case.query[:1, :2],
        case.query[:1, :2],
        case.key_cache,
        case.value_cache,
        torch.tensor([-1], device=case.query.device),
        backend="triton",
    )
    assert (prefill_calls, decode_calls, store_calls) == ([expected_prefill], [expected_decode], [expected_store])
