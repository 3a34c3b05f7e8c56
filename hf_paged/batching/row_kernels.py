"""`independent_rows`: from how many rows on an fp32 CPU matmul gives each row the bits a larger product gives it.

The lean forward's pruning (the last layer on the kept rows only) and the certified head's open rows compute some
rows of a product apart from the others, and are exact only where a row's bits do not depend on how many rows the
product has. On one thread, MKL's sgemm takes other kernels for products of few rows, and how few depends on the CPU:
below 4 rows on AVX2 (AMD EPYC), below 16 on AVX-512 (Intel Xeon: rows of 1-15-row products differ from the same
rows in a 512-row product for k = 256-8192; of 1-2 rows for k = 32-64). So the threshold is measured here, for the
shapes at hand, once per process, rather than assumed: the first `CANDIDATES` entry from which every product of m
sampled rows (all of 1..64, then a spread up to `PROBE_ROWS`) equals the first m rows of a `PROBE_ROWS`-row product.
A product narrower than its weight is measured on at most `MAX_COLUMNS` of its columns (the kernel is chosen by the
rows and the reduction depth, not by a wide output: measured the same for 256 and 8192 columns). Cost, once per shape
and process, only where pruning applies (fp32, CPU, one thread): 0.11 s of CPU for k = 2048, 0.42 s for k = 8192.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["CANDIDATES", "independent_rows"]

CANDIDATES = (4, 8, 16, 32, 64)  # no pruning past 64: fewer rows would be saved than the padding costs
PROBE_ROWS = 512  # the default step budget's tokens: the largest product a step compares with
MAX_COLUMNS = 512
_SAMPLED = (*range(1, 65), 96, 128, 192, 256, 384)


def independent_rows(shapes: set[tuple[int, int]]) -> int | None:
    """The fewest rows (a `CANDIDATES` entry) from which an fp32 CPU product `x [m, k] @ w[n, k].T` of any
    (k, n) in `shapes` gives each row the bits it has in a larger product, on one thread; None: none up to 64."""
    worst = max((_last_dependent(k, min(n, MAX_COLUMNS)) for k, n in shapes), default=0)
    return next((c for c in CANDIDATES if c > worst), None)


@functools.cache
def _last_dependent(k: int, n: int) -> int:
    """The largest sampled row count whose product differs from the same rows of a `PROBE_ROWS`-row one."""
    threads = torch.get_num_threads()
    generator = torch.Generator(device="cpu").manual_seed(0)  # (the CPU BLAS is what is measured)
    weight = torch.randn(n, k, generator=generator, device="cpu")
    x = torch.randn(PROBE_ROWS, k, generator=generator, device="cpu")
    try:
        torch.set_num_threads(1)
        with torch.inference_mode():
            full = torch.mm(x, weight.t())
            return max((m for m in _SAMPLED if not torch.equal(torch.mm(x[:m], weight.t()), full[:m])), default=0)
    finally:
        torch.set_num_threads(threads)
