"""The CPU (numba) paged-attention kernels against the dense oracles, on poisoned caches.

Every slot no sequence owns is NaN (quantized: 0xFF bytes, NaN scales, NaN tail slots, tail table entries past the
buffer, plain tables padded with -1), so a kernel that reads outside a sequence's own slots returns non-finite
output or crashes instead of passing.
"""

from __future__ import annotations

import functools

import pytest
import torch

from hf_paged.cache.compression import BlockFormat
from hf_paged.cache.kernels.cpu_attention import MAX_KERNEL_PAIRS, MAX_KERNEL_QUERIES
from hf_paged.cache.kernels.cpu_launch import cpu_kernel_applies, plan_cpu_attention, run_cpu_attention
from tests.kernels.paged_cases import dense_attention, tolerance
from tests.kernels.paged_cases import make_case as _make_case
from tests.kernels.quantized_cases import dense_quantized_attention, quantize_case, requantize

make_case = functools.partial(_make_case, device=torch.device("cpu"))  # CPU kernels: CPU cases, GPU or not

# decodes (one key, a full block, mid-block, several blocks), short chunks (prefix hit + chunk, one filling its
# block), and one long prefill (torch path) in the same batch
MIXED = ([1, 16, 17, 70, 40, 33, 90], [1, 1, 1, 1, 7, 16, MAX_KERNEL_QUERIES + 30])


def _plan(case, window=None, quantized=False):
    return plan_cpu_attention(case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(),
                                  case.key_cache.shape[1], window, quantized=quantized)


def _softcapped_oracle(case, softcap):
    outs, qsl = [], case.query_start_loc.tolist()
    for i, (k, v) in enumerate(zip(case.dense_keys, case.dense_values)):
        q = case.query[qsl[i] : qsl[i + 1]]
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * case.scale
        scores = torch.tanh(scores / softcap) * softcap
        ctx, q_len = k.shape[0], q.shape[0]
        mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - q_len, ctx)[:, None]
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(outs)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_plain_kernel_matches_dense_attention(num_heads, num_kv_heads, block_size):
    case = make_case(*MIXED, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=32, block_size=block_size,
                     dtype=torch.float32, seed=block_size)
    plan = _plan(case)
    assert plan.seqs.tolist() == list(range(6)) and plan.long_seqs == [6]
    out = run_cpu_attention(plan, case.query, case.key_cache, case.value_cache, scale=case.scale, softcap=None)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_attention(case), **tolerance(torch.float32))


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(12, 2, 48), (5, 5, 64), (8, 1, 8), (6, 3, 20)])
@pytest.mark.parametrize("block_size,window", [(1, None), (16, None), (32, None), (16, 11)])
def test_decodes_and_short_chunks_match_dense_attention_at_every_shape(num_heads, num_kv_heads, head_dim, block_size,
                                                                       window):
    """`cpu_decode`'s vectors where head_dim % 8 == 0 (the scalar loops for 20): GQA groups of 6 (4 heads + 2 single
    heads), 1 and 8; decodes and chunks of up to 16 queries, contexts around the kernel's groups of 8 keys and its
    blocks' edges."""
    lens, q_lens = [1, 7, 8, 9, 15, 16, 17, 33, 100], [1, 7, 8, 1, 15, 16, 3, 9, 1]
    case = make_case(lens, q_lens, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     block_size=block_size, dtype=torch.float32, seed=head_dim + block_size)
    plan = _plan(case, window)
    assert plan.seqs.tolist() == list(range(len(lens))) and not plan.long_seqs
    out = run_cpu_attention(plan, case.query, case.key_cache, case.value_cache, scale=case.scale, softcap=None)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_attention(case, window), **tolerance(torch.float32))


