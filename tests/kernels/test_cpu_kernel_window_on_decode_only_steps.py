"""A step where every sequence decodes one token (`plan_cpu_attention`'s fast path) keeps the layer's sliding window
in the CPU kernels, plain and quantized: the other kernel tests mix decodes with chunks, which takes the general
path. NaN fills every slot no sequence owns."""

from __future__ import annotations

import functools

import pytest
import torch

from hf_paged.cache.kernels.cpu_launch import plan_cpu_attention, run_cpu_attention
from tests.kernels.paged_cases import dense_attention, tolerance
from tests.kernels.paged_cases import make_case as _make_case
from tests.kernels.quantized_cases import dense_quantized_attention, quantize_case

make_case = functools.partial(_make_case, device=torch.device("cpu"))
LENS = [1, 8, 16, 17, 40, 70]  # one key, a full block, mid-block, several blocks (block size 8)


def _plan(case, window, quantized=False):
    return plan_cpu_attention(case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(),
                              case.key_cache.shape[1], window, quantized=quantized)


@pytest.mark.parametrize("window", [1, 5, 24])
def test_decode_only_step_keeps_the_window(window):
    case = make_case(LENS, [1] * len(LENS), num_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
                     dtype=torch.float32, seed=window)
    plan = _plan(case, window)
    assert plan.window == window and plan.seqs.tolist() == list(range(len(LENS)))
    out = run_cpu_attention(plan, case.query, case.key_cache, case.value_cache, scale=case.scale, softcap=None)
    torch.testing.assert_close(out, dense_attention(case, window), **tolerance(torch.float32))


def test_quantized_decode_only_step_keeps_the_window():
    case = make_case(LENS, [1] * len(LENS), num_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
                     dtype=torch.float32, seed=3)
    qc = quantize_case(case, "int8", "int8", seed=1)
    plan = _plan(case, 12, quantized=True)
    assert plan.window == 12
    out = run_cpu_attention(plan, case.query, qc.key, qc.value, scale=case.scale, softcap=None, tail=qc.tail)
    torch.testing.assert_close(out, dense_quantized_attention(qc, 12), **tolerance(torch.float32))
