"""`cpu_prefetch.prefetch_lines`: a hint that never faults and never writes, on any address."""

from __future__ import annotations

import numpy as np
from numba import njit

from hf_paged.cache.kernels.cpu_prefetch import prefetch_lines


@njit(cache=False)
def _hint(data, addresses, nbytes):
    for a in addresses:
        prefetch_lines(a, nbytes)
    prefetch_lines(data.ctypes.data, data.size * 4)
    return data.sum()


def test_prefetch_lines_is_a_hint_on_any_address():
    data = np.arange(1000, dtype=np.float32)
    before = data.copy()
    # null, unmapped, kernel-space and unaligned addresses: a prefetch of them must neither fault nor read
    addresses = np.array([0, 1, 63, 1 << 40, (1 << 47) - 1, data.ctypes.data + 3], dtype=np.int64)
    assert _hint(data, addresses, 512) == before.sum()
    assert np.array_equal(data, before)
    assert _hint(data, addresses, 0) == before.sum()  # no bytes: no line