@pytest.mark.parametrize("window", [None, 40])
def test_short_chunk_over_a_long_context_takes_the_torch_path(window):
    """A chunk within MAX_KERNEL_QUERIES whose queries x keys pass MAX_KERNEL_PAIRS goes to the torch plan (plain
    blocks); with a sliding window its keys are the window's; quantized plans keep it in the kernel."""
    long_ctx = MAX_KERNEL_PAIRS // 4 + 8  # 4 queries over it pass the bound, 2 do not
    case = make_case([long_ctx, long_ctx, 30], [4, 2, 4], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16,
                     dtype=torch.float32, seed=3)
    plan = _plan(case, window)
    assert (plan.seqs.tolist(), plan.long_seqs) == (([1, 2], [0]) if window is None else ([0, 1, 2], []))
    assert _plan(case, window, quantized=True).long_seqs == []
    out = run_cpu_attention(plan, case.query, case.key_cache, case.value_cache, scale=case.scale, softcap=None)
    torch.testing.assert_close(out, dense_attention(case, window), **tolerance(torch.float32))


@pytest.mark.parametrize("window", [1, 5, 16, 33])
def test_plain_kernel_sliding_window(window):
    case = make_case(*MIXED, num_heads=4, num_kv_heads=2, head_dim=16, block_size=8, dtype=torch.float32, seed=1)
    out = run_cpu_attention(_plan(case, window), case.query, case.key_cache, case.value_cache, scale=case.scale,
                            softcap=None)
    torch.testing.assert_close(out, dense_attention(case, window), **tolerance(torch.float32))


def test_plain_kernel_softcap():
    case = make_case([1, 30, 45], [1, 1, 9], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
                     dtype=torch.float32, seed=2)
    out = run_cpu_attention(_plan(case), case.query * 20, case.key_cache, case.value_cache, scale=case.scale,
                            softcap=5.0)
    case.query = case.query * 20
    torch.testing.assert_close(out, _softcapped_oracle(case, 5.0), **tolerance(torch.float32))


QUANTIZED = {
    "int8": (BlockFormat("int8"), BlockFormat("int8")),
    "fp8": (BlockFormat("fp8"), BlockFormat("fp8")),
    "int4 (K per channel)": (BlockFormat("int4", per_channel=True), BlockFormat("int4")),
    "int4 V per head, log8": (BlockFormat("int4", per_channel=True, log_scale=True),
                              BlockFormat("int4", per_head=True, log_scale=True)),
    "int8 per head, log8": (BlockFormat("int8", per_head=True, log_scale=True),
                            BlockFormat("int8", per_head=True, log_scale=True)),
    "fp8 K, int4 V": (BlockFormat("fp8"), BlockFormat("int4")),
    "plain K, int8 V": (BlockFormat("auto"), BlockFormat("int8")),
}


@pytest.mark.parametrize("formats", list(QUANTIZED))
@pytest.mark.parametrize("block_size", [8, 16])
def test_quantized_kernel_matches_the_oracle(formats, block_size, one_thread):
    """Each pairing of block formats through the serial kernel: a pairing's first compile is tens of seconds on 2
    cores, and the parallel variant's as much again (the parallel launch is
    `test_sequences_spread_over_threads_give_the_same_output`'s)."""
    key, value = QUANTIZED[formats]
    case = make_case(*MIXED, num_heads=8, num_kv_heads=2, head_dim=32, block_size=block_size, dtype=torch.float32,
                     seed=block_size)
    qc = quantize_case(case, "int8", "int8", seed=1)
    qc = requantize(qc, key, value)
    out = run_cpu_attention(_plan(case, quantized=True), case.query, qc.key, qc.value, scale=case.scale,
                            softcap=None, tail=qc.tail)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_quantized_attention(qc), **tolerance(torch.float32))


