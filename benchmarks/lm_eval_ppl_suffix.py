"""What running only the scored rows through the last layer's attention would save on hf_paged_ppl (issue 44): a
rolling window's later part scores a suffix of its rows; the rows before it (context) need keys and values in every
layer but no attention output in the last one. Measured on the embedded model's attention shapes (2,048-token
window, 8 query / 2 key-value heads, dim 32, fp32, one thread) for the 7 last windows of the 12 documents (scored
suffixes of 126-1,817 rows): one causal SDPA over the window vs the suffix alone (unmasked keys before it plus a causal
square, two calls of torch's CPU flash kernel merged by their logsumexp; torch's `is_causal` aligns top-left when
queries are fewer than keys, so one call cannot do it). Not built in the engine: this is the ceiling of the idea.

    python benchmarks/lm_eval_ppl_suffix.py
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import machine

T, HEADS, KV_HEADS, DIM = 2048, 8, 2, 32
SUFFIXES = (126, 122, 549, 382, 666, 944, 1817)  # scored rows of the later windows with a context (tokenized docs)


def main(repeats: int = 3) -> None:
    torch.set_num_threads(1)
    print(f"machine: {machine()}", flush=True)
    torch.manual_seed(0)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # returns (out, logsumexp)
    scale = DIM ** -0.5
    q = torch.randn(T, HEADS, DIM).transpose(0, 1).unsqueeze(0)  # the engine's layouts: [T, heads, dim] transposed
    k, v = (torch.randn(T, KV_HEADS, DIM).transpose(0, 1).unsqueeze(0) for _ in range(2))
    k_rep, v_rep = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)

    def whole():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)

    def suffix(n: int) -> torch.Tensor:
        a = T - n
        o2, l2 = flash(q[:, :, a:], k_rep[:, :, a:], v_rep[:, :, a:], 0.0, True, scale=scale)
        o1, l1 = flash(q[:, :, a:], k_rep[:, :, :a], v_rep[:, :, :a], 0.0, False, scale=scale)
        m = torch.maximum(l1, l2)
        w1, w2 = torch.exp(l1 - m).unsqueeze(-1), torch.exp(l2 - m).unsqueeze(-1)
        return (o1 * w1 + o2 * w2) / (w1 + w2)

    reference = whole()
    error = max((suffix(n) - reference[:, :, T - n:]).abs().max().item() for n in SUFFIXES)
    full_s = suffix_s = 0.0
    for _ in range(repeats):  # interleaved
        start = time.process_time()
        for _ in SUFFIXES:
            whole()
        full_s += time.process_time() - start
        start = time.process_time()
        for n in SUFFIXES:
            suffix(n)
        suffix_s += time.process_time() - start
    print(f"last-layer attention of the {len(SUFFIXES)} windows: whole window {full_s / repeats * 1e3:.0f} ms, "
          f"scored suffix only {suffix_s / repeats * 1e3:.0f} ms, saved {(full_s - suffix_s) / repeats * 1e3:.0f} ms "
          f"a call (max difference {error:.1e})")


if __name__ == "__main__":
    main()
