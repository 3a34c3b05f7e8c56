"""`plan_cpu_attention`: a decode (one query) stays in the CPU kernel however long its context, beside a chunk (the
general path, not the all-decodes one): `MAX_KERNEL_PAIRS` sends only short chunks over long contexts to the torch
plan, where one matmul shares the gather among the chunk's queries; a lone query has nothing to share it with."""

from __future__ import annotations

import torch

from hf_paged.cache.kernels.cpu_attention import MAX_KERNEL_PAIRS, MAX_KERNEL_QUERIES
from hf_paged.cache.kernels.cpu_launch import plan_cpu_attention


def test_a_decode_over_a_context_past_the_pair_bound_stays_in_the_kernel():
    bs, long_ctx = 16, MAX_KERNEL_PAIRS + 100
    lens, q_lens = [long_ctx, long_ctx, 40], [1, 2, MAX_KERNEL_QUERIES + 1]
    tables = torch.zeros(3, -(-long_ctx // bs), dtype=torch.int32)
    qsl = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    for window, quantized in ((None, False), (None, True), (MAX_KERNEL_PAIRS, False)):
        plan = plan_cpu_attention(tables, qsl, lens, bs, window, quantized=quantized)
        # the decode in the kernel; 2 queries over the long context pass the bound (plain blocks: torch plan)
        kernel = [0] if not quantized else [0, 1]
        assert plan.seqs.tolist() == kernel and plan.long_seqs == sorted({1, 2} - set(kernel)), (window, quantized)