@pytest.mark.parametrize("formats", ["int8", "int4 (K per channel)", "plain K, int8 V"])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(12, 2, 48), (8, 1, 8), (6, 3, 20)])
@pytest.mark.parametrize("block_size,window", [(1, None), (16, None), (16, 11)])
def test_quantized_decodes_match_the_oracle_at_every_shape(formats, num_heads, num_kv_heads, head_dim, block_size,
                                                           window, one_thread):
    """`cpu_quantized_decode`'s vectors where head_dim % 8 == 0 (the scalar loops for 20): GQA groups of 6 (4 heads
    + 2 single heads, 48 dims: 32 + 2 x 8 lanes), 1 and 8; decodes whose last block is open (read from the tail)
    or full (from the cache), contexts around the groups of 8 keys, beside short chunks."""
    key, value = QUANTIZED[formats]
    lens, q_lens = [1, 7, 8, 9, 15, 16, 17, 33, 100], [1, 7, 1, 1, 15, 1, 3, 1, 1]
    case = make_case(lens, q_lens, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     block_size=block_size, dtype=torch.float32, seed=head_dim + block_size)
    qc = requantize(quantize_case(case, "int8", "int8", seed=3), key, value)
    out = run_cpu_attention(_plan(case, window, quantized=True), case.query, qc.key, qc.value, scale=case.scale,
                            softcap=None, tail=qc.tail)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_quantized_attention(qc, window), **tolerance(torch.float32))


def test_quantized_kernel_sliding_window():
    case = make_case(*MIXED, num_heads=4, num_kv_heads=2, head_dim=16, block_size=8, dtype=torch.float32, seed=4)
    qc = quantize_case(case, "int8", "int4", seed=2)
    out = run_cpu_attention(_plan(case, 12, quantized=True), case.query, qc.key, qc.value, scale=case.scale,
                            softcap=None, tail=qc.tail)
    torch.testing.assert_close(out, dense_quantized_attention(qc, 12), **tolerance(torch.float32))


def test_kernel_applies_to_fp32_on_the_cpu_only():
    q = torch.zeros(1, 2, 4)
    assert cpu_kernel_applies(q, torch.zeros(1, 1, 1, 4))
    assert not cpu_kernel_applies(q.half(), torch.zeros(1, 1, 1, 4).half())
    assert not cpu_kernel_applies(q, torch.zeros(1, 1, 1, 4).bfloat16())


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_sequences_spread_over_threads_give_the_same_output(two_threads):
    import hf_paged.cache.kernels.cpu_launch as launch

    case = make_case(*MIXED, num_heads=8, num_kv_heads=2, head_dim=32, block_size=16, dtype=torch.float32, seed=5)
    out = run_cpu_attention(_plan(case), case.query, case.key_cache, case.value_cache, scale=case.scale,
                            softcap=None)
    torch.testing.assert_close(out, dense_attention(case), **tolerance(torch.float32))
    qc = quantize_case(case, "int8", "int4", seed=3)
    out = run_cpu_attention(_plan(case, quantized=True), case.query, qc.key, qc.value, scale=case.scale,
                            softcap=None, tail=qc.tail)
    torch.testing.assert_close(out, dense_quantized_attention(qc), **tolerance(torch.float32))
    if launch._parallel_ok is False:
        pytest.skip("numba has no thread-safe threading layer here (TBB or OpenMP): the serial kernels ran")


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("block_size", [8, 16])
def test_long_quantized_chunks_in_segments_match_the_oracle(monkeypatch, window, block_size):
    """Long chunks (a fresh prompt, a chunk after a prefix hit starting mid-block, one ending mid-block) cut into
    several query segments: every query still reads the same copy of every key as the oracle's."""
    import hf_paged.cache.kernels.cpu_prefill as cpu_prefill

    monkeypatch.setattr(cpu_prefill, "SEGMENT_TOKENS", 32)
    case = make_case([150, 203, 1, 37], [150, 101, 1, 37], num_heads=4, num_kv_heads=2, head_dim=16,
                     block_size=block_size, dtype=torch.float32, seed=7)
    qc = quantize_case(case, "int8", "int4", seed=3)
    plan = _plan(case, window, quantized=True)
    assert plan.long_seqs == [0, 1, 3]
    out = run_cpu_attention(plan, case.query, qc.key, qc.value, scale=case.scale, softcap=None, tail=qc.tail)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_quantized_attention(qc, window), **tolerance(torch.float32))
